//! The coordinators: Kafka's consumer groups (classic and KIP-848) and transactions,
//! each run by the owner of an internal stream (`__consumer_offsets/N`,
//! `__transaction_state/N`) and kept in it (`state_stream`).
//!
//! They sit above the storage core and use it through a narrow face: append to an
//! internal stream, read it, learn when it moves. The core never names them: what it
//! asks of them (verifying a transactional write, a transaction's offsets settled by a
//! marker) goes through `crate::node::coordination`'s traits, registered at startup
//! (`scripts/check-layering.sh`).

pub mod groups;
pub mod state_stream;
pub mod txn;
