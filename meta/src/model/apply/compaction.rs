//! Compaction's log side (D-20): a compactor rewrites runs of streams' small ranges
//! (in multi-stream upload objects) into larger objects, and these entries swap them in
//! the index by compare-and-set, so a stale or overlapping compaction, or one racing a
//! trim or a takeover's commits, changes nothing.
//!
//! `CompactObjects` swaps one stream's run for per-stream objects (the first form, kept
//! so logs written with it replay). `CompactStreams` carries a whole batch of a pass:
//! many streams' swaps and objects that may hold ranges of several streams, so a pass
//! costs one entry and a few objects per batch rather than one of each per stream.

use super::{reject, Txn};
use crate::model::command::{
    Applied, CompactedObject, NewObject, Outcome, Proposer, RejectCode, Rejection, ReplacedRange, StreamSwap,
};
use crate::model::index::IndexChange;
use crate::model::rows::*;
use crate::model::state::RowKey;
use std::collections::{BTreeMap, BTreeSet};
use weir_shared::ids::{ObjectKey, StreamId};

/// Most ranges one compaction replaces (bounds the entry's size).
pub const MAX_REPLACED: usize = 10_000;

/// Object rows as a compaction leaves them: the index's, with the swaps applied so far.
struct ObjectEdits {
    /// Replaced objects: their rows as read, minus the streams swapped out of them.
    released: BTreeMap<ObjectKey, Option<ObjectRow>>,
    /// New objects, by key: size, and the streams whose swap applied.
    written: BTreeMap<ObjectKey, (u64, BTreeSet<StreamId>)>,
}

impl ObjectEdits {
    fn new(objects: &[NewObject]) -> Self {
        Self {
            released: BTreeMap::new(),
            written: objects
                .iter()
                .map(|o| (o.key.clone(), (o.size, BTreeSet::new())))
                .collect(),
        }
    }
}

