//! Rebuilding a stream's idempotent-producer and transaction state from its stored
//! batches when the stream is first written (or read `read_committed`) after an open,
//! so duplicate detection, producer fences and open transactions survive moves and
//! failover. Not at open: opening many streams stays a few metadata entries, and an
//! idle stream never reads its tail (D-23). Only the tail is read, however large the
//! range holding it (a compacted object): the oldest range needed is read from where
//! the tail starts, to its first whole batch. A transaction open since before the tail
//! is found through the last range's summary (its LSO), and read from there.

use super::Node;
use crate::error::StreamdError;
use crate::partition::txns::StreamTxns;
use crate::stream::{StreamHandle, TailState};
use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_meta::model::ObjectRange;
use weir_shared::batch::split_batches;
use weir_shared::ids::StreamId;

/// RR-WAL-7: the first wait before a failed rebuild is tried again, and the longest.
const TAIL_RETRY_FIRST: Duration = Duration::from_millis(250);
const TAIL_RETRY_MAX: Duration = Duration::from_secs(30);
/// Tails rebuilt at once after opens.
const PREFETCH_CONCURRENCY: usize = 16;

impl Node {
    /// Rebuilds `handle`'s producer and transaction state if it is not yet: once per
    /// open, by the first caller that needs it (or the prefetch after an open); the
    /// others wait for it. A rebuild that fails is tried again on a doubling backoff
    /// (RR-WAL-7), each attempt logged, and until one succeeds this answers
    /// `Unavailable`: nothing is written on top of state that is not restored. Damaged
    /// data rebuilds nothing (it is never served, and must not keep the stream closed).
    pub async fn tail_state(&self, handle: &StreamHandle) -> Result<(), StreamdError> {
        if handle.tail_loaded() {
            return Ok(());
        }
        let opening = || {
            StreamdError::Unavailable(format!(
                "stream '{}' is opening: its producer state is not restored yet",
                handle.name
            ))
        };
        if handle.tail_retry_due().is_some_and(|due| due > Instant::now()) {
            return Err(opening());
        }
        let _loading = handle.tail_loading.lock().await;
        if handle.tail_loaded() {
            return Ok(());
        }
        // Another attempt failed while this one waited: it waits for the next turn.
        if handle.tail_retry_due().is_some_and(|due| due > Instant::now()) {
            return Err(opening());
        }
        match self.load_tail(handle).await {
            Ok(()) => {
                if handle.tail_failed(None).is_some() {
                    tracing::info!(stream = %handle.name, "producer state restored; the stream takes appends");
                }
                Ok(())
            }
            Err(why) => {
                let wait = handle
                    .tail_failed(Some((TAIL_RETRY_FIRST, TAIL_RETRY_MAX)))
                    .unwrap_or(TAIL_RETRY_FIRST);
                tracing::warn!(stream = %handle.name, error = %why, retry_in = ?wait, "cannot open stream yet; will retry");
                Err(opening())
            }
        }
    }

    /// Rebuilds the tail state of streams just opened, a few at a time, so their first
    /// appends find it ready (an append that comes first rebuilds its own), and keeps
    /// trying, on each stream's backoff, those whose rebuild fails.
    pub fn prefetch_tails(self: &Arc<Self>, handles: Vec<Arc<StreamHandle>>) {
        let handles: Vec<_> = handles.into_iter().filter(|h| !h.tail_loaded()).collect();
        if handles.is_empty() {
            return;
        }
        let node = self.clone();
        self.tasks.spawn("open", "restore producer state", None, async move {
            futures::stream::iter(handles)
                .for_each_concurrent(PREFETCH_CONCURRENCY, |h| {
                    let node = node.clone();
                    async move {
                        while h.is_serving() && !node.fenced.is_cancelled() && node.tail_state(&h).await.is_err() {
                            let due = h.tail_retry_due().unwrap_or_else(|| Instant::now() + TAIL_RETRY_FIRST);
                            tokio::select! {
                                _ = tokio::time::sleep_until(due.into()) => {}
                                _ = node.fenced.cancelled() => {}
                            }
                        }
                    }
                })
                .await;
        });
    }

