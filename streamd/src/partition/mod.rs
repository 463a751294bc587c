//! Kafka's state on one partition: what the storage core needs to admit a Kafka batch
//! and to serve `read_committed` readers. Idempotent producers' sequences
//! (`producers`), the transactions open in the stream with its last stable offset and
//! aborted ranges (`txns`), and the control batches that end them (`marker`).
//!
//! Pure state and rules, fed by the core in offset order: nothing here names the
//! core's streams, its WAL or a coordinator (`scripts/check-layering.sh`).

pub mod marker;
pub mod producers;
pub mod txns;
