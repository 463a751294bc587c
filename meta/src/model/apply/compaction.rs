//! Compaction's log side (D-20): a compactor rewrites a run of a stream's small
//! ranges (in multi-stream upload objects) into per-stream objects, and this entry
//! swaps them in the index by compare-and-set, so a stale or overlapping compaction,
//! or one racing a trim or a takeover's commits, changes nothing.

use super::{reject, Txn};
use crate::model::command::{Applied, CompactedObject, Outcome, Proposer, RejectCode, ReplacedRange};
use crate::model::index::IndexChange;
use crate::model::rows::*;
use crate::model::state::RowKey;
use std::collections::{BTreeMap, BTreeSet};
use weir_shared::ids::{ObjectKey, StreamId};

/// Most ranges one compaction replaces (bounds the entry's size).
pub const MAX_REPLACED: usize = 10_000;

impl Txn<'_> {
    pub(super) fn compact_objects(
        &mut self,
        proposer: &Proposer,
        id: StreamId,
        replaced: &[ReplacedRange],
        objects: &[CompactedObject],
    ) -> Outcome {
        self.node_proposer(proposer)?;
        let row = self.stream(id)?;
        if row.state == StreamState::Deleted {
            return Err(reject(
                RejectCode::NotFound,
                format!("stream '{}' is deleted", row.name),
            ));
        }
        let name = row.name.clone();
        let start_offset = row.start_offset;
        check_shape(&name, replaced, objects)?;
        // A retry of a compaction that applied finds its objects committed.
        for o in objects {
            if self.objects.object(&o.range.key).is_some() {
                return Err(reject(
                    RejectCode::AlreadyExists,
                    format!("object '{}' is already committed", o.range.key),
                ));
            }
        }

        // Compare-and-set: every replaced range is in the index exactly as read.
        for r in replaced {
            let found = self
                .objects
                .ranges_from(id, r.start, 1)
                .into_iter()
                .next()
                .filter(|found| found.start == r.start && found.end == r.end && found.key == r.key);
            if found.is_none() {
                return Err(reject(
                    RejectCode::Conflict,
                    format!(
                        "stream '{name}' range {}..{} in '{}' is no longer in the index; the compaction is stale",
                        r.start, r.end, r.key
                    ),
                ));
            }
        }
        let mut old: BTreeMap<ObjectKey, Option<ObjectRow>> = BTreeMap::new();
        let mut removed = 0u64;
        for r in replaced {
            let range = self
                .objects
                .ranges_from(id, r.start, 1)
                .into_iter()
                .next()
                .expect("checked above");
            removed += range.len;
            self.index_changes.push(IndexChange::DeleteRange {
                stream: id,
                start: r.start,
            });
            let object = self.objects.object(&r.key);
            old.entry(r.key.clone()).or_insert(object);
        }
        self.release_objects(id, old);
        // Pieces wholly below a start a trim set meanwhile are not indexed: GC takes them.
        let mut added = 0u64;
        for o in objects.iter().filter(|o| o.range.end > start_offset) {
            added += o.range.len;
            self.index_changes.push(IndexChange::PutRange {
                stream: id,
                range: o.range.clone(),
            });
            self.index_changes.push(IndexChange::PutObject(ObjectRow {
                key: o.range.key.clone(),
                size: o.size,
                committed_index: self.index,
                streams: vec![id],
            }));
        }
        let row = self.state.streams.get_mut(&id).expect("checked above");
        row.bytes = row.bytes.saturating_sub(removed) + added;
        self.touch(RowKey::Stream(id));
        Ok(Applied::Done)
    }
}

