//! Transaction markers written into a stream by the coordinator of a transaction
//! (issue 23, design 0005): a control batch that commits or aborts the producer's
//! transaction in this stream and fences the producer's older epochs here.
//!
//! Markers do not go through [`Node::admit_append`], which refuses control batches
//! from everyone else. A marker is written when it ends a transaction open here or
//! raises the producer's epoch (the fence must survive a move, so it is stored); one
//! that would change neither is a retry of one already written, and is answered once
//! everything before it is durable, without being written again.

use super::append::{sequence_error, wal_error, Admitted};
use super::Node;
use crate::error::StreamdError;
use crate::partition::marker::{self, Marker};
use weir_shared::batch::split_batches;

/// Where a marker went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkerWritten {
    /// The marker's offset; `None` when it had been written before.
    pub offset: Option<u64>,
    /// The stream's durable end after it.
    pub end_offset: u64,
}

impl Node {
    /// Writes `m` into `stream` and waits until it is durable.
    pub async fn write_marker(&self, stream: &str, m: &Marker) -> Result<MarkerWritten, StreamdError> {
        // Failpoint (tests): markers slower than a client's next request.
        weir_shared::failpoint::pause("before_marker").await;
        if self.intake_closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(StreamdError::Draining);
        }
        let handle = self.stream(stream)?;
        self.wal.check().map_err(wal_error)?;
        self.tail_state(&handle).await?;
        let mut inner = self.lock_for_write(&handle).await?;
        inner
            .producers
            .check_marker(m.producer_id, m.epoch)
            .map_err(sequence_error)?;
        let ends = inner.txns.check_marker(m).map_err(super::append::txn_error)?;
        let fences = inner.producers.epoch_of(m.producer_id).is_none_or(|e| m.epoch > e);
        if !ends && !fences {
            // A retry: answered once the original (and all before it) is durable.
            let end = inner.next_offset;
            drop(inner);
            let done = self.answer_duplicate(&handle, &[(end, end)]).await?;
            // The first attempt may have failed after the marker was stored.
            self.tell_coordinators(stream, m, end).await;
            return Ok(MarkerWritten {
                offset: None,
                end_offset: done.end_offset,
            });
        }
        let batch = marker::encode(m, now_ms()).map_err(StreamdError::Internal)?;
        let parsed = split_batches(&batch).map_err(|e| StreamdError::Internal(e.to_string()))?;
        let queued = self.queue(&handle, &mut inner, &batch, &parsed).await?;
        let (base, end) = (queued.appended.base_offset, queued.appended.end_offset);
        inner.producers.record_marker(m.producer_id, m.epoch, end);
        inner.txns.record_marker(m, base);
        drop(inner);
        let done = self.complete(Admitted::queued(handle, queued)).await?;
        self.tell_coordinators(stream, m, base).await;
        Ok(MarkerWritten {
            offset: Some(base),
            end_offset: done.end_offset,
        })
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Node {
    /// The coordinators settle what the marker ends (a transaction's offsets) before
    /// it counts as written (the transaction completes only after that).
    /// `before`: the marker's offset, or any offset past it.
    async fn tell_coordinators(&self, stream: &str, m: &Marker, before: u64) {
        if let Some(listener) = self.coordination.markers() {
            listener.marker_written(stream, m.producer_id, m.commit, before).await;
        }
    }
}
