//! RocksDB storage of the metadata log: the Raft log and vote (`log_store`) and
//! the state machine with snapshots (`state_machine`), in column families of one database.

pub mod db;
pub mod history;
pub mod log_store;
pub mod state_machine;

pub use db::open_db;
pub use log_store::LogStore;
pub use state_machine::{StateMachineStore, ViewHub, WatchItem};

#[cfg(test)]
mod storage_suite;
