//! The state machine in RocksDB: the view's rows in `sm`, the object index in `index`
//! (design 0002), the applied log id and membership in `meta`, each applied range
//! written as one synced batch together with its history (RR-WAL-3). The in-memory view
//! lives in a [`ViewHub`] that serves reads and feeds watchers the delta of every
//! applied entry; the index is read from the store. Snapshots are files
//! (`snapshot_file`), sent and installed in bounded chunks.

mod snapshots;
mod view_hub;

use super::db::{row_key_bytes, sync_write, CF_HISTORY, CF_META, CF_SM, CF_SNAPSHOT, KEY_APPLIED, KEY_MEMBERSHIP};
use super::history::HistoryEntry;
use super::index::StoreIndex;
use super::snapshot_file;
use crate::raft_types::{Entry, LogId, NodeId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig};
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, StorageIOError};
use rocksdb::{IteratorMode, WriteBatch, DB};
use snapshots::{file_name, finish_install, SnapshotRecord, INCOMING, KEY_INSTALL_MARKER};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use weir_meta::model::command::Applied;
use weir_meta::model::state::{Delta, Row, State};
use weir_meta::model::{codec, Outcome, Overlay};

pub use view_hub::{ViewHub, WatchItem};

fn io_err(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    StorageIOError::new(subject, verb, openraft::AnyError::error(e.to_string())).into()
}

/// The RocksDB state machine; its clones share the database, the hub and the
/// snapshot directory.
#[derive(Clone)]
pub struct StateMachineStore {
    db: Arc<DB>,
    hub: Arc<ViewHub>,
    snapshots: PathBuf,
    /// How much of the applied-command history is kept.
    history_retention: Arc<std::sync::Mutex<super::history::Retention>>,
}

impl StateMachineStore {
    /// Loads the state machine, first redoing a snapshot install a crash interrupted
    /// (RR-INT-6). Snapshot files live in `snapshots`.
    pub fn open(db: Arc<DB>, snapshots: &Path) -> anyhow::Result<Self> {
        weir_shared::durable_dir::create_dir_all(snapshots)?;
        let cf = db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
        if let Some(marker) = db.get_cf(cf, KEY_INSTALL_MARKER)? {
            let record: SnapshotRecord = codec::decode(&marker)?;
            tracing::warn!(snapshot_id = %record.meta.snapshot_id, "redoing an interrupted snapshot install");
            finish_install(&db, snapshots, &record)?;
            tracing::info!(snapshot_id = %record.meta.snapshot_id, "installed metadata snapshot (redone at startup)");
        }
        let (state, last_applied, membership) = load_state(&db)?;
        let store = Self {
            hub: Arc::new(ViewHub::new(state, last_applied, membership)),
            db,
            snapshots: snapshots.to_path_buf(),
            history_retention: Default::default(),
        };
        // A store migrated from format 1 has no snapshot of its own format yet; a
        // follower behind the purged log needs one.
        if store.current_record()?.is_none() && last_applied.is_some() {
            store.write_snapshot()?;
        }
        Ok(store)
    }

    pub fn hub(&self) -> Arc<ViewHub> {
        self.hub.clone()
    }

    pub fn db(&self) -> &DB {
        &self.db
    }

