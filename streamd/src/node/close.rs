//! Closing streams: stop intake, let in-flight appends become durable, upload and
//! commit every buffered record, then close them in the metadata log, many streams
//! per `CloseStreams` entry (D-23): a drain hands a node's streams off in a few
//! entries, not one per stream.
//!
//! Intake reopens only once the log says the close did not land. A close whose answer
//! was lost, or that was refused because an earlier attempt of it already landed, may
//! have closed the stream: an append acknowledged after that is lost, since the next
//! owner starts from the committed end.

use super::Node;
use crate::error::StreamdError;
use crate::stream::StreamHandle;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use weir_meta::model::{Applied, Command, RejectCode, StreamAt, StreamState, MAX_BATCH};
use weir_shared::backoff::Backoff;

/// How long a close may take when its caller sets no bound.
pub const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits between attempts at a `CloseStreams` that got no answer.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// How often a close waiting for its upload looks again at whether it is still served.
const COMMIT_RECHECK: Duration = Duration::from_millis(100);
/// How long the closes of a batch wait for one more of them to be ready, so those
/// ready together go in one entry.
const CLOSE_LINGER: Duration = Duration::from_millis(10);

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
    /// lies below. As [`Node::close_streams`] for one stream.
    pub async fn close_stream(self: &Arc<Self>, stream: &str, within: Duration) -> Result<u64, StreamdError> {
        let mut results = self.close_streams(&[stream.to_string()], within).await;
        results.pop().expect("one result per stream")
    }

    /// Closes `streams` within `within`; for each, in order, the end offset every
    /// acknowledged record lies below, or why it did not close. Each stream stops
    /// intake and waits for its records to be durable and committed on its own, so
    /// one that hangs or fails holds up none of the others (SD-ADM-11); those ready
    /// together close together, in one `CloseStreams` entry per [`MAX_BATCH`]. A close
    /// that cannot finish in time reopens the stream's intake, so a transfer that gave
    /// up releases its gate (SD-DRN-4, SD-DRN-7), unless its close may still land: then
    /// intake stays closed until the log settles it.
    pub async fn close_streams(
        self: &Arc<Self>,
        streams: &[String],
        within: Duration,
    ) -> Vec<Result<u64, StreamdError>> {
        use futures::StreamExt;
        let deadline = Instant::now() + within;
        let mut results: Vec<Option<Result<u64, StreamdError>>> = streams.iter().map(|_| None).collect();
        let mut preparing: futures::stream::FuturesUnordered<_> = streams
            .iter()
            .enumerate()
            .map(|(i, name)| async move { (i, self.prepare_close(name, deadline, within).await) })
            .collect();
        let mut ready = Vec::new();
        loop {
            // Those ready within a moment of each other close in one entry; the first
            // of a batch is waited for as long as it takes.
            let next = if ready.is_empty() {
                preparing.next().await
            } else {
                tokio::time::timeout(CLOSE_LINGER, preparing.next())
                    .await
                    .ok()
                    .flatten()
            };
            match next {
                Some((i, Ok((handle, target)))) => {
                    ready.push((i, handle, target));
                    if ready.len() < MAX_BATCH {
                        continue;
                    }
                }
                Some((i, Err(e))) => {
                    results[i] = Some(Err(e));
                    continue;
                }
                None if ready.is_empty() => break,
                None => {}
            }
            let batch = std::mem::take(&mut ready);
            let handles: Vec<Arc<StreamHandle>> = batch.iter().map(|(_, h, _)| h.clone()).collect();
            let settled = self.settle_closes(&handles, Some(deadline)).await;
            for ((i, handle, target), settled) in batch.into_iter().zip(settled) {
                results[i] = Some(match settled {
                    Settled::Unknown(why) => {
                        self.settle_later(handle.clone(), target).await;
                        Err(StreamdError::Unavailable(format!(
                            "close of stream '{}' not confirmed ({why}); it takes no appends until the metadata log settles it",
                            handle.name
                        )))
                    }
                    settled => self.finish_close(&handle, target, settled),
                });
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every stream has its result"))
            .collect()
    }

    /// Stops `stream`'s intake and waits, up to `deadline`, until everything it
    /// admitted is durable and committed; its handle and end offset. On failure its
    /// intake reopens.
    async fn prepare_close(
        &self,
        stream: &str,
        deadline: Instant,
        within: Duration,
    ) -> Result<(Arc<StreamHandle>, u64), StreamdError> {
        let handle = self.stream(stream)?;
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
        let mut committed = handle.committed.subscribe();
        loop {
            if *committed.borrow_and_update() >= target {
                return Ok((handle, target));
            }
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
                _ = committed.changed() => {}
                _ = tokio::time::sleep_until(deadline.min(Instant::now() + COMMIT_RECHECK)) => {}
                _ = self.fenced.cancelled() => {}
            }
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

    /// Proposes the closes of `handles` in one entry until the log answers or
    /// `deadline` passes, and reads each refusal against the view: a refusal does not
    /// prove that no earlier attempt landed. One outcome per handle, in order.
    async fn settle_closes(&self, handles: &[Arc<StreamHandle>], deadline: Option<Instant>) -> Vec<Settled> {
        let command = Command::CloseStreams {
            streams: handles
                .iter()
                .map(|h| StreamAt {
                    stream: h.id,
                    stream_epoch: h.epoch,
                })
                .collect(),
        };
        let all = |settled: &dyn Fn() -> Settled| handles.iter().map(|_| settled()).collect::<Vec<_>>();
        // Without a deadline, a day stands for none.
        let deadline_or_far = || deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
        let proposer = self.proposer();
        loop {
            let proposal = self.metad.propose(&proposer, command.clone());
            let why = match tokio::time::timeout_at(deadline_or_far(), proposal).await {
                Ok(Ok((_, Err(r)))) if matches!(r.code, RejectCode::Fenced | RejectCode::Superseded) => {
                    return all(&|| Settled::Fenced(r.message.clone()));
                }
                Ok(Ok((index, outcome))) => {
                    // Each refusal is read on the view applied through this entry.
                    let applied = async {
                        tokio::select! {
                            _ = self.view.wait_applied(index) => true,
                            _ = self.fenced.cancelled() => false,
                        }
                    };
                    let seen = matches!(tokio::time::timeout_at(deadline_or_far(), applied).await, Ok(true));
                    let refused = |handle: &StreamHandle, message: String| {
                        if seen {
                            self.read_close(handle, message)
                        } else {
                            Settled::Unknown(format!(
                                "refused at log index {index} ({message}), and the view did not reach it"
                            ))
                        }
                    };
                    return match outcome {
                        Ok(Applied::Each { outcomes }) => handles
                            .iter()
                            .zip(outcomes)
                            .map(|(handle, outcome)| match outcome {
                                Ok(_) => Settled::Closed(Some(index)),
                                Err(r) => refused(handle, r.message),
                            })
                            .collect(),
                        Ok(other) => all(&|| Settled::Unknown(format!("unexpected answer to CloseStreams: {other:?}"))),
                        Err(r) => handles.iter().map(|h| refused(h, r.message.clone())).collect(),
                    };
                }
                Ok(Err(e)) => format!("metadata log: {e}"),
                Err(_) => "metadata log: no answer in time".to_string(),
            };
            let now = Instant::now();
            let wait = backoff.next_wait();
            if self.fenced.is_cancelled() || deadline.is_some_and(|d| now + wait >= d) {
                return all(&|| Settled::Unknown(why.clone()));
            }
            tracing::debug!(streams = handles.len(), error = %why, retry_in = ?wait, "close not answered; asking again");
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.fenced.cancelled() => return all(&|| Settled::Unknown(why.clone())),
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
                    let settled = node.settle_closes(std::slice::from_ref(&handle), None).await;
                    match settled.into_iter().next().expect("one outcome") {
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