impl Txn<'_> {
    pub(super) fn compact_objects(
        &mut self,
        proposer: &Proposer,
        id: StreamId,
        replaced: &[ReplacedRange],
        objects: &[CompactedObject],
    ) -> Outcome {
        self.node_proposer(proposer)?;
        let new: Vec<NewObject> = objects
            .iter()
            .map(|o| NewObject {
                key: o.range.key.clone(),
                size: o.size,
            })
            .collect();
        let swap = StreamSwap {
            stream: id,
            replaced: replaced.to_vec(),
            ranges: objects.iter().map(|o| o.range.clone()).collect(),
        };
        let swaps = std::slice::from_ref(&swap);
        check_command(&new, swaps)?;
        self.check_not_committed(&new)?;
        let mut edits = ObjectEdits::new(&new);
        self.swap(&swap, &mut edits)?;
        self.finish(edits);
        Ok(Applied::Done)
    }

    pub(super) fn compact_streams(
        &mut self,
        proposer: &Proposer,
        objects: &[NewObject],
        swaps: &[StreamSwap],
    ) -> Outcome {
        self.node_proposer(proposer)?;
        check_command(objects, swaps)?;
        self.check_not_committed(objects)?;
        let mut edits = ObjectEdits::new(objects);
        let mut skipped = Vec::new();
        let mut first_refusal = None;
        for swap in swaps {
            // Each swap validates before it changes anything, so a skipped one changed nothing.
            if let Err(r) = self.swap(swap, &mut edits) {
                skipped.push(swap.stream);
                first_refusal.get_or_insert(r);
            }
        }
        if skipped.len() == swaps.len() {
            let r = first_refusal.expect("at least one swap");
            return Err(reject(
                r.code,
                format!("no stream of the compaction applied; the first: {}", r.message),
            ));
        }
        self.finish(edits);
        Ok(Applied::Compacted { skipped })
    }

    /// A retry of a compaction that applied finds its objects committed.
    fn check_not_committed(&self, objects: &[NewObject]) -> Result<(), Rejection> {
        for o in objects {
            if self.objects.object(&o.key).is_some() {
                return Err(reject(
                    RejectCode::AlreadyExists,
                    format!("object '{}' is already committed", o.key),
                ));
            }
        }
        Ok(())
    }

    /// Applies one stream's swap if every replaced range is in the index exactly as
    /// read; otherwise changes nothing and says why.
    fn swap(&mut self, swap: &StreamSwap, edits: &mut ObjectEdits) -> Result<(), Rejection> {
        let id = swap.stream;
        let row = self.stream(id)?;
        if row.state == StreamState::Deleted {
            return Err(reject(
                RejectCode::NotFound,
                format!("stream '{}' is deleted", row.name),
            ));
        }
        let name = row.name.clone();
        let start_offset = row.start_offset;
        let mut current = Vec::with_capacity(swap.replaced.len());
        for r in &swap.replaced {
            let found = self
                .objects
                .ranges_from(id, r.start, 1)
                .into_iter()
                .next()
                .filter(|found| found.start == r.start && found.end == r.end && found.key == r.key);
            let Some(found) = found else {
                return Err(reject(
                    RejectCode::Conflict,
                    format!(
                        "stream '{name}' range {}..{} in '{}' is no longer in the index; the compaction is stale",
                        r.start, r.end, r.key
                    ),
                ));
            };
            current.push(found);
        }
        let mut removed = 0u64;
        for r in current {
            removed += r.len;
            self.index_changes.push(IndexChange::DeleteRange {
                stream: id,
                start: r.start,
            });
            let objects = self.objects;
            let row = edits
                .released
                .entry(r.key.clone())
                .or_insert_with(|| objects.object(&r.key));
            if let Some(row) = row {
                row.streams.retain(|s| *s != id);
            }
        }
        // Pieces wholly below a start a trim set meanwhile are not indexed: GC takes them.
        let mut added = 0u64;
        for range in swap.ranges.iter().filter(|r| r.end > start_offset) {
            added += range.len;
            self.index_changes.push(IndexChange::PutRange {
                stream: id,
                range: range.clone(),
            });
            edits
                .written
                .get_mut(&range.key)
                .expect("checked: every range is in a new object")
                .1
                .insert(id);
        }
        self.state
            .streams
            .update(&id, |row| row.bytes = row.bytes.saturating_sub(removed) + added)
            .expect("checked above");
        self.touch(RowKey::Stream(id));
        Ok(())
    }

    /// Writes the object rows the swaps left: a replaced object no stream names leaves
    /// the index; a new object is indexed with the streams that reference it, if any.
    fn finish(&mut self, edits: ObjectEdits) {
        for (key, row) in edits.released {
            let Some(row) = row else { continue };
            self.index_changes.push(if row.streams.is_empty() {
                IndexChange::DeleteObject(key)
            } else {
                IndexChange::PutObject(row)
            });
        }
        for (key, (size, streams)) in edits.written {
            if !streams.is_empty() {
                self.index_changes.push(IndexChange::PutObject(ObjectRow {
                    key,
                    size,
                    committed_index: self.index,
                    streams: streams.into_iter().collect(),
                }));
            }
        }
    }
}

