//! Data objects: CommitObjects makes an uploaded object's ranges visible (RR-WAL-4),
//! advancing each stream's committed end in the view and writing the ranges and the
//! object to the object index.

use super::{reject, Txn};
use crate::model::command::{Applied, CommitRange, Outcome, Proposer, RejectCode};
use crate::model::index::IndexChange;
use crate::model::rows::*;
use crate::model::state::RowKey;
use weir_shared::ids::{ObjectKey, StreamId};

impl Txn<'_> {
    /// RR-WAL-4: objects become visible only here, from the owner (or its takeover agent)
    /// at the stream's current epoch, each range continuing the committed end.
    pub(super) fn commit_objects(
        &mut self,
        proposer: &Proposer,
        key: &ObjectKey,
        size: u64,
        ranges: &[CommitRange],
    ) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        if ranges.is_empty() {
            return Err(reject(RejectCode::InvalidArgument, "a commit needs at least one range"));
        }
        if self.objects.object(key).is_some() {
            return Err(reject(
                RejectCode::AlreadyExists,
                format!("object '{key}' is already committed"),
            ));
        }
        // One range per stream per object: trims and compactions release an object from a
        // stream when they drop that stream's range in it.
        let mut seen = std::collections::BTreeSet::new();
        if !ranges.iter().all(|r| seen.insert(r.stream)) {
            return Err(reject(
                RejectCode::InvalidArgument,
                "a commit holds at most one range per stream",
            ));
        }
        let mut updated: std::collections::BTreeMap<StreamId, StreamRow> = Default::default();
        let mut ranges_out = Vec::with_capacity(ranges.len());
        for range in ranges {
            let mut row = match updated.get(&range.stream) {
                Some(r) => r.clone(),
                None => self.stream(range.stream)?.clone(),
            };
            if row.state != StreamState::Open {
                return Err(reject(
                    RejectCode::NotOwner,
                    format!("stream '{}' is not open", row.name),
                ));
            }
            let owner = row.owner.clone().expect("an open stream has an owner");
            let agent_of_owner = self
                .state
                .takeovers
                .get(&(owner.node.clone(), owner.epoch))
                .is_some_and(|t| t.state == TakeoverState::Pending && t.agent.as_ref() == Some(&who));
            if owner != who && !agent_of_owner {
                return Err(reject(
                    RejectCode::NotOwner,
                    format!("stream '{}' is owned by {owner}, not {who}", row.name),
                ));
            }
            if row.epoch != range.stream_epoch {
                return Err(reject(
                    RejectCode::NotOwner,
                    format!(
                        "stream '{}' is at epoch {}, not {}",
                        row.name, row.epoch, range.stream_epoch
                    ),
                ));
            }
            if range.start != row.committed_end || range.end <= range.start {
                return Err(reject(
                    RejectCode::Conflict,
                    format!(
                        "stream '{}' range {}..{} does not continue its committed end {}",
                        row.name, range.start, range.end, row.committed_end
                    ),
                ));
            }
            if range.pos.checked_add(range.len).is_none_or(|end| end > size) {
                return Err(reject(
                    RejectCode::InvalidArgument,
                    format!("range of stream '{}' lies outside the object", row.name),
                ));
            }
            if !range.txns.fits(range.start.0, range.end.0) {
                return Err(reject(
                    RejectCode::InvalidArgument,
                    format!(
                        "the transaction summary of stream '{}' lies outside its range",
                        row.name
                    ),
                ));
            }
            row.committed_end = range.end;
            row.commits += 1;
            row.bytes += range.len;
            ranges_out.push(IndexChange::PutRange {
                stream: range.stream,
                range: ObjectRange {
                    key: key.clone(),
                    start: range.start,
                    end: range.end,
                    pos: range.pos,
                    len: range.len,
                    crc: range.crc,
                    max_timestamp: range.max_timestamp,
                    txns: range.txns.clone(),
                },
            });
            updated.insert(range.stream, row);
        }
        let streams: Vec<StreamId> = updated.keys().copied().collect();
        for (id, row) in updated {
            self.state.streams.insert(row);
            self.touch(RowKey::Stream(id));
        }
        self.index_changes.extend(ranges_out);
        self.index_changes.push(IndexChange::PutObject(ObjectRow {
            key: key.clone(),
            size,
            committed_index: self.index,
            streams,
        }));
        Ok(Applied::Done)
    }
}
