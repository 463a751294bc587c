//! Rebuilding a stream's idempotent-producer and transaction state from its stored
//! batches when the stream is opened, so duplicate detection, producer fences and open
//! transactions survive moves and failover. Only the tail is read, however large the
//! range holding it (a compacted object): the oldest range needed is read from where
//! the tail starts, to its first whole batch.

use super::Node;
use crate::error::StreamdError;
use crate::stream::TailState;
use futures::StreamExt;
use weir_shared::batch::split_batches;
use weir_shared::ids::StreamId;

impl Node {
    /// Replays the batches of the last `--producer-state-bytes` of the stream's
    /// committed data, below `end` (read from the object index's tail).
    pub async fn rebuild_tail_state(&self, stream: StreamId, end: u64) -> Result<TailState, StreamdError> {
        let mut tail = TailState::default();
        let wanted = self.tunables.producer_state_bytes;
        let ranges = self.tail_ranges(stream, end, wanted).await?;
        // Of the oldest range, only what the tail needs.
        let covered: u64 = ranges.iter().map(|r| r.len).sum();
        let skip = covered.saturating_sub(wanted);
        // Fetched several at a time (a tail of many small ranges would otherwise cost
        // one round trip each), replayed in order.
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
            tail.replay(parsed.iter().map(|(h, b)| (h, *b)));
        }
        Ok(tail)
    }
}
