//! Group commit: one writer drains every waiting append, makes them durable with one
//! write and one sync, and only then answers them all. It also reclaims segments whose
//! records are all committed in data objects, and bounds the WAL by `--wal-max-bytes`.
//!
//! A file WAL's writer is a thread of its own that blocks on the disk (issue 17): an
//! append wakes it and its answer wakes the appender. That is as many cross-thread
//! wake-ups as a runtime task handing each group to the blocking pool and back (the
//! latency measured the same); what it saves is that task per group, and it keeps the
//! disk's waits out of the runtime's workers. An object WAL's writer is a runtime task
//! with several objects in flight (`object_writer`).

use super::file::FileSink;
use super::record::WalRecord;
use super::{SegmentId, Sink, WalError};
use bytes::BytesMut;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use weir_shared::ids::StreamId;

/// Most bytes one group commit writes.
const MAX_GROUP_BYTES: usize = 8 * 1024 * 1024;
/// Bounded queue of appends waiting for the writer.
const QUEUE: usize = 4096;

pub(super) enum Request {
    /// Framed by the writer into its group, so the batches are copied once.
    Append {
        record: WalRecord,
        done: Answer,
        on_durable: Option<OnDurable>,
    },
    /// Delete segments whose every stream's records end at or below these committed ends.
    /// New committed ends are waiting in `WalWriter::committed`.
    Reclaim,
    /// The stop was requested: wakes a writer thread waiting for appends.
    Wake,
}

/// Run by the writer once a record is durable, before its submitter is told: what
/// must follow durability whether or not the submitter still waits (a caller that
/// went away, such as a cancelled request, must not leave a stream's durable end
/// behind a record that is in the log).
pub type OnDurable = Box<dyn FnOnce() + Send>;

/// Where an append's submitter is told how its write went.
type Answer = oneshot::Sender<Result<(), WalError>>;

/// What a segment holds, for reclaiming it.
#[derive(Default)]
struct SegmentInfo {
    bytes: u64,
    /// Per stream, the end offset of its last record in the segment.
    stream_ends: HashMap<StreamId, u64>,
}

/// The handle appends go through.
#[derive(Clone)]
pub struct WalWriter {
    tx: mpsc::Sender<Request>,
    bytes: Arc<AtomicU64>,
    max_bytes: u64,
    fenced: Arc<AtomicBool>,
    /// Why a write waits for its store, while one does (issue 60).
    stalled: Stall,
    /// Committed ends reported since the writer last looked: streams whose records up
    /// to there are in committed objects. Kept here, not in the queue, so a full queue
    /// loses none; only what changed is reported, never every stream's (D-23).
    committed: Arc<Mutex<HashMap<StreamId, u64>>>,
}

