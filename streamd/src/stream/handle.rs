//! One served stream at one stream epoch.

use super::tail::TailState;
use crate::partition::producers::ProducerTable;
use crate::partition::txns::StreamTxns;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::{watch, Mutex};
use weir_shared::backoff::Backoff;
use weir_shared::ids::{ObjectKey, StreamEpoch, StreamId};

/// One batch in the tail buffer, with its assigned offsets.
#[derive(Clone, Debug)]
pub struct Buffered {
    pub start: u64,
    pub end: u64,
    pub data: Bytes,
}

/// State changed under the stream's lock.
pub struct StreamInner {
    /// The next offset to assign.
    pub next_offset: u64,
    pub start_offset: u64,
    /// Batches not yet in a committed object, in offset order (some may not be durable yet).
    pub buffer: VecDeque<Buffered>,
    /// End of what the uploader has taken into an object (committed or in flight).
    pub uploaded_end: u64,
    /// End of what is committed in data objects.
    pub committed_end: u64,
    /// Closes under way, or whose `CloseStream` may still land: while any is, the
    /// stream takes no appends (an append acknowledged after a close landed is lost).
    pub closers: u32,
    /// A task is settling an unconfirmed close of the stream (it holds one closer).
    pub settling: bool,
    /// Idempotent producers' recent batches (duplicate and sequence checks).
    pub producers: ProducerTable,
    /// Transactions open in the stream, its last stable offset and the aborts behind
    /// it (issue 23).
    pub txns: StreamTxns,
    /// Bytes in `buffer`, kept so the append path need not sum it.
    buffered: u64,
}

impl StreamInner {
    pub fn buffered_bytes(&self) -> u64 {
        self.buffered
    }

    /// Adds batches at the end of the tail buffer.
    pub fn push(&mut self, batches: impl IntoIterator<Item = Buffered>) {
        for b in batches {
            self.buffered += b.data.len() as u64;
            self.buffer.push_back(b);
        }
    }

    /// Drops buffered batches now covered by committed objects.
    pub fn trim_committed(&mut self) {
        while self.buffer.front().is_some_and(|b| b.end <= self.committed_end) {
            if let Some(b) = self.buffer.pop_front() {
                self.buffered -= b.data.len() as u64;
            }
        }
    }
}

/// A stream this node owns and has opened at `epoch`.
pub struct StreamHandle {
    pub id: StreamId,
    pub name: String,
    pub epoch: StreamEpoch,
    /// The Kafka leader epoch this open started, stamped into every batch appended
    /// (issue 22); −1 when metad recorded none.
    pub leader_epoch: i32,
    pub inner: Mutex<StreamInner>,
    /// The durable end offset; readers wait on it.
    pub durable: watch::Sender<u64>,
    /// The committed end offset; a trim above it waits on it.
    pub committed: watch::Sender<u64>,
    /// `inner.start_offset`, readable without the lock (the view follower compares it).
    pub start: AtomicU64,
    serving: AtomicBool,
    /// The committed end this epoch opened at. The producer and transaction state is
    /// rebuilt from the data below it on first need, not at open (`Node::tail_state`):
    /// opening stays one metadata entry for many streams (D-23).
    pub opened_at: u64,
    /// The rebuilt tail state is in `inner`; until then appends, markers and
    /// `read_committed` reads wait for it.
    tail_loaded: AtomicBool,
    /// Held by the one rebuild of the tail state.
    pub tail_loading: Mutex<()>,
    /// Set while the rebuild fails: when it may be tried again, and its backoff.
    tail_retry: std::sync::Mutex<Option<(std::time::Instant, Backoff)>>,
    /// Where the last read stopped inside a committed range, so a sequential reader's
    /// next read starts there rather than at the range's first batch.
    read_hint: std::sync::Mutex<Option<ReadHint>>,
}

