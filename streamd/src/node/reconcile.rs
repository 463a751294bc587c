//! Keeps what the node serves equal to what the view says it owns: opens streams
//! placed on it (at stream epoch + 1), stops serving streams now owned by another
//! `(node, epoch)` (FO-FEN-9), and stops the node when its own row is fenced or
//! replaced (FO-FEN-8, SD-TRG-3). A failed open is retried on a doubling backoff
//! (RR-WAL-7); until it succeeds the stream is not served, so it takes no appends.

use super::Node;
use crate::stream::StreamHandle;
use futures::StreamExt;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use weir_meta::model::{Applied, Command, StreamState};
use weir_shared::backoff::Backoff;
use weir_shared::ids::StreamId;

/// Reconciles on every view change, and when a failed open is due again, until the
/// node is fenced or `cancel` fires.
pub async fn reconcile_loop(node: Arc<Node>, cancel: tokio_util::sync::CancellationToken) {
    let mut applied = node.view.subscribe();
    let mut retries = OpenRetries::default();
    loop {
        if node.is_admitted() {
            reconcile(&node, &mut retries).await;
        }
        let due = retries.earliest();
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = node.fenced.cancelled() => return,
            changed = applied.changed() => if changed.is_err() { return },
            // Never sooner than a floor: a pass that returned early leaves an overdue retry.
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now).max(Instant::now() + RETRY_FLOOR)), if due.is_some() => {}
        }
    }
}

/// RR-WAL-7: the first wait before a failed open is tried again, and the longest.
const OPEN_RETRY_FIRST: Duration = Duration::from_millis(250);
const OPEN_RETRY_MAX: Duration = Duration::from_secs(30);
/// The least time between two passes a retry wakes.
const RETRY_FLOOR: Duration = Duration::from_millis(50);

/// Streams whose open failed: when each may be tried again, and its backoff.
#[derive(Default)]
struct OpenRetries(HashMap<StreamId, (Instant, Backoff)>);

impl OpenRetries {
    fn ready(&self, id: StreamId, now: Instant) -> bool {
        self.0.get(&id).is_none_or(|(due, _)| *due <= now)
    }

    /// Records a failed open; the wait before the next attempt.
    fn failed(&mut self, id: StreamId) -> Duration {
        let (due, backoff) = self
            .0
            .entry(id)
            .or_insert_with(|| (Instant::now(), Backoff::new(OPEN_RETRY_FIRST, OPEN_RETRY_MAX)));
        let wait = backoff.next_wait();
        *due = Instant::now() + wait;
        wait
    }

    fn earliest(&self) -> Option<Instant> {
        self.0.values().map(|(due, _)| *due).min()
    }
}

/// Placed streams opened at once.
const OPEN_CONCURRENCY: usize = 16;

async fn reconcile(node: &Arc<Node>, retries: &mut OpenRetries) {
    let me = node.me.clone();
    // Our own row: fenced or superseded means stop at once.
    let row_state = node.view.with(|s| s.nodes.get(&me.node).map(|r| (r.epoch, r.fenced)));
    match row_state {
        Some((epoch, fenced)) if epoch == me.epoch && !fenced => {}
        Some((epoch, true)) if epoch == me.epoch => return node.fence("its node row is fenced"),
        Some((epoch, _)) => return node.fence(&format!("a newer registration (epoch {epoch}) replaced it")),
        None => return,
    }
    // Streams served that the view gives to someone else, or closed, or deleted.
    for handle in node.all_streams() {
        let keep = node.view.with(|s| {
            s.streams.get(&handle.id).is_some_and(|row| {
                row.owner.as_ref() == Some(&me) && row.state == StreamState::Open && row.epoch == handle.epoch
            })
        });
        if !keep {
            let end = handle.inner.lock().await.committed_end;
            tracing::info!(stream = %handle.name, stream_epoch = %handle.epoch, "ownership moved; no longer serving the stream");
            node.remove_stream(handle.id, end);
            continue;
        }
        // A trim another proposer made (an operator's) moves the served start too.
        let start = node.view.with(|s| s.streams.get(&handle.id).map(|r| r.start_offset.0));
        if let Some(start) = start {
            node.apply_start(&handle, start).await;
        }
        node.recheck_cleared_damage(&handle);
    }
    // Deleted streams this incarnation holds: it has stopped serving them, so it destroys them.
    let deleted: Vec<StreamId> = node.view.with(|s| {
        s.streams
            .values()
            .filter(|row| row.owner.as_ref() == Some(&me) && row.state == StreamState::Deleted)
            .map(|row| row.id)
            .collect()
    });
    for stream in deleted {
        match node
            .metad
            .propose(&node.proposer(), Command::DestroyStream { stream })
            .await
        {
            Ok((index, Ok(_))) => tracing::info!(stream = %stream, log_index = index, "destroyed deleted stream"),
            Ok((_, Err(r))) => tracing::debug!(stream = %stream, rejection = %r, "deleted stream not destroyed"),
            Err(e) => tracing::debug!(stream = %stream, error = %e, "deleted stream not destroyed yet"),
        }
    }
    // Streams placed on this incarnation that it does not serve yet.
    let to_open: Vec<(StreamId, String)> = node.view.with(|s| {
        s.streams
            .values()
            .filter(|row| row.owner.as_ref() == Some(&me) && row.state != StreamState::Deleted)
            .map(|row| (row.id, row.name.clone()))
            .collect()
    });
    let served: HashSet<StreamId> = node.all_streams().iter().map(|h| h.id).collect();
    // Only streams still placed here and not served yet keep a retry.
    let placed: HashSet<StreamId> = to_open.iter().map(|(id, _)| *id).collect();
    retries.0.retain(|id, _| !served.contains(id) && placed.contains(id));
    let now = Instant::now();
    let due: Vec<(StreamId, String)> = to_open
        .into_iter()
        .filter(|(id, _)| !served.contains(id) && retries.ready(*id, now))
        .collect();
    // Several at a time: each open waits on metad and reads its producer-state tail.
    let results: Vec<(StreamId, String, Result<(), String>)> = futures::stream::iter(due)
        .map(|(id, name)| async move {
            let result = open_stream(node, id, &name).await;
            (id, name, result)
        })
        .buffer_unordered(OPEN_CONCURRENCY)
        .collect()
        .await;
    for (id, name, result) in results {
        match result {
            // Opened, or refused until the view changes: no timer.
            Ok(()) => {
                retries.0.remove(&id);
            }
            Err(why) => {
                let retry_in = retries.failed(id);
                tracing::warn!(stream = name, error = %why, retry_in = ?retry_in, "cannot open stream yet; will retry");
            }
        }
    }
}

