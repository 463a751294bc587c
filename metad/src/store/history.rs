//! The applied-command history: index, proposer, command and outcome of recent
//! entries, kept for operators (`weir metadata dump`) and for log-order assertions in tests.

use serde::{Deserialize, Serialize};
use weir_meta::model::command::{Outcome, Proposal};

/// How many recent entries the history keeps.
pub const HISTORY_RETAIN: u64 = 200_000;

/// One applied log entry as the dump shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub index: u64,
    pub term: u64,
    /// `None` for blank and membership entries.
    pub proposal: Option<Proposal>,
    pub outcome: Option<Outcome>,
    /// For membership entries: the new voter ids.
    pub membership: Option<Vec<u64>>,
}
