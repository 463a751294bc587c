//! The compactor (D-20): each owner rewrites runs of its streams' small ranges (each
//! in a multi-stream upload object) into objects of the target size, and swaps them in
//! with compare-and-set log entries. The replaced objects leave the bucket through GC
//! once no stream references them and its grace period has passed.
//!
//! A pass plans every stream's windows ([`plan`]), reads each source object once per
//! batch, cuts each window into pieces at the target size, and lays a batch out as a
//! few `CompactStreams` entries and objects ([`layout`]). Its reads and writes go at
//! the pass's rate ([`io_limit`]).

mod io_limit;
mod layout;
mod plan;
mod txns;

use super::Node;
use crate::error::StreamdError;
use crate::object::format::ObjectBuilder;
use crate::object::pace::paced;
use crate::stream::StreamHandle;
use bytes::Bytes;
use futures::StreamExt;
use layout::{layout, EntryLayout, WindowShape, MAX_COMMAND_RANGES};
use object_store::{ObjectStore, PutPayload};
use plan::{batches, plan};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_meta::model::{Applied, Command, NewObject, ObjectRange, RejectCode, ReplacedRange, StreamSwap};
use weir_meta::view::ChangedStreams;
use weir_shared::batch::split_batches_by_header;
use weir_shared::ids::{ObjectKey, Offset, StreamId};

/// Objects fetched or written at once while compacting (less than reads use:
/// compaction is background work).
const FETCH_CONCURRENCY: usize = 4;
/// Streams planned or cut at once.
const STREAM_CONCURRENCY: usize = 4;
/// Most bytes of source ranges one batch of a pass holds in memory.
const BATCH_BYTES: u64 = 64 << 20;

/// Source ranges read for a batch, by (object key, position in the object).
type Sources = HashMap<(String, u64), Bytes>;

/// A window's records, cut at batch boundaries into pieces: every piece but the last
/// holds at least the target.
struct CutWindow {
    handle: Arc<StreamHandle>,
    replaced: Vec<ObjectRange>,
    pieces: Vec<Piece>,
}

struct Piece {
    start: u64,
    end: u64,
    batches: Vec<Bytes>,
    bytes: u64,
    /// The transactions as the piece leaves them (issue 23).
    txns: weir_meta::model::RangeTxns,
}

/// What a pass did, for its log line and the soak.
#[derive(Default)]
struct PassStats {
    streams: usize,
    replaced: usize,
    entries: usize,
    objects: usize,
    plan: Duration,
    read: Duration,
    write: Duration,
    commit: Duration,
}

