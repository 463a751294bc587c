//! Closing a stream: stop intake, let in-flight appends become durable, upload and
//! commit every buffered record, then close it in the metadata log.
//!
//! Intake reopens only once the log says the close did not land. A `CloseStream`
//! whose answer was lost, or that was refused because an earlier attempt of it already
//! landed, may have closed the stream: an append acknowledged after that is lost, since
//! the next owner starts from the committed end.

use super::Node;
use crate::error::StreamdError;
use crate::stream::StreamHandle;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use weir_meta::model::{Command, RejectCode, StreamState};
use weir_shared::backoff::Backoff;

/// How long a close may take when its caller sets no bound.
pub const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits between attempts at a `CloseStream` that got no answer.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// What the metadata log says became of this node's close of a stream.
#[derive(Debug, PartialEq)]
enum Settled {
    /// The close landed: now (at this log index), or in an earlier attempt whose
    /// answer was lost.
    Closed(Option<u64>),
    /// It did not, and the stream is no longer this node's (deleted, say): the refusal.
    Gone(String),
    /// This incarnation is fenced or replaced.
    Fenced(String),
    /// No answer yet: the close may still land.
    Unknown(String),
}

impl Node {
    /// Closes `stream` within `within`; returns the end offset every acknowledged record
    /// lies below. A close that cannot finish in time reopens the stream's intake, so a
    /// transfer that gave up releases its gate (SD-DRN-4, SD-DRN-7), unless its
    /// `CloseStream` may still land: then intake stays closed until the log settles it.
    pub async fn close_stream(self: &Arc<Self>, stream: &str, within: Duration) -> Result<u64, StreamdError> {
        let handle = self.stream(stream)?;
        let deadline = Instant::now() + within;
        let target = {
            let mut inner = handle.inner.lock().await;
            inner.closers += 1;
            inner.next_offset
        };
        // Failpoints: this stream's close fails after intake stopped (SD-DRN-7), or is
        // slow, within its bound (SD-REL-8).
        match weir_shared::failpoint::action(&format!("close_stream_{stream}")) {
            Some(weir_shared::failpoint::Action::Error) => {
                release_intake(&handle).await;
                return Err(StreamdError::Unavailable(format!(
                    "failpoint close_stream: stream '{stream}' did not close"
                )));
            }
            Some(weir_shared::failpoint::Action::Sleep(d)) => {
                tracing::warn!(stream, delay = ?d, "failpoint: slow close");
                tokio::time::sleep_until(deadline.min(Instant::now() + d)).await;
            }
            _ => {}
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
                release_intake(&handle).await;
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
            if Instant::now() >= deadline {
                release_intake(&handle).await;
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
        match self.settle_close(&handle, Some(deadline)).await {
            Settled::Unknown(why) => {
                self.settle_later(handle.clone(), target).await;
                Err(StreamdError::Unavailable(format!(
                    "close of stream '{stream}' not confirmed ({why}); it takes no appends until the metadata log settles it"
                )))
            }
            settled => self.finish_close(&handle, target, settled),
        }
    }

    /// Acts on what the log says of a close.
    fn finish_close(&self, handle: &Arc<StreamHandle>, target: u64, settled: Settled) -> Result<u64, StreamdError> {
        let stream = handle.name.clone();
        match settled {
            Settled::Closed(log_index) => {
                tracing::info!(stream, stream_epoch = %handle.epoch, offset = target, log_index, "closed stream");
                self.remove_served(handle, target);
                Ok(target)
            }
            Settled::Gone(refusal) => {
                self.remove_served(handle, target);
                Err(StreamdError::NotOwner {
                    stream,
                    owner: Some(refusal),
                })
            }
            Settled::Fenced(why) => {
                self.fence(&why);
                Err(StreamdError::Fenced)
            }
            Settled::Unknown(why) => Err(StreamdError::Unavailable(why)),
        }
    }

    /// Proposes the close until the log answers or `deadline` passes, and reads a
    /// refusal against the view: a refusal does not prove that no earlier attempt landed.
    async fn settle_close(&self, handle: &StreamHandle, deadline: Option<Instant>) -> Settled {
        let command = Command::CloseStream {
            stream: handle.id,
            stream_epoch: handle.epoch,
        };
        // Without a deadline, a day stands for none.
        let deadline_or_far = || deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
        let proposer = self.proposer();
        loop {
            let proposal = self.metad.propose(&proposer, command.clone());
            let why = match tokio::time::timeout_at(deadline_or_far(), proposal).await {
                Ok(Ok((index, Ok(_)))) => return Settled::Closed(Some(index)),
                Ok(Ok((_, Err(r)))) if matches!(r.code, RejectCode::Fenced | RejectCode::Superseded) => {
                    return Settled::Fenced(r.message);
                }
                Ok(Ok((index, Err(r)))) => {
                    let applied = async {
                        tokio::select! {
                            _ = self.view.wait_applied(index) => true,
                            _ = self.fenced.cancelled() => false,
                        }
                    };
                    return match tokio::time::timeout_at(deadline_or_far(), applied).await {
                        Ok(true) => self.read_close(handle, r.message),
                        _ => Settled::Unknown(format!(
                            "refused at log index {index} ({}), and the view did not reach it",
                            r.message
                        )),
                    };
                }
                Ok(Err(e)) => format!("metadata log: {e}"),
                Err(_) => "metadata log: no answer in time".to_string(),
            };
            let now = Instant::now();
            let wait = backoff.next_wait();
            if self.fenced.is_cancelled() || deadline.is_some_and(|d| now + wait >= d) {
                return Settled::Unknown(why);
            }
            tracing::debug!(stream = %handle.name, error = %why, retry_in = ?wait, "close not answered; asking again");
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.fenced.cancelled() => return Settled::Unknown(why),
            }
        }
    }

    /// What the view, applied through a refusal of this close, says became of it.
    fn read_close(&self, handle: &StreamHandle, refusal: String) -> Settled {
        self.view.with(|s| {
            match s.nodes.get(&self.me.node) {
                Some(row) if row.epoch == self.me.epoch && !row.fenced => {}
                _ => return Settled::Fenced(format!("its node row is fenced or replaced ({refusal})")),
            }
            match s.streams.get(&handle.id) {
                None => Settled::Gone(refusal),
                // The stream is reopened only after a close, and ours is the only one
                // a live owner's stream gets: it landed before the refusal.
                Some(row) if row.epoch > handle.epoch => Settled::Closed(None),
                Some(row) if row.epoch == handle.epoch && row.state == StreamState::Closed => Settled::Closed(None),
                // Refused for another reason, which no model rule has today: an earlier
                // attempt may still land later, so it is not taken as "not closed".
                Some(row)
                    if row.epoch == handle.epoch
                        && row.state == StreamState::Open
                        && row.owner.as_ref() == Some(&self.me) =>
                {
                    Settled::Unknown(format!("refused while the stream is still open here ({refusal})"))
                }
                Some(_) => Settled::Gone(refusal),
            }
        })
    }

    /// Keeps asking the log about a close nobody waits for any more; intake stays
    /// closed until it answers, or until this incarnation is fenced. The answer is a
    /// close in the end (the stream moves, by the transfer's mark or by placement),
    /// unless the stream left this node meanwhile. One such task per stream: it holds
    /// this close's count, and a later unconfirmed close only gives its own back.
    async fn settle_later(self: &Arc<Self>, handle: Arc<StreamHandle>, target: u64) {
        {
            let mut inner = handle.inner.lock().await;
            if inner.settling {
                inner.closers = inner.closers.saturating_sub(1);
                return;
            }
            inner.settling = true;
        }
        let node = self.clone();
        let name = handle.name.clone();
        tracing::warn!(stream = %name, stream_epoch = %handle.epoch, "close not confirmed by the metadata log; the stream takes no appends until it is");
        self.tasks
            .spawn("close", "settle an unconfirmed close", Some(name.clone()), async move {
                let settled = loop {
                    match node.settle_close(&handle, None).await {
                        Settled::Unknown(why) if !node.fenced.is_cancelled() => {
                            tracing::debug!(stream = %name, error = %why, "close still not settled");
                            tokio::select! {
                                _ = tokio::time::sleep(RETRY_MAX) => {}
                                _ = node.fenced.cancelled() => {}
                            }
                        }
                        settled => break settled,
                    }
                };
                tracing::info!(stream = %name, outcome = ?settled, "unconfirmed close settled");
                handle.inner.lock().await.settling = false;
                let _ = node.finish_close(&handle, target, settled);
            });
    }
}

/// This close is over without closing the stream: intake reopens unless another close
/// is still under way.
async fn release_intake(handle: &StreamHandle) {
    let mut inner = handle.inner.lock().await;
    inner.closers = inner.closers.saturating_sub(1);
}
