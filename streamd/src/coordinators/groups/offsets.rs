//! Committed offsets as records of the offsets stream, and the table rebuilt from them.
//!
//! Each commit is a record keyed `{"group","topic","partition"}` with value
//! `{"offset","leader_epoch","metadata"}`; a deleted group is a record keyed
//! `{"group"}` with a null value. Replaying the stream in order rebuilds the table, so
//! commits survive a move or failover of the stream with it (like Kafka's
//! `__consumer_offsets`).
//!
//! A transaction's offsets (TxnOffsetCommit, issue 23) are the same records in a
//! transactional batch of the producer: pending until the transaction's marker in this
//! stream commits them (they then apply, in order) or aborts them (dropped).

use bytes::Bytes;
use kafka_protocol::records::Record;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most bytes an offsets-stream batch inflates to on replay. The coordinator writes them
/// uncompressed and appends are checked against `--max-decompressed-bytes` (default
/// 64 MiB) anyway; this only keeps replay bounded on its own.
const OFFSETS_BATCH_INFLATED_BYTES: usize = 64 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Key {
    group: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    partition: Option<i32>,
}

/// One change to the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Commit {
        group: String,
        topic: String,
        partition: i32,
        committed: Committed,
    },
    DeleteGroup {
        group: String,
    },
    /// OffsetDelete (KIP-496): one partition's committed offset removed, stored as
    /// Kafka stores it, a tombstone (the partition's key, no value).
    DeleteOffset {
        group: String,
        topic: String,
        partition: i32,
    },
}

/// Every group's committed offsets, by topic and partition.
#[derive(Debug, Default)]
pub struct OffsetTable {
    groups: BTreeMap<String, BTreeMap<(String, i32), Committed>>,
    /// Offsets of open transactions, by producer id: each with its record's offset.
    pending: BTreeMap<i64, Vec<(u64, Change)>>,
    /// Changes applied since this table was loaded or last snapshotted.
    changes: u64,
}

impl OffsetTable {
    /// Changes applied since [`OffsetTable::snapshotted`] (or the load).
    pub fn changes_since_snapshot(&self) -> u64 {
        self.changes
    }

    /// How many committed offsets the table holds (what a snapshot writes).
    pub fn entries(&self) -> u64 {
        self.groups.values().map(|g| g.len() as u64).sum()
    }

    /// The whole table as commits, which replayed on their own rebuild it exactly.
    pub fn snapshot(&self) -> Vec<Change> {
        self.groups
            .iter()
            .flat_map(|(group, offsets)| {
                offsets
                    .iter()
                    .map(move |((topic, partition), committed)| Change::Commit {
                        group: group.clone(),
                        topic: topic.clone(),
                        partition: *partition,
                        committed: committed.clone(),
                    })
            })
            .collect()
    }

    /// A snapshot of the table was stored: count changes from here.
    pub fn snapshotted(&mut self) {
        self.changes = 0;
    }

    pub fn apply(&mut self, change: Change) {
        self.changes += 1;
        self.apply_uncounted(change);
    }

    /// [`OffsetTable::apply`] for a change counted when it was stored (pending).
    fn apply_uncounted(&mut self, change: Change) {
        match change {
            Change::Commit {
                group,
                topic,
                partition,
                committed,
            } => {
                self.groups
                    .entry(group)
                    .or_default()
                    .insert((topic, partition), committed);
            }
            Change::DeleteGroup { group } => {
                self.groups.remove(&group);
            }
            Change::DeleteOffset {
                group,
                topic,
                partition,
            } => {
                if let Some(offsets) = self.groups.get_mut(&group) {
                    offsets.remove(&(topic, partition));
                    if offsets.is_empty() {
                        self.groups.remove(&group);
                    }
                }
            }
        }
    }

    /// Holds `changes`, stored from `offset` in a transactional batch of `producer_id`,
    /// until its transaction ends.
    pub fn add_pending(&mut self, producer_id: i64, offset: u64, changes: Vec<Change>) {
        // Stored records either way: they count towards the next snapshot when
        // written, whether their transaction commits or aborts.
        self.changes += changes.len() as u64;
        let held = self.pending.entry(producer_id).or_default();
        held.extend(changes.into_iter().enumerate().map(|(i, c)| (offset + i as u64, c)));
    }

    /// A marker at `marker_offset` ended `producer_id`'s transaction: its offsets stored
    /// before the marker apply (`commit`) or are dropped. A marker seen twice (a load
    /// that replayed it, then the marker's own notice) finds nothing left to end.
    pub fn end_txn(&mut self, producer_id: i64, commit: bool, marker_offset: u64) {
        let Some(held) = self.pending.get_mut(&producer_id) else {
            return;
        };
        let later = held.split_off(held.partition_point(|(at, _)| *at < marker_offset));
        let ended = std::mem::replace(held, later);
        if held.is_empty() {
            self.pending.remove(&producer_id);
        }
        if commit {
            ended.into_iter().for_each(|(_, c)| self.apply_uncounted(c));
        }
    }