impl Node {
    /// One pass over the served streams; returns the ranges replaced. Every stream's
    /// windows are planned first. Then, in batches of at most [`BATCH_BYTES`] of
    /// windows, each source object is read once, with one GET of the span the batch
    /// needs, and cut into the batch's ranges. An upload object holds a range of nearly
    /// every stream of its node, so reading per stream would GET each object once per
    /// stream (the soak: ~100,000 GETs, over 200 s, per pass over 500 streams).
    ///
    /// Only `candidates` are planned: streams whose rows changed since they were last
    /// planned (D-23). A stream planned with nothing to compact leaves them until its
    /// row changes again (an upload's commit, a trim); one whose plan failed stays.
    pub async fn compact_streams(&self, candidates: &mut HashSet<StreamId>) -> usize {
        let started = Instant::now();
        let target = self.tunables.compaction_target_bytes;
        // Only streams open here with two ranges or more have anything to compact: a
        // stream just opened, or written once, costs the pass nothing.
        candidates.retain(|id| {
            self.view.with(|s| {
                s.streams.get(id).is_some_and(|r| {
                    r.owner.as_ref() == Some(&self.me)
                        && r.state == weir_meta::model::StreamState::Open
                        && r.commits >= 2
                })
            })
        });
        let handles: Vec<Arc<StreamHandle>> = candidates.iter().filter_map(|id| self.handle(*id)).collect();
        let planned: Vec<(Arc<StreamHandle>, Vec<Vec<ObjectRange>>)> = futures::stream::iter(handles)
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
            .filter_map(|p| async move { p })
            .collect()
            .await;
        // Planned: looked at again once its row changes (this pass's swaps change it).
        for (handle, _) in &planned {
            candidates.remove(&handle.id);
        }
        let planned: Vec<_> = planned.into_iter().filter(|(_, w)| !w.is_empty()).collect();
        let source_bytes: u64 = planned
            .iter()
            .flat_map(|(_, windows)| windows.iter().flatten())
            .map(|r| r.len)
            .sum();
        let rate = io_limit::pass_rate(
            self.tunables.compaction_max_bytes_per_sec,
            source_bytes,
            self.tunables.compaction_interval,
        );
        self.compaction_pace.set_rate(rate);
        crate::metrics::metrics().compaction_rate.set(rate as i64);
        let mut stats = PassStats {
            streams: planned.len(),
            plan: started.elapsed(),
            ..PassStats::default()
        };
        for batch in batches(planned, BATCH_BYTES) {
            if self.fenced.is_cancelled() || self.compaction_pace.is_stopped() {
                break;
            }
            let read = Instant::now();
            let fetched = &self.fetch_sources(&batch).await;
            let windows: Vec<CutWindow> = futures::stream::iter(
                batch
                    .into_iter()
                    .flat_map(|(handle, windows)| windows.into_iter().map(move |w| (handle.clone(), w))),
            )
            .map(|(handle, window)| async move {
                if !handle.is_serving() {
                    return None;
                }
                match self.cut_window(&handle, &window, fetched).await {
                    Ok(pieces) => Some(CutWindow {
                        handle,
                        replaced: window,
                        pieces,
                    }),
                    Err(e) => {
                        tracing::warn!(stream = %handle.name, error = %e, "compaction failed; will retry");
                        None
                    }
                }
            })
            .buffered(STREAM_CONCURRENCY)
            .filter_map(|w| async move { w })
            .collect()
            .await;
            stats.read += read.elapsed();
            match self.commit_batch(windows, &mut stats).await {
                Ok(()) => {}
                Err(StreamdError::Fenced) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "compaction failed; will retry");
                    break;
                }
            }
        }
        crate::metrics::metrics()
            .compaction_pass_seconds
            .observe(started.elapsed().as_secs_f64());
        if stats.replaced > 0 {
            tracing::debug!(
                streams = stats.streams,
                source_bytes,
                rate,
                replaced = stats.replaced,
                entries = stats.entries,
                objects = stats.objects,
                plan_ms = stats.plan.as_millis() as u64,
                read_ms = stats.read.as_millis() as u64,
                write_ms = stats.write.as_millis() as u64,
                commit_ms = stats.commit.as_millis() as u64,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "compaction pass"
            );
        }
        stats.replaced
    }

    /// Lays a batch's windows out as entries and commits them one after another.
    async fn commit_batch(&self, windows: Vec<CutWindow>, stats: &mut PassStats) -> Result<(), StreamdError> {
        let shapes: Vec<WindowShape> = windows
            .iter()
            .map(|w| WindowShape {
                stream: w.handle.id,
                replaced: w.replaced.len(),
                pieces: w.pieces.iter().map(|p| p.bytes).collect(),
            })
            .collect();
        for entry in layout(&shapes, self.tunables.compaction_target_bytes, MAX_COMMAND_RANGES) {
            if self.fenced.is_cancelled() {
                return Err(StreamdError::Fenced);
            }
            if self.compaction_pace.is_stopped() {
                break;
            }
            let replaced = self.commit_entry(&windows, &entry, stats).await?;
            stats.replaced += replaced;
        }
        Ok(())
    }

    /// The bytes of the ranges in `batch`, by (object, position): one ranged GET per
    /// source object, of the span from its first needed range to the end of its last.
    /// An object that cannot be read or fails a checksum is left out: its streams read
    /// their ranges one by one in [`Node::cut_window`] and fail there alone.
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
    async fn stream_ranges(&self, handle: &StreamHandle) -> Result<Vec<ObjectRange>, StreamdError> {
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
    async fn cut_window(
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

    /// Writes one entry's objects and proposes its `CompactStreams`; the ranges replaced.
    async fn commit_entry(
        &self,
        windows: &[CutWindow],
        entry: &EntryLayout,
        stats: &mut PassStats,
    ) -> Result<usize, StreamdError> {
        let write = Instant::now();
        // Built on a blocking thread: copying and checksumming up to the target (64 MiB)
        // per object takes tens of milliseconds, which on a runtime worker would stall
        // the appends queued behind it (issue 17: the produce p99 while compaction ran).
        let jobs: Vec<(ObjectKey, Vec<Member>)> = entry
            .objects
            .iter()
            .map(|members| {
                let key = self.compacted_key(windows, members);
                let members = members
                    .iter()
                    .map(|&(w, p)| {
                        let (window, piece) = (&windows[w], &windows[w].pieces[p]);
                        Member {
                            window: w,
                            piece: p,
                            stream: window.handle.id,
                            epoch: window.handle.epoch,
                            start: piece.start,
                            end: piece.end,
                            bytes: piece.bytes,
                            batches: piece.batches.clone(),
                            txns: piece.txns.clone(),
                        }
                    })
                    .collect();
                (key, members)
            })
            .collect();
        let built = tokio::task::spawn_blocking(move || {
            jobs.into_iter()
                .map(|(key, members)| build(key, members))
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| StreamdError::Internal(format!("building compacted objects: {e}")))?;
        // Each window's new ranges, in piece order.
        let mut ranges: HashMap<usize, Vec<(usize, ObjectRange)>> = HashMap::new();
        let mut objects = Vec::with_capacity(built.len());
        for (key, object, pieces) in built {
            for (w, p, range) in pieces {
                ranges.entry(w).or_default().push((p, range));
            }
            objects.push((key, object));
        }
        let new: Vec<NewObject> = objects
            .iter()
            .map(|(key, object)| NewObject {
                key: key.clone(),
                size: object.len() as u64,
            })
            .collect();
        weir_shared::failpoint::pause("compaction_write").await;
        // SD-INT-7: a stopping node starts no new compaction write; the sources stay
        // referenced and nothing is lost.
        if self.compaction_pace.is_stopped() {
            return Ok(0);
        }
        tracing::debug!(objects = objects.len(), "writing compacted objects");
        futures::stream::iter(objects)
            .map(|(key, object)| async move {
                let path = object_store::path::Path::from(key.0.as_str());
                self.store
                    .put_opts(&path, PutPayload::from_bytes(object), paced(&self.compaction_pace))
                    .await
                    .map_err(|e| StreamdError::Unavailable(format!("writing compacted object {key}: {e}")))
            })
            .buffer_unordered(FETCH_CONCURRENCY)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        stats.write += write.elapsed();
        stats.objects += new.len();
        if weir_shared::failpoint::is_set("compaction_before_commit") {
            // Tests: the compactor dies with its objects written and nothing committed.
            tracing::error!("failpoint: exiting in the middle of a compaction");
            std::process::exit(86);
        }
        weir_shared::failpoint::pause("compaction_commit").await;

        let swaps: Vec<StreamSwap> = entry
            .windows
            .iter()
            .map(|&w| {
                let mut pieces = ranges.remove(&w).unwrap_or_default();
                pieces.sort_by_key(|(p, _)| *p);
                StreamSwap {
                    stream: windows[w].handle.id,
                    replaced: windows[w].replaced.iter().map(ReplacedRange::from).collect(),
                    ranges: pieces.into_iter().map(|(_, r)| r).collect(),
                }
            })
            .collect();
        let commit = Instant::now();
        let m = crate::metrics::metrics();
        m.compaction_commands.inc();
        m.compaction_objects.inc_by(new.len() as u64);
        stats.entries += 1;
        let command = Command::CompactStreams {
            objects: new.clone(),
            swaps: swaps.clone(),
        };
        let outcome = self.metad.propose(&self.proposer(), command).await;
        stats.commit += commit.elapsed();
        match outcome {
            Ok((index, Ok(Applied::Compacted { skipped }))) => {
                let (mut replaced, mut written, mut bytes) = (0, 0, 0);
                for swap in swaps.iter().filter(|s| !skipped.contains(&s.stream)) {
                    // Readers of this node go to the new objects from now on; ranges the
                    // view does not show replaced yet are read linearizably.
                    self.ranges.forget_unsettled(swap.stream);
                    self.ranges.insert(swap.stream, swap.ranges.iter().cloned());
                    replaced += swap.replaced.len();
                    written += swap.ranges.len();
                    bytes += swap.ranges.iter().map(|r| r.len).sum::<u64>();
                }
                m.compacted_ranges.inc_by(replaced as u64);
                m.compacted_bytes.inc_by(bytes);
                tracing::info!(
                    streams = swaps.len() - skipped.len(),
                    skipped = skipped.len(),
                    replaced,
                    written,
                    objects = new.len(),
                    bytes,
                    log_index = index,
                    "compacted ranges"
                );
                Ok(replaced)
            }
            Ok((_, Ok(other))) => Err(StreamdError::Internal(format!(
                "unexpected answer to CompactStreams: {other:?}"
            ))),
            Ok((_, Err(r))) => {
                // What was written is left to GC, which deletes it only once the index
                // shows it unreferenced: a refusal does not prove that an earlier attempt
                // of this same proposal, whose answer was lost (the client then asks the
                // next replica), did not commit it. That attempt's swap would also be
                // why this one was refused, so the ranges this node holds for the
                // streams are read again from the index.
                for swap in &swaps {
                    self.ranges.forget_unsettled(swap.stream);
                }
                match r.code {
                    RejectCode::Fenced | RejectCode::Superseded => {
                        self.fence(&r.message);
                        Err(StreamdError::Fenced)
                    }
                    _ => {
                        tracing::debug!(rejection = %r, "compaction refused; the ranges changed");
                        Ok(0)
                    }
                }
            }
            // The outcome is unknown: what was written may be committed, so GC decides,
            // and the swap may have replaced what this node holds for the streams.
            Err(e) => {
                for swap in &swaps {
                    self.ranges.forget_unsettled(swap.stream);
                }
                Err(StreamdError::Unavailable(format!("metadata log: {e}")))
            }
        }
    }

    /// A new object's key: a per-stream object is named after its stream and first
    /// offset; one shared by several streams is a stream set.
    fn compacted_key(&self, windows: &[CutWindow], members: &[(usize, usize)]) -> ObjectKey {
        let prefix = format!("data/{}/{:020}/compacted", self.me.node, self.me.epoch.0);
        match members {
            [(w, p)] => ObjectKey(format!(
                "{prefix}/{}-{:020}-{:08x}.wdo",
                windows[*w].handle.id.0,
                windows[*w].pieces[*p].start,
                rand::random::<u32>()
            )),
            _ => ObjectKey(format!("{prefix}/set-{:016x}.wdo", rand::random::<u64>())),
        }
    }
}

/// One piece of a window, owned, to be written into a compacted object.
struct Member {
    window: usize,
    piece: usize,
    stream: weir_shared::ids::StreamId,
    epoch: weir_shared::ids::StreamEpoch,
    start: u64,
    end: u64,
    bytes: u64,
    batches: Vec<Bytes>,
    txns: weir_meta::model::RangeTxns,
}

/// Builds one compacted object from its members: the object, and each member's new
/// range by (window, piece).
fn build(key: ObjectKey, members: Vec<Member>) -> (ObjectKey, Bytes, Vec<(usize, usize, ObjectRange)>) {
    let mut builder = ObjectBuilder::with_capacity(members.iter().map(|m| m.bytes as usize).sum());
    let mut ranges = Vec::with_capacity(members.len());
    for m in members {
        let chunk = builder.add(m.stream, m.epoch, m.start, m.end, &m.batches).clone();
        let max_timestamp = m
            .batches
            .iter()
            .map(|b| weir_shared::batch::max_timestamp(b))
            .max()
            .unwrap_or(weir_meta::model::NO_TIMESTAMP);
        ranges.push((
            m.window,
            m.piece,
            ObjectRange {
                key: key.clone(),
                start: Offset(m.start),
                end: Offset(m.end),
                pos: chunk.pos,
                len: chunk.len,
                crc: chunk.crc,
                max_timestamp,
                txns: m.txns,
            },
        ));
    }
    let (object, _) = builder.finish();
    (key, object, ranges)
}

/// Starts a compaction pass every `--compaction-interval-ms` (`every`) until `cancel`.
/// Passes start at a fixed rate (a pass longer than `every` delays the next, never
/// overlaps it) rather than `every` after the last one ended: a range written just
/// after a pass planned waits at most `every` plus one pass to be merged, not `every`
/// plus two (the ranges bound, D-20).
pub async fn compaction_loop(node: Arc<Node>, cancel: tokio_util::sync::CancellationToken) {
    let every = node.tunables.compaction_interval;
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let changed = node.view.track();
    let mut candidates = HashSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = node.fenced.cancelled() => return,
            _ = ticks.tick() => {}
        }
        if node.is_admitted() {
            match changed.take() {
                ChangedStreams::All => candidates.extend(node.served_or_open()),
                ChangedStreams::Some(ids) => candidates.extend(ids),
            }
            let pass = node.compact_streams(&mut candidates);
            tokio::pin!(pass);
            tokio::select! {
                _ = &mut pass => {}
                _ = cancel.cancelled() => {
                    // A stop: the pass waits on its pace no more, writes nothing new and
                    // ends at its next batch; a pass stuck elsewhere is aborted after
                    // its grace at teardown.
                    node.compaction_pace.stop();
                    pass.await;
                    return;
                }
            }
        }
    }
}
