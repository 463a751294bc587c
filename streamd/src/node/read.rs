//! Reads by offset: from the in-memory tail, the block cache, or ranged GETs of
//! committed data objects; a read at the end can wait for new data.

use super::Node;
use crate::error::StreamdError;
use crate::object::range_reads;
use crate::stream::{ReadHint, StreamHandle};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use weir_meta::model::{AbortedTxn, ObjectRange};
use weir_shared::batch::{batches_from, split_batches_by_header};
use weir_shared::ids::StreamId;

/// Ranged GETs one read or open has in flight at once.
pub const FETCH_CONCURRENCY: usize = 16;
/// Most committed ranges one read answers from (each can be a separate object).
const MAX_RANGES_PER_READ: usize = 256;

/// Adds to `out` the buffered batches from `offset` (the batch holding it first)
/// below `durable_end`, while they fit in `max_bytes` (at least one batch when `out`
/// is empty and `max_bytes` is `Budget::AtLeastOne`) and follow on without a gap.
fn append_tail(
    buffer: &std::collections::VecDeque<crate::stream::Buffered>,
    offset: u64,
    durable_end: u64,
    max_bytes: Budget,
    out: &mut Gathered,
) {
    let mut at = offset;
    for b in buffer.iter().skip_while(|b| b.end <= offset) {
        if b.start > at || b.end > durable_end || max_bytes.full(out.len, b.data.len()) {
            break;
        }
        out.push(&b.data, &b.data);
        at = b.end;
    }
}

/// A stream whose committed ranges a read walks: one served here, whose handle
/// remembers where reads stopped, or one recovering from a failed owner, read-only.
pub(super) struct CommittedStream<'a> {
    pub id: StreamId,
    pub name: &'a str,
    /// Its committed end when the read began.
    pub end: u64,
    pub handle: Option<&'a StreamHandle>,
}

/// A read's answer as it is gathered: slices of cached ranges and buffered batches,
/// joined into one buffer only when they are not already one, so a read inside one
/// cached range is answered without a copy (issue 17).
#[derive(Default)]
pub(super) struct Gathered {
    /// Each piece is a span of its parent; pieces that continue each other in the
    /// same parent are one span.
    spans: Vec<(Bytes, std::ops::Range<usize>)>,
    len: usize,
}

impl Gathered {
    /// Adds `part`, which lies inside `parent`.
    fn push(&mut self, parent: &Bytes, part: &[u8]) {
        let from = part.as_ptr() as usize - parent.as_ptr() as usize;
        let span = from..from + part.len();
        self.len += part.len();
        if let Some((last, range)) = self.spans.last_mut() {
            if last.as_ptr() == parent.as_ptr() && last.len() == parent.len() && range.end == span.start {
                range.end = span.end;
                return;
            }
        }
        self.spans.push((parent.clone(), span));
    }

    pub(super) fn into_bytes(self) -> Bytes {
        match &self.spans[..] {
            [] => Bytes::new(),
            [(parent, range)] => parent.slice(range.clone()),
            spans => {
                let mut out = BytesMut::with_capacity(self.len);
                for (parent, range) in spans {
                    out.extend_from_slice(&parent[range.clone()]);
                }
                out.freeze()
            }
        }
    }
}

/// A read's byte limit.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub bytes: usize,
    /// The first batch is returned even when it alone is over `bytes`, so a reader of
    /// batches larger than its limit still makes progress (Kafka's rule).
    pub at_least_one: bool,
}

impl Budget {
    /// Whether `next` more bytes would not fit after `len` gathered.
    fn full(&self, len: usize, next: usize) -> bool {
        (len > 0 || !self.at_least_one) && len + next > self.bytes
    }
}

/// A read's answer.
#[derive(Debug, Clone)]
pub struct ReadResult {
    pub batches: Bytes,
    pub next_offset: u64,
    pub start_offset: u64,
    pub end_offset: u64,
    /// Below it every transaction is decided.
    pub last_stable_offset: u64,
    /// In `read_committed`: the aborted transactions with data in `batches`.
    pub aborted: Vec<AbortedTxn>,
}

/// Which records a read may return (Kafka's `isolation_level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Up to the durable end (the high watermark).
    ReadUncommitted,
    /// Up to the last stable offset, told the aborted transactions (issue 23).
    ReadCommitted,
}