impl WalWriter {
    /// Starts the group-commit writer on `sink`: a thread for a file WAL, a task on
    /// `tasks` for an object WAL. Either ends at `stop`, answering nothing queued after.
    pub fn start(
        sink: Sink,
        max_bytes: u64,
        tasks: &tokio_util::task::TaskTracker,
        stop: CancellationToken,
    ) -> Result<Self, WalError> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer = Self {
            tx,
            bytes: Arc::new(AtomicU64::new(0)),
            max_bytes,
            fenced: Arc::new(AtomicBool::new(false)),
            stalled: Stall::default(),
            committed: Arc::default(),
        };
        let log = Log {
            segments: BTreeMap::new(),
            failed: None,
            bytes: writer.bytes.clone(),
            fenced: writer.fenced.clone(),
            stalled: writer.stalled.clone(),
            reported: writer.committed.clone(),
            committed: HashMap::new(),
        };
        match sink {
            Sink::File(file) => {
                let (ended, thread_ended) = oneshot::channel::<()>();
                let thread_stop = stop.clone();
                std::thread::Builder::new()
                    .name("wal-writer".into())
                    .spawn(move || {
                        run_file(file, rx, log, &thread_stop);
                        let _ = ended.send(());
                    })
                    .map_err(|e| WalError::Io(format!("cannot start the WAL writer thread: {e}")))?;
                // Tracked, so teardown waits for the file to be closed; weak, so the
                // thread also ends once every handle is gone.
                let wake = writer.tx.downgrade();
                tasks.spawn(async move {
                    let mut thread_ended = thread_ended;
                    tokio::select! {
                        _ = stop.cancelled() => {
                            if let Some(tx) = wake.upgrade() {
                                // A full queue means the thread is busy, and sees the stop next.
                                let _ = tx.try_send(Request::Wake);
                            }
                            let _ = (&mut thread_ended).await;
                        }
                        _ = &mut thread_ended => {}
                    }
                });
            }
            Sink::Object(object) => {
                tasks.spawn(async move {
                    tokio::select! {
                        _ = super::object_writer::run(object, rx, log) => {}
                        _ = stop.cancelled() => {}
                    }
                });
            }
        }
        Ok(writer)
    }

    /// Appends `record`; returns once it is durable and the WAL was not taken over.
    pub async fn append(&self, record: &WalRecord) -> Result<(), WalError> {
        self.check()?;
        self.submit(record, None).await?.await
    }

    /// Refuses new appends once fenced, over `--wal-max-bytes` (FO-MDO-7), or while a
    /// write waits for space on a full volume (issue 60).
    pub fn check(&self) -> Result<(), WalError> {
        if self.fenced.load(Ordering::Acquire) {
            return Err(WalError::Fenced);
        }
        if let Some(why) = self.stalled.reason() {
            return Err(WalError::Stalled(why));
        }
        let held = self.bytes.load(Ordering::Relaxed);
        if held >= self.max_bytes {
            return Err(WalError::Full(held));
        }
        Ok(())
    }

    /// Queues `record` behind every earlier one; the returned future resolves once it is
    /// durable. Queue order is write order, so callers holding a stream's lock while
    /// submitting keep its records in offset order.
    pub async fn submit(
        &self,
        record: &WalRecord,
        on_durable: Option<OnDurable>,
    ) -> Result<impl std::future::Future<Output = Result<(), WalError>>, WalError> {
        let (done, rx) = oneshot::channel();
        let req = Request::Append {
            record: record.clone(),
            done,
            on_durable,
        };
        self.tx
            .send(req)
            .await
            .map_err(|_| WalError::Io("the WAL writer has stopped".into()))?;
        Ok(async move {
            rx.await
                .map_err(|_| WalError::Io("the WAL writer has stopped".into()))?
        })
    }

    /// Reports streams' new committed ends (their records below are in committed
    /// objects, or no longer this incarnation's to keep), and reclaims the segments
    /// they now cover.
    pub fn reclaim(&self, ends: impl IntoIterator<Item = (StreamId, u64)>) {
        {
            let mut committed = self.committed.lock().unwrap_or_else(|p| p.into_inner());
            for (stream, end) in ends {
                let e = committed.entry(stream).or_insert(end);
                *e = (*e).max(end);
            }
        }
        // A full queue means the writer is busy: it takes the ends with its next group.
        let _ = self.tx.try_send(Request::Reclaim);
    }

    /// Bytes held in live segments.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }
}

/// Why the WAL's writes wait for their store, shared by the writer and the handle.
/// Every append asks, so the answer "not stalled" is one atomic load.
#[derive(Clone, Default)]
pub(super) struct Stall(Arc<StallState>);

#[derive(Default)]
struct StallState {
    stalled: AtomicBool,
    why: Mutex<Option<String>>,
}

impl Stall {
    /// Records why; true if it was not stalled before.
    pub(super) fn set(&self, why: String) -> bool {
        let mut held = self.0.why.lock().unwrap_or_else(|p| p.into_inner());
        self.0.stalled.store(true, Ordering::Release);
        held.replace(why).is_none()
    }

