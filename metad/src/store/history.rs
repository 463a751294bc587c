//! The applied-command history: index, proposer, command and outcome of recent
//! entries, kept for operators (`weir metadata dump`) and for log-order assertions in tests.

use serde::{Deserialize, Serialize};
use weir_meta::model::command::{Outcome, Proposal};

/// How many recent entries the history keeps, at most.
pub const HISTORY_RETAIN: u64 = 200_000;
/// About how many bytes the history keeps, at most: batch entries (a thousand streams
/// opened in one) are large, and the history is bounded by bytes as well as entries.
pub const HISTORY_BYTES: u64 = 256 << 20;

/// What the history keeps: at most [`HISTORY_RETAIN`] entries and, at the mean size of
/// recent entries, about [`HISTORY_BYTES`].
#[derive(Debug)]
pub struct Retention {
    /// Mean encoded size of an entry, an exponential average of recent ones.
    mean_bytes: f64,
}

impl Default for Retention {
    fn default() -> Self {
        Self { mean_bytes: 256.0 }
    }
}

impl Retention {
    /// Counts an entry of `bytes`.
    pub fn saw(&mut self, bytes: usize) {
        self.mean_bytes += (bytes as f64 - self.mean_bytes) / 1024.0;
    }

    /// How many of the latest entries to keep.
    pub fn keep(&self) -> u64 {
        ((HISTORY_BYTES as f64 / self.mean_bytes.max(1.0)) as u64).clamp(1_000, HISTORY_RETAIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 57: the history keeps 200,000 small entries but far fewer large ones, so
    /// batch commands do not make it grow to gigabytes.
    #[test]
    fn the_history_keeps_fewer_entries_when_they_are_large() {
        let mut r = Retention::default();
        for _ in 0..10_000 {
            r.saw(300);
        }
        assert_eq!(r.keep(), HISTORY_RETAIN);
        for _ in 0..10_000 {
            r.saw(100_000);
        }
        let keep = r.keep();
        assert!((2_000..3_000).contains(&keep), "{keep}");
    }
}

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