impl Node {
    /// Reads whole batches from `offset`, at most `max_bytes` (but at least one batch
    /// when `at_least_one`), waiting up to `wait` when `offset` is the durable end (in
    /// `read_committed`, the last stable offset).
    pub async fn read(
        &self,
        stream: &str,
        offset: u64,
        max_bytes: usize,
        at_least_one: bool,
        wait: Duration,
        isolation: Isolation,
    ) -> Result<ReadResult, StreamdError> {
        let budget = Budget {
            bytes: if at_least_one { max_bytes.max(1) } else { max_bytes },
            at_least_one,
        };
        let handle = match self.stream(stream) {
            Ok(handle) => handle,
            // Its owner failed and this incarnation takes its WAL over: what is
            // committed is readable meanwhile (issue 60).
            Err(not_owner @ StreamdError::NotOwner { .. }) => match self.recovering(stream) {
                Some(recovering) => {
                    return self
                        .read_recovering(stream, recovering, offset, budget, wait, isolation)
                        .await
                }
                None => return Err(not_owner),
            },
            Err(e) => return Err(e),
        };
        // The last stable offset needs the transactions open in the stream.
        if isolation == Isolation::ReadCommitted {
            self.tail_state(&handle).await?;
        }
        let mut durable_rx = handle.durable.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let end = handle.durable_end();
            let (start, lso) = {
                let inner = handle.inner.lock().await;
                // SD-INT-6: a stopping node's stream being moved refuses reads as
                // draining; its next owner serves them.
                if inner.closers > 0 && self.terminating.load(std::sync::atomic::Ordering::Acquire) {
                    return Err(StreamdError::Draining);
                }
                (inner.start_offset, inner.txns.lso(end))
            };
            if offset < start || offset > end {
                return Err(StreamdError::OffsetOutOfRange { offset, start, end });
            }
            let limit = match isolation {
                Isolation::ReadUncommitted => end,
                Isolation::ReadCommitted => lso,
            };
            if offset < limit {
                let batches = self.read_at(&handle, offset, limit, budget).await?;
                let next_offset = last_end(&batches).unwrap_or(offset);
                let aborted = match isolation {
                    Isolation::ReadUncommitted => Vec::new(),
                    Isolation::ReadCommitted => self.aborted_in(&handle, offset, next_offset).await?,
                };
                return Ok(ReadResult {
                    batches,
                    next_offset,
                    start_offset: start,
                    end_offset: end,
                    last_stable_offset: lso,
                    aborted,
                });
            }
            // At the tail: wait for an append, the deadline, or the stream stopping.
            let woke = tokio::select! {
                r = durable_rx.changed() => r.is_ok(),
                _ = tokio::time::sleep_until(deadline) => false,
                _ = self.fenced.cancelled() => false,
                _ = self.reads_end.cancelled() => {
                    return Err(StreamdError::Unavailable("the node is shutting down; read again".into()))
                }
            };
            if !handle.is_serving() {
                return Err(StreamdError::NotOwner {
                    stream: stream.to_string(),
                    owner: None,
                });
            }
            if !woke {
                return Ok(ReadResult {
                    batches: Bytes::new(),
                    next_offset: offset,
                    start_offset: start,
                    end_offset: end,
                    last_stable_offset: lso,
                    aborted: Vec::new(),
                });
            }
        }
    }

    /// Reads from `offset` up to `durable_end` (or a lower limit: the last stable
    /// offset, which is always a batch's start).
    async fn read_at(
        &self,
        handle: &Arc<StreamHandle>,
        offset: u64,
        durable_end: u64,
        max_bytes: Budget,
    ) -> Result<Bytes, StreamdError> {
        let mut out = Gathered::default();
        let mut at = offset;
        loop {
            // The tail buffer covers offsets from its first batch on.
            {
                let inner = handle.inner.lock().await;
                if inner.buffer.front().is_some_and(|b| b.start <= at) {
                    append_tail(&inner.buffer, at, durable_end, max_bytes, &mut out);
                    return Ok(out.into_bytes());
                }
            }
            // Below the buffer: committed ranges. A read that reaches the committed end
            // goes on, so it fills its budget however the records are split between
            // objects and memory, even when an upload moved them from one to the other
            // while this read fetched (the buffer then starts past where it stopped).
            let committed = CommittedStream {
                id: handle.id,
                name: &handle.name,
                end: handle.inner.lock().await.committed_end,
                handle: Some(handle),
            };
            match self
                .read_committed(&committed, at, durable_end, max_bytes, &mut out)
                .await?
            {
                Some(reached) if reached > at && reached < durable_end => at = reached,
                _ => return Ok(out.into_bytes()),
            }
        }
    }

    /// Adds committed ranges from `offset` to `out` until the budget (at least one
    /// batch), `durable_end` or the start of the tail buffer: found first (mostly in
    /// the range cache), then fetched several at a time, and cut in order. Answers
    /// the offset it reached when the read may go on past it, `None` when it must stop.
    pub(super) async fn read_committed(
        &self,
        stream: &CommittedStream<'_>,
        offset: u64,
        durable_end: u64,
        max_bytes: Budget,
        out: &mut Gathered,
    ) -> Result<Option<u64>, StreamdError> {
        let id = stream.id;
        // Marked damage is refused at once, and a read from below it stops at it.
        self.check_damage(id, stream.name, offset)?;
        let damaged_from = self.damage(id).map(|d| d.from.0).filter(|f| *f > offset);
        let stop = stream.end.min(durable_end).min(damaged_from.unwrap_or(u64::MAX));
        if offset >= stop {
            return Ok(None);
        }
        let mut ranges = Vec::new();
        let (mut at, mut planned) = (offset, 0u64);
        loop {
            let range = self.range_at(id, at).await?;
            planned += range.len;
            at = range.end.0;
            ranges.push(range);
            if planned >= max_bytes.bytes as u64 || at >= stop || ranges.len() >= MAX_RANGES_PER_READ {
                break;
            }
        }
        if let Some(last) = ranges.last() {
            self.read_ahead_after(id, last, stop);
        }
        let mut chunks = futures::stream::iter(ranges)
            .map(|range| async move {
                let fetched = self.fetch_range(&range).await;
                if matches!(fetched, Err(StreamdError::ObjectGone(_))) {
                    // Looked up before a compaction replaced it: the next read rereads
                    // the index, linearizably.
                    self.ranges.forget_unsettled(id);
                }
                let chunk = self.note_damage(id, &range, fetched)?;
                Ok::<_, StreamdError>((range, chunk))
            })
            .buffered(FETCH_CONCURRENCY);
        let mut at = offset;
        while let Some(fetched) = chunks.next().await {
            let (range, chunk) = fetched?;
            // Checked whole against the range's CRC when it was fetched, so headers
            // alone split it; from where the last read stopped, if it stopped here.
            let from = stream
                .handle
                .and_then(|h| h.read_hint(&range.key, range.pos, at))
                .unwrap_or(0);
            for batch in batches_from(&chunk, from) {
                let batch = batch.map_err(|e| StreamdError::Corrupt(format!("object {}: {e}", range.key)));
                let (pos, header, bytes) = self.note_damage(id, &range, batch)?;
                let start = header.base_offset as u64;
                if start + header.offset_count() <= at {
                    continue;
                }
                if start >= durable_end {
                    return Ok(None);
                }
                if max_bytes.full(out.len, bytes.len()) {
                    if let Some(handle) = stream.handle {
                        handle.remember_read(ReadHint {
                            key: range.key.clone(),
                            pos: range.pos,
                            offset: start,
                            at: pos,
                        });
                    }
                    return Ok(None);
                }
                out.push(&chunk, bytes);
            }
            at = range.end.0;
        }
        let more = out.len < max_bytes.bytes && damaged_from.is_none_or(|f| at < f);
        Ok(more.then_some(at))
    }

    /// A reader in `range` most likely reads the next committed range next: fetch it
    /// into the cache now, if the index cache knows it and it is below `stop`.
    fn read_ahead_after(&self, stream: StreamId, range: &ObjectRange, stop: u64) {
        if range.end.0 >= stop {
            return;
        }
        if let Some(next) = self.ranges.find(stream, range.end.0) {
            self.range_reads.read_ahead(&next);
        }
    }

    /// One committed range's bytes, from the cache or a ranged GET, checked against its CRC.
    pub async fn fetch_range(&self, range: &ObjectRange) -> Result<Bytes, StreamdError> {
        self.range_reads.get(range).await
    }

    /// One committed range's bytes by a ranged GET, checked against its CRC, without
    /// filling the cache (background work such as compaction reads old data once).
    pub async fn fetch_range_uncached(&self, range: &ObjectRange) -> Result<Bytes, StreamdError> {
        range_reads::get_checked(self.store.as_ref(), range).await
    }

    /// Bytes `span` of object `key` by one ranged GET.
    pub async fn fetch_span(&self, key: &str, span: std::ops::Range<u64>) -> Result<Bytes, StreamdError> {
        range_reads::get_span(self.store.as_ref(), key, span).await
    }

    /// The whole batches of `range` after its first `skip` bytes: a ranged GET of the
    /// rest, from its first whole batch (each batch's CRC is checked; the range's own
    /// CRC covers bytes not read). Metered for tests in `tail_bytes_read`.
    pub async fn fetch_range_tail(&self, range: &ObjectRange, skip: u64) -> Result<Bytes, StreamdError> {
        let bytes = self
            .fetch_span(&range.key.0, range.pos + skip..range.pos + range.len)
            .await?;
        crate::metrics::metrics().tail_bytes_read.inc_by(bytes.len() as u64);
        match weir_shared::batch::first_whole_batch(&bytes, range.end.0) {
            Some(at) => Ok(bytes.slice(at..)),
            // A tail shorter than one batch: the whole range, then.
            None => self.fetch_range(range).await,
        }
    }
}

