//! metad: the Raft metadata quorum of Weir. The metadata log (openraft, RocksDB)
//! holds the model of `weir-meta`; every replica serves the client API (propose,
//! linearizable read, watch) and admin, and the leader runs placement, failover and
//! drains. Only the configuration and `run` are public: other services reach metad
//! through `weir-meta`'s client, never through its storage or Raft.

mod admin;
mod admin_http;
mod authz;
mod bootstrap_token;
mod client_service;
mod config;
mod failover;
mod leader;
mod metrics;
mod network;
mod placement_loop;
mod raft_health;
mod raft_service;
mod raft_types;
mod server;
mod snapshot_policy;
mod store;
mod token_callers;
mod transfer_marks;
mod transfer_runner;

pub use config::{MetadArgs, MetadConfig};
pub use server::run;
