//! Appends: validate the batches, assign offsets under the stream's lock, queue the
//! WAL record in that same order, and acknowledge only once it is durable (RR-WAL-2).

use super::Node;
use crate::error::StreamdError;
use crate::partition::producers::{Decision, SequenceError};
use crate::partition::txns::{is_transactional_data, TxnError};
use crate::stream::{Buffered, StreamHandle, StreamInner};
use crate::wal::{WalError, WalRecord};
use bytes::BytesMut;
use futures::future::BoxFuture;
use std::sync::Arc;
use weir_shared::batch::{
    check_producer_batch, check_record_count, set_base_offset, set_partition_leader_epoch, split_batches, BatchError,
    BatchHeader, ProducerBatchError,
};

/// What an acknowledged append was assigned.
#[derive(Debug, Clone)]
pub struct Appended {
    pub base_offset: u64,
    pub end_offset: u64,
    pub stream_epoch: u64,
    pub batch_base_offsets: Vec<u64>,
}

/// Batches given offsets, queued for the WAL and buffered, under the stream's lock.
pub(super) struct Queued {
    pub durable: BoxFuture<'static, Result<(), WalError>>,
    pub appended: Appended,
    /// `(base, end)` of each batch.
    pub spans: Vec<(u64, u64)>,
    /// The stream's buffer reached the upload threshold with these batches.
    pub upload_due: bool,
}

/// An append whose offsets are assigned and whose WAL record is queued; what is left
/// is to wait for durability ([`Node::complete`]). Admitting in order and completing
/// concurrently is what lets a pipelined connection's appends share one fdatasync.
pub struct Admitted(Admission);

impl Admitted {
    pub(super) fn queued(handle: Arc<StreamHandle>, q: Queued) -> Self {
        Admitted(Admission::Queued {
            handle,
            durable: q.durable,
            appended: q.appended,
            upload_due: q.upload_due,
        })
    }
}

enum Admission {
    /// New records: durable once the WAL writer says so.
    Queued {
        handle: Arc<StreamHandle>,
        durable: BoxFuture<'static, Result<(), WalError>>,
        appended: Appended,
        /// The stream's buffer reached the upload threshold with this append.
        upload_due: bool,
    },
    /// A retry of batches already appended: answered with their original offsets.
    Duplicate {
        handle: Arc<StreamHandle>,
        offsets: Vec<(u64, u64)>,
    },
}

impl Node {
    /// Appends concatenated v2 record batches to `stream`.
    pub async fn append(
        &self,
        stream: &str,
        batches: &[u8],
        match_next_offset: Option<u64>,
    ) -> Result<Appended, StreamdError> {
        let admitted = self.admit_append(stream, batches, match_next_offset, None).await?;
        self.complete(admitted).await
    }

    /// Waits until an admitted append is durable; its offsets.
    pub async fn complete(&self, admitted: Admitted) -> Result<Appended, StreamdError> {
        match admitted.0 {
            Admission::Queued {
                handle,
                durable,
                appended,
                upload_due,
            } => {
                // The WAL writer marks the stream durable (see `queue`); it did before
                // answering this.
                if let Err(e) = durable.await {
                    return Err(self.wal_failed(e));
                }
                debug_assert!(handle.durable_end() >= appended.end_offset);
                // No stream lock here: completions wait in a caller's queue that is not
                // polled while it admits the next append, which takes that lock; a
                // completion queued on the (fair) lock would hold it unpolled for ever.
                if upload_due {
                    self.upload_now.notify_one();
                }
                Ok(appended)
            }
            Admission::Duplicate { handle, offsets } => self.answer_duplicate(&handle, &offsets).await,
        }
    }

    /// Admits a client's append ([`Node::admit_append`]) unless a volume is under its
    /// refuse mark (issue 60). Only clients' appends are refused there: the internal
    /// streams of consumer groups and transactions go on, so reads, commits and the
    /// ends of transactions work on a full node.
    pub async fn admit_client_append(
        &self,
        stream: &str,
        batches: &[u8],
        match_next_offset: Option<u64>,
        transactional_id: Option<&str>,
    ) -> Result<Admitted, StreamdError> {
        if let Some(why) = self.disk.refusal() {
            return Err(StreamdError::StorageFull(why));
        }
        self.admit_append(stream, batches, match_next_offset, transactional_id)
            .await
    }

