//! Transactional ids as records of the transaction-state stream, and the table rebuilt
//! from them. Each transition is a record keyed `{"txn"}` whose value is the whole
//! entry; a forgotten (expired) id is a record with a null value. Replaying the stream
//! in order rebuilds the table, so transactions survive a move or failover of the
//! stream with it (like Kafka's `__transaction_state`).

use super::state::TxnEntry;
use bytes::Bytes;
use kafka_protocol::records::Record;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most bytes a state-stream batch inflates to on replay (see the offsets stream's).
const STATE_BATCH_INFLATED_BYTES: usize = 64 << 20;

#[derive(Serialize, Deserialize)]
struct Key {
    txn: String,
}

/// One change to the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Put { id: String, entry: TxnEntry },
    Forget { id: String },
}

/// Every transactional id of one state stream.
#[derive(Debug, Default)]
pub struct TxnTable {
    entries: BTreeMap<String, TxnEntry>,
    /// Changes applied since the table was loaded or last snapshotted.
    changes: u64,
}

impl TxnTable {
    pub fn get(&self, id: &str) -> Option<&TxnEntry> {
        self.entries.get(id)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &TxnEntry)> {
        self.entries.iter()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn changes_since_snapshot(&self) -> u64 {
        self.changes
    }

    /// The whole table as puts, which replayed on their own rebuild it exactly.
    pub fn snapshot(&self) -> Vec<Change> {
        self.entries
            .iter()
            .map(|(id, entry)| Change::Put {
                id: id.clone(),
                entry: entry.clone(),
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
            Change::Put { id, entry } => {
                self.entries.insert(id, entry);
            }
            Change::Forget { id } => {
                self.entries.remove(&id);
            }
        }
    }

    /// Replays stored batches; records that are not state records are skipped.
    pub fn replay(&mut self, batches: Bytes) -> Result<(), String> {
        crate::keyed_records::replay(batches, STATE_BATCH_INFLATED_BYTES, "transaction-state", |r| {
            if let Some(change) = decode(r) {
                self.apply(change);
            }
        })
    }
}

fn decode(r: &Record) -> Option<Change> {
    let key: Key = serde_json::from_slice(r.key.as_deref()?).ok()?;
    match r.value.as_deref() {
        Some(value) => Some(Change::Put {
            id: key.txn,
            entry: serde_json::from_slice(value).ok()?,
        }),
        None => Some(Change::Forget { id: key.txn }),
    }
}

/// Encodes changes as one batch for the state stream.
pub fn encode(changes: &[Change]) -> Result<Bytes, String> {
    let records = changes.iter().map(|c| {
        let (id, value) = match c {
            Change::Put { id, entry } => (id, Some(serde_json::to_vec(entry).unwrap_or_default())),
            Change::Forget { id } => (id, None),
        };
        let key = serde_json::to_vec(&Key { txn: id.clone() }).unwrap_or_default();
        (key, value)
    });
    crate::keyed_records::encode(records, "transaction state")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinators::txn::state::{init_with_new_id, InitRequest, TxnState};
    use bytes::BytesMut;

    fn entry(pid: i64) -> TxnEntry {
        let req = InitRequest {
            timeout_ms: 60_000,
            expected: None,
        };
        init_with_new_id(None, pid, req, 1)
    }

    #[test]
    fn replay_rebuilds_transitions_and_forgotten_ids_in_order() {
        let mut ongoing = entry(1);
        ongoing.state = TxnState::Ongoing;
        ongoing.partitions.insert("t/0".into());
        let mut stored = BytesMut::new();
        let put = |id: &str, entry: &TxnEntry| Change::Put {
            id: id.into(),
            entry: entry.clone(),
        };
        stored.extend_from_slice(&encode(&[put("a", &entry(1)), put("b", &entry(2))]).expect("encode"));
        stored.extend_from_slice(&encode(&[put("a", &ongoing)]).expect("encode"));
        stored.extend_from_slice(&encode(&[Change::Forget { id: "b".into() }]).expect("encode"));
        let mut table = TxnTable::default();
        table.replay(stored.freeze()).expect("replay");
        assert_eq!(table.get("a"), Some(&ongoing));
        assert!(table.get("b").is_none());
        assert_eq!(table.len(), 1);
        assert_eq!(table.changes_since_snapshot(), 4);
    }

    #[test]
    fn a_snapshot_replayed_alone_rebuilds_the_table() {
        let mut table = TxnTable::default();
        for i in 0..40 {
            table.apply(Change::Put {
                id: format!("id-{}", i % 9),
                entry: entry(i),
            });
        }
        table.apply(Change::Forget { id: "id-3".into() });
        let snapshot = table.snapshot();
        assert_eq!(snapshot.len(), table.len());
        let mut stored = BytesMut::new();
        for chunk in snapshot.chunks(4) {
            stored.extend_from_slice(&encode(chunk).expect("encode"));
        }
        let mut rebuilt = TxnTable::default();
        rebuilt.replay(stored.freeze()).expect("replay");
        assert_eq!(rebuilt.entries, table.entries);
        table.snapshotted();
        assert_eq!(table.changes_since_snapshot(), 0);
    }

    #[test]
    fn records_of_other_shapes_are_skipped() {
        // An offsets-stream record in the wrong stream decodes as nothing.
        let other = crate::keyed_records::encode([(br#"{"group":"g"}"#.to_vec(), None)], "test").expect("encode");
        let mut table = TxnTable::default();
        table.replay(other).expect("replay");
        assert!(table.is_empty());
    }
}
