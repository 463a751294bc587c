//! Writing a batch's cut windows: laid out as entries, each entry's objects built and
//! written, then swapped in by one `CompactStreams` proposal: the write half of a pass,
//! which sees the windows only once they are cut.

use super::layout::{layout, EntryLayout, WindowShape, MAX_COMMAND_RANGES};
use super::{CutWindow, PassStats, FETCH_CONCURRENCY};
use crate::error::StreamdError;
use crate::node::Node;
use crate::object::format::ObjectBuilder;
use crate::object::pace::paced;
use bytes::Bytes;
use futures::StreamExt;
use object_store::{ObjectStore, PutPayload};
use std::collections::HashMap;
use std::time::Instant;
use weir_meta::model::{Applied, Command, NewObject, ObjectRange, RejectCode, ReplacedRange, StreamSwap};
use weir_shared::ids::{ObjectKey, Offset};

impl Node {
    /// Lays a batch's windows out as entries and commits them one after another.
    pub(super) async fn commit_batch(
        &self,
        windows: Vec<CutWindow>,
        stats: &mut PassStats,
    ) -> Result<(), StreamdError> {
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
                size: object.content_length() as u64,
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
                    .put_opts(&path, object, paced(&self.compaction_pace))
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
    batches: Vec<Bytes>,
    txns: weir_meta::model::RangeTxns,
}

/// Builds one compacted object from its members: the object, and each member's new
/// range by (window, piece).
fn build(key: ObjectKey, members: Vec<Member>) -> (ObjectKey, PutPayload, Vec<(usize, usize, ObjectRange)>) {
    let mut builder = ObjectBuilder::new();
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
