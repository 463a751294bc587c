//! Keeps what the node serves equal to what the view says it owns: opens streams
//! placed on it (at stream epoch + 1), stops serving streams now owned by another
//! `(node, epoch)` (FO-FEN-9), and stops the node when its own row is fenced or
//! replaced (FO-FEN-8, SD-TRG-3). A failed open is retried on a doubling backoff
//! (RR-WAL-7); until it succeeds the stream is not served, so it takes no appends.
//!
//! A pass visits the streams whose rows changed since the last one (the view's change
//! tracker), and the opens due for a retry; only after a fresh snapshot of the view
//! does it visit every stream the node serves or owns (D-23). Opens go to the log in
//! batches of up to [`MAX_BATCH`] streams, one `OpenStreams` entry each.

use super::Node;
use crate::stream::StreamHandle;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use weir_meta::model::{Applied, Command, RejectCode, State, StreamState, MAX_BATCH};
use weir_meta::view::{Changed, ChangedStreams};
use weir_shared::backoff::Backoff;
use weir_shared::ids::{Incarnation, StreamEpoch, StreamId};

/// Reconciles on every view change, and when a failed open is due again, until the
/// node is fenced or `cancel` fires.
pub async fn reconcile_loop(node: Arc<Node>, cancel: tokio_util::sync::CancellationToken) {
    let mut applied = node.view.subscribe();
    let changed = node.view.track();
    let mut retries = OpenRetries::default();
    loop {
        if node.is_admitted() {
            reconcile(&node, &changed, &mut retries).await;
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

    fn due(&self, now: Instant) -> impl Iterator<Item = StreamId> + '_ {
        self.0
            .iter()
            .filter(move |(_, (due, _))| *due <= now)
            .map(|(id, _)| *id)
    }
}

/// What one stream needs, as a pass finds it.
#[derive(Debug, PartialEq, Eq)]
enum Need {
    Nothing,
    /// Served, and the view says it still is this node's at that epoch.
    Keep,
    /// Served, but the view gives it to another owner, or closed or deleted it.
    StopServing,
    /// Placed on this incarnation and not served: open it.
    Open,
    /// Deleted while this incarnation holds it: destroy it.
    Destroy,
}

/// The streams a pass looks at: those that changed, those whose open is due again,
/// and when anything may have changed (after a snapshot) every stream `all` lists.
fn to_visit(
    changed: ChangedStreams,
    due: impl Iterator<Item = StreamId>,
    all: impl FnOnce() -> Vec<StreamId>,
) -> BTreeSet<StreamId> {
    let mut visit: BTreeSet<StreamId> = due.collect();
    match changed {
        ChangedStreams::Some(ids) => visit.extend(ids),
        ChangedStreams::All => visit.extend(all()),
    }
    visit
}

/// What stream `id` needs, given the handle this node serves it with, if any.
fn need_of(node: &Node, id: StreamId, handle: Option<&Arc<StreamHandle>>) -> Need {
    node.view.with(|s| need_in(s, &node.me, id, handle.map(|h| h.epoch)))
}

/// What stream `id` needs in `state` on incarnation `me`, whose handle of it is at
/// epoch `served`, or which has none. A stream open here without a handle needs
/// nothing: it gets one on first use.
fn need_in(state: &State, me: &Incarnation, id: StreamId, served: Option<StreamEpoch>) -> Need {
    let mine = state.streams.get(&id).filter(|r| r.owner.as_ref() == Some(me));
    match (served, mine) {
        (Some(epoch), Some(r)) if r.state == StreamState::Open && r.epoch == epoch => Need::Keep,
        (Some(_), _) => Need::StopServing,
        (None, Some(r)) if r.state == StreamState::Deleted => Need::Destroy,
        (None, Some(r)) if r.state == StreamState::Closed => Need::Open,
        (None, _) => Need::Nothing,
    }
}

async fn reconcile(node: &Arc<Node>, changed: &Changed, retries: &mut OpenRetries) {
    let me = node.me.clone();
    // Our own row: fenced or superseded means stop at once.
    let row_state = node.view.with(|s| s.nodes.get(&me.node).map(|r| (r.epoch, r.fenced)));
    match row_state {
        Some((epoch, fenced)) if epoch == me.epoch && !fenced => {}
        Some((epoch, true)) if epoch == me.epoch => return node.fence("its node row is fenced"),
        Some((epoch, _)) => return node.fence(&format!("a newer registration (epoch {epoch}) replaced it")),
        None => return,
    }
    let now = Instant::now();
    let mut opens = Vec::new();
    let mut destroys = Vec::new();
    let visit = to_visit(changed.take(), retries.due(now), || node.served_or_owned());
    for id in visit {
        node.forget_stopped_if_settled(id);
        let mut handle = node.served(id);
        let mut need = need_of(node, id, handle.as_ref());
        if need == Need::StopServing {
            let served = handle.take().expect("served");
            // A deleted stream's records are nobody's to keep: all of its WAL records
            // are given up, so a delete frees WAL space at once (issue 60). A stream
            // that moved keeps what is not committed until its move settles it.
            let deleted = node
                .view
                .with(|s| s.streams.get(&id).is_none_or(|r| r.state == StreamState::Deleted));
            let end = if deleted {
                u64::MAX
            } else {
                served.inner.lock().await.committed_end
            };
            tracing::info!(stream = %served.name, stream_epoch = %served.epoch, deleted, "ownership moved; no longer serving the stream");
            node.remove_stream(served.id, end);
            // Placed here again at a later epoch, or deleted: acted on in this pass.
            need = need_of(node, id, None);
        }
        match need {
            Need::Keep => {
                let handle = handle.expect("served");
                // A trim another proposer made (an operator's) moves the served start too.
                let start = node.view.with(|s| s.streams.get(&id).map(|r| r.start_offset.0));
                if let Some(start) = start {
                    node.apply_start(&handle, start).await;
                }
                node.recheck_cleared_damage(&handle);
                retries.0.remove(&id);
            }
            Need::StopServing => unreachable!("acted on above"),
            Need::Open if retries.ready(id, now) => opens.push(id),
            Need::Open => {}
            Need::Destroy => {
                retries.0.remove(&id);
                destroys.push(id);
            }
            Need::Nothing => {
                retries.0.remove(&id);
            }
        }
    }
    for stream in destroys {
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
    for batch in opens.chunks(MAX_BATCH) {
        if node.fenced.is_cancelled() {
            return;
        }
        match open_streams(node, batch).await {
            Ok(()) => {
                for id in batch {
                    retries.0.remove(id);
                }
            }
            Err(why) => {
                for &id in batch {
                    let retry_in = retries.failed(id);
                    tracing::warn!(stream = %id, error = %why, retry_in = ?retry_in, "cannot open stream yet; will retry");
                }
            }
        }
    }
}

/// Opens placed streams with one `OpenStreams` entry; a retried open after an unknown
/// outcome gets the same epochs. `Err` says why the whole batch should be retried (the
/// metadata log did not answer); a stream the log refuses is not retried until its row
/// changes.
async fn open_streams(node: &Arc<Node>, streams: &[StreamId]) -> Result<(), String> {
    // Tests: a slow open, so the placed node can change incarnation first (FO-TKO-17).
    weir_shared::failpoint::pause("open_stream").await;
    let command = Command::OpenStreams {
        streams: streams.to_vec(),
        stamps_leader_epochs: true,
    };
    let (index, outcome) = node
        .metad
        .propose(&node.proposer(), command)
        .await
        .map_err(|e| format!("metadata unavailable: {e}"))?;
    let outcomes = match outcome {
        Ok(Applied::Each { outcomes }) => outcomes,
        Ok(other) => {
            tracing::warn!(?other, "unexpected answer to OpenStreams");
            return Ok(());
        }
        Err(r) if matches!(r.code, RejectCode::Fenced | RejectCode::Superseded) => {
            node.fence(&r.message);
            return Ok(());
        }
        Err(r) => {
            tracing::warn!(rejection = %r, "streams not opened");
            return Ok(());
        }
    };
    // Apply through the open, so the rows we start from are current.
    node.view.wait_applied(index).await;
    let mut opened = Vec::new();
    for (&id, outcome) in streams.iter().zip(outcomes) {
        let (stream_epoch, committed_end) = match outcome {
            Ok(Applied::StreamOpened {
                stream_epoch,
                committed_end,
            }) => (stream_epoch, committed_end),
            Ok(other) => {
                tracing::warn!(stream = %id, ?other, "unexpected answer to the open of a stream");
                continue;
            }
            Err(rejection) => {
                tracing::debug!(stream = %id, %rejection, "stream not opened");
                continue;
            }
        };
        let row = node.view.with(|s| s.streams.get(&id).cloned());
        let Some(row) = row.filter(|r| r.epoch == stream_epoch && r.owner.as_ref() == Some(&node.me)) else {
            continue;
        };
        // Its handle comes with its first use (`handles`); its producer state is
        // rebuilt ahead for the streams with data, so their first appends find it.
        let leader_epoch = weir_meta::model::leader_epochs::stamped_at(&row, stream_epoch);
        tracing::info!(stream = %row.name, stream_epoch = %stream_epoch, leader_epoch, offset = committed_end.0, log_index = index, "opened stream");
        if committed_end.0 > 0 {
            opened.extend(node.handle(id));
        }
    }
    node.prefetch_tails(opened);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_meta::model::{Delta, Row, RowKey};
    use weir_meta::view::View;

    /// D-23: with 100,000 streams open on this node, a change to one of them makes a
    /// pass visit that one stream and read that one row.
    #[test]
    fn a_change_to_one_of_100_000_streams_visits_one() {
        let (state, me) = weir_meta::crowd::open_on_one_node(100_000);
        let view = View::default();
        view.install(state.clone());
        let changed = view.track();
        assert_eq!(
            changed.take(),
            ChangedStreams::All,
            "a new tracker looks at everything once"
        );
        let mut row = state.streams[&StreamId(42)].clone();
        row.state = StreamState::Closed;
        view.install_delta(&Delta {
            index: state.applied_index + 1,
            changes: vec![weir_meta::model::Change {
                key: RowKey::Stream(StreamId(42)),
                row: Some(Row::Stream(row)),
            }],
        });
        let visit = to_visit(changed.take(), std::iter::empty(), || panic!("not a full pass"));
        assert_eq!(visit.into_iter().collect::<Vec<_>>(), [StreamId(42)]);
        let before = view.with(|s| s.streams.visits());
        let need = view.with(|s| need_in(s, &me, StreamId(42), Some(StreamEpoch(1))));
        assert_eq!(need, Need::StopServing, "closed in the view");
        assert_eq!(view.with(|s| s.streams.visits()) - before, 1);
    }
}
