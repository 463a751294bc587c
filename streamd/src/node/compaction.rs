//! The compactor (D-20): each owner rewrites runs of its streams' small ranges (each
//! in a multi-stream upload object) into per-stream objects of the target size, as
//! AutoMQ compacts stream-set objects into stream objects, and swaps them in with a
//! compare-and-set `CompactObjects`. The replaced objects leave the bucket through GC
//! once no stream references them and its grace period has passed.
//!
//! Which ranges are rewritten: in each maximal run of consecutive ranges smaller than
//! the target, a window is merged only when its largest range is no larger than the
//! rest together, so every rewrite of a byte at least doubles the range holding it:
//! a byte is rewritten at most log2(target / upload size) times, and a stream keeps
//! about ceil(bytes / target) ranges plus a few per size class below it.

use super::Node;
use crate::error::StreamdError;
use crate::object::format::ObjectBuilder;
use crate::stream::StreamHandle;
use bytes::Bytes;
use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use weir_meta::client::{ClientError, Consistency};
use weir_meta::model::{Applied, Command, CompactedObject, ObjectRange, RejectCode, ReplacedRange};
use weir_shared::batch::split_batches;
use weir_shared::ids::{ObjectKey, Offset};

/// Most ranges one `CompactObjects` replaces (keeps log entries small).
pub const MAX_RUN: usize = 1_000;
/// Ranges read per index page.
const PAGE: u32 = 1_000;
/// Ranges fetched at once per stream while compacting (less than reads use:
/// compaction is background work).
const FETCH_CONCURRENCY: usize = 4;
/// Streams planned or compacted at once.
const STREAM_CONCURRENCY: usize = 4;
/// Most bytes of source ranges one batch of a pass holds in memory.
const BATCH_BYTES: u64 = 64 << 20;

/// Source ranges read for a batch, by (object key, position in the object).
type Sources = HashMap<(String, u64), Bytes>;

