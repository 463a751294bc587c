//! The uploader: gathers the durable, not yet uploaded batches of every served stream
//! into one data object, PUTs it, and commits it with CommitObjects. Commits retry with
//! backoff through metadata outages (FO-MDO-2); only a committed object is ever read
//! (RR-WAL-4), and once committed its records' WAL space is reclaimed.

use super::Node;
use crate::object::format::{Chunk, ObjectBuilder};
use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_meta::client::ClientError;
use weir_meta::model::{Command, CommitRange, RangeTxns, RejectCode};
use weir_shared::ids::{ObjectKey, Offset, StreamEpoch, StreamId};

/// Most streams one upload round takes: its commit is one metadata entry.
pub const MAX_ROUND_STREAMS: usize = 1_000;

/// Runs upload rounds until `cancel` (a final round is the caller's, via close).
pub async fn upload_loop(node: Arc<Node>, cancel: tokio_util::sync::CancellationToken) {
    let mut seq: u64 = 0;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = node.fenced.cancelled() => return,
            _ = node.upload_now.notified() => {}
            _ = tokio::time::sleep(node.tunables.upload_interval) => {}
        }
        seq += 1;
        node.upload_round(seq).await;
    }
}

/// The streams with buffered records not yet uploaded, in the order they got them
/// (D-23): an append queues its stream, and a round takes the queue, so the uploader
/// visits the streams being written, never every stream, and an idle node's rounds
/// cost nothing. A stream a round leaves with records is queued again.
#[derive(Default)]
pub struct UploadQueue {
    inner: std::sync::Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    order: std::collections::VecDeque<StreamId>,
    queued: std::collections::HashSet<StreamId>,
}

impl UploadQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `id` at the back, unless it is queued.
    pub fn push(&self, id: StreamId) {
        let mut q = self.lock();
        if q.queued.insert(id) {
            q.order.push_back(id);
        }
    }

    /// Takes every queued stream, oldest first.
    fn take(&self) -> Vec<StreamId> {
        let mut q = self.lock();
        q.queued.clear();
        std::mem::take(&mut q.order).into()
    }

    /// Puts streams a round did not reach back at the front, in their order.
    fn put_back(&self, ids: &[StreamId]) {
        let mut q = self.lock();
        for &id in ids.iter().rev() {
            if q.queued.insert(id) {
                q.order.push_front(id);
            }
        }
    }
}

/// What became of a data object's commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Commit {
    /// Committed; the index holds the object's ranges.
    Committed,
    /// A retry was refused, but an earlier attempt whose answer was lost had landed:
    /// the offsets are committed, though the object's ranges may already be replaced.
    LandedEarlier,
    /// Not committed.
    Refused,
}

/// A stream's part of one upload.
pub(super) struct Part {
    pub stream: StreamId,
    pub chunk: Chunk,
    pub batches: Vec<Bytes>,
    /// The transactions as the part's range leaves them (issue 23).
    pub txns: RangeTxns,
}

impl Part {
    /// The newest record timestamp in the part, for `retention.ms`.
    fn max_timestamp(&self) -> i64 {
        self.batches
            .iter()
            .map(|b| weir_shared::batch::max_timestamp(b))
            .max()
            .unwrap_or(weir_meta::model::NO_TIMESTAMP)
    }
}

