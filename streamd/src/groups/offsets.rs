//! Committed offsets as records of the offsets stream, and the table rebuilt from them.
//!
//! Each commit is a record keyed `{"group","topic","partition"}` with value
//! `{"offset","leader_epoch","metadata"}`; a deleted group is a record keyed
//! `{"group"}` with a null value. Replaying the stream in order rebuilds the table, so
//! commits survive a move or failover of the stream with it (like Kafka's
//! `__consumer_offsets`).

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
}

/// Every group's committed offsets, by topic and partition.
#[derive(Debug, Default)]
pub struct OffsetTable {
    groups: BTreeMap<String, BTreeMap<(String, i32), Committed>>,
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
        }
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
            if let Some(change) = decode(r) {
                self.apply(change);
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
        _ => None,
    }
}

/// Encodes changes as one batch for the offsets stream.
pub fn encode(changes: &[Change]) -> Result<Bytes, String> {
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
        };
        (serde_json::to_vec(&key).unwrap_or_default(), value)
    });
    crate::keyed_records::encode(records, "offset commits")
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
}