/// Cuts `planned` into batches whose windows hold at most `budget` bytes (a stream
/// larger than that is a batch of its own).
fn batches<T>(planned: Vec<(T, Vec<Vec<ObjectRange>>)>, budget: u64) -> Vec<Vec<(T, Vec<Vec<ObjectRange>>)>> {
    let mut out: Vec<Vec<(T, Vec<Vec<ObjectRange>>)>> = Vec::new();
    let mut bytes = 0u64;
    for (stream, windows) in planned {
        let size: u64 = windows.iter().flatten().map(|r| r.len).sum();
        if out.is_empty() || (bytes + size > budget && !out.last().is_some_and(|b| b.is_empty())) {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        out.last_mut().expect("pushed above").push((stream, windows));
    }
    out
}

/// The windows of `ranges` (a stream's ranges in offset order) worth merging.
pub fn plan(ranges: &[ObjectRange], target: u64) -> Vec<Range<usize>> {
    let mut windows = Vec::new();
    let mut i = 0;
    while i < ranges.len() {
        if ranges[i].len >= target {
            i += 1;
            continue;
        }
        let run_end = (i..ranges.len())
            .find(|&j| ranges[j].len >= target)
            .unwrap_or(ranges.len());
        split_dominated(ranges, i..run_end, &mut windows);
        i = run_end;
    }
    // Each window is replaced by one command; long ones are cut.
    windows
        .into_iter()
        .flat_map(|w| {
            let (start, end) = (w.start, w.end);
            (start..end)
                .step_by(MAX_RUN)
                .map(move |s| s..(s + MAX_RUN).min(end))
                .filter(|w| w.len() >= 2)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Adds `run` to `out` when no range in it outweighs the others together; otherwise
/// leaves the heaviest range alone and looks at what is on either side of it.
fn split_dominated(ranges: &[ObjectRange], run: Range<usize>, out: &mut Vec<Range<usize>>) {
    if run.len() < 2 {
        return;
    }
    let total: u64 = ranges[run.clone()].iter().map(|r| r.len).sum();
    let (heaviest, max) = run
        .clone()
        .map(|i| (i, ranges[i].len))
        .max_by_key(|&(i, len)| (len, std::cmp::Reverse(i)))
        .expect("a run of at least two");
    if max <= total - max {
        out.push(run);
    } else {
        split_dominated(ranges, run.start..heaviest, out);
        split_dominated(ranges, heaviest + 1..run.end, out);
    }
}

impl Node {
    /// One pass over the served streams; returns the ranges replaced. Every stream's
    /// windows are planned first. Then, in batches of at most [`BATCH_BYTES`] of
    /// windows, each source object is read once, with one GET of the span the batch
    /// needs, and cut into the batch's ranges. An upload object holds a range of nearly
    /// every stream of its node, so reading per stream would GET each object once per
    /// stream (the soak: ~100,000 GETs, over 200 s, per pass over 500 streams).
    pub async fn compact_streams(&self) -> usize {
        let started = std::time::Instant::now();
        let target = self.tunables.compaction_target_bytes;
        let planned: Vec<(Arc<StreamHandle>, Vec<Vec<ObjectRange>>)> = futures::stream::iter(self.all_streams())
            .map(|handle| async move {
                match self.stream_ranges(&handle).await {
                    Ok(ranges) => {
                        let windows: Vec<Vec<ObjectRange>> =
                            plan(&ranges, target).into_iter().map(|w| ranges[w].to_vec()).collect();
                        Some((handle, windows))
                    }
                    Err(e) => {
                        tracing::warn!(stream = %handle.name, error = %e, "compaction failed; will retry");
                        None
                    }
                }
            })
            .buffer_unordered(STREAM_CONCURRENCY)
            .filter_map(|p| async move { p.filter(|(_, w)| !w.is_empty()) })
            .collect()
            .await;
        let streams = planned.len();
        let mut replaced = 0;
        for batch in batches(planned, BATCH_BYTES) {
            let fetched = &self.fetch_sources(&batch).await;
            replaced += futures::stream::iter(batch)
                .map(|(handle, windows)| async move {
                    let mut n = 0;
                    for window in windows {
                        if !handle.is_serving() || self.fenced.is_cancelled() {
                            break;
                        }
                        match self.compact_window(&handle, &window, fetched).await {
                            Ok(r) => n += r,
                            Err(e) => {
                                tracing::warn!(stream = %handle.name, error = %e, "compaction failed; will retry");
                                break;
                            }
                        }
                    }
                    n
                })
                .buffer_unordered(STREAM_CONCURRENCY)
                .fold(0, |sum, n| async move { sum + n })
                .await;
        }
        crate::metrics::metrics()
            .compaction_pass_seconds
            .observe(started.elapsed().as_secs_f64());
        if replaced > 0 {
            tracing::debug!(
                streams,
                replaced,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "compaction pass"
            );
        }
        replaced
    }

    /// The bytes of the ranges in `batch`, by (object, position): one ranged GET per
    /// source object, of the span from its first needed range to the end of its last.
    /// An object that cannot be read or fails a checksum is left out: its streams read
    /// their ranges one by one in [`Node::compact_window`] and fail there alone.
    async fn fetch_sources(&self, batch: &[(Arc<StreamHandle>, Vec<Vec<ObjectRange>>)]) -> Sources {
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
                ranges
                    .into_iter()
                    .map(|r| ((key.clone(), r.pos), span.slice((r.pos - from) as usize..(r.pos - from + r.len) as usize), r.crc))
                    // A range failing its checksum is read again, and refused, on its own.
                    .filter(|(_, bytes, crc)| crc32c::crc32c(bytes) == *crc)
                    .map(|(at, bytes, _)| (at, bytes))
                    .collect::<Vec<_>>()
            })
            .buffer_unordered(FETCH_CONCURRENCY)
            .flat_map(futures::stream::iter)
            .collect()
            .await
    }

    /// Every committed range of the stream from its start.
    async fn stream_ranges(&self, handle: &StreamHandle) -> Result<Vec<ObjectRange>, StreamdError> {
        let mut at = handle.inner.lock().await.start_offset;
        let mut out = Vec::new();
        loop {
            let page = self
                .metad
                .read_ranges(
                    handle.id,
                    Offset(at),
                    false,
                    PAGE,
                    Consistency::AtLeast(self.view.applied_index()),
                )
                .await
                .map_err(|e| StreamdError::Unavailable(format!("reading the object index: {e}")))?;
            let Some(last) = page.ranges.last() else { return Ok(out) };
            at = last.end.0;
            out.extend(page.ranges);
            if !page.more {
                return Ok(out);
            }
        }
    }

    /// Rewrites `window` into per-stream objects of the target size and commits the
    /// swap; the ranges replaced (0 when another change got there first).
    async fn compact_window(
        &self,
        handle: &StreamHandle,
        window: &[ObjectRange],
        sources: &Sources,
    ) -> Result<usize, StreamdError> {
        let target = self.tunables.compaction_target_bytes;
        let mut written: Vec<CompactedObject> = Vec::new();
        let mut pending: Vec<Bytes> = Vec::new();
        let (mut pending_start, mut pending_bytes) = (window[0].start.0, 0u64);
        let mut chunks = futures::stream::iter(window.iter().cloned())
            .map(|range| async move {
                let bytes = match sources.get(&(range.key.0.clone(), range.pos)) {
                    Some(b) => b.clone(),
                    None => self.note_damage(handle.id, &range, self.fetch_range_uncached(&range).await)?,
                };
                Ok::<_, StreamdError>((range, bytes))
            })
            .buffered(FETCH_CONCURRENCY);
        while let Some(fetched) = chunks.next().await {
            let (range, bytes) = fetched?;
            let batches =
                split_batches(&bytes).map_err(|e| StreamdError::Corrupt(format!("object {}: {e}", range.key)));
            let batches = self.note_damage(handle.id, &range, batches)?;
            for (header, raw) in batches {
                pending.push(bytes.slice_ref(raw));
                pending_bytes += raw.len() as u64;
                if pending_bytes >= target {
                    let end = header.base_offset as u64 + header.offset_count();
                    written.push(self.put_compacted(handle, pending_start, end, &pending).await?);
                    pending.clear();
                    (pending_start, pending_bytes) = (end, 0);
                }
            }
        }
        let window_end = window[window.len() - 1].end.0;
        if !pending.is_empty() {
            written.push(self.put_compacted(handle, pending_start, window_end, &pending).await?);
        }
        if weir_shared::failpoint::is_set("compaction_before_commit") {
            // Tests: the compactor dies with its objects written and nothing committed.
            tracing::error!("failpoint: exiting in the middle of a compaction");
            std::process::exit(86);
        }
        weir_shared::failpoint::pause("compaction_commit").await;
        let replaced: Vec<ReplacedRange> = window
            .iter()
            .map(|r| ReplacedRange {
                start: r.start,
                end: r.end,
                key: r.key.clone(),
            })
            .collect();
        let command = Command::CompactObjects {
            stream: handle.id,
            replaced,
            objects: written.clone(),
        };
        match self.metad.propose(&self.proposer(), command).await {
            Ok((index, Ok(Applied::Done))) => {
                // Readers of this node go to the new objects from now on.
                self.ranges.forget(handle.id);
                self.ranges.insert(handle.id, written.iter().map(|o| o.range.clone()));
                let m = crate::metrics::metrics();
                m.compacted_ranges.inc_by(window.len() as u64);
                m.compacted_bytes.inc_by(written.iter().map(|o| o.range.len).sum());
                tracing::info!(stream = %handle.name, replaced = window.len(), objects = written.len(), start = window[0].start.0, end = window_end, log_index = index, "compacted ranges");
                Ok(window.len())
            }
            Ok((_, Ok(other))) => Err(StreamdError::Internal(format!(
                "unexpected answer to CompactObjects: {other:?}"
            ))),
            Ok((_, Err(r))) => {
                // Refused, so nothing references what was written: delete it now.
                for o in &written {
                    let path = object_store::path::Path::from(o.range.key.0.as_str());
                    if let Err(e) = self.store.delete(&path).await {
                        tracing::debug!(object_key = %o.range.key, error = %e, "cannot delete refused compaction output; GC will");
                    }
                }
                match r.code {
                    RejectCode::Fenced | RejectCode::Superseded => {
                        self.fence(&r.message);
                        Err(StreamdError::Fenced)
                    }
                    _ => {
                        tracing::debug!(stream = %handle.name, rejection = %r, "compaction refused; the ranges changed");
                        Ok(0)
                    }
                }
            }
            // The outcome is unknown: what was written may be committed, so GC decides.
            Err(ClientError::Unavailable(e)) => Err(StreamdError::Unavailable(format!("metadata log: {e}"))),
            Err(e) => Err(StreamdError::Unavailable(format!("metadata log: {e}"))),
        }
    }

    /// PUTs one per-stream object holding `start..end` of the stream.
    async fn put_compacted(
        &self,
        handle: &StreamHandle,
        start: u64,
        end: u64,
        batches: &[Bytes],
    ) -> Result<CompactedObject, StreamdError> {
        let mut builder = ObjectBuilder::new();
        let chunk = builder.add(handle.id, handle.epoch, start, end, batches).clone();
        let (object, _) = builder.finish();
        let key = ObjectKey(format!(
            "data/{}/{:020}/compacted/{}-{start:020}-{:08x}.wdo",
            self.me.node,
            self.me.epoch.0,
            handle.id.0,
            rand::random::<u32>()
        ));
        let size = object.len() as u64;
        let path = object_store::path::Path::from(key.0.as_str());
        self.store
            .put(&path, PutPayload::from_bytes(object))
            .await
            .map_err(|e| StreamdError::Unavailable(format!("writing compacted object {key}: {e}")))?;
        let max_timestamp = batches
            .iter()
            .map(|b| weir_shared::batch::max_timestamp(b))
            .max()
            .unwrap_or(weir_meta::model::NO_TIMESTAMP);
        Ok(CompactedObject {
            size,
            range: ObjectRange {
                key,
                start: Offset(start),
                end: Offset(end),
                pos: chunk.pos,
                len: chunk.len,
                crc: chunk.crc,
                max_timestamp,
            },
        })
    }
}

/// Runs a compaction pass every `every` until `cancel`.
pub async fn compaction_loop(node: Arc<Node>, every: Duration, cancel: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = node.fenced.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if node.is_admitted() {
            node.compact_streams().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_reads_its_sources_in_batches_within_the_memory_budget() {
        // Streams whose windows hold 40, 40, 30, 100 and 10 bytes, a budget of 80.
        let planned: Vec<(usize, Vec<Vec<ObjectRange>>)> = [40u64, 40, 30, 100, 10]
            .iter()
            .enumerate()
            .map(|(i, &len)| (i, vec![ranges(&[len / 2, len - len / 2])]))
            .collect();
        let got: Vec<Vec<usize>> = batches(planned, 80)
            .into_iter()
            .map(|b| b.into_iter().map(|(i, _)| i).collect())
            .collect();
        // A stream over the budget is a batch of its own; no stream is split or lost.
        assert_eq!(got, vec![vec![0, 1], vec![2], vec![3], vec![4]]);
    }

    fn ranges(lens: &[u64]) -> Vec<ObjectRange> {
        lens.iter()
            .enumerate()
            .map(|(i, &len)| ObjectRange {
                key: ObjectKey(format!("data/{i}")),
                start: Offset(i as u64),
                end: Offset(i as u64 + 1),
                pos: 0,
                len,
                crc: 0,
                max_timestamp: 0,
            })
            .collect()
    }

    #[test]
    fn small_uploads_are_merged_and_full_ranges_are_left_alone() {
        assert_eq!(plan(&ranges(&[10, 10, 10, 10]), 100), vec![0..4]);
        // A full range splits runs; a lone small range is left.
        assert_eq!(
            plan(&ranges(&[10, 10, 100, 10, 200, 10, 10, 10]), 100),
            vec![0..2, 5..8]
        );
        assert!(plan(&ranges(&[100, 5, 100]), 100).is_empty());
    }

    #[test]
    fn a_range_that_outweighs_the_rest_is_not_rewritten_for_them() {
        // 60 > 5 + 5: the big partial waits until the small ones add up.
        assert_eq!(plan(&ranges(&[60, 5, 5]), 100), vec![1..3]);
        assert_eq!(plan(&ranges(&[60, 30, 30]), 100), vec![0..3]);
        // Dominance is checked on each side of the heaviest range.
        assert_eq!(plan(&ranges(&[4, 4, 90, 1]), 100), vec![0..2]);
    }

    #[test]
    fn long_runs_are_cut_into_commands_of_at_most_max_run_ranges() {
        let windows = plan(&ranges(&vec![1; MAX_RUN * 2 + 1]), 1 << 30);
        assert_eq!(windows, vec![0..MAX_RUN, MAX_RUN..2 * MAX_RUN]);
    }

    #[test]
    fn repeated_compaction_rewrites_each_byte_a_bounded_number_of_times() {
        // Simulate: every round one upload of 1 or 2 units arrives, then the plan runs and each
        // window becomes one range of the window's size (cut at the target).
        let target = 64;
        let mut lens: Vec<u64> = Vec::new();
        let mut rewritten = 0u64;
        for upload in 0..4096u64 {
            // Uploads vary a little in size, as they do.
            lens.push(1 + upload % 2);
            let windows = plan(&ranges(&lens), target);
            for w in windows.iter().rev() {
                let total: u64 = lens[w.clone()].iter().sum();
                rewritten += total;
                let mut pieces = vec![target; (total / target) as usize];
                if !total.is_multiple_of(target) {
                    pieces.push(total % target);
                }
                lens.splice(w.clone(), pieces);
            }
        }
        let bytes: u64 = lens.iter().sum();
        assert_eq!(bytes, 4096 * 3 / 2);
        assert!(
            rewritten <= bytes * 8,
            "each byte rewritten at most log2(64) + 2 times: {rewritten}"
        );
        assert!(
            lens.len() as u64 <= bytes.div_ceil(target) + 8,
            "ranges stay near bytes / target: {}",
            lens.len()
        );
    }
}