    /// Clears it; true if it was stalled.
    pub(super) fn clear(&self) -> bool {
        if !self.0.stalled.load(Ordering::Acquire) {
            return false;
        }
        let mut held = self.0.why.lock().unwrap_or_else(|p| p.into_inner());
        self.0.stalled.store(false, Ordering::Release);
        held.take().is_some()
    }

    fn reason(&self) -> Option<String> {
        if !self.0.stalled.load(Ordering::Acquire) {
            return None;
        }
        self.0.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The writer's account of its log: what each segment holds, and whether it failed.
pub(super) struct Log {
    segments: BTreeMap<SegmentId, SegmentInfo>,
    /// Set by the first failure: nothing after it is acknowledged.
    failed: Option<WalError>,
    bytes: Arc<AtomicU64>,
    fenced: Arc<AtomicBool>,
    stalled: Stall,
    /// Where the handle leaves reported committed ends (`WalWriter::reclaim`).
    reported: Arc<Mutex<HashMap<StreamId, u64>>>,
    /// The committed end of every stream with records in a live segment, as reported;
    /// a stream not in it has nothing committed yet.
    committed: HashMap<StreamId, u64>,
}

/// Appends gathered for one write.
#[derive(Default)]
pub(super) struct Group {
    pub(super) data: BytesMut,
    pub(super) waiters: Vec<(Answer, Option<OnDurable>)>,
    ends: Vec<(StreamId, u64)>,
    /// Committed ends were reported.
    pub(super) reclaim: bool,
}

impl Group {
    /// `first`, and every request already waiting behind it, up to a group's bytes.
    fn gather(first: Request, rx: &mut mpsc::Receiver<Request>) -> Self {
        let mut group = Group::default();
        group.take(first);
        while !group.is_full() {
            match rx.try_recv() {
                Ok(req) => group.take(req),
                Err(_) => break,
            }
        }
        group
    }

    pub(super) fn take(&mut self, req: Request) {
        match req {
            Request::Append {
                record,
                done,
                on_durable,
            } => {
                record.encode_into(&mut self.data);
                self.waiters.push((done, on_durable));
                self.ends.push((record.stream, record.end_offset()));
            }
            Request::Reclaim => self.reclaim = true,
            Request::Wake => {}
        }
    }

    pub(super) fn is_full(&self) -> bool {
        self.data.len() >= MAX_GROUP_BYTES
    }
}

impl Log {
    /// Answers a group's appends with what its write did.
    pub(super) fn settle(&mut self, group: Group, result: Result<(SegmentId, u64), WalError>) {
        match result {
            Ok((segment, len)) => {
                let info = self.segments.entry(segment).or_default();
                info.bytes += len;
                for (stream, end) in group.ends {
                    let e = info.stream_ends.entry(stream).or_insert(0);
                    *e = (*e).max(end);
                }
                self.bytes.fetch_add(len, Ordering::Relaxed);
                for (w, on_durable) in group.waiters {
                    if let Some(f) = on_durable {
                        f();
                    }
                    let _ = w.send(Ok(()));
                }
            }
            Err(e) => {
                // Nothing after a failure is acknowledged: a taken-over or broken WAL stays failed.
                if e == WalError::Fenced {
                    self.fenced.store(true, Ordering::Release);
                }
                // Said once, when it first failed (objects in flight fail after it).
                if self.failed.is_none() {
                    if e == WalError::Fenced {
                        tracing::error!("write-ahead log was taken over; acknowledging nothing more");
                    } else {
                        tracing::error!(error = %e, "write-ahead log write failed; acknowledging nothing more");
                    }
                    self.failed = Some(e.clone());
                }
                for (w, _) in group.waiters {
                    let _ = w.send(Err(e.clone()));
                }
            }
        }
    }

    /// A write found the volume full: said once, and new appends refused until it is written.
    fn out_of_space(&mut self, why: String) {
        if self.stalled.set(format!("write-ahead log volume is full: {why}")) {
            tracing::error!(error = %why, "write-ahead log volume is full; refusing new appends and retrying the write until space returns");
        }
    }

    /// The write went through (or failed otherwise): appends are taken again.
    fn space_returned(&mut self) {
        if self.stalled.clear() {
            tracing::info!("write-ahead log volume has space again; taking appends");
        }
    }

    /// Where an object WAL's PUTs say they are retrying.
    pub(super) fn stall(&self) -> Stall {
        self.stalled.clone()
    }

    /// The failure that ended this log's acknowledgements, if any.
    pub(super) fn failure(&self) -> Option<&WalError> {
        self.failed.as_ref()
    }

    /// Whether `segment` holds any record (an object WAL's floor object holds none).
    pub(super) fn holds_records(&self, segment: SegmentId) -> bool {
        self.segments.get(&segment).is_some_and(|info| info.bytes > 0)
    }

    /// Whether committed ends were reported and not yet taken (a full queue may have
    /// dropped the request that announced them).
    pub(super) fn has_reported(&self) -> bool {
        !self.reported.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Takes the committed ends reported since the last look.
    pub(super) fn take_reported(&mut self) {
        let reported = std::mem::take(&mut *self.reported.lock().unwrap_or_else(|p| p.into_inner()));
        for (stream, end) in reported {
            let e = self.committed.entry(stream).or_insert(end);
            *e = (*e).max(end);
        }
    }

    /// Segments, oldest first, whose every record is covered by the committed ends;
    /// never the `boundary` one, which the writer still needs.
    pub(super) fn reclaimable(&self, boundary: Option<SegmentId>) -> Vec<SegmentId> {
        tracing::debug!(segments = self.segments.len(), ?boundary, "reclaiming WAL segments");
        self.segments
            .iter()
            .take_while(|(id, info)| {
                Some(**id) != boundary
                    && info
                        .stream_ends
                        .iter()
                        .all(|(s, end)| self.committed.get(s).is_some_and(|c| c >= end))
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Forgets the committed ends of streams no live segment holds a record of, so
    /// the map follows what is in the log, not every stream ever served.
    pub(super) fn forget_reclaimed(&mut self) {
        let live: std::collections::HashSet<StreamId> = self
            .segments
            .values()
            .flat_map(|info| info.stream_ends.keys().copied())
            .collect();
        self.committed.retain(|s, _| live.contains(s));
    }

    /// Records that deleting `segment` went as it did; false stops this reclaim.
    pub(super) fn deleted(&mut self, segment: SegmentId, result: Result<(), WalError>) -> bool {
        match result {
            Ok(()) => {
                if let Some(info) = self.segments.remove(&segment) {
                    self.bytes.fetch_sub(info.bytes, Ordering::Relaxed);
                }
                tracing::debug!(segment, "reclaimed WAL segment");
                true
            }
            Err(e) => {
                tracing::warn!(segment, error = %e, "cannot reclaim WAL segment; will retry");
                false
            }
        }
    }
}

/// The file WAL's writer thread: blocks for the first waiting request, takes every
/// other one already waiting, writes and syncs them as one, answers them; until `stop`.
fn run_file(mut file: FileSink, mut rx: mpsc::Receiver<Request>, mut log: Log, stop: &CancellationToken) {
    while let Some(first) = rx.blocking_recv() {
        if stop.is_cancelled() {
            break;
        }
        let group = Group::gather(first, &mut rx);
        let reclaim = group.reclaim || log.has_reported();
        if !group.waiters.is_empty() {
            // Tests: a slow disk, so appends that arrive meanwhile pile up for the next group.
            if !weir_shared::failpoint::pause_blocking("wal_persist", stop) {
                break;
            }
            let Some(result) = persist_until_space(&mut file, &group, &mut log, stop) else {
                break;
            };
            log.settle(group, result);
        }
        if reclaim {
            reclaim_segments(&mut file, &mut log);
        }
    }
    // Appends still queued are answered "stopped" as their senders drop.
    drop(rx);
    file.close();
}

/// Deletes the segments whose records the reported committed ends now cover.
fn reclaim_segments(file: &mut FileSink, log: &mut Log) {
    log.take_reported();
    for segment in log.reclaimable(file.active_segment()) {
        if !log.deleted(segment, file.delete(segment)) {
            break;
        }
    }
    log.forget_reclaimed();
}

/// Writes `group`; on a full volume (issue 60) retries the same write, backing off,
/// while reclaiming what uploads free, until it is written or fails otherwise. New
/// appends are refused meanwhile ([`WalWriter::check`]), and the ones already queued
/// wait behind this group, so every stream's order holds. `None` at the stop.
fn persist_until_space(
    file: &mut FileSink,
    group: &Group,
    log: &mut Log,
    stop: &CancellationToken,
) -> Option<Result<(SegmentId, u64), WalError>> {
    let mut backoff = NO_SPACE_FIRST_RETRY;
    loop {
        let result = match &log.failed {
            Some(e) => Err(e.clone()),
            None => file.persist(&group.data),
        };
        let Err(WalError::NoSpace(why)) = result else {
            log.space_returned();
            return Some(result);
        };
        log.out_of_space(why);
        reclaim_segments(file, log);
        if !sleep_unless_stopped(backoff, stop) {
            return None;
        }
        backoff = (backoff * 2).min(NO_SPACE_LAST_RETRY);
    }
}

/// Blocks the writer thread for `wait`, looking at `stop` every few milliseconds (the
/// thread cannot take the stop's wake-up from its queue without taking appends); false
/// at the stop.
fn sleep_unless_stopped(wait: std::time::Duration, stop: &CancellationToken) -> bool {
    let until = std::time::Instant::now() + wait;
    while !stop.is_cancelled() {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(std::time::Duration::from_millis(20)));
    }
    false
}

/// How soon a write refused for want of space is tried again, at first and at most.
const NO_SPACE_FIRST_RETRY: std::time::Duration = std::time::Duration::from_millis(50);
const NO_SPACE_LAST_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::file::{incarnation_dir, replay_dir};
    use bytes::Bytes;
    use std::time::Duration;
    use weir_shared::ids::{Epoch, NodeId, StreamEpoch};

    fn record(stream: u64, i: u64) -> WalRecord {
        WalRecord {
            stream: StreamId(stream),
            stream_epoch: StreamEpoch(1),
            base_offset: i,
            offset_count: 1,
            batches: Bytes::from(format!("{stream}-{i}")),
        }
    }

    // Issue 17: the file WAL's writer thread groups appends from many tasks, answers each
    // once it is durable, keeps each stream's submit order, and at the stop ends, closes
    // the WAL (its preallocated tail given back) and answers nothing after.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_thread_commits_concurrent_appends_in_order_and_ends_at_the_stop() {
        let root = tempfile::tempdir().expect("tmp");
        let node = NodeId::new("n");
        let sink = Sink::File(FileSink::create(root.path(), &node, Epoch(1), 1 << 20).expect("create"));
        let (tasks, stop) = (tokio_util::task::TaskTracker::new(), CancellationToken::new());
        let wal = WalWriter::start(sink, u64::MAX, &tasks, stop.clone()).expect("writer");
        let appenders = tokio_util::task::TaskTracker::new();
        let writers: Vec<_> = (0..8u64)
            .map(|s| {
                let wal = wal.clone();
                appenders.spawn(async move {
                    for i in 0..50 {
                        wal.append(&record(s, i)).await.expect("durable");
                    }
                })
            })
            .collect();
        for w in writers {
            w.await.expect("writer task");
        }
        stop.cancel();
        tasks.close();
        tokio::time::timeout(Duration::from_secs(10), tasks.wait())
            .await
            .expect("the writer thread ends at the stop");
        assert!(wal.append(&record(0, 50)).await.is_err(), "an append after the stop");
        let dir = incarnation_dir(root.path(), &node, Epoch(1));
        let replay = replay_dir(&dir).expect("replay");
        assert!(replay.damage.is_empty(), "{:?}", replay.damage);
        assert_eq!(replay.records.len(), 400);
        for s in 0..8 {
            let offsets: Vec<u64> = replay
                .records
                .iter()
                .filter(|r| r.stream == StreamId(s))
                .map(|r| r.base_offset)
                .collect();
            assert_eq!(offsets, (0..50).collect::<Vec<_>>(), "stream {s}");
        }
        // Closed: the segment ends at its records, and nothing is prepared ahead.
        let entries: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .map(|e| e.path())
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        let written =
            super::super::record::SEGMENT_HEADER_LEN + replay.records.iter().map(WalRecord::encoded_len).sum::<usize>();
        assert_eq!(std::fs::metadata(&entries[0]).expect("segment").len(), written as u64);
    }

    // Issue 23: a record's durability hook runs once it is durable, before its submitter
    // is answered, and whether or not anyone still waits for the answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_durability_hook_runs_even_when_nobody_waits() {
        let root = tempfile::tempdir().expect("tmp");
        let sink = Sink::File(FileSink::create(root.path(), &NodeId::new("n"), Epoch(1), 1 << 20).expect("create"));
        let (tasks, stop) = (tokio_util::task::TaskTracker::new(), CancellationToken::new());
        let wal = WalWriter::start(sink, u64::MAX, &tasks, stop.clone()).expect("writer");
        let (told, mut durable) = tokio::sync::watch::channel(0u64);
        let hook = |end: u64| -> Option<OnDurable> {
            let told = told.clone();
            Some(Box::new(move || told.send_modify(|d| *d = (*d).max(end))))
        };
        // Submitted, and the answer dropped unread.
        drop(wal.submit(&record(0, 0), hook(1)).await.expect("queued"));
        tokio::time::timeout(Duration::from_secs(10), durable.wait_for(|d| *d == 1))
            .await
            .expect("the hook ran with nobody waiting")
            .expect("watch");
        let answered = wal.submit(&record(0, 1), hook(2)).await.expect("queued");
        answered.await.expect("durable");
        assert_eq!(*durable.borrow(), 2, "the hook ran before the answer");
        stop.cancel();
    }

    /// D-23: only changed committed ends are reported. A segment is reclaimed once every
    /// stream in it is reported committed past its records; a stream not reported yet
    /// keeps its segments, and the ends of streams no live segment holds are forgotten.
    #[test]
    fn segments_are_reclaimed_from_reported_ends_and_unreported_streams_keep_theirs() {
        let mut log = Log {
            segments: BTreeMap::new(),
            failed: None,
            bytes: Arc::default(),
            fenced: Arc::default(),
            stalled: Stall::default(),
            reported: Arc::default(),
            committed: HashMap::new(),
        };
        let segment = |ends: &[(u64, u64)]| SegmentInfo {
            bytes: 1,
            stream_ends: ends.iter().map(|&(s, e)| (StreamId(s), e)).collect(),
        };
        log.segments.insert(1, segment(&[(1, 10), (2, 5)]));
        log.segments.insert(2, segment(&[(1, 20)]));
        log.segments.insert(3, segment(&[(3, 1)]));
        let report = |log: &Log, ends: &[(u64, u64)]| {
            log.reported
                .lock()
                .expect("lock")
                .extend(ends.iter().map(|&(s, e)| (StreamId(s), e)));
        };
        report(&log, &[(1, 20)]);
        log.take_reported();
        assert!(log.reclaimable(None).is_empty(), "stream 2 was never reported");
        report(&log, &[(2, 5)]);
        log.take_reported();
        assert_eq!(log.reclaimable(Some(3)), vec![1, 2], "never the boundary segment");
        for s in [1, 2] {
            assert!(log.deleted(s, Ok(())));
        }
        log.forget_reclaimed();
        assert!(log.committed.is_empty(), "no live segment holds streams 1 and 2");
    }
}
