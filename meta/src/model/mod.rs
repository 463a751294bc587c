//! The metadata log's data model: rows, commands, and the pure rules that apply one to the other.

pub mod acls;
pub mod apply;
pub mod codec;
pub mod command;
pub mod format1;
pub mod grants;
pub mod index;
pub mod leader_epochs;
pub mod metadata;
pub mod names;
pub mod quotas;
pub mod rows;
pub mod scopes;
pub mod state;
pub mod streams;
pub mod takeover_agents;
pub mod user_commands;

pub use apply::{check_destination, Effects};
pub use command::{
    Applied, Command, CommitRange, CompactedObject, ConfigTarget, DamageRemedy, NewObject, Outcome, Placement,
    Proposal, Proposer, RejectCode, Rejection, ReplacedRange, StreamAt, StreamSwap, TransferTo, MAX_BATCH,
};
pub use index::{IndexChange, IndexRead, MemIndex, Overlay};
pub use metadata::Metadata;
pub use names::validate_name;
pub use rows::*;
pub use state::{Change, Delta, Row, RowKey, State};
pub use streams::{Owned, Streams};

#[cfg(test)]
mod apply_props;