/// The offset after the last batch in `batches`.
pub(super) fn last_end(batches: &[u8]) -> Option<u64> {
    split_batches_by_header(batches)
        .ok()?
        .last()
        .map(|(h, _)| h.base_offset as u64 + h.offset_count())
}

#[cfg(test)]
mod tests {
    use super::{append_tail, Budget, Gathered};
    use crate::stream::Buffered;
    use bytes::Bytes;
    use std::collections::VecDeque;

    /// Batches of 10 bytes each covering offsets `[i*2, i*2+2)`.
    fn buffer(from: u64, n: u64) -> VecDeque<Buffered> {
        (from..from + n)
            .map(|i| Buffered {
                start: i * 2,
                end: i * 2 + 2,
                data: Bytes::from(vec![i as u8; 10]),
            })
            .collect()
    }

    fn soft(bytes: usize) -> Budget {
        Budget {
            bytes,
            at_least_one: true,
        }
    }

    #[test]
    fn the_tail_fills_the_budget_from_the_batch_holding_the_offset() {
        let mut out = Gathered::default();
        append_tail(&buffer(0, 10), 5, 20, soft(35), &mut out);
        // Offset 5 is in the batch at 4..6; three whole batches fit in 35 bytes.
        assert_eq!(&out.into_bytes()[..], &[[2u8; 10], [3; 10], [4; 10]].concat()[..]);
    }

