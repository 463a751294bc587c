//! The whole metadata in memory: the view's state and the object index together, as a
//! replica holds them. metad keeps the index in RocksDB instead; tests, property tests
//! and the format migration use this.

use super::apply::Effects;
use super::command::{Outcome, Proposal};
use super::index::MemIndex;
use super::state::{Change, State};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    pub state: State,
    pub index: MemIndex,
}

impl Metadata {
    /// Applies one proposal at `index` to both halves; its outcome and view changes.
    pub fn apply(&mut self, index: u64, proposal: &Proposal) -> (Outcome, Vec<Change>) {
        let Effects {
            outcome,
            changes,
            index: writes,
        } = self.state.apply(index, proposal, &self.index);
        self.index.apply(&writes);
        (outcome, changes)
    }
}