    /// Rebuilds and installs `handle`'s tail state; the caller holds `tail_loading`.
    async fn load_tail(&self, handle: &StreamHandle) -> Result<(), String> {
        let rebuilt = if weir_shared::failpoint::fails("open_read") {
            // Tests: the tail's read fails as an unreachable object store would.
            Err(StreamdError::Unavailable("failpoint open_read".into()))
        } else if handle.opened_at == 0 {
            // Nothing was ever committed: nothing to rebuild from.
            Ok(TailState::default())
        } else {
            self.rebuild_tail_state(handle.id, handle.opened_at).await
        };
        let mut tail = match rebuilt {
            Ok(tail) => tail,
            Err(e @ StreamdError::Corrupt(_)) => {
                tracing::error!(stream = %handle.name, error = %e, "producer state not rebuilt from damaged data; duplicates of earlier idempotent batches are not detected");
                TailState::default()
            }
            Err(e) => return Err(format!("cannot rebuild producer state: {e}")),
        };
        let mut inner = handle.inner.lock().await;
        // A range holding the start can carry trimmed producers' batches.
        tail.forget_below(inner.start_offset);
        handle.install_tail(&mut inner, tail);
        Ok(())
    }

    /// Replays the batches of the last `--producer-state-bytes` of the stream's
    /// committed data, below `end` (read from the object index's tail), and the
    /// transactions open at `end` however long ago they began.
    pub async fn rebuild_tail_state(&self, stream: StreamId, end: u64) -> Result<TailState, StreamdError> {
        let mut tail = TailState::default();
        let wanted = self.tunables.producer_state_bytes;
        let ranges = self.tail_ranges(stream, end, wanted).await?;
        let lso = ranges.last().and_then(|r| r.txns.lso_at_end);
        // Of the oldest range, only what the tail needs.
        let covered: u64 = ranges.iter().map(|r| r.len).sum();
        let skip = covered.saturating_sub(wanted);
        // Where the replay surely began: a tail cut inside its oldest range began
        // somewhere before that range's end.
        let replayed_from = ranges.first().map(|r| if skip > 0 { r.end.0 } else { r.start.0 });
        self.replay_ranges(stream, ranges, skip, &mut tail).await?;
        // The oldest transaction still open began before the tail: read from its start.
        if let (Some(lso), Some(from)) = (lso, replayed_from) {
            if lso < from {
                tail.txns = self.txns_from(stream, lso, end).await?;
            }
        }
        // What is committed is summarised in the index; only later markers are kept.
        tail.txns.forget_below(end);
        Ok(tail)
    }

    /// The transactions open at `end`, the stream's committed end: replayed from the
    /// LSO the last range ends with (nothing is open when it has none).
    pub async fn txns_at(&self, stream: StreamId, end: u64) -> Result<StreamTxns, StreamdError> {
        let last = self.tail_ranges(stream, end, 1).await?;
        let Some(lso) = last.last().and_then(|r| r.txns.lso_at_end) else {
            return Ok(StreamTxns::default());
        };
        let mut txns = self.txns_from(stream, lso, end).await?;
        txns.forget_below(end);
        Ok(txns)
    }

    /// Replays the committed ranges from the one holding `from` up to `end` into the
    /// transaction state alone.
    async fn txns_from(&self, stream: StreamId, from: u64, end: u64) -> Result<StreamTxns, StreamdError> {
        // Retention may have trimmed the start of a transaction left open: what remains
        // of it is read.
        let start = self
            .view
            .with(|s| s.streams.get(&stream).map(|r| r.start_offset.0))
            .unwrap_or(0);
        let mut ranges = Vec::new();
        let mut at = from.max(start);
        while at < end {
            let range = self.range_at(stream, at).await?;
            at = range.end.0;
            ranges.push(range);
        }
        let mut replayed = TailState::default();
        self.replay_ranges(stream, ranges, 0, &mut replayed).await?;
        Ok(replayed.txns)
    }

    /// Fetches `ranges` (the first from `skip` bytes on, to its first whole batch)
    /// several at a time, as a tail of many small ranges would otherwise cost one round
    /// trip each, and replays them in order.
    async fn replay_ranges(
        &self,
        stream: StreamId,
        ranges: Vec<ObjectRange>,
        skip: u64,
        into: &mut TailState,
    ) -> Result<(), StreamdError> {
        let mut chunks = futures::stream::iter(ranges.into_iter().enumerate())
            .map(|(i, range)| async move {
                let chunk = if i == 0 && skip > 0 {
                    self.fetch_range_tail(&range, skip).await
                } else {
                    self.fetch_range(&range).await
                };
                let chunk = self.note_damage(stream, &range, chunk)?;
                Ok::<_, StreamdError>((range, chunk))
            })
            .buffered(super::read::FETCH_CONCURRENCY);
        while let Some(fetched) = chunks.next().await {
            let (range, chunk) = fetched?;
            let parsed = split_batches(&chunk).map_err(|e| StreamdError::Corrupt(format!("object {}: {e}", range.key)));
            let parsed = self.note_damage(stream, &range, parsed)?;
            into.replay(parsed.iter().map(|(h, b)| (h, *b)));
        }
        Ok(())
    }
}
