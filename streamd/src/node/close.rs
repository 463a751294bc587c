//! Closing a stream: stop intake, let in-flight appends become durable, upload and
//! commit every buffered record, then close it in the metadata log.

use super::Node;
use crate::error::StreamdError;
use std::time::Duration;
use weir_metad::client::ClientError;
use weir_metad::model::{Command, RejectCode};

/// How long a close waits for in-flight appends to become durable.
const DRAIN_APPENDS: Duration = Duration::from_secs(30);
/// How long a close waits for its buffered records to be uploaded and committed.
const CLOSE_UPLOAD: Duration = Duration::from_secs(30);

impl Node {
    /// Closes `stream`; returns the end offset every acknowledged record lies below.
    pub async fn close_stream(&self, stream: &str) -> Result<u64, StreamdError> {
        let handle = self.stream(stream)?;
        let target = {
            let mut inner = handle.inner.lock().await;
            inner.closing = true;
            inner.next_offset
        };
        let mut durable = handle.durable.subscribe();
        tokio::time::timeout(DRAIN_APPENDS, durable.wait_for(|d| *d >= target))
            .await
            .map_err(|_| StreamdError::Unavailable("in-flight appends did not become durable in time".into()))?
            .map_err(|_| StreamdError::Unavailable("stream stopped while closing".into()))?;
        // The uploader task commits (an upload round is never cancelled midway, or its
        // batches would be left marked as in flight); the close only waits, up to a deadline.
        let deadline = tokio::time::Instant::now() + CLOSE_UPLOAD;
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
                    "stream '{stream}' could not commit its buffered records within {CLOSE_UPLOAD:?}"
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