    #[test]
    fn the_tail_stops_at_the_durable_end_and_at_a_gap() {
        let mut out = Gathered::default();
        append_tail(&buffer(0, 10), 0, 6, soft(1 << 20), &mut out);
        assert_eq!(out.len, 30, "only batches below the durable end");
        // A read that ended at offset 4 finds a buffer starting at 6: nothing is skipped over.
        let committed = Bytes::from_static(b"committed");
        let mut out = Gathered::default();
        out.push(&committed, &committed);
        append_tail(&buffer(3, 5), 4, 20, soft(1 << 20), &mut out);
        assert_eq!(&out.into_bytes()[..], b"committed");
    }

    #[test]
    fn an_empty_read_takes_one_batch_even_over_its_budget() {
        let mut out = Gathered::default();
        append_tail(&buffer(0, 3), 0, 6, soft(1), &mut out);
        assert_eq!(out.len, 10);
    }

    // Issue 19: a Fetch's share of its byte budget is never exceeded, even by one batch.
    #[test]
    fn an_exact_budget_may_return_nothing() {
        let exact = |bytes| Budget {
            bytes,
            at_least_one: false,
        };
        let mut out = Gathered::default();
        append_tail(&buffer(0, 3), 0, 6, exact(9), &mut out);
        assert_eq!(out.len, 0);
        append_tail(&buffer(0, 3), 0, 6, exact(25), &mut out);
        assert_eq!(out.len, 20);
    }

    // Issue 17: a read inside one cached range is a slice of it, not a copy.
    #[test]
    fn batches_that_follow_each_other_in_one_range_are_one_slice() {
        let range = Bytes::from((0u8..100).collect::<Vec<_>>());
        let mut out = Gathered::default();
        out.push(&range, &range[10..30]);
        out.push(&range, &range[30..60]);
        let got = out.into_bytes();
        assert_eq!(&got[..], &range[10..60]);
        assert_eq!(got.as_ptr(), range[10..].as_ptr(), "no copy");
    }

    #[test]
    fn pieces_of_several_parents_or_with_a_hole_are_joined_in_order() {
        let (a, b) = (Bytes::from_static(b"abcdef"), Bytes::from_static(b"ghij"));
        let mut out = Gathered::default();
        out.push(&a, &a[0..2]);
        out.push(&a, &a[3..4]);
        out.push(&b, &b[..]);
        assert_eq!(out.spans.len(), 3);
        assert_eq!(&out.into_bytes()[..], b"abdghij");
        assert!(Gathered::default().into_bytes().is_empty());
    }
}
