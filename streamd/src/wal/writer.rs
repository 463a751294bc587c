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

use super::file_writer::run_file;
use super::group_commit::{Log, Request};
use super::record::WalRecord;
use super::stall::Stall;
use super::{Sink, WalError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use weir_shared::ids::StreamId;

pub use super::group_commit::OnDurable;

/// Bounded queue of appends waiting for the writer.
const QUEUE: usize = 4096;

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
        let log = Log::new(
            writer.bytes.clone(),
            writer.fenced.clone(),
            writer.stalled.clone(),
            writer.committed.clone(),
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::file::FileSink;
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
}