    /// A watch snapshot read from the store, not the view: a point-in-time copy of the
    /// view's rows as stored, sent as frames of at most `frame_bytes` (each the
    /// versioned JSON list of its rows, built from the stored rows' JSON without
    /// decoding them). `begin` gets the applied index the snapshot is at, `frame` each
    /// frame; either returning false stops it. Its applied index and row count, or
    /// `None` when stopped. Runs on a blocking thread.
    pub fn watch_snapshot(
        &self,
        frame_bytes: usize,
        begin: impl FnOnce(u64) -> bool,
        mut frame: impl FnMut(Vec<u8>) -> bool,
    ) -> anyhow::Result<Option<(u64, u64)>> {
        use std::sync::atomic::Ordering;
        let snapshot = loop {
            let installs = self.hub.installs.load(Ordering::Acquire);
            let snapshot = self.db.snapshot();
            // Not during an install: its rows are replaced in several batches.
            if installs.is_multiple_of(2) && self.hub.installs.load(Ordering::Acquire) == installs {
                break snapshot;
            }
            drop(snapshot);
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let meta = self.db.cf_handle(CF_META).expect("opened with this column family");
        let applied: Option<LogId> = snapshot
            .get_cf(meta, KEY_APPLIED)?
            .map(|b| codec::decode_compatible(&b))
            .transpose()?
            .flatten();
        let index = applied.map_or(0, |l| l.index);
        if !begin(index) {
            return Ok(None);
        }
        let sm = self.db.cf_handle(CF_SM).expect("opened with this column family");
        let header = [codec::MAGIC, codec::FORMAT_VERSION];
        let mut buf = Vec::with_capacity(frame_bytes.min(1 << 20));
        let (mut rows, mut in_frame) = (0u64, 0usize);
        for item in snapshot.iterator_cf(sm, rocksdb::IteratorMode::Start) {
            let (_, value) = item?;
            // A stored row is the versioned JSON of one `Row`.
            let json = match value.as_ref() {
                [m, v, json @ ..] if *m == codec::MAGIC && *v == codec::FORMAT_VERSION => json,
                other => anyhow::bail!(
                    "stored view row has an unknown format (header {:02x?})",
                    other.iter().take(2).collect::<Vec<_>>()
                ),
            };
            if in_frame > 0 && buf.len() + json.len() + 2 > frame_bytes {
                buf.push(b']');
                if !frame(std::mem::take(&mut buf)) {
                    return Ok(None);
                }
                in_frame = 0;
            }
            if in_frame == 0 {
                buf.extend_from_slice(&header);
                buf.push(b'[');
            } else {
                buf.push(b',');
            }
            buf.extend_from_slice(json);
            in_frame += 1;
            rows += 1;
        }
        if in_frame > 0 {
            buf.push(b']');
            if !frame(buf) {
                return Ok(None);
            }
        }
        Ok(Some((index, rows)))
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
            out.push(codec::decode_compatible(&value)?);
        }
        Ok(out)
    }
}