/// Opens a placed stream; a retried open after an unknown outcome gets the same epoch.
/// `Err` says why an open that should be retried failed (a metadata or object-store
/// read error); a refusal is not retried until the view changes.
async fn open_stream(node: &Arc<Node>, id: StreamId, name: &str) -> Result<(), String> {
    // Tests: a slow open, so the placed node can change incarnation first (FO-TKO-17).
    weir_shared::failpoint::pause("open_stream").await;
    let result = node
        .metad
        .propose(
            &node.proposer(),
            Command::OpenStream {
                stream: id,
                stamps_leader_epochs: true,
            },
        )
        .await;
    match result {
        Ok((
            index,
            Ok(Applied::StreamOpened {
                stream_epoch,
                committed_end,
            }),
        )) => {
            // Apply through the open so the committed ranges we start from are current.
            node.view.wait_applied(index).await;
            let row = node.view.with(|s| s.streams.get(&id).cloned());
            let Some(row) = row.filter(|r| r.epoch == stream_epoch && r.owner.as_ref() == Some(&node.me)) else {
                return Ok(());
            };
            let rebuilt = if weir_shared::failpoint::fails("open_read") {
                // Tests: the tail's read fails as an unreachable object store would.
                Err(crate::error::StreamdError::Unavailable("failpoint open_read".into()))
            } else {
                node.rebuild_tail_state(id, committed_end.0).await
            };
            let tail = match rebuilt {
                Ok(mut t) => {
                    // A range holding the start can carry trimmed producers' batches.
                    t.forget_below(row.start_offset.0);
                    t
                }
                // Damaged data is never served, but must not keep the stream closed to appends.
                Err(e @ crate::error::StreamdError::Corrupt(_)) => {
                    tracing::error!(stream = name, error = %e, "producer state not rebuilt from damaged data; duplicates of earlier idempotent batches are not detected");
                    Default::default()
                }
                Err(e) => return Err(format!("cannot rebuild producer state: {e}")),
            };
            let leader_epoch = weir_meta::model::leader_epochs::stamped_at(&row, stream_epoch);
            let handle = StreamHandle::new(
                id,
                name.to_string(),
                stream_epoch,
                leader_epoch,
                row.start_offset.0,
                committed_end.0,
                tail,
            );
            tracing::info!(stream = name, stream_epoch = %stream_epoch, leader_epoch, offset = committed_end.0, log_index = index, "opened stream");
            node.insert_stream(Arc::new(handle));
            Ok(())
        }
        Ok((_, Ok(other))) => {
            tracing::warn!(stream = name, ?other, "unexpected answer to OpenStream");
            Ok(())
        }
        Ok((_, Err(rejection))) => {
            use weir_meta::model::RejectCode;
            match rejection.code {
                RejectCode::Fenced | RejectCode::Superseded => node.fence(&rejection.message),
                _ => tracing::debug!(stream = name, %rejection, "stream not opened"),
            }
            Ok(())
        }
        Err(e) => Err(format!("metadata unavailable: {e}")),
    }
}
