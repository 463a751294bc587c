//! The state machine in RocksDB: one row per key in `sm`, the applied log id and
//! membership in `meta`, each applied range written as one synced batch together
//! with its rows and history (RR-WAL-3). The in-memory copy lives in a [`ViewHub`]
//! that serves reads and feeds watchers the delta of every applied entry.

use super::db::{sync_write, CF_HISTORY, CF_META, CF_SM, CF_SNAPSHOT, KEY_APPLIED, KEY_MEMBERSHIP};
use super::history::{HistoryEntry, HISTORY_RETAIN};
use crate::raft_types::{Entry, LogId, NodeId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig};
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, StorageIOError};
use rocksdb::{IteratorMode, WriteBatch, DB};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Cursor;
use std::sync::{Arc, RwLock};
use tokio::sync::broadcast;
use weir_meta::model::command::Applied;
use weir_meta::model::state::{Delta, Row, RowKey, State};
use weir_meta::model::{codec, Outcome};

/// Keys in `snapshot`; stable.
const KEY_CURRENT: &[u8] = b"current";
const KEY_STAGED: &[u8] = b"staged";
const KEY_INSTALL_MARKER: &[u8] = b"install_marker";

/// How many recent deltas a watcher can resume from without a new snapshot.
const RECENT_DELTAS: usize = 16_384;

fn io_err(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    StorageIOError::new(subject, verb, openraft::AnyError::error(e.to_string())).into()
}

/// What a snapshot holds.
#[derive(Serialize, Deserialize)]
struct SnapshotDoc {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: State,
}

/// A snapshot as stored: its metadata and the encoded [`SnapshotDoc`].
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

/// Stable storage key of a row: a kind byte (must be kept stable) then the key.
pub fn row_key_bytes(key: &RowKey) -> Vec<u8> {
    let mut out = Vec::new();
    match key {
        RowKey::Settings => out.push(0x01),
        RowKey::Counters => out.push(0x02),
        RowKey::Node(id) => {
            out.push(0x10);
            out.extend_from_slice(id.as_str().as_bytes());
        }
        RowKey::Stream(id) => {
            out.push(0x11);
            out.extend_from_slice(&id.0.to_be_bytes());
        }
        RowKey::Topic(name) => {
            out.push(0x12);
            out.extend_from_slice(name.as_bytes());
        }
        RowKey::Object(key) => {
            out.push(0x13);
            out.extend_from_slice(key.0.as_bytes());
        }
        RowKey::Lease(name) => {
            out.push(0x14);
            out.extend_from_slice(name.as_bytes());
        }
        RowKey::Takeover(node, epoch) => {
            out.push(0x15);
            out.extend_from_slice(&epoch.0.to_be_bytes());
            out.extend_from_slice(node.as_str().as_bytes());
        }
        RowKey::Token(name) => {
            out.push(0x16);
            out.extend_from_slice(name.as_bytes());
        }
    }
    out
}

/// What a watcher receives.
#[derive(Clone, Debug)]
pub enum WatchItem {
    /// The changes of one applied entry, in index order.
    Delta(Arc<Delta>),
    /// The state was replaced by a snapshot install: start again from a snapshot.
    Reset,
}

struct ViewInner {
    state: State,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    recent: VecDeque<Arc<Delta>>,
}

/// The applied state in memory, shared by the state machine (writer) and the
/// client, admin and watch services (readers).
pub struct ViewHub {
    inner: RwLock<ViewInner>,
    tx: broadcast::Sender<WatchItem>,
}

/// How a new watcher starts: from a snapshot, or from a backlog of deltas after its index.
pub struct WatchStart {
    pub snapshot: Option<State>,
    pub backlog: Vec<Arc<Delta>>,
    pub rx: broadcast::Receiver<WatchItem>,
}