/// Reads every view row and the applied position from storage.
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
        .map(|b| codec::decode_compatible(&b))
        .transpose()?
        .flatten();
    let membership: StoredMembership = db
        .get_cf(meta, KEY_MEMBERSHIP)?
        .map(|b| codec::decode_compatible(&b))
        .transpose()?
        .unwrap_or_default();
    state.applied_index = last_applied.map_or(0, |l| l.index);
    Ok((state, last_applied, membership))
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let store = self.clone();
        let built = tokio::task::spawn_blocking(move || store.write_snapshot())
            .await
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, format!("{e:#}")))?;
        let (record, file) = built;
        Ok(Snapshot {
            meta: record.meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
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
        // Test hook: a replica that applies slowly (a lagging follower's view).
        weir_shared::failpoint::pause("state_machine_apply").await;
        let sm = self.db.cf_handle(CF_SM).expect("opened with this column family");
        let meta = self.db.cf_handle(CF_META).expect("opened with this column family");
        let history = self.db.cf_handle(CF_HISTORY).expect("opened with this column family");
        let mut batch = WriteBatch::default();
        let mut outcomes = Vec::new();
        let last_index;
        {
            let stored = StoreIndex::new(&self.db);
            // The index as stored plus this batch's writes, so later entries see earlier ones.
            let mut index = Overlay::new(&stored);
            let mut inner = self.hub.write();
            let inner = &mut *inner;
            for entry in entries {
                let log_id = entry.log_id;
                let entry_index = log_id.index;
                inner.last_applied = Some(log_id);
                let mut record = HistoryEntry {
                    index: entry_index,
                    term: log_id.leader_id.term,
                    proposal: None,
                    outcome: None,
                    membership: None,
                };
                let (outcome, changes) = match entry.payload {
                    EntryPayload::Blank => (Ok(Applied::Done), Vec::new()),
                    EntryPayload::Normal(proposal) => {
                        let effects = inner.state.apply(entry_index, &proposal, &index);
                        index.apply(&effects.index);
                        super::index::write(&self.db, &mut batch, &effects.index);
                        record.proposal = Some(proposal);
                        record.outcome = Some(effects.outcome.clone());
                        (effects.outcome, effects.changes)
                    }
                    EntryPayload::Membership(m) => {
                        record.membership = Some(m.voter_ids().collect());
                        inner.membership = StoredMembership::new(Some(log_id), m);
                        (Ok(Applied::Done), Vec::new())
                    }
                };
                inner.state.applied_index = entry_index;
                for change in &changes {
                    let key = row_key_bytes(&change.key);
                    match &change.row {
                        Some(row) => batch.put_cf(sm, key, codec::encode(row)),
                        None => batch.delete_cf(sm, key),
                    }
                }
                let encoded = codec::encode(&record);
                let mut retention = self.history_retention.lock().unwrap_or_else(|p| p.into_inner());
                retention.saw(encoded.len());
                batch.put_cf(history, entry_index.to_be_bytes(), encoded);
                let keep = retention.keep();
                if entry_index % 1024 == 0 && entry_index > keep {
                    batch.delete_range_cf(history, 0u64.to_be_bytes(), (entry_index - keep).to_be_bytes());
                }
                ViewHub::publish(
                    inner,
                    &self.hub.tx,
                    Delta {
                        index: entry_index,
                        changes,
                    },
                );
                outcomes.push(outcome);
            }
            batch.put_cf(meta, KEY_APPLIED, codec::encode(&inner.last_applied));
            batch.put_cf(meta, KEY_MEMBERSHIP, codec::encode(&inner.membership));
            last_index = inner.state.applied_index;
        }
        // The applied range is acknowledged only once synced (RR-WAL-3).
        self.db
            .write_opt(batch, &sync_write())
            .map_err(|e| io_err(ErrorSubject::StateMachine, ErrorVerb::Write, e))?;
        self.hub.durable.send_replace(last_index);
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let path = self.snapshots.join(INCOMING);
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?;
        Ok(Box::new(file))
    }

    /// RR-INT-6: the received snapshot is staged durably as a file and marked, then the
    /// store is replaced in bounded batches; the last one clears the marker. A crash in
    /// between is redone from the staged file at open.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        mut snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        let subject = || ErrorSubject::Snapshot(Some(meta.signature()));
        let staged = snapshot_file::path_of(&self.snapshots, &meta.snapshot_id);
        // Whatever file the snapshot arrived in, the staged copy is ours and synced.
        {
            use tokio::io::AsyncSeekExt;
            snapshot
                .flush()
                .await
                .map_err(|e| io_err(subject(), ErrorVerb::Write, e))?;
            snapshot
                .seek(std::io::SeekFrom::Start(0))
                .await
                .map_err(|e| io_err(subject(), ErrorVerb::Read, e))?;
            let mut out = tokio::fs::File::create(&staged)
                .await
                .map_err(|e| io_err(subject(), ErrorVerb::Write, e))?;
            tokio::io::copy(&mut *snapshot, &mut out)
                .await
                .map_err(|e| io_err(subject(), ErrorVerb::Write, e))?;
            out.sync_all()
                .await
                .map_err(|e| io_err(subject(), ErrorVerb::Write, e))?;
        }
        let record = SnapshotRecord {
            meta: meta.clone(),
            file: file_name(&staged),
        };
        let (db, dir) = (self.db.clone(), self.snapshots.clone());
        // Watch snapshots read no rows while the install replaces them.
        self.hub.installs.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let installed = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            snapshot_file::verify(&staged)?;
            snapshot_file::sync_dir(&dir)?;
            let cf = db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
            db.put_cf_opt(cf, KEY_INSTALL_MARKER, codec::encode(&record), &sync_write())?;
            if weir_shared::failpoint::is_set("snapshot_install_mid") {
                // Test hook for RR-INT-6: die between staging and replacing.
                tracing::error!("failpoint snapshot_install_mid: exiting");
                std::process::exit(86);
            }
            finish_install(&db, &dir, &record)?;
            load_state(&db)
        })
        .await;
        self.hub.installs.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let (state, last_applied, membership) = installed
            .map_err(|e| io_err(subject(), ErrorVerb::Write, e))?
            .map_err(|e| io_err(subject(), ErrorVerb::Write, format!("{e:#}")))?;
        let mut inner = self.hub.write();
        inner.state = state;
        inner.last_applied = last_applied;
        inner.membership = membership;
        inner.recent.clear();
        inner.recent_bytes = 0;
        let applied = inner.state.applied_index;
        let _ = self.hub.tx.send(WatchItem::Reset);
        self.hub.durable.send_replace(applied);
        tracing::info!(snapshot_id = %meta.snapshot_id, applied_index = applied, "installed metadata snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let store = self.clone();
        let opened = tokio::task::spawn_blocking(move || store.open_current())
            .await
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))?
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Read, format!("{e:#}")))?;
        Ok(opened.map(|(record, file)| Snapshot {
            meta: record.meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        }))
    }
}
