//! streamd: owns streams, acknowledges appends once durable in a fenced write-ahead
//! log, uploads them as data objects to object storage, and serves reads.

pub mod append_stream;
pub mod config;
pub mod coordinators;
pub mod error;
pub mod http;
pub mod keyed_records;
pub mod metrics;
pub mod node;
pub mod object;
pub mod partition;
pub mod server;
pub mod service;
pub mod shutdown_drain;
pub mod stream;
pub mod wal;

pub use config::StreamdArgs;
pub use server::run;
pub use weir_shared::service::Exit;
