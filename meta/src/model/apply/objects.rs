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

#[cfg(test)]
mod tests {
    use super::super::test_log::{op, Log};
    use crate::model::command::{Applied, Proposer, RejectCode};
    use crate::model::rows::*;
    use crate::model::Command;
    use weir_shared::ids::{Epoch, Incarnation, NodeId};

    fn register(log: &mut Log, name: &str) -> Incarnation {
        let command = Command::RegisterNode {
            node: NodeId::new(name),
            kind: NodeKind::Streamd,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        let Ok(Applied::Registered { epoch }) = log.apply(op(), command) else {
            panic!("register {name}")
        };
        Incarnation {
            node: NodeId::new(name),
            epoch,
        }
    }

    // FO-TKO, INV-8: a dead owner's records are committed only by the agent of its
    // pending takeover: not by another live node, and not once the takeover is over.
    #[test]
    fn only_the_pending_takeovers_agent_commits_for_a_dead_owner() {
        let mut log = Log::new();
        let agent = register(&mut log, "m");
        let other = register(&mut log, "k");
        log.apply(
            op(),
            Command::FenceNode {
                node: NodeId::new("n"),
                epoch: Epoch(1),
                seen_heartbeats: 0,
            },
        )
        .expect("fence n");
        let dead = Incarnation {
            node: NodeId::new("n"),
            epoch: Epoch(1),
        };
        let key = (dead.node.clone(), dead.epoch);
        log.meta.state.takeovers.insert(
            key.clone(),
            TakeoverRow {
                dead,
                agent: Some(agent.clone()),
                state: TakeoverState::Pending,
            },
        );
        let by = |who: &Incarnation| Proposer::Node(who.clone());
        assert_eq!(
            log.commit_as(by(&other), "data/k/1", &[(0, 5, 50)]),
            Err(RejectCode::NotOwner),
            "not the agent"
        );
        log.commit_as(by(&agent), "data/m/1", &[(0, 5, 50)])
            .expect("the agent commits the dead owner's records");
        assert_eq!(log.row(0).committed_end.0, 5);
        log.meta.state.takeovers.get_mut(&key).expect("row").state = TakeoverState::Recovered;
        assert_eq!(
            log.commit_as(by(&agent), "data/m/2", &[(0, 5, 50)]),
            Err(RejectCode::NotOwner),
            "the takeover is over"
        );
        assert_eq!(log.row(0).committed_end.0, 5);
    }
}
