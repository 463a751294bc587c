//! Kafka transactions (issue 23; design in `docs/design/0005-transactions.md`).
//!
//! The coordinator of a transactional id is the owner of the id's transaction-state
//! stream (`__transaction_state/N`), as a group's is the owner of its offsets stream.
//! This module holds the coordinator's rules and log; what a partition's owner keeps
//! of the transactions in it, and the markers, are in `crate::partition`.

pub mod coordinator;
mod introspection;
pub mod log;
pub mod peer_calls;
pub mod state;