    /// Checks an append and assigns its offsets in order behind every earlier one to
    /// the stream; it is acknowledged only after [`Node::complete`].
    pub async fn admit_append(
        &self,
        stream: &str,
        batches: &[u8],
        match_next_offset: Option<u64>,
        transactional_id: Option<&str>,
    ) -> Result<Admitted, StreamdError> {
        // Failpoint (tests, SD-INT-2): an append held before it is admitted, where a
        // caller that goes away cancels it.
        weir_shared::failpoint::pause("before_admit").await;
        if self.intake_closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(StreamdError::Draining);
        }
        if batches.len() > self.tunables.max_append_bytes {
            return Err(StreamdError::TooLarge(format!(
                "append of {} bytes is over the {} byte limit",
                batches.len(),
                self.tunables.max_append_bytes
            )));
        }
        let parsed = split_batches(batches).map_err(|e| StreamdError::InvalidArgument(e.to_string()))?;
        for (header, bytes) in &parsed {
            check_record_count(bytes, header, self.tunables.max_decompressed_bytes).map_err(|e| match e {
                BatchError::TooLarge(_) => StreamdError::TooLarge(e.to_string()),
                e => StreamdError::InvalidArgument(e.to_string()),
            })?;
            match check_producer_batch(header) {
                // Checked with the transaction's coordinator below.
                Err(ProducerBatchError::Transactional) => {}
                checked => checked.map_err(|e| StreamdError::InvalidArgument(e.to_string()))?,
            }
        }
        if parsed.is_empty() {
            return Err(StreamdError::InvalidArgument(
                "an append needs at least one record batch".into(),
            ));
        }
        let handle = self.stream(stream)?;
        self.wal.check().map_err(wal_error)?;
        self.tail_state(&handle).await?;
        let headers: Vec<_> = parsed.iter().map(|(h, _)| *h).collect();
        let verified = self.verify_transactions(&handle, transactional_id, &headers).await?;
        let mut inner = self.lock_for_write(&handle).await?;
        if let Some(verified) = &verified {
            // A marker may have ended the transaction while it was being verified.
            let unverified = inner.txns.unverified(&headers).map_err(txn_error)?;
            if unverified.iter().any(|p| !verified.contains(p)) {
                return Err(StreamdError::Unavailable(
                    "the transaction changed while it was verified; retry".into(),
                ));
            }
        }
        // A retry is answered with its original offsets, even when the stream moved on.
        if let Decision::Duplicate(offsets) = inner.producers.check(&headers).map_err(sequence_error)? {
            drop(inner);
            return Ok(Admitted(Admission::Duplicate { handle, offsets }));
        }
        if let Some(expected) = match_next_offset {
            if expected != inner.next_offset {
                return Err(StreamdError::OffsetMismatch {
                    expected,
                    actual: inner.next_offset,
                });
            }
        }
        let queued = self.queue(&handle, &mut inner, batches, &parsed).await?;
        inner.producers.record(&headers, &queued.spans);
        inner.txns.record_batches(&headers, &queued.spans);
        drop(inner);
        Ok(Admitted::queued(handle, queued))
    }

    /// KIP-890: the producers whose transactional batches in `headers` begin their
    /// transaction in this stream (or continue it at a newer epoch), each checked with
    /// the transaction's coordinator first, so a late write after its transaction
    /// ended cannot open one no coordinator knows about. `None` when the append holds
    /// no transactional data.
    async fn verify_transactions(
        &self,
        handle: &StreamHandle,
        transactional_id: Option<&str>,
        headers: &[BatchHeader],
    ) -> Result<Option<Vec<(i64, i16)>>, StreamdError> {
        if !headers.iter().any(is_transactional_data) {
            return Ok(None);
        }
        let wanted = handle.inner.lock().await.txns.unverified(headers).map_err(txn_error)?;
        if wanted.is_empty() || weir_shared::failpoint::is_set("admit_unverified_transactions") {
            // Tests of the partition side alone, with no coordinator: all admitted.
            return Ok(Some(wanted));
        }
        let id = transactional_id.filter(|id| !id.is_empty()).ok_or_else(|| {
            StreamdError::InvalidTxnState("transactional records need the producer's transactional id".into())
        })?;
        let txns = self
            .coordination
            .txns()
            .ok_or_else(|| StreamdError::Unavailable("the node is stopping".into()))?;
        for (pid, epoch) in &wanted {
            txns.clone().verify_write(id, &handle.name, *pid, *epoch).await?;
        }
        Ok(Some(wanted))
    }

    /// Locks `handle`'s state for a write: refused when the stream is no longer served
    /// here, or while a close is under way.
    pub(super) async fn lock_for_write<'h>(
        &self,
        handle: &'h StreamHandle,
    ) -> Result<tokio::sync::MutexGuard<'h, StreamInner>, StreamdError> {
        let inner = handle.inner.lock().await;
        if !handle.is_serving() {
            return Err(StreamdError::NotOwner {
                stream: handle.name.clone(),
                owner: None,
            });
        }
        if inner.closers > 0 {
            // SD-INT-6: a stopping node's stream being moved refuses as draining, so
            // the sender re-routes to its next owner rather than retrying here.
            if self.terminating.load(std::sync::atomic::Ordering::Acquire) {
                return Err(StreamdError::Draining);
            }
            return Err(StreamdError::Unavailable(format!(
                "stream '{}' is closing",
                handle.name
            )));
        }
        Ok(inner)
    }

    /// Assigns `batches` (parsed as `parsed`) the offsets at the stream's end, queues
    /// their WAL record and adds them to the tail buffer. The caller holds the stream's
    /// lock, so WAL order is offset order.
    pub(super) async fn queue(
        &self,
        handle: &Arc<StreamHandle>,
        inner: &mut StreamInner,
        batches: &[u8],
        parsed: &[(BatchHeader, &[u8])],
    ) -> Result<Queued, StreamdError> {
        let base = inner.next_offset;
        let mut next = base;
        // One copy of the request's batches, stamped in place: the WAL record holds it
        // whole and the tail buffer slices of it (the batches lie end to end in it).
        let mut all = BytesMut::from(batches);
        let mut offsets = Vec::with_capacity(parsed.len());
        let mut spans = Vec::with_capacity(parsed.len());
        let mut at = 0;
        for (header, bytes) in parsed {
            let span = at..at + bytes.len();
            set_base_offset(&mut all[span.clone()], next as i64);
            set_partition_leader_epoch(&mut all[span.clone()], handle.leader_epoch);
            let end = next + header.offset_count();
            offsets.push(next);
            spans.push((next, end, span));
            at += bytes.len();
            next = end;
        }
        let all = all.freeze();
        let buffered: Vec<Buffered> = spans
            .into_iter()
            .map(|(start, end, span)| Buffered {
                start,
                end,
                data: all.slice(span),
            })
            .collect();
        let record = WalRecord {
            stream: handle.id,
            stream_epoch: handle.epoch,
            base_offset: base,
            offset_count: u32::try_from(next - base)
                .map_err(|_| StreamdError::InvalidArgument("append spans too many offsets".into()))?,
            batches: all,
        };
        // Marked by the writer, not by this append's caller: a caller that goes away
        // (a cancelled request) would otherwise leave the durable end short of records
        // in the log, and a retry of them, or a marker, would wait for it for ever.
        let marks = handle.clone();
        let on_durable: crate::wal::OnDurable = Box::new(move || marks.mark_durable(next));
        let durable = match self.wal.submit(&record, Some(on_durable)).await {
            Ok(d) => d,
            Err(e) => return Err(self.wal_failed(e)),
        };
        inner.next_offset = next;
        let spans: Vec<(u64, u64)> = buffered.iter().map(|b| (b.start, b.end)).collect();
        inner.push(buffered);
        self.uploads.push(handle.id);
        Ok(Queued {
            durable: Box::pin(durable),
            appended: Appended {
                base_offset: base,
                end_offset: next,
                stream_epoch: handle.epoch.0,
                batch_base_offsets: offsets,
            },
            spans,
            upload_due: inner.buffered_bytes() >= self.tunables.upload_bytes,
        })
    }

    /// The answer to a retried append: its original offsets, once they are durable (a
    /// retry can overtake the original's WAL write, and must not be acknowledged first).
    pub(super) async fn answer_duplicate(
        &self,
        handle: &StreamHandle,
        offsets: &[(u64, u64)],
    ) -> Result<Appended, StreamdError> {
        let end = offsets.last().map_or(0, |o| o.1);
        let mut durable = handle.durable.subscribe();
        tokio::select! {
            r = durable.wait_for(|d| *d >= end) => { r.map_err(|_| StreamdError::Unavailable("stream stopped".into()))?; }
            _ = self.fenced.cancelled() => return Err(StreamdError::Fenced),
        }
        if !handle.is_serving() && handle.durable_end() < end {
            return Err(StreamdError::Unavailable(format!("stream '{}' stopped", handle.name)));
        }
        Ok(Appended {
            base_offset: offsets.first().map_or(0, |o| o.0),
            end_offset: end,
            stream_epoch: handle.epoch.0,
            batch_base_offsets: offsets.iter().map(|o| o.0).collect(),
        })
    }

    /// A WAL failure after offsets may have been assigned: nothing more can be
    /// acknowledged in order, so the incarnation stops (FO-FEN-8 for a takeover).
    fn wal_failed(&self, e: WalError) -> StreamdError {
        match e {
            WalError::Full(n) => StreamdError::WalFull(n),
            // Issue 60: not written, and known not to be; nothing to fence.
            WalError::NoSpace(why) | WalError::Stalled(why) => StreamdError::StorageFull(why),
            WalError::Fenced => {
                self.fence("write-ahead log was taken over");
                StreamdError::Fenced
            }
            // The record may still be recovered from the WAL: the outcome is unknown,
            // which `fenced` tells a caller (only `unavailable` means "not applied").
            other => {
                self.fence(&format!("write-ahead log failed: {other}"));
                StreamdError::Fenced
            }
        }
    }
}

pub(super) fn txn_error(e: TxnError) -> StreamdError {
    match e {
        TxnError::InvalidProducerEpoch { .. } => StreamdError::InvalidProducerEpoch(e.to_string()),
    }
}

pub(super) fn sequence_error(e: SequenceError) -> StreamdError {
    match e {
        SequenceError::InvalidProducerEpoch { .. } => StreamdError::InvalidProducerEpoch(e.to_string()),
        SequenceError::OutOfOrder { .. } | SequenceError::PartialRetry => {
            StreamdError::OutOfOrderSequence(e.to_string())
        }
    }
}

pub(super) fn wal_error(e: WalError) -> StreamdError {
    match e {
        WalError::Full(n) => StreamdError::WalFull(n),
        WalError::NoSpace(why) | WalError::Stalled(why) => StreamdError::StorageFull(why),
        WalError::Fenced => StreamdError::Fenced,
        other => StreamdError::Unavailable(other.to_string()),
    }
}
