//! Closing a stream: stop intake, let in-flight appends become durable, upload and
//! commit every buffered record, then close it in the metadata log.

use super::Node;
use crate::error::StreamdError;
use std::time::Duration;
use weir_meta::client::ClientError;
use weir_meta::model::{Command, RejectCode};

/// How long a close may take when its caller sets no bound.
pub const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

impl Node {
    /// Closes `stream` within `within`; returns the end offset every acknowledged record
    /// lies below. A close that cannot finish in time reopens the stream's intake, so a
    /// transfer that gave up releases its gate (SD-DRN-4, SD-DRN-7).
    pub async fn close_stream(&self, stream: &str, within: Duration) -> Result<u64, StreamdError> {
        let handle = self.stream(stream)?;
        let deadline = tokio::time::Instant::now() + within;
        let target = {
            let mut inner = handle.inner.lock().await;
            inner.closing = true;
            inner.next_offset
        };
        // Failpoint for SD-DRN-7: this stream's close fails after intake stopped.
        if weir_shared::failpoint::action(&format!("close_stream_{stream}"))
            == Some(weir_shared::failpoint::Action::Error)
        {
            handle.inner.lock().await.closing = false;
            return Err(StreamdError::Unavailable(format!(
                "failpoint close_stream: stream '{stream}' did not close"
            )));
        }
        let mut durable = handle.durable.subscribe();
        // The watch's read guard is dropped at once: it must not live across an await.
        let durable = tokio::time::timeout_at(deadline, durable.wait_for(|d| *d >= target))
            .await
            .map(|r| r.map(|_| ()));
        match durable {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(StreamdError::Unavailable("stream stopped while closing".into())),
            Err(_) => {
                handle.inner.lock().await.closing = false;
                return Err(StreamdError::Unavailable(format!(
                    "in-flight appends to stream '{stream}' did not become durable within {within:?}"
                )));
            }
        }
        // The uploader task commits (an upload round is never cancelled midway, or its
        // batches would be left marked as in flight); the close only waits, up to a deadline.
        while handle.inner.lock().await.committed_end < target {
            if !handle.is_serving() || self.fenced.is_cancelled() {
                return Err(StreamdError::NotOwner {
                    stream: stream.to_string(),
                    owner: None,
                });
            }
            if tokio::time::Instant::now() >= deadline {
                handle.inner.lock().await.closing = false;
                return Err(StreamdError::Unavailable(format!(
                    "stream '{stream}' could not commit its buffered records within {within:?}"
                )));
            }
            self.upload_now.notify_one();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                _ = self.fenced.cancelled() => {}
            }
        }
        let command = Command::CloseStream {
            stream: handle.id,
            stream_epoch: handle.epoch,
        };
        match self.metad.propose(&self.proposer(), command).await {
            Ok((index, Ok(_))) => {
                tracing::info!(stream, stream_epoch = %handle.epoch, offset = target, log_index = index, "closed stream");
                self.remove_stream(handle.id, target);
                Ok(target)
            }
            Ok((_, Err(r))) if matches!(r.code, RejectCode::Fenced | RejectCode::Superseded) => {
                self.fence(&r.message);
                Err(StreamdError::Fenced)
            }
            Ok((_, Err(r))) => {
                handle.inner.lock().await.closing = false;
                Err(StreamdError::NotOwner {
                    stream: stream.to_string(),
                    owner: Some(r.message),
                })
            }
            Err(ClientError::Unavailable(e)) => {
                // Everything is committed; the close can be retried.
                handle.inner.lock().await.closing = false;
                Err(StreamdError::Unavailable(e))
            }
            Err(e) => {
                handle.inner.lock().await.closing = false;
                Err(StreamdError::Internal(e.to_string()))
            }
        }
    }
}