/// The command's shape, whatever the index holds: objects named once and each used; a
/// stream in at most one swap; no new object among the replaced ones; at most
/// [`MAX_REPLACED`] ranges replaced; and each swap well formed.
fn check_command(objects: &[NewObject], swaps: &[StreamSwap]) -> Result<(), Rejection> {
    let invalid = |m: String| Err(reject(RejectCode::InvalidArgument, m));
    if swaps.is_empty() {
        return invalid("a compaction swaps at least one stream's ranges".into());
    }
    if objects.is_empty() {
        return invalid("a compaction writes at least one object".into());
    }
    let replaced: usize = swaps.iter().map(|s| s.replaced.len()).sum();
    if replaced > MAX_REPLACED {
        return invalid(format!(
            "a compaction replaces at most {MAX_REPLACED} ranges, got {replaced}"
        ));
    }
    let mut sizes = BTreeMap::new();
    for o in objects {
        if sizes.insert(&o.key, o.size).is_some() {
            return invalid(format!("object '{}' appears twice in the compaction", o.key));
        }
    }
    let replaced_keys: BTreeSet<&ObjectKey> = swaps.iter().flat_map(|s| &s.replaced).map(|r| &r.key).collect();
    if let Some(key) = sizes.keys().find(|k| replaced_keys.contains(*k)) {
        return invalid(format!("object '{key}' is both replaced and written by the compaction"));
    }
    let mut streams = BTreeSet::new();
    let mut used = BTreeSet::new();
    for swap in swaps {
        if !streams.insert(swap.stream) {
            return invalid(format!("stream {} has two swaps in one compaction", swap.stream));
        }
        check_swap(swap, &sizes)?;
        used.extend(swap.ranges.iter().map(|r| &r.key));
    }
    if let Some(key) = sizes.keys().find(|k| !used.contains(*k)) {
        return invalid(format!("object '{key}' holds no range of the compaction"));
    }
    Ok(())
}

