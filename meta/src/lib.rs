//! weir-meta: the metadata model of Weir and everything a node needs to follow it,
//! with no Raft or storage in it. metad serves this model; streamd, gatewayd and the
//! CLI use it through the client, the watched view and node registration.
//!
//! - `model`: rows, commands, state, the stored codec, and the apply rules by resource;
//! - pure decisions: `placement`, `failover_plan`, `drain_plan`;
//! - following the log: `client`, `view`, `catch_up`, `registration`;
//! - operator views: `listing`.

pub mod catch_up;
pub mod client;
#[doc(hidden)]
pub mod crowd;
pub mod drain_plan;
pub mod failover_plan;
pub mod listing;
pub mod model;
pub mod placement;
pub mod registration;
pub mod scram;
pub mod view;

pub use client::{ClientError, MetadClient};
pub use view::View;