/// A read stopped before the batch at `offset`, which begins `at` bytes into the range
/// stored at (`key`, `pos`). Objects never change, so the position stays right for as
/// long as the range exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadHint {
    pub key: ObjectKey,
    pub pos: u64,
    pub offset: u64,
    pub at: usize,
}

impl StreamHandle {
    pub fn new(
        id: StreamId,
        name: String,
        epoch: StreamEpoch,
        leader_epoch: i32,
        start_offset: u64,
        committed_end: u64,
    ) -> Self {
        Self {
            id,
            name,
            epoch,
            leader_epoch,
            inner: Mutex::new(StreamInner {
                next_offset: committed_end,
                start_offset,
                buffer: VecDeque::new(),
                uploaded_end: committed_end,
                committed_end,
                closers: 0,
                settling: false,
                producers: Default::default(),
                txns: Default::default(),
                buffered: 0,
            }),
            durable: watch::channel(committed_end).0,
            committed: watch::channel(committed_end).0,
            start: AtomicU64::new(start_offset),
            serving: AtomicBool::new(true),
            opened_at: committed_end,
            tail_loaded: AtomicBool::new(false),
            tail_loading: Mutex::new(()),
            tail_retry: std::sync::Mutex::new(None),
            read_hint: std::sync::Mutex::new(None),
        }
    }

    pub fn tail_loaded(&self) -> bool {
        self.tail_loaded.load(Ordering::Acquire)
    }

    /// When a failed rebuild of the tail state may be tried again; `None` unless one failed.
    pub fn tail_retry_due(&self) -> Option<std::time::Instant> {
        self.tail_retry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(due, _)| *due)
    }

    /// Records a failed rebuild (`Some((first, max))`, the backoff's bounds) and returns
    /// the wait before the next attempt; or, with `None`, a successful one, returning
    /// whether one had failed before.
    pub fn tail_failed(
        &self,
        bounds: Option<(std::time::Duration, std::time::Duration)>,
    ) -> Option<std::time::Duration> {
        let mut retry = self.tail_retry.lock().unwrap_or_else(|p| p.into_inner());
        let Some((first, max)) = bounds else {
            return retry.take().map(|_| std::time::Duration::ZERO);
        };
        let (due, backoff) = retry.get_or_insert_with(|| (std::time::Instant::now(), Backoff::new(first, max)));
        let wait = backoff.next_wait();
        *due = std::time::Instant::now() + wait;
        Some(wait)
    }

    /// Installs the rebuilt tail state; nothing was appended before it (appends wait
    /// for it), so it replaces the empty state whole.
    pub fn install_tail(&self, inner: &mut StreamInner, tail: TailState) {
        inner.producers = tail.producers;
        inner.txns = tail.txns;
        self.tail_loaded.store(true, Ordering::Release);
    }

    /// Where the batch at `offset` begins in the range at (`key`, `pos`), if the last
    /// read stopped right there.
    pub fn read_hint(&self, key: &ObjectKey, pos: u64, offset: u64) -> Option<usize> {
        let hint = self.read_hint.lock().unwrap_or_else(|p| p.into_inner());
        hint.as_ref()
            .filter(|h| h.key == *key && h.pos == pos && h.offset == offset)
            .map(|h| h.at)
    }

    pub fn remember_read(&self, hint: ReadHint) {
        *self.read_hint.lock().unwrap_or_else(|p| p.into_inner()) = Some(hint);
    }

    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// Stops serving (ownership moved, or the node stops); wakes waiting readers.
    pub fn stop(&self) {
        self.serving.store(false, Ordering::Release);
        self.durable.send_modify(|_| {});
    }

    pub fn durable_end(&self) -> u64 {
        *self.durable.borrow()
    }

    /// Advances the durable end; appends complete in WAL order, so it only grows.
    pub fn mark_durable(&self, end: u64) {
        self.durable.send_if_modified(|d| {
            if end > *d {
                *d = end;
                true
            } else {
                false
            }
        });
    }
}