/// The replaced ranges are one contiguous run, and the new ranges cover exactly its
/// offsets, each inside its object, one per object (a stream has at most one range in
/// any object).
fn check_swap(swap: &StreamSwap, sizes: &BTreeMap<&ObjectKey, u64>) -> Result<(), Rejection> {
    let invalid = |m: String| Err(reject(RejectCode::InvalidArgument, m));
    let id = swap.stream;
    let (Some(first), Some(last)) = (swap.replaced.first(), swap.replaced.last()) else {
        return invalid(format!("the swap of stream {id} replaces no range"));
    };
    let mut at = first.start;
    for r in &swap.replaced {
        if r.start != at || r.end <= r.start {
            return invalid(format!("the replaced ranges of stream {id} are not one contiguous run"));
        }
        at = r.end;
    }
    let uncovered = || {
        invalid(format!(
            "the new ranges of stream {id} do not cover {}..{} exactly",
            first.start, last.end
        ))
    };
    let mut keys = BTreeSet::new();
    let mut at = first.start;
    for r in &swap.ranges {
        if r.start != at || r.end <= r.start {
            return uncovered();
        }
        let Some(&size) = sizes.get(&r.key) else {
            return invalid(format!(
                "a new range of stream {id} is in '{}', which the compaction does not write",
                r.key
            ));
        };
        if r.pos.checked_add(r.len).is_none_or(|end| end > size) {
            return invalid(format!("a new range of stream {id} lies outside its object"));
        }
        if !r.txns.fits(r.start.0, r.end.0) {
            return invalid(format!(
                "the transaction summary of a new range of stream {id} lies outside the range"
            ));
        }
        if !keys.insert(&r.key) {
            return invalid(format!("stream {id} has two ranges in object '{}'", r.key));
        }
        at = r.end;
    }
    if at != last.end {
        return uncovered();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_log::{node, op, Log};
    use crate::model::command::{Applied, CompactedObject, NewObject, RejectCode, ReplacedRange, StreamSwap};
    use crate::model::index::IndexRead;
    use crate::model::rows::*;
    use crate::model::Command;
    use weir_shared::ids::{Epoch, Incarnation, NodeId, ObjectKey, Offset, StreamId};

    fn replaced(log: &Log, stream: u64) -> Vec<ReplacedRange> {
        log.meta
            .index
            .ranges_from(StreamId(stream), Offset(0), usize::MAX)
            .iter()
            .map(ReplacedRange::from)
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
                txns: Default::default(),
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

    /// A swap of all of `stream`'s ranges for one range at `pos` in `key`.
    fn swap_all(log: &Log, stream: u64, key: &str, pos: u64, len: u64) -> StreamSwap {
        let run = replaced(log, stream);
        let mut range = piece(key, run[0].start.0, run[run.len() - 1].end.0, len).range;
        range.pos = pos;
        StreamSwap {
            stream: StreamId(stream),
            replaced: run,
            ranges: vec![range],
        }
    }

    fn compact_streams(objects: &[(&str, u64)], swaps: Vec<StreamSwap>) -> Command {
        Command::CompactStreams {
            objects: objects
                .iter()
                .map(|&(key, size)| NewObject {
                    key: ObjectKey(key.into()),
                    size,
                })
                .collect(),
            swaps,
        }
    }

    // Issue 16, D-20: one entry swaps many streams' runs for ranges in one shared object.
    #[test]
    fn one_compaction_swaps_many_streams_into_a_shared_object() {
        let mut log = three_uploads();
        let swaps = vec![
            swap_all(&log, 0, "data/s/1", 8, 300),
            swap_all(&log, 1, "data/s/1", 308, 30),
        ];
        assert_eq!(
            log.apply(node(), compact_streams(&[("data/s/1", 400)], swaps)),
            Ok(Applied::Compacted { skipped: vec![] })
        );
        for (stream, pos, bytes) in [(0, 8, 300), (1, 308, 30)] {
            let ranges = log.meta.index.ranges_from(StreamId(stream), Offset(0), 10);
            assert_eq!(ranges.len(), 1);
            assert_eq!((ranges[0].key.0.as_str(), ranges[0].pos), ("data/s/1", pos));
            assert_eq!(log.row(stream).bytes, bytes);
        }
        let shared = log.meta.index.object(&ObjectKey("data/s/1".into())).expect("committed");
        assert_eq!((shared.streams, shared.size), (vec![StreamId(0), StreamId(1)], 400));
        // Both streams left the upload objects, so they leave the index.
        for key in ["data/1", "data/2", "data/3"] {
            assert_eq!(log.meta.index.object(&ObjectKey(key.into())), None, "{key}");
        }
    }

    // Issue 16, D-20: each swap is its own compare-and-set: a stale one is skipped and
    // changes nothing; the others apply; a compaction none of whose swaps apply is
    // refused whole; a retry of one that applied finds its objects committed.
    #[test]
    fn a_stale_swap_is_skipped_and_the_rest_apply() {
        let mut log = three_uploads();
        let mut stale = swap_all(&log, 0, "data/s/1", 8, 300);
        stale.replaced[1].key = ObjectKey("data/elsewhere".into());
        let fresh = swap_all(&log, 1, "data/s/1", 308, 30);
        let stream0_before = log.meta.index.ranges_from(StreamId(0), Offset(0), 10);
        let command = compact_streams(&[("data/s/1", 400)], vec![stale.clone(), fresh]);
        assert_eq!(
            log.apply(node(), command.clone()),
            Ok(Applied::Compacted {
                skipped: vec![StreamId(0)]
            })
        );
        assert_eq!(log.meta.index.ranges_from(StreamId(0), Offset(0), 10), stream0_before);
        assert_eq!(log.row(0).bytes, 300);
        let shared = log.meta.index.object(&ObjectKey("data/s/1".into())).expect("committed");
        assert_eq!(shared.streams, vec![StreamId(1)]);
        // The upload objects still hold stream 0 only.
        let upload = log
            .meta
            .index
            .object(&ObjectKey("data/2".into()))
            .expect("held by stream 0");
        assert_eq!(upload.streams, vec![StreamId(0)]);
        assert_eq!(log.apply(node(), command), Err(RejectCode::AlreadyExists));

        let before = log.meta.clone();
        let all_stale = compact_streams(
            &[("data/s/2", 400)],
            vec![StreamSwap {
                ranges: vec![piece("data/s/2", 0, 30, 300).range],
                ..stale
            }],
        );
        assert_eq!(log.apply(node(), all_stale), Err(RejectCode::Conflict));
        assert_eq!(log.meta.index, before.index);
        assert_eq!(log.meta.state.streams, before.state.streams);
    }

    #[test]
    fn a_malformed_compaction_is_refused_whole() {
        let log = three_uploads();
        let both = |log: &Log| {
            vec![
                swap_all(log, 0, "data/s/1", 8, 300),
                swap_all(log, 1, "data/s/1", 308, 30),
            ]
        };
        let cases: Vec<(&str, Command)> = vec![
            ("no swaps", compact_streams(&[("data/s/1", 400)], vec![])),
            ("a stream twice", {
                let mut swaps = both(&log);
                swaps[1] = swaps[0].clone();
                compact_streams(&[("data/s/1", 400)], swaps)
            }),
            (
                "an object no range uses",
                compact_streams(&[("data/s/1", 400), ("data/s/9", 10)], both(&log)),
            ),
            (
                "a range in an object not written",
                compact_streams(&[("data/s/9", 400)], both(&log)),
            ),
            (
                "a range past its object's end",
                compact_streams(&[("data/s/1", 330)], both(&log)),
            ),
            ("a replaced object written again", {
                let mut swaps = both(&log);
                swaps[1].ranges[0].key = ObjectKey("data/1".into());
                compact_streams(&[("data/s/1", 400), ("data/1", 400)], swaps)
            }),
            ("a gap in the replaced run", {
                let mut swaps = both(&log);
                assert!(swaps[0].replaced.len() >= 3, "a run of three uploads");
                swaps[0].replaced.remove(1);
                compact_streams(&[("data/s/1", 400)], swaps)
            }),
            ("an empty replaced range", {
                let mut swaps = both(&log);
                swaps[0].replaced[0].end = swaps[0].replaced[0].start;
                compact_streams(&[("data/s/1", 400)], swaps)
            }),
            ("a new range starting past the run", {
                let mut swaps = both(&log);
                swaps[0].ranges[0].start = Offset(swaps[0].ranges[0].start.0 + 1);
                compact_streams(&[("data/s/1", 400)], swaps)
            }),
            ("an empty new range", {
                let mut swaps = both(&log);
                let mut empty = swaps[0].ranges[0].clone();
                empty.key = ObjectKey("data/s/2".into());
                (empty.start, empty.pos, empty.len) = (empty.end, 0, 0);
                swaps[0].ranges.push(empty);
                compact_streams(&[("data/s/1", 400), ("data/s/2", 10)], swaps)
            }),
            ("two ranges of a stream in one object", {
                let mut swaps = both(&log);
                let whole = swaps[0].ranges[0].clone();
                let mut second = whole.clone();
                swaps[0].ranges[0].end = Offset(whole.end.0 - 1);
                second.start = Offset(whole.end.0 - 1);
                swaps[0].ranges.push(second);
                compact_streams(&[("data/s/1", 400)], swaps)
            }),
        ];
        for (what, command) in cases {
            let mut log = three_uploads();
            let before = log.meta.clone();
            assert_eq!(log.apply(node(), command), Err(RejectCode::InvalidArgument), "{what}");
            assert_eq!(log.meta.index, before.index, "{what}");
        }
    }

    /// One compaction replaces at most `MAX_REPLACED` ranges, so one entry's apply stays
    /// bounded: one more is refused for that, and the bound itself is not.
    #[test]
    fn a_compaction_replaces_at_most_max_replaced_ranges() {
        let log = three_uploads();
        let objects = [NewObject {
            key: ObjectKey("data/s/1".into()),
            size: 400,
        }];
        let with = |n: usize| {
            let mut swap = swap_all(&log, 0, "data/s/1", 8, 300);
            let one = swap.replaced[0].clone();
            swap.replaced = vec![one; n];
            super::check_command(&objects, &[swap])
                .err()
                .map(|r| r.message)
                .unwrap_or_default()
        };
        assert!(
            with(super::MAX_REPLACED + 1).contains("at most"),
            "{}",
            with(super::MAX_REPLACED + 1)
        );
        assert!(
            !with(super::MAX_REPLACED).contains("at most"),
            "{}",
            with(super::MAX_REPLACED)
        );
    }
}
