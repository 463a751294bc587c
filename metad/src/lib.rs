//! metad: the Raft metadata quorum of Weir. The metadata log (openraft, RocksDB)
//! holds nodes, streams, topics, data objects, leases, takeovers and tokens; every
//! replica serves the client API (propose, linearizable read, watch) and admin.

pub mod admin;
pub mod admin_http;
pub mod bootstrap_token;
pub mod client;
pub mod client_service;
pub mod config;
pub mod failover;
pub mod failover_plan;
pub mod leader;
pub mod membership;
pub mod metrics;
pub mod model;
pub mod network;
pub mod placement;
pub mod raft_service;
pub mod raft_types;
pub mod server;
pub mod store;
pub mod transfer;
pub mod view;

pub use config::{MetadArgs, MetadConfig};
pub use server::run;
