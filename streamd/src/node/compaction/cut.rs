//! Reading a batch's source objects (one ranged GET per object) and cutting each
//! window's records into pieces of the target size: the read half of a pass, apart
//! from the pass's plan and from what it writes.

use super::{txns, Piece, Sources, FETCH_CONCURRENCY};
use crate::error::StreamdError;
use crate::node::Node;
use crate::stream::StreamHandle;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use weir_meta::model::ObjectRange;
use weir_shared::batch::split_batches_by_header;

impl Node {
    /// The bytes of the ranges in `batch`, by (object, position): one ranged GET per
    /// source object, of the span from its first needed range to the end of its last.
    /// An object that cannot be read or fails a checksum is left out: its streams read
    /// their ranges one by one in [`Node::cut_window`] and fail there alone.
    pub(super) async fn fetch_sources(&self, batch: &[(Arc<StreamHandle>, Vec<Vec<ObjectRange>>)]) -> Sources {
        // Owned, so the fetches' futures borrow nothing from the batch (they are polled
        // inside a spawned task).
        let mut by_object: HashMap<String, Vec<ObjectRange>> = HashMap::new();
        for range in batch.iter().flat_map(|(_, windows)| windows.iter().flatten()) {
            by_object.entry(range.key.0.clone()).or_default().push(range.clone());
        }
        futures::stream::iter(by_object)
            .map(|(key, ranges)| async move {
                let from = ranges.iter().map(|r| r.pos).min().unwrap_or(0);
                let to = ranges.iter().map(|r| r.pos + r.len).max().unwrap_or(0);
                self.compaction_pace.take(to - from).await;
                let span = match self.fetch_span(&key, from..to).await {
                    Ok(span) => span,
                    Err(e) => {
                        tracing::debug!(object_key = %key, error = %e, "compaction source not read; its ranges are read one by one");
                        return Vec::new();
                    }
                };
                let m = crate::metrics::metrics();
                m.compaction_source_reads.inc();
                m.compaction_source_ranges.inc_by(ranges.len() as u64);
                // Checksummed on a blocking thread: a span can be tens of MiB.
                tokio::task::spawn_blocking(move || {
                    ranges
                        .into_iter()
                        .map(|r| ((key.clone(), r.pos), span.slice((r.pos - from) as usize..(r.pos - from + r.len) as usize), r.crc))
                        // A range failing its checksum is read again, and refused, on its own.
                        .filter(|(_, bytes, crc)| crc32c::crc32c(bytes) == *crc)
                        .map(|(at, bytes, _)| (at, bytes))
                        .collect::<Vec<_>>()
                })
                .await
                .unwrap_or_default()
            })
            .buffer_unordered(FETCH_CONCURRENCY)
            .flat_map(futures::stream::iter)
            .collect()
            .await
    }

    /// Every committed range of the stream from its start.
    pub(super) async fn stream_ranges(&self, handle: &StreamHandle) -> Result<Vec<ObjectRange>, StreamdError> {
        let mut at = handle.inner.lock().await.start_offset;
        let mut out = Vec::new();
        loop {
            let page = self.index_page(handle.id, at).await?;
            let Some(last) = page.ranges.last() else { return Ok(out) };
            at = last.end.0;
            out.extend(page.ranges);
            if !page.more {
                return Ok(out);
            }
        }
    }

    /// The window's batches, cut into pieces of the target size (the last may be
    /// smaller). The bytes are slices of the sources; a range missing from them is
    /// read on its own.
    pub(super) async fn cut_window(
        &self,
        handle: &StreamHandle,
        window: &[ObjectRange],
        sources: &Sources,
    ) -> Result<Vec<Piece>, StreamdError> {
        let target = self.tunables.compaction_target_bytes;
        let mut pieces = Vec::new();
        let new_piece = |at: u64| Piece {
            start: at,
            end: at,
            batches: Vec::new(),
            bytes: 0,
            txns: Default::default(),
        };
        let mut piece = new_piece(window[0].start.0);
        let mut summaries = txns::SummaryCutter::new(self.lso_before(handle, &window[0]).await?);
        let mut chunks = futures::stream::iter(window.iter().cloned())
            .map(|range| async move {
                let bytes = match sources.get(&(range.key.0.clone(), range.pos)) {
                    Some(b) => b.clone(),
                    None => {
                        self.compaction_pace.take(range.len).await;
                        self.note_damage(handle.id, &range, self.fetch_range_uncached(&range).await)?
                    }
                };
                Ok::<_, StreamdError>((range, bytes))
            })
            .buffered(FETCH_CONCURRENCY);
        while let Some(fetched) = chunks.next().await {
            let (range, bytes) = fetched?;
            // Each source range was checked whole against its CRC when it was read.
            let batches = split_batches_by_header(&bytes)
                .map_err(|e| StreamdError::Corrupt(format!("object {}: {e}", range.key)));
            let batches = self.note_damage(handle.id, &range, batches)?;
            summaries.begin_range(&range);
            for (header, raw) in batches {
                summaries.batch(&header, raw);
                piece.batches.push(bytes.slice_ref(raw));
                piece.bytes += raw.len() as u64;
                if piece.bytes >= target {
                    let end = header.base_offset as u64 + header.offset_count();
                    piece.end = end;
                    piece.txns = summaries.cut(piece.start, end);
                    pieces.push(std::mem::replace(&mut piece, new_piece(end)));
                }
            }
        }
        if !piece.batches.is_empty() {
            piece.end = window[window.len() - 1].end.0;
            piece.txns = summaries.cut(piece.start, piece.end);
            pieces.push(piece);
        }
        Ok(pieces)
    }

    /// The LSO at the end of the range before `first` (none at the stream's start):
    /// where the transactions open at the window's start began, at the latest.
    async fn lso_before(&self, handle: &StreamHandle, first: &ObjectRange) -> Result<Option<u64>, StreamdError> {
        let start = handle.inner.lock().await.start_offset;
        if first.start.0 <= start {
            return Ok(None);
        }
        Ok(self.range_at(handle.id, first.start.0 - 1).await?.txns.lso_at_end)
    }
}