impl ViewHub {
    fn new(state: State, last_applied: Option<LogId>, membership: StoredMembership) -> Self {
        let (tx, _) = broadcast::channel(RECENT_DELTAS);
        Self {
            inner: RwLock::new(ViewInner {
                state,
                last_applied,
                membership,
                recent: VecDeque::new(),
            }),
            tx,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, ViewInner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, ViewInner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` over the applied state.
    pub fn with_state<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.read().state)
    }

    pub fn applied_index(&self) -> u64 {
        self.read().state.applied_index
    }

    /// Subscribes a watcher that has applied through `after` (or nothing).
    pub fn subscribe(&self, after: Option<u64>) -> WatchStart {
        let inner = self.read();
        let rx = self.tx.subscribe();
        let applied = inner.state.applied_index;
        let resumable = after
            .filter(|a| *a <= applied && (*a == applied || inner.recent.front().is_some_and(|d| d.index <= a + 1)));
        match resumable {
            Some(a) => WatchStart {
                snapshot: None,
                backlog: inner.recent.iter().filter(|d| d.index > a).cloned().collect(),
                rx,
            },
            None => WatchStart {
                snapshot: Some(inner.state.clone()),
                backlog: Vec::new(),
                rx,
            },
        }
    }

    fn publish(inner: &mut ViewInner, tx: &broadcast::Sender<WatchItem>, delta: Delta) {
        let delta = Arc::new(delta);
        if inner.recent.len() == RECENT_DELTAS {
            inner.recent.pop_front();
        }
        inner.recent.push_back(delta.clone());
        // No receivers is fine: nobody watches yet.
        let _ = tx.send(WatchItem::Delta(delta));
    }
}

/// The RocksDB state machine; its clones share the database and the hub.
#[derive(Clone)]
pub struct StateMachineStore {
    db: Arc<DB>,
    hub: Arc<ViewHub>,
}

impl StateMachineStore {
    /// Loads the state machine, first redoing a snapshot install a crash interrupted (RR-INT-6).
    pub fn open(db: Arc<DB>) -> anyhow::Result<Self> {
        let snapshots = db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
        if db.get_cf(snapshots, KEY_INSTALL_MARKER)?.is_some() {
            let staged = db.get_cf(snapshots, KEY_STAGED)?.ok_or_else(|| {
                anyhow::anyhow!("snapshot install marker without a staged snapshot; recreate the data directory")
            })?;
            let staged: StoredSnapshot = codec::decode(&staged)?;
            tracing::warn!(snapshot_id = %staged.meta.snapshot_id, "redoing an interrupted snapshot install");
            replace_state(&db, &staged)?;
            tracing::info!(snapshot_id = %staged.meta.snapshot_id, "installed metadata snapshot (redone at startup)");
        }
        let (state, last_applied, membership) = load_state(&db)?;
        Ok(Self {
            hub: Arc::new(ViewHub::new(state, last_applied, membership)),
            db,
        })
    }

    pub fn hub(&self) -> Arc<ViewHub> {
        self.hub.clone()
    }

    /// Up to `limit` history entries from `from_index` on.
    pub fn history(&self, from_index: u64, limit: usize) -> anyhow::Result<Vec<HistoryEntry>> {
        let cf = self.db.cf_handle(CF_HISTORY).expect("opened with this column family");
        let mut out = Vec::new();
        let from = from_index.to_be_bytes();
        for item in self
            .db
            .iterator_cf(cf, IteratorMode::From(&from, rocksdb::Direction::Forward))
            .take(limit)
        {
            let (_, value) = item?;
            out.push(codec::decode(&value)?);
        }
        Ok(out)
    }
}

/// Reads every row and the applied position from storage.
fn load_state(db: &DB) -> anyhow::Result<(State, Option<LogId>, StoredMembership)> {
    let sm = db.cf_handle(CF_SM).expect("opened with this column family");
    let meta = db.cf_handle(CF_META).expect("opened with this column family");
    let mut state = State::default();
    for item in db.iterator_cf(sm, IteratorMode::Start) {
        let (_, value) = item?;
        let row: Row = codec::decode(&value)?;
        state.set_row(&row.key(), Some(row));
    }
    let last_applied: Option<LogId> = db
        .get_cf(meta, KEY_APPLIED)?
        .map(|b| codec::decode(&b))
        .transpose()?
        .flatten();
    let membership: StoredMembership = db
        .get_cf(meta, KEY_MEMBERSHIP)?
        .map(|b| codec::decode(&b))
        .transpose()?
        .unwrap_or_default();
    state.applied_index = last_applied.map_or(0, |l| l.index);
    state.reindex();
    Ok((state, last_applied, membership))
}

/// Replaces the stored state with a staged snapshot in one synced batch, making it
/// the current snapshot and clearing the install marker.
fn replace_state(db: &DB, staged: &StoredSnapshot) -> anyhow::Result<SnapshotDoc> {
    let doc: SnapshotDoc = codec::decode(&staged.data)?;
    let sm = db.cf_handle(CF_SM).expect("opened with this column family");
    let meta = db.cf_handle(CF_META).expect("opened with this column family");
    let snapshots = db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
    let mut batch = WriteBatch::default();
    batch.delete_range_cf(sm, [0x00u8].as_slice(), [0xffu8; 9].as_slice());
    for row in doc.state.rows() {
        batch.put_cf(sm, row_key_bytes(&row.key()), codec::encode(&row));
    }
    batch.put_cf(meta, KEY_APPLIED, codec::encode(&doc.last_applied));
    batch.put_cf(meta, KEY_MEMBERSHIP, codec::encode(&doc.membership));
    batch.put_cf(snapshots, KEY_CURRENT, codec::encode(staged));
    batch.delete_cf(snapshots, KEY_STAGED);
    batch.delete_cf(snapshots, KEY_INSTALL_MARKER);
    db.write_opt(batch, &sync_write())?;
    Ok(doc)
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let (doc_bytes, last_applied, membership) = {
            let inner = self.hub.read();
            let doc = SnapshotDoc {
                last_applied: inner.last_applied,
                membership: inner.membership.clone(),
                state: inner.state.clone(),
            };
            (codec::encode(&doc), inner.last_applied, inner.membership.clone())
        };
        let snapshot_id = match last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, rand::random::<u32>()),
            None => format!("0-0-{}", rand::random::<u32>()),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: doc_bytes.clone(),
        };
        let cf = self.db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
        self.db
            .put_cf_opt(cf, KEY_CURRENT, codec::encode(&stored), &sync_write())
            .map_err(|e| io_err(ErrorSubject::Snapshot(Some(meta.signature())), ErrorVerb::Write, e))?;
        tracing::info!(snapshot_id = %meta.snapshot_id, bytes = doc_bytes.len(), "built metadata snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(doc_bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let inner = self.hub.read();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let sm = self.db.cf_handle(CF_SM).expect("opened with this column family");
        let meta = self.db.cf_handle(CF_META).expect("opened with this column family");
        let history = self.db.cf_handle(CF_HISTORY).expect("opened with this column family");
        let mut batch = WriteBatch::default();
        let mut outcomes = Vec::new();
        {
            let mut inner = self.hub.write();
            let inner = &mut *inner;
            for entry in entries {
                let log_id = entry.log_id;
                let index = log_id.index;
                inner.last_applied = Some(log_id);
                let mut record = HistoryEntry {
                    index,
                    term: log_id.leader_id.term,
                    proposal: None,
                    outcome: None,
                    membership: None,
                };
                let (outcome, changes) = match entry.payload {
                    EntryPayload::Blank => (Ok(Applied::Done), Vec::new()),
                    EntryPayload::Normal(proposal) => {
                        let (outcome, changes) = inner.state.apply(index, &proposal);
                        record.proposal = Some(proposal);
                        record.outcome = Some(outcome.clone());
                        (outcome, changes)
                    }
                    EntryPayload::Membership(m) => {
                        record.membership = Some(m.voter_ids().collect());
                        inner.membership = StoredMembership::new(Some(log_id), m);
                        (Ok(Applied::Done), Vec::new())
                    }
                };
                inner.state.applied_index = index;
                for change in &changes {
                    let key = row_key_bytes(&change.key);
                    match &change.row {
                        Some(row) => batch.put_cf(sm, key, codec::encode(row)),
                        None => batch.delete_cf(sm, key),
                    }
                }
                batch.put_cf(history, index.to_be_bytes(), codec::encode(&record));
                if index % 1024 == 0 && index > HISTORY_RETAIN {
                    batch.delete_range_cf(history, 0u64.to_be_bytes(), (index - HISTORY_RETAIN).to_be_bytes());
                }
                ViewHub::publish(inner, &self.hub.tx, Delta { index, changes });
                outcomes.push(outcome);
            }
            batch.put_cf(meta, KEY_APPLIED, codec::encode(&inner.last_applied));
            batch.put_cf(meta, KEY_MEMBERSHIP, codec::encode(&inner.membership));
        }
        // The applied range is acknowledged only once synced (RR-WAL-3).
        self.db
            .write_opt(batch, &sync_write())
            .map_err(|e| io_err(ErrorSubject::StateMachine, ErrorVerb::Write, e))?;
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    /// RR-INT-6: stage the snapshot and a marker durably, then replace the state in one
    /// synced batch that also clears the marker; a crash in between is redone at open.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let subject = || ErrorSubject::Snapshot(Some(meta.signature()));
        let staged = StoredSnapshot {
            meta: meta.clone(),
            data: snapshot.into_inner(),
        };
        let cf = self.db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
        let mut batch = WriteBatch::default();
        batch.put_cf(cf, KEY_STAGED, codec::encode(&staged));
        batch.put_cf(cf, KEY_INSTALL_MARKER, meta.snapshot_id.as_bytes());
        self.db
            .write_opt(batch, &sync_write())
            .map_err(|e| io_err(subject(), ErrorVerb::Write, e))?;
        if weir_shared::failpoint::is_set("snapshot_install_mid") {
            // Test hook for RR-INT-6: die between staging and replacing.
            tracing::error!("failpoint snapshot_install_mid: exiting");
            std::process::exit(86);
        }
        let mut doc = replace_state(&self.db, &staged).map_err(|e| io_err(subject(), ErrorVerb::Write, e))?;
        doc.state.reindex();
        let mut inner = self.hub.write();
        inner.state = doc.state;
        inner.last_applied = doc.last_applied;
        inner.membership = doc.membership;
        inner.recent.clear();
        let _ = self.hub.tx.send(WatchItem::Reset);
        tracing::info!(snapshot_id = %meta.snapshot_id, applied_index = inner.state.applied_index, "installed metadata snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let cf = self.db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
        let Some(bytes) = self
            .db
            .get_cf(cf, KEY_CURRENT)
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))?
        else {
            return Ok(None);
        };
        let stored: StoredSnapshot =
            codec::decode(&bytes).map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))?;
        Ok(Some(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}