    /// The offset of the oldest pending record: the stream is trimmed no further, so
    /// a load still finds it.
    pub fn first_pending_offset(&self) -> Option<u64> {
        self.pending
            .values()
            .filter_map(|held| held.first())
            .map(|(at, _)| *at)
            .min()
    }

    /// Whether an open transaction holds an offset for this partition of `group`
    /// (OffsetFetch then answers UNSTABLE_OFFSET_COMMIT to a client asking for stable
    /// offsets).
    pub fn is_pending(&self, group: &str, topic: &str, partition: i32) -> bool {
        self.pending.values().flatten().any(|(_, c)| {
            matches!(c, Change::Commit { group: g, topic: t, partition: p, .. }
                if g == group && t == topic && *p == partition)
        })
    }

    pub fn group(&self, group: &str) -> Option<&BTreeMap<(String, i32), Committed>> {
        self.groups.get(group)
    }

    pub fn groups(&self) -> impl Iterator<Item = &String> {
        self.groups.keys()
    }

    /// Replays stored batches; records that are not offset records, and batches that
    /// do not decode, are skipped (one bad batch must not make every group on the
    /// stream unavailable).
    pub fn replay(&mut self, batches: Bytes) -> Result<(), String> {
        crate::keyed_records::replay(batches, OFFSETS_BATCH_INFLATED_BYTES, "offsets", |r| {
            let offset = u64::try_from(r.offset).unwrap_or(0);
            if let Some(m) = crate::partition::marker::from_record(r) {
                self.end_txn(m.producer_id, m.commit, offset);
            } else if let Some(change) = decode(r) {
                if r.transactional {
                    self.add_pending(r.producer_id, offset, vec![change]);
                } else {
                    self.apply(change);
                }
            }
        })
    }
}

fn decode(r: &Record) -> Option<Change> {
    let key: Key = serde_json::from_slice(r.key.as_deref()?).ok()?;
    match (key.topic, key.partition, r.value.as_deref()) {
        (Some(topic), Some(partition), Some(value)) => Some(Change::Commit {
            group: key.group,
            topic,
            partition,
            committed: serde_json::from_slice(value).ok()?,
        }),
        (None, None, None) => Some(Change::DeleteGroup { group: key.group }),
        (Some(topic), Some(partition), None) => Some(Change::DeleteOffset {
            group: key.group,
            topic,
            partition,
        }),
        _ => None,
    }
}

/// Encodes changes as one batch for the offsets stream.
pub fn encode(changes: &[Change]) -> Result<Bytes, String> {
    encode_as(changes, None)
}