/// The replaced ranges are one contiguous run, and the new objects cover exactly its
/// offsets, each holding one range of its own key inside it.
fn check_shape(
    name: &str,
    replaced: &[ReplacedRange],
    objects: &[CompactedObject],
) -> Result<(), crate::model::Rejection> {
    let invalid = |m: String| Err(reject(RejectCode::InvalidArgument, m));
    let (Some(first), Some(last)) = (replaced.first(), replaced.last()) else {
        return invalid("a compaction replaces at least one range".into());
    };
    if replaced.len() > MAX_REPLACED {
        return invalid(format!(
            "a compaction replaces at most {MAX_REPLACED} ranges, got {}",
            replaced.len()
        ));
    }
    if objects.is_empty() {
        return invalid("a compaction writes at least one object".into());
    }
    let mut at = first.start;
    for r in replaced {
        if r.start != at || r.end <= r.start {
            return invalid(format!(
                "the replaced ranges of stream '{name}' are not one contiguous run"
            ));
        }
        at = r.end;
    }
    let mut keys = BTreeSet::new();
    let replaced_keys: BTreeSet<&ObjectKey> = replaced.iter().map(|r| &r.key).collect();
    let mut at = first.start;
    for o in objects {
        let r = &o.range;
        if r.start != at || r.end <= r.start {
            return invalid(format!(
                "the new ranges of stream '{name}' do not cover {}..{} exactly",
                first.start, last.end
            ));
        }
        if r.pos.checked_add(r.len).is_none_or(|end| end > o.size) {
            return invalid(format!("a new range of stream '{name}' lies outside its object"));
        }
        if !keys.insert(&r.key) || replaced_keys.contains(&r.key) {
            return invalid(format!("object '{}' appears twice in the compaction", r.key));
        }
        at = r.end;
    }
    if at != last.end {
        return invalid(format!(
            "the new ranges of stream '{name}' do not cover {}..{} exactly",
            first.start, last.end
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_log::{node, op, Log};
    use crate::model::command::{Applied, CompactedObject, RejectCode, ReplacedRange};
    use crate::model::index::IndexRead;
    use crate::model::rows::*;
    use crate::model::Command;
    use weir_shared::ids::{Epoch, Incarnation, NodeId, ObjectKey, Offset, StreamId};

    fn replaced(log: &Log, stream: u64) -> Vec<ReplacedRange> {
        log.meta
            .index
            .ranges_from(StreamId(stream), Offset(0), usize::MAX)
            .into_iter()
            .map(|r| ReplacedRange {
                start: r.start,
                end: r.end,
                key: r.key,
            })
            .collect()
    }

    fn piece(key: &str, start: u64, end: u64, len: u64) -> CompactedObject {
        CompactedObject {
            size: len + 100,
            range: ObjectRange {
                key: ObjectKey(key.into()),
                start: Offset(start),
                end: Offset(end),
                pos: 8,
                len,
                crc: 7,
                max_timestamp: 5,
            },
        }
    }

    fn compact(stream: u64, replaced: Vec<ReplacedRange>, objects: Vec<CompactedObject>) -> Command {
        Command::CompactObjects {
            stream: StreamId(stream),
            replaced,
            objects,
        }
    }

    /// Stream 0 in three multi-stream objects shared with stream 1.
    fn three_uploads() -> Log {
        let mut log = Log::new();
        log.commit("data/1", &[(0, 10, 100), (1, 1, 10)]);
        log.commit("data/2", &[(0, 10, 100), (1, 1, 10)]);
        log.commit("data/3", &[(0, 10, 100), (1, 1, 10)]);
        log
    }

    #[test]
    fn a_compaction_swaps_a_run_of_ranges_for_per_stream_objects() {
        let mut log = three_uploads();
        let run = replaced(&log, 0);
        let out = vec![piece("data/c/0", 0, 20, 200), piece("data/c/1", 20, 30, 100)];
        assert_eq!(log.apply(node(), compact(0, run, out)), Ok(Applied::Done));
        let ranges = log.meta.index.ranges_from(StreamId(0), Offset(0), 10);
        let keys: Vec<_> = ranges.iter().map(|r| r.key.0.as_str()).collect();
        assert_eq!(keys, ["data/c/0", "data/c/1"]);
        assert_eq!(log.row(0).bytes, 300);
        // The upload objects still hold stream 1 only; the new ones hold stream 0 only.
        let old = log
            .meta
            .index
            .object(&ObjectKey("data/2".into()))
            .expect("held by stream 1");
        assert_eq!(old.streams, vec![StreamId(1)]);
        let new = log.meta.index.object(&ObjectKey("data/c/0".into())).expect("committed");
        assert_eq!((new.streams, new.size), (vec![StreamId(0)], 300));
        // Once stream 1 is compacted too, the upload objects leave the index.
        let run = replaced(&log, 1);
        assert_eq!(
            log.apply(node(), compact(1, run, vec![piece("data/c/2", 0, 3, 30)])),
            Ok(Applied::Done)
        );
        for key in ["data/1", "data/2", "data/3"] {
            assert_eq!(log.meta.index.object(&ObjectKey(key.into())), None, "{key}");
        }
    }

    #[test]
    fn a_stale_or_overlapping_compaction_changes_nothing() {
        let mut log = three_uploads();
        let run = replaced(&log, 0);
        let first = compact(0, run[..2].to_vec(), vec![piece("data/c/a", 0, 20, 200)]);
        assert_eq!(log.apply(node(), first.clone()), Ok(Applied::Done));
        let before = log.meta.clone();
        // The same compaction again, and one overlapping it, find their ranges gone.
        assert_eq!(log.apply(node(), first), Err(RejectCode::AlreadyExists));
        let overlapping = compact(0, run[1..].to_vec(), vec![piece("data/c/b", 10, 30, 200)]);
        assert_eq!(log.apply(node(), overlapping), Err(RejectCode::Conflict));
        // A replaced range that does not match the index (another key) is stale.
        let mut wrong = run[2..].to_vec();
        wrong[0].key = ObjectKey("data/9".into());
        assert_eq!(
            log.apply(node(), compact(0, wrong, vec![piece("data/c/c", 20, 30, 100)])),
            Err(RejectCode::Conflict)
        );
        // New ranges that do not cover the replaced run exactly, or reuse a key, are refused.
        let gap = compact(0, run[2..].to_vec(), vec![piece("data/c/d", 20, 29, 100)]);
        assert_eq!(log.apply(node(), gap), Err(RejectCode::InvalidArgument));
        let reuse = compact(0, run[2..].to_vec(), vec![piece("data/3", 20, 30, 100)]);
        assert_eq!(log.apply(node(), reuse), Err(RejectCode::InvalidArgument));
        // Operators do not compact; nodes do.
        let by_operator = compact(0, run[2..].to_vec(), vec![piece("data/c/e", 20, 30, 100)]);
        assert_eq!(log.apply(op(), by_operator), Err(RejectCode::InvalidArgument));
        assert_eq!(log.meta.index, before.index);
        assert_eq!(log.meta.state.streams, before.state.streams);
    }

    #[test]
    fn a_compaction_races_commits_trims_and_a_takeover_safely() {
        let mut log = three_uploads();
        let run = replaced(&log, 0);
        // The takeover agent's commits continue the stream while the compactor works:
        // they do not touch the replaced run, so the compaction still applies.
        log.apply(
            op(),
            Command::RegisterNode {
                node: NodeId::new("agent"),
                kind: NodeKind::Streamd,
                addrs: NodeAddrs::default(),
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            },
        )
        .expect("register agent");
        let owner = log.row(0).owner.clone().expect("owner");
        let seen = log.meta.state.nodes[&owner.node].heartbeats;
        log.apply(
            op(),
            Command::FenceNode {
                node: owner.node.clone(),
                epoch: owner.epoch,
                seen_heartbeats: seen,
            },
        )
        .expect("fence the owner");
        let agent = crate::model::Proposer::Node(Incarnation {
            node: NodeId::new("agent"),
            epoch: Epoch(1),
        });
        log.apply(
            agent.clone(),
            Command::BeginTakeover {
                node: owner.node.clone(),
                epoch: owner.epoch,
                agent: NodeId::new("agent"),
            },
        )
        .expect("begin takeover");
        // The fenced owner's compaction is refused; the agent's (any live node's) applies.
        let out = || vec![piece("data/c/0", 0, 30, 300)];
        assert_eq!(
            log.apply(node(), compact(0, run.clone(), out())),
            Err(RejectCode::Fenced)
        );
        assert_eq!(log.apply(agent, compact(0, run.clone(), out())), Ok(Applied::Done));
        assert_eq!(log.meta.index.ranges_from(StreamId(0), Offset(0), 10).len(), 1);

        // A trim that lands between the read and the commit: pieces wholly below the new
        // start are not indexed, and the stream's bytes count only what is.
        let mut log = three_uploads();
        let run = replaced(&log, 0);
        log.apply(
            op(),
            Command::TrimStream {
                stream: StreamId(0),
                start: Offset(5),
            },
        )
        .expect("trim");
        let out = vec![piece("data/c/0", 0, 4, 40), piece("data/c/1", 4, 30, 260)];
        assert_eq!(log.apply(node(), compact(0, run, out)), Ok(Applied::Done));
        let ranges = log.meta.index.ranges_from(StreamId(0), Offset(0), 10);
        assert_eq!(ranges.len(), 1);
        assert_eq!(ranges[0].key, ObjectKey("data/c/1".into()));
        assert_eq!(log.meta.index.object(&ObjectKey("data/c/0".into())), None);
        assert_eq!(log.row(0).bytes, 260);
    }
}
