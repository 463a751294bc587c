//! The uploader: gathers the durable, not yet uploaded batches of every served stream
//! into one data object, PUTs it, and commits it with CommitObjects. Commits retry with
//! backoff through metadata outages (FO-MDO-2); only a committed object is ever read
//! (RR-WAL-4), and once committed its records' WAL space is reclaimed.

use super::Node;
use crate::object::format::{Chunk, ObjectBuilder};
use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_meta::client::ClientError;
use weir_meta::model::{Command, CommitRange, RejectCode};
use weir_shared::ids::{ObjectKey, Offset, StreamId};

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

/// A stream's part of one upload.
pub(super) struct Part {
    pub stream: StreamId,
    pub chunk: Chunk,
    pub batches: Vec<Bytes>,
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
    /// single batch is larger): a stream's range is read whole and cached whole, so a
    /// round that took everything after a burst (541 MB was seen) made a range no cache
    /// holds, and every later read of it fetched it all again. What a round leaves is
    /// taken by the next, started at once; rounds start at a different stream each time,
    /// so none waits behind the others every round.
    async fn upload_round(&self, seq: u64) {
        let budget = self.tunables.compaction_target_bytes;
        let (mut taken, mut round_bytes, mut more) = (Vec::new(), 0u64, false);
        let streams = self.all_streams();
        let first = seq as usize % streams.len().max(1);
        for handle in streams[first..].iter().chain(&streams[..first]) {
            if round_bytes >= budget {
                more = true;
                break;
            }
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
            let Some(last) = batches.last() else { continue };
            let end = last.end;
            inner.uploaded_end = end;
            // Copying and checksumming the batches waits until the lock is released, so
            // appends to the stream do not wait on them.
            drop(inner);
            // Tests: the copy below takes a while; appends must not wait on it.
            weir_shared::failpoint::pause("upload_copy").await;
            let data: Vec<Bytes> = batches.into_iter().map(|b| b.data).collect();
            taken.push((handle.id, handle.epoch, from, end, data));
        }
        if more {
            self.upload_now.notify_one();
        }
        if taken.is_empty() {
            return;
        }
        // Built on a blocking thread: at full produce rate an object is tens of MiB to
        // copy and checksum, which on a runtime worker would stall the appends queued
        // behind it. A panic there is a bug, and is raised here as it would have been.
        let (object, parts) = tokio::task::spawn_blocking(move || {
            let bytes = taken.iter().flat_map(|t| &t.4).map(Bytes::len).sum();
            let mut builder = ObjectBuilder::with_capacity(bytes);
            let parts: Vec<Part> = taken
                .into_iter()
                .map(|(stream, epoch, from, end, batches)| Part {
                    stream,
                    chunk: builder.add(stream, epoch, from, end, &batches).clone(),
                    batches,
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
        let size = object.len() as u64;
        let committed = self.put_and_commit(&key, object, &parts).await;
        let m = crate::metrics::metrics();
        if committed {
            m.objects_committed.inc();
            m.uploaded_bytes.inc_by(size);
        } else {
            m.objects_refused.inc();
        }
        self.finish_round(&key, &parts, committed).await;
    }

    /// PUTs the object and commits it, retrying through outages; `false` if refused.
    pub(super) async fn put_and_commit(&self, key: &ObjectKey, object: Bytes, parts: &[Part]) -> bool {
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
            })
            .collect();
        let command = Command::CommitObjects {
            key: key.clone(),
            size: object.len() as u64,
            ranges,
        };
        let mut backoff = Duration::from_millis(100);
        let mut put_at: Option<Instant> = None;
        loop {
            if self.fenced.is_cancelled() {
                return false;
            }
            // (Re-)put when never put, or when a long outage may have let GC take it.
            if put_at.is_none_or(|t| t.elapsed() > self.tunables.reupload_after) {
                match self.store.put(&path, PutPayload::from_bytes(object.clone())).await {
                    Ok(_) => put_at = Some(Instant::now()),
                    Err(e) => {
                        tracing::warn!(object_key = %key, error = %e, "data object upload failed; retrying");
                        self.backoff(&mut backoff).await;
                        continue;
                    }
                }
            }
            match self.metad.propose(&self.proposer(), command.clone()).await {
                Ok((index, Ok(_))) => {
                    tracing::debug!(object_key = %key, log_index = index, "committed data object");
                    return true;
                }
                // A retry after an unknown outcome: the first attempt committed it.
                Ok((_, Err(r))) if r.code == RejectCode::AlreadyExists => return true,
                Ok((_, Err(r))) => {
                    if matches!(r.code, RejectCode::Fenced | RejectCode::Superseded) {
                        self.fence(&r.message);
                    } else {
                        tracing::warn!(object_key = %key, rejection = %r, "data object commit refused");
                    }
                    // Not deleted here: an earlier attempt whose answer was lost may
                    // have committed it (a fenced node's retry is refused as fenced
                    // even then). GC deletes it once the index shows it unreferenced.
                    return false;
                }
                Err(ClientError::Unavailable(e)) => {
                    tracing::warn!(object_key = %key, error = %e, "metadata log unavailable; commit will be retried");
                    self.backoff(&mut backoff).await;
                }
                Err(e) => {
                    tracing::error!(object_key = %key, error = %e, "data object commit failed");
                    self.backoff(&mut backoff).await;
                }
            }
        }
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
    async fn finish_round(&self, key: &ObjectKey, parts: &[Part], committed: bool) {
        let streams: HashMap<StreamId, _> = self.all_streams().into_iter().map(|h| (h.id, h)).collect();
        for part in parts {
            let Some(handle) = streams.get(&part.stream) else {
                continue;
            };
            if committed {
                // Write-through, so tail readers just past the buffer stay off object
                // storage. Cached before the buffer lets go of the batches, so a read finds
                // them in one or the other; copied before the stream's lock is taken, so
                // appends do not wait on the copy.
                let mut joined = Vec::with_capacity(part.chunk.len as usize);
                for b in &part.batches {
                    joined.extend_from_slice(b);
                }
                self.cache.insert(&key.0, part.chunk.pos, Bytes::from(joined));
            }
            let mut inner = handle.inner.lock().await;
            if committed {
                inner.committed_end = part.chunk.end;
                handle.committed.send_replace(part.chunk.end);
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
                    }],
                );
                inner.trim_committed();
            } else {
                inner.uploaded_end = inner.committed_end;
            }
        }
        if committed {
            self.wal.reclaim(self.committed_ends().await);
        }
    }

    /// Committed end of every stream this incarnation has served.
    pub async fn committed_ends(&self) -> HashMap<StreamId, u64> {
        let mut ends = self.closed_ends.read().unwrap_or_else(|p| p.into_inner()).clone();
        for h in self.all_streams() {
            ends.insert(h.id, h.inner.lock().await.committed_end);
        }
        ends
    }
}
