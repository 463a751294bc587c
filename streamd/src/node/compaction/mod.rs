//! The compactor (D-20): each owner rewrites runs of its streams' small ranges (each
//! in a multi-stream upload object) into objects of the target size, and swaps them in
//! with compare-and-set log entries. The replaced objects leave the bucket through GC
//! once no stream references them and its grace period has passed.
//!
//! A pass plans every stream's windows ([`plan`]), reads each source object once per
//! batch, cuts each window into pieces at the target size, and lays a batch out as a
//! few `CompactStreams` entries and objects ([`layout`]). Its reads and writes go at
//! the pass's rate ([`io_limit`]).

mod commit;
mod cut;
mod io_limit;
mod layout;
mod plan;
mod txns;

use super::Node;
use crate::error::StreamdError;
use crate::stream::StreamHandle;
use bytes::Bytes;
use futures::StreamExt;
use plan::{batches, plan};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_meta::model::ObjectRange;
use weir_meta::view::ChangedStreams;
use weir_shared::ids::StreamId;

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
