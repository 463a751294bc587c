//! The state machine in RocksDB: the view's rows in `sm`, the object index in `index`
//! (design 0002), the applied log id and membership in `meta`, each applied range
//! written as one synced batch together with its history (RR-WAL-3). The in-memory view
//! lives in a [`ViewHub`] that serves reads and feeds watchers the delta of every
//! applied entry; the index is read from the store. Snapshots are files
//! (`snapshot_file`), sent and installed in bounded chunks.

use super::db::{sync_write, CF_HISTORY, CF_META, CF_SM, CF_SNAPSHOT, KEY_APPLIED, KEY_MEMBERSHIP};
use super::history::HistoryEntry;
use super::index::StoreIndex;
use super::snapshot_file;
use crate::raft_types::{Entry, LogId, NodeId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig};
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, StorageIOError};
use rocksdb::{IteratorMode, WriteBatch, DB};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio::io::AsyncWriteExt;
use tokio::sync::{broadcast, watch};
use weir_meta::model::command::Applied;
use weir_meta::model::state::{Delta, Row, RowKey, State};
use weir_meta::model::{codec, Outcome, Overlay};

/// Keys in `snapshot`; stable. (`staged`, a whole format-1 snapshot, is no longer written.)
const KEY_CURRENT: &[u8] = b"current";
const KEY_INSTALL_MARKER: &[u8] = b"install_marker";

/// The file a snapshot being received is written to, in the snapshot directory.
const INCOMING: &str = "incoming.snap";

/// How many recent deltas a watcher can resume from without a new snapshot, and about
/// how many bytes of them: a commit's delta carries a row per stream it touched, so a
/// count alone let the kept deltas grow to gigabytes on a busy cluster (the soak's
/// metad grew 85 MiB a minute with 1,000 partitions).
const RECENT_DELTAS: usize = 16_384;
const RECENT_BYTES: usize = 32 << 20;
/// Deltas a watcher may fall behind the live ones before it resumes from the kept
/// deltas (or a snapshot); the channel keeps each until every watcher has read it.
const LIVE_DELTAS: usize = 1_024;
/// A change's rough size in memory, for [`RECENT_BYTES`] (a stream row is ~300 bytes).
const CHANGE_BYTES: usize = 320;

fn io_err(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    StorageIOError::new(subject, verb, openraft::AnyError::error(e.to_string())).into()
}

/// The current snapshot, or one being installed: its metadata and its file's name in
/// the snapshot directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SnapshotRecord {
    meta: SnapshotMeta,
    file: String,
}

/// Stable storage key of a view row: a kind byte (must be kept stable) then the key.
/// 0x13 held format 1's object rows; it is never reused.
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
    /// About how many bytes `recent` holds.
    recent_bytes: usize,
}

/// The applied view in memory, shared by the state machine (writer) and the client,
/// admin and watch services (readers), and the index of the last batch written.
pub struct ViewHub {
    inner: RwLock<ViewInner>,
    tx: broadcast::Sender<WatchItem>,
    /// The applied index whose batch (view and index rows) is in the store.
    durable: watch::Sender<u64>,
    /// Snapshot installs begun and ended; odd while one replaces the store, whose rows
    /// a watch snapshot then must not read.
    installs: std::sync::atomic::AtomicU64,
}

/// How a new watcher starts: from a backlog of deltas after its index, or, when
/// `snapshot`, from a snapshot of the store ([`StateMachineStore::watch_snapshot`])
/// followed by the deltas of `backlog` after it (every delta kept in memory) and `rx`.
pub struct WatchStart {
    pub snapshot: bool,
    pub backlog: Vec<Arc<Delta>>,
    pub rx: broadcast::Receiver<WatchItem>,
}

