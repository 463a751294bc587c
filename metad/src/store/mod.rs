//! RocksDB storage of the metadata log: the Raft log and vote (`log_store`), the state
//! machine (`state_machine`) with the view's rows and the object index (`index`), in
//! column families of one database, and snapshots as files (`snapshot_file`).

pub mod db;
pub mod history;
pub mod index;
pub mod log_store;
mod migrate;
mod open;
pub mod snapshot_file;
pub mod state_machine;

pub use log_store::LogStore;
pub use open::open_db;
pub use state_machine::{StateMachineStore, ViewHub, WatchItem};

#[cfg(test)]
mod storage_suite;
