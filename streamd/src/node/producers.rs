//! Rebuilding a stream's idempotent-producer and transaction state from its stored
//! batches when the stream is opened, so duplicate detection, producer fences and open
//! transactions survive moves and failover. Only the tail is read, however large the
//! range holding it (a compacted object): the oldest range needed is read from where
//! the tail starts, to its first whole batch. A transaction open since before the tail
//! is found through the last range's summary (its LSO), and read from there.

use super::Node;
use crate::error::StreamdError;
use crate::stream::TailState;
use crate::txn::partition::StreamTxns;
use futures::StreamExt;
use weir_meta::model::ObjectRange;
use weir_shared::batch::split_batches;
use weir_shared::ids::StreamId;

impl Node {
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