impl ViewHub {
    fn new(state: State, last_applied: Option<LogId>, membership: StoredMembership) -> Self {
        let (tx, _) = broadcast::channel(LIVE_DELTAS);
        let durable = watch::channel(state.applied_index).0;
        Self {
            inner: RwLock::new(ViewInner {
                state,
                last_applied,
                membership,
                recent: VecDeque::new(),
                recent_bytes: 0,
            }),
            tx,
            durable,
            installs: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, ViewInner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, ViewInner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` over the applied view.
    pub fn with_state<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.read().state)
    }

    pub fn applied_index(&self) -> u64 {
        self.read().state.applied_index
    }

    /// The applied index whose rows, view and index alike, are in the store.
    pub fn durable_index(&self) -> u64 {
        *self.durable.borrow()
    }

    /// Changes each time a batch of entries is applied and stored: the loops that plan
    /// from the view wake on it.
    pub fn applied_changes(&self) -> watch::Receiver<u64> {
        self.durable.subscribe()
    }

    /// Waits until the store holds what was applied through `index`.
    pub async fn wait_durable(&self, index: u64) {
        let _ = self.durable.subscribe().wait_for(|i| *i >= index).await;
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
                snapshot: false,
                backlog: inner.recent.iter().filter(|d| d.index > a).cloned().collect(),
                rx,
            },
            // Not a copy of the view: the snapshot is read from the store, outside any
            // lock (a million rows took the view's lock for the length of a copy).
            None => WatchStart {
                snapshot: true,
                backlog: inner.recent.iter().cloned().collect(),
                rx,
            },
        }
    }

    fn publish(inner: &mut ViewInner, tx: &broadcast::Sender<WatchItem>, delta: Delta) {
        let delta = Arc::new(delta);
        inner.recent_bytes += delta_bytes(&delta);
        inner.recent.push_back(delta.clone());
        while inner.recent.len() > RECENT_DELTAS || (inner.recent_bytes > RECENT_BYTES && inner.recent.len() > 1) {
            if let Some(old) = inner.recent.pop_front() {
                inner.recent_bytes -= delta_bytes(&old);
            }
        }
        // No receivers is fine: nobody watches yet.
        let _ = tx.send(WatchItem::Delta(delta));
    }
}

fn delta_bytes(delta: &Delta) -> usize {
    (delta.changes.len() + 1) * CHANGE_BYTES
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

    fn current_record(&self) -> anyhow::Result<Option<SnapshotRecord>> {
        let cf = self.db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
        Ok(self
            .db
            .get_cf(cf, KEY_CURRENT)?
            .map(|b| codec::decode(&b))
            .transpose()?)
    }

    /// Writes a snapshot of the store as it stands, makes it the current one and drops
    /// older files; the new file is returned open, so a build that another replaces at
    /// once still has the file it built.
    fn write_snapshot(&self) -> anyhow::Result<(SnapshotRecord, std::fs::File)> {
        let building = self
            .snapshots
            .join(format!("building-{:08x}.tmp", rand::random::<u32>()));
        let header = snapshot_file::write(&self.db, &building)?;
        let snapshot_id = match header.last_applied {
            Some(l) => format!("{}-{}-{:08x}", l.leader_id.term, l.index, rand::random::<u32>()),
            None => format!("0-0-{:08x}", rand::random::<u32>()),
        };
        let path = snapshot_file::path_of(&self.snapshots, &snapshot_id);
        std::fs::rename(&building, &path)?;
        snapshot_file::sync_dir(&self.snapshots)?;
        let record = SnapshotRecord {
            meta: SnapshotMeta {
                last_log_id: header.last_applied,
                last_membership: header.membership,
                snapshot_id,
            },
            file: file_name(&path),
        };
        let cf = self.db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
        self.db
            .put_cf_opt(cf, KEY_CURRENT, codec::encode(&record), &sync_write())?;
        let file = std::fs::File::open(&path)?;
        remove_other_snapshots(&self.snapshots, &record.file);
        let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        tracing::info!(snapshot_id = %record.meta.snapshot_id, bytes, "built metadata snapshot");
        Ok((record, file))
    }

    /// The current snapshot, opened. A build running in the background may make a new
    /// snapshot current and delete this one's file between reading the record and
    /// opening it; the record then names the newer file, which is opened instead.
    fn open_current(&self) -> anyhow::Result<Option<(SnapshotRecord, std::fs::File)>> {
        open_current_of(&self.snapshots, || self.current_record())
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Opens the file of the snapshot `current` names, reading the record again when a
/// newer snapshot replaced the file in between (a background build). Gives up after a
/// few replacements in a row, which a build taking seconds makes impossible in practice.
fn open_current_of(
    snapshots: &Path,
    mut current: impl FnMut() -> anyhow::Result<Option<SnapshotRecord>>,
) -> anyhow::Result<Option<(SnapshotRecord, std::fs::File)>> {
    let mut attempts = 0;
    loop {
        let Some(record) = current()? else { return Ok(None) };
        match std::fs::File::open(snapshots.join(&record.file)) {
            Ok(file) => return Ok(Some((record, file))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempts < 3 => attempts += 1,
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "snapshot {} ({}): {e}",
                    record.meta.snapshot_id,
                    record.file
                ))
            }
        }
    }
}

/// Deletes snapshot files other than `keep` and the one being received.
fn remove_other_snapshots(dir: &Path, keep: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != keep && name != INCOMING && (name.ends_with(".snap") || name.ends_with(".tmp")) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Replaces the store with the staged snapshot `record` names, clearing the install
/// marker and making it current in the last (synced) batch.
fn finish_install(db: &DB, snapshots: &Path, record: &SnapshotRecord) -> anyhow::Result<()> {
    let path = snapshots.join(&record.file);
    let cf = db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
    snapshot_file::install(db, &path, |batch| {
        batch.put_cf(cf, KEY_CURRENT, codec::encode(record));
        batch.delete_cf(cf, KEY_INSTALL_MARKER);
    })?;
    remove_other_snapshots(snapshots, &record.file);
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use weir_meta::model::{Change, RowKey};
    use weir_shared::ids::StreamId;

    fn record(file: &str) -> SnapshotRecord {
        SnapshotRecord {
            meta: SnapshotMeta {
                last_log_id: None,
                last_membership: Default::default(),
                snapshot_id: file.into(),
            },
            file: file.into(),
        }
    }

    // A snapshot a background build replaced between reading its record and opening
    // its file is served from the newer file. It used to be a storage error, which
    // stops Raft (a CI run's leader lost its metadata log this way).
    #[test]
    fn a_snapshot_replaced_while_it_is_opened_is_read_from_the_newer_file() {
        use std::io::Read;
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("new.snap"), b"new").expect("write");
        let mut reads = vec![record("new.snap"), record("old.snap")];
        let (got, mut file) = open_current_of(dir.path(), || Ok(reads.pop()))
            .expect("opened")
            .expect("a snapshot");
        assert_eq!(got.file, "new.snap");
        let mut text = String::new();
        file.read_to_string(&mut text).expect("read");
        assert_eq!(text, "new");
        // A file missing for good is still an error, naming it.
        let err = open_current_of(dir.path(), || Ok(Some(record("gone.snap")))).unwrap_err();
        assert!(err.to_string().contains("gone.snap"), "{err}");
        assert!(open_current_of(dir.path(), || Ok(None)).expect("no snapshot").is_none());
    }

    fn delta(index: u64, changes: usize) -> Delta {
        Delta {
            index,
            changes: (0..changes as u64)
                .map(|s| Change {
                    key: RowKey::Stream(StreamId(s)),
                    row: None,
                })
                .collect(),
        }
    }

    /// The deltas kept for resuming watchers stay within their byte budget however
    /// large each is, and a watcher just behind still resumes without a snapshot.
    #[test]
    fn recent_deltas_are_bounded_by_bytes_and_the_latest_stay_resumable() {
        let hub = ViewHub::new(State::default(), None, StoredMembership::default());
        for index in 1..=2_000 {
            let mut inner = hub.write();
            inner.state.applied_index = index;
            ViewHub::publish(&mut inner, &hub.tx, delta(index, 1_000));
        }
        let inner = hub.read();
        assert!(inner.recent_bytes <= RECENT_BYTES, "{} bytes kept", inner.recent_bytes);
        assert!(
            inner.recent.len() < 2_000 && inner.recent.len() > 10,
            "{} deltas kept",
            inner.recent.len()
        );
        assert_eq!(inner.recent.back().map(|d| d.index), Some(2_000));
        drop(inner);
        let start = hub.subscribe(Some(1_990));
        assert!(!start.snapshot);
        assert_eq!(start.backlog.len(), 10);
        assert!(hub.subscribe(Some(5)).snapshot, "too far behind: a snapshot");
    }
}