impl Node {
    /// Uploads and commits what is durable and not yet uploaded, up to the budget below;
    /// returns once committed
    /// (or once the node is fenced). Only the uploader task runs rounds, one at a time, and
    /// never cancels one midway: its batches are marked in flight until it finishes.
    ///
    /// A round's object holds at most the compaction target (one batch more when a
    /// single batch is larger) and at most [`MAX_ROUND_STREAMS`] streams: a stream's
    /// range is read whole and cached whole, so a round that took everything after a
    /// burst (541 MB was seen) made a range no cache holds, and every later read of it
    /// fetched it all again; and its commit is one metadata entry, which must not grow
    /// with the number of streams. What a round leaves is taken by the next, started at
    /// once; the streams it did not reach go first, so none waits behind the others.
    async fn upload_round(&self, seq: u64) {
        let budget = self.tunables.compaction_target_bytes;
        let (mut taken, mut round_bytes, mut more) = (Vec::new(), 0u64, false);
        let queued = self.uploads.take();
        for (i, &id) in queued.iter().enumerate() {
            if round_bytes >= budget || taken.len() >= MAX_ROUND_STREAMS {
                more = true;
                self.uploads.put_back(&queued[i..]);
                break;
            }
            let Some(handle) = self.served(id) else { continue };
            let durable = handle.durable_end();
            let mut inner = handle.inner.lock().await;
            // Tests: an upload that holds the stream's lock a while, so appends contend.
            weir_shared::failpoint::pause("upload_stream_locked").await;
            let from = inner.uploaded_end;
            let mut batches = Vec::new();
            for b in inner.buffer.iter().filter(|b| b.start >= from && b.end <= durable) {
                let len = b.data.len() as u64;
                if round_bytes > 0 && round_bytes + len > budget {
                    more = true;
                    break;
                }
                round_bytes += len;
                batches.push(b.clone());
            }
            let Some(last) = batches.last() else {
                // Nothing durable yet: its records are being written.
                if inner.next_offset > inner.uploaded_end {
                    self.uploads.push(id);
                }
                continue;
            };
            let end = last.end;
            inner.uploaded_end = end;
            // Records past this round's are taken by a later one.
            if inner.next_offset > end {
                self.uploads.push(id);
            }
            let txns = inner.txns.summary(from, end);
            // Copying and checksumming the batches waits until the lock is released, so
            // appends to the stream do not wait on them.
            drop(inner);
            // Tests: the copy below takes a while; appends must not wait on it.
            weir_shared::failpoint::pause("upload_copy").await;
            let data: Vec<Bytes> = batches.into_iter().map(|b| b.data).collect();
            taken.push((handle.id, handle.epoch, from, end, data, txns));
        }
        if more {
            self.upload_now.notify_one();
        }
        if taken.is_empty() {
            return;
        }
        // Built on a blocking thread: at full produce rate an object is tens of MiB to
        // checksum, which on a runtime worker would stall the appends queued behind it.
        // A panic there is a bug, and is raised here as it would have been.
        let (object, parts) = tokio::task::spawn_blocking(move || {
            let mut builder = ObjectBuilder::new();
            let parts: Vec<Part> = taken
                .into_iter()
                .map(|(stream, epoch, from, end, batches, txns)| Part {
                    stream,
                    chunk: builder.add(stream, epoch, from, end, &batches).clone(),
                    batches,
                    txns,
                })
                .collect();
            (builder.finish().0, parts)
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let key = ObjectKey(format!(
            "data/{}/{:020}/{seq:016}-{:08x}.wdo",
            self.me.node,
            self.me.epoch.0,
            rand::random::<u32>()
        ));
        let size = object.content_length() as u64;
        let commit = self.put_and_commit(&key, object, &parts).await;
        let m = crate::metrics::metrics();
        if commit != Commit::Refused {
            m.objects_committed.inc();
            m.uploaded_bytes.inc_by(size);
        } else {
            m.objects_refused.inc();
        }
        self.finish_round(&key, &parts, commit).await;
    }

    /// PUTs the object and commits it, retrying through outages.
    pub(super) async fn put_and_commit(&self, key: &ObjectKey, object: PutPayload, parts: &[Part]) -> Commit {
        let path = object_store::path::Path::from(key.0.as_str());
        let ranges: Vec<CommitRange> = parts
            .iter()
            .map(|p| CommitRange {
                stream: p.stream,
                stream_epoch: p.chunk.stream_epoch,
                start: Offset(p.chunk.start),
                end: Offset(p.chunk.end),
                pos: p.chunk.pos,
                len: p.chunk.len,
                crc: p.chunk.crc,
                max_timestamp: p.max_timestamp(),
                txns: p.txns.clone(),
            })
            .collect();
        let command = Command::CommitObjects {
            key: key.clone(),
            size: object.content_length() as u64,
            ranges,
        };
        let mut backoff = Duration::from_millis(100);
        let mut put_at: Option<Instant> = None;
        loop {
            if self.fenced.is_cancelled() {
                return Commit::Refused;
            }
            // (Re-)put when never put, or when a long outage may have let GC take it.
            if put_at.is_none_or(|t| t.elapsed() > self.tunables.reupload_after) {
                match self.store.put(&path, object.clone()).await {
                    Ok(_) => put_at = Some(Instant::now()),
                    Err(e) => {
                        tracing::warn!(object_key = %key, error = %e, "data object upload failed; retrying");
                        self.backoff(&mut backoff).await;
                        continue;
                    }
                }
            }
            let mut proposed = if weir_shared::failpoint::fails("commit_objects") {
                // Tests: the commit fails before it reaches the log.
                Err(ClientError::Unavailable(
                    "failpoint commit_objects: the commit failed".into(),
                ))
            } else {
                self.metad.propose(&self.proposer(), command.clone()).await
            };
            // Tests: the commit landed, but its answer is lost on the way back.
            if matches!(proposed, Ok((_, Ok(_)))) && weir_shared::failpoint::drops("commit_reply") {
                proposed = Err(ClientError::Unavailable(
                    "failpoint commit_reply: the answer was lost".into(),
                ));
            }
            match proposed {
                Ok((index, Ok(_))) => {
                    tracing::debug!(object_key = %key, log_index = index, "committed data object");
                    return Commit::Committed;
                }
                // A retry after an unknown outcome: the first attempt committed it (a
                // compaction may since have replaced some of its ranges).
                Ok((_, Err(r))) if r.code == RejectCode::AlreadyExists => {
                    tracing::info!(object_key = %key, "data object commit already landed; its answer was lost");
                    return Commit::LandedEarlier;
                }
                // Not deleted on a refusal: an earlier attempt whose answer was lost may
                // have committed it (a fenced node's retry is refused as fenced even
                // then). GC deletes it once the index shows it unreferenced.
                Ok((_, Err(r))) if matches!(r.code, RejectCode::Fenced | RejectCode::Superseded) => {
                    self.fence(&r.message);
                    return Commit::Refused;
                }
                Ok((index, Err(r))) => {
                    // An earlier attempt may have landed, its object since replaced by a
                    // compaction or trim (so the retry is no longer `AlreadyExists`):
                    // the view through the refusal shows the offsets committed then.
                    let view = tokio::time::timeout(self.metad.timeout(), self.view.wait_applied(index)).await;
                    let landed = parts.iter().all(|p| {
                        self.committed_in_view(p.stream, p.chunk.stream_epoch)
                            .is_some_and(|end| end >= p.chunk.end)
                    });
                    if view.is_ok() && landed {
                        tracing::info!(object_key = %key, rejection = %r, "data object commit refused, but an earlier attempt of it landed");
                        return Commit::LandedEarlier;
                    }
                    tracing::warn!(object_key = %key, rejection = %r, "data object commit refused");
                    return Commit::Refused;
                }
                Err(ClientError::Unavailable(e)) => {
                    tracing::warn!(object_key = %key, error = %e, "metadata log unavailable; commit will be retried");
                    // Tests: the retry comes late, after compaction had its turn.
                    weir_shared::failpoint::pause("commit_retry").await;
                    self.backoff(&mut backoff).await;
                }
                Err(e) => {
                    tracing::error!(object_key = %key, error = %e, "data object commit failed");
                    self.backoff(&mut backoff).await;
                }
            }
        }
    }

    /// The committed end the view shows for `stream` at `epoch`, while this incarnation
    /// stands: then only its own commits (or, for a takeover's streams, the same WAL
    /// records committed by the dead owner or an earlier agent) can have put it there.
    fn committed_in_view(&self, stream: StreamId, epoch: StreamEpoch) -> Option<u64> {
        self.view.with(|s| {
            let standing = s
                .nodes
                .get(&self.me.node)
                .is_some_and(|n| n.epoch == self.me.epoch && !n.fenced);
            let row = s.streams.get(&stream).filter(|row| standing && row.epoch == epoch)?;
            Some(row.committed_end.0)
        })
    }

    async fn backoff(&self, backoff: &mut Duration) {
        tokio::select! {
            _ = tokio::time::sleep(*backoff) => {}
            _ = self.fenced.cancelled() => {}
        }
        *backoff = (*backoff * 2).min(Duration::from_secs(5));
    }

    /// Applies a round's result to each stream: advance committed ends and trim buffers,
    /// or let the next round retry what was refused.
    async fn finish_round(&self, key: &ObjectKey, parts: &[Part], commit: Commit) {
        let committed = commit != Commit::Refused;
        // The committed ends this round moved, for the WAL to reclaim what they cover.
        let mut reclaimed = Vec::new();
        for part in parts {
            let Some(handle) = self.served(part.stream).filter(|h| h.epoch == part.chunk.stream_epoch) else {
                continue;
            };
            if commit == Commit::Committed {
                // Write-through, so tail readers just past the buffer stay off object
                // storage. Cached before the buffer lets go of the batches, so a read finds
                // them in one or the other; the same batches, not a copy (issue 62).
                self.cache.insert_batches(&key.0, part.chunk.pos, part.batches.clone());
            }
            let mut inner = handle.inner.lock().await;
            if committed {
                inner.committed_end = part.chunk.end;
                inner.txns.forget_below(part.chunk.end);
                handle.committed.send_replace(part.chunk.end);
                if commit == Commit::Committed {
                    self.ranges.insert(
                        part.stream,
                        [weir_meta::model::ObjectRange {
                            key: key.clone(),
                            start: Offset(part.chunk.start),
                            end: Offset(part.chunk.end),
                            pos: part.chunk.pos,
                            len: part.chunk.len,
                            crc: part.chunk.crc,
                            max_timestamp: part.max_timestamp(),
                            txns: part.txns.clone(),
                        }],
                    );
                } else {
                    // The index holds what replaced this object's ranges.
                    self.ranges.forget_unsettled(part.stream);
                }
                inner.trim_committed();
                reclaimed.push((part.stream, part.chunk.end));
            } else {
                // Taken again by the next round.
                self.uploads.push(part.stream);
                // The view may show the stream committed further: an earlier round's
                // commit landed though its answer was lost, and a retry of it was refused
                // (its ranges replaced since). The next round starts there, or its
                // object would overlap what is committed and be refused for ever.
                let seen = self.committed_in_view(part.stream, handle.epoch).unwrap_or(0);
                if seen > inner.committed_end {
                    tracing::info!(stream = %handle.name, from = inner.committed_end, to = seen, "the view shows more committed than this node knew; uploads go on from there");
                    inner.committed_end = seen;
                    inner.txns.forget_below(seen);
                    handle.committed.send_replace(seen);
                    inner.trim_committed();
                    self.ranges.forget_unsettled(part.stream);
                    reclaimed.push((part.stream, seen));
                }
                inner.uploaded_end = inner.committed_end;
            }
        }
        if !reclaimed.is_empty() {
            self.wal.reclaim(reclaimed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// D-23: a round takes the streams appended to since the last one, oldest first,
    /// not every stream; what a round does not reach goes first in the next.
    #[test]
    fn a_round_takes_the_streams_written_to_and_leaves_the_idle_ones() {
        let queue = UploadQueue::default();
        // 100,000 idle streams are never queued; two are written, one twice.
        for id in [7, 3, 7] {
            queue.push(StreamId(id));
        }
        assert_eq!(queue.take(), vec![StreamId(7), StreamId(3)]);
        assert!(queue.take().is_empty(), "taken");
        for id in 0..4 {
            queue.push(StreamId(id));
        }
        let round = queue.take();
        queue.push(StreamId(9));
        queue.put_back(&round[2..]);
        assert_eq!(queue.take(), vec![StreamId(2), StreamId(3), StreamId(9)]);
    }
}