/// [`encode`], as a transactional batch of `producer` (id, epoch) when given.
pub fn encode_as(changes: &[Change], producer: Option<(i64, i16)>) -> Result<Bytes, String> {
    let records = changes.iter().map(|c| {
        let (key, value) = match c {
            Change::Commit {
                group,
                topic,
                partition,
                committed,
            } => (
                Key {
                    group: group.clone(),
                    topic: Some(topic.clone()),
                    partition: Some(*partition),
                },
                Some(serde_json::to_vec(committed).unwrap_or_default()),
            ),
            Change::DeleteGroup { group } => (
                Key {
                    group: group.clone(),
                    topic: None,
                    partition: None,
                },
                None,
            ),
            Change::DeleteOffset {
                group,
                topic,
                partition,
            } => (
                Key {
                    group: group.clone(),
                    topic: Some(topic.clone()),
                    partition: Some(*partition),
                },
                None,
            ),
        };
        (serde_json::to_vec(&key).unwrap_or_default(), value)
    });
    crate::keyed_records::encode_as(records, producer, "offset commits")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn commit(group: &str, p: i32, offset: i64) -> Change {
        Change::Commit {
            group: group.into(),
            topic: "t".into(),
            partition: p,
            committed: Committed {
                offset,
                leader_epoch: -1,
                metadata: Some("m".into()),
            },
        }
    }

    #[test]
    fn a_snapshot_replayed_alone_rebuilds_the_table() {
        let mut table = OffsetTable::default();
        for i in 0..50 {
            table.apply(commit(&format!("g{}", i % 3), i % 4, i as i64));
        }
        table.apply(Change::DeleteGroup { group: "g2".into() });
        assert_eq!(table.changes_since_snapshot(), 51);
        let snapshot = table.snapshot();
        assert_eq!(snapshot.len() as u64, table.entries());
        let mut stored = BytesMut::new();
        for chunk in snapshot.chunks(7) {
            stored.extend_from_slice(&encode(chunk).expect("encode"));
        }
        let mut rebuilt = OffsetTable::default();
        rebuilt.replay(stored.freeze()).expect("replay");
        assert_eq!(rebuilt.groups, table.groups);
        table.snapshotted();
        assert_eq!(table.changes_since_snapshot(), 0);
    }

    /// Issue 23: a transaction's offsets apply at its commit marker, vanish at its
    /// abort marker, and hold back trimming while pending.
    #[test]
    fn transactional_offsets_wait_for_their_marker() {
        use crate::partition::marker::{self, Marker};
        let with_base = |batch: Bytes, base: i64| {
            let mut b = batch.to_vec();
            b[..8].copy_from_slice(&base.to_be_bytes());
            Bytes::from(b)
        };
        let m = |pid, commit| Marker {
            producer_id: pid,
            epoch: 0,
            commit,
            coordinator_epoch: 0,
        };
        let mut stored = BytesMut::new();
        stored.extend_from_slice(&with_base(encode(&[commit("g", 0, 1)]).expect("encode"), 0));
        stored.extend_from_slice(&with_base(
            encode_as(&[commit("g", 0, 5)], Some((7, 0))).expect("encode"),
            1,
        ));
        stored.extend_from_slice(&with_base(
            encode_as(&[commit("g", 1, 9)], Some((8, 0))).expect("encode"),
            2,
        ));
        let mut table = OffsetTable::default();
        table.replay(stored.clone().freeze()).expect("replay");
        let at = |t: &OffsetTable, p: i32| {
            t.group("g")
                .and_then(|g| g.get(&("t".to_string(), p)))
                .map(|c| c.offset)
        };
        assert_eq!(at(&table, 0), Some(1), "pending offsets do not apply");
        assert!(table.is_pending("g", "t", 0) && table.is_pending("g", "t", 1));
        assert_eq!(table.first_pending_offset(), Some(1));
        stored.extend_from_slice(&with_base(marker::encode(&m(7, true), 0).expect("marker"), 3));
        stored.extend_from_slice(&with_base(marker::encode(&m(8, false), 0).expect("marker"), 4));
        let mut table = OffsetTable::default();
        table.replay(stored.freeze()).expect("replay");
        assert_eq!(at(&table, 0), Some(5), "the commit marker applies its offsets");
        assert_eq!(at(&table, 1), None, "the abort marker drops them");
        assert_eq!(table.first_pending_offset(), None);
        // The same marker again (a load, then its notice) changes nothing, and a later
        // transaction of the producer is not ended by an earlier marker.
        table.add_pending(7, 10, vec![commit("g", 0, 12)]);
        table.end_txn(7, true, 3);
        assert_eq!(at(&table, 0), Some(5));
        table.end_txn(7, true, 11);
        assert_eq!(at(&table, 0), Some(12));
    }

    #[test]
    fn replay_rebuilds_commits_and_deletions_in_order() {
        let mut stored = BytesMut::new();
        stored.extend_from_slice(&encode(&[commit("a", 0, 5), commit("b", 1, 7)]).expect("encode"));
        stored.extend_from_slice(&encode(&[commit("a", 0, 9)]).expect("encode"));
        stored.extend_from_slice(&encode(&[Change::DeleteGroup { group: "b".into() }]).expect("encode"));
        let mut table = OffsetTable::default();
        table.replay(stored.freeze()).expect("replay");
        let a = table.group("a").expect("group a");
        assert_eq!(a.get(&("t".to_string(), 0)).map(|c| c.offset), Some(9));
        assert!(table.group("b").is_none());
        assert_eq!(table.groups().count(), 1);
    }

    // Issue 59 (OffsetDelete): a partition's tombstone removes only that partition's
    // offset, survives a replay, and a group whose last offset goes is gone.
    #[test]
    fn an_offset_tombstone_removes_one_partition_and_replays() {
        let mut stored = BytesMut::new();
        stored.extend_from_slice(&encode(&[commit("a", 0, 5), commit("a", 1, 6), commit("b", 0, 7)]).expect("encode"));
        let gone = |group: &str, partition| Change::DeleteOffset {
            group: group.into(),
            topic: "t".into(),
            partition,
        };
        stored.extend_from_slice(&encode(&[gone("a", 0), gone("b", 0)]).expect("encode"));
        let mut table = OffsetTable::default();
        table.replay(stored.freeze()).expect("replay");
        let a = table.group("a").expect("group a");
        assert_eq!(a.get(&("t".to_string(), 0)), None);
        assert_eq!(a.get(&("t".to_string(), 1)).map(|c| c.offset), Some(6));
        assert!(table.group("b").is_none(), "b's only offset was deleted");
    }
}
