//! Drain-support of a stopping streamd (F steps 2–5, D-3). It keeps serving for
//! `--shutdown-drain-sec` and ends live reads. Then, when another live schedulable
//! streamd exists, it asks the metad leader to drain it (`stopping_node_drain`,
//! SD-DRN-8): the leader cordons it and moves its streams in batches by planned
//! transfer. Each stream's intake stops when its transfer's close begins (SD-INT-10:
//! no append is admitted after its stream's final upload began), not for all streams
//! at once: a stream waiting for its batch still takes appends, so none is unwritable
//! for longer than its own hand-off, however many the node holds (D-23). Then intake
//! stops on every stream, and whatever did not move is closed in place (its buffered
//! records uploaded and committed) while the drain's cordon is released (SD-ADM-1,
//! SD-REL-8). What still does not close is left to failover after the self-fence.
//! Every wait is bounded by the drain timeout and the deadline.

use crate::node::Node;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use weir_meta::client::ClientError;
use weir_meta::model::{Command, CordonBy, NodeKind, State, MAX_BATCH};
use weir_proto::metad::DrainRequest;
use weir_shared::shutdown::{PhaseOutcome as Outcome, Shutdown};

/// SD-REL-6: the release of the drain's cordon always gets at least this long.
const RELEASE_GRACE: Duration = Duration::from_secs(1);
/// SD-ADM-1: the most of the drain timeout kept for part 2, closing in place what the
/// drain request (part 1) did not move.
const CLOSE_SHARE_MAX: Duration = Duration::from_secs(2);

/// What part 1 may spend of `left`, the drain time left: all but part 2's share, a
/// quarter of the drain timeout (at most [`CLOSE_SHARE_MAX`]) and never more than half
/// of `left`. A drain request never answered would otherwise spend it all, and the
/// closes would start with nothing left, leaving buffered records to failover.
fn part_1_budget(shutdown: &Shutdown, left: Duration) -> Duration {
    let share = (shutdown.drain_timeout() / 4).min(CLOSE_SHARE_MAX).min(left / 2);
    left - share
}
/// How long one look for the metadata leader may take.
const LEADER_PROBE: Duration = Duration::from_secs(1);

/// How the request for this node's own drain ended.
enum Requested {
    /// No leader was observed within the budget: nothing was asked, nothing cordoned.
    NoLeader,
    /// The leader answered with its report.
    Answered(serde_json::Value),
    /// The request was sent, but no answer came (it may have been received); why, and
    /// the leader last asked.
    Unanswered { error: String, leader: String },
}

pub async fn drain(node: &Arc<Node>, shutdown: &Shutdown) -> Outcome {
    tokio::time::sleep(shutdown.step(shutdown.drain_window)).await;
    node.reads_end.cancel();
    let (operator_cordon, replacement) = node.view.with(|s| {
        let cordon = s.nodes.get(&node.me.node).and_then(|n| n.cordon);
        // The leader's own choice of destination, on this node's view (SD-DRN-8/13).
        let replacement = weir_meta::drain_plan::choose_destination(s, &node.me.node).is_some();
        (cordon == Some(CordonBy::Operator), replacement)
    });
    // SD-REL-2: remembered before the drain; the drain never clears it.
    if operator_cordon {
        tracing::info!(node_id = %node.me.node, "preserving operator cordon across graceful shutdown");
    }
    let mut outcome = Outcome::Completed;
    let mut requested = false;
    if replacement {
        // Each stream's intake stops when its transfer's close begins, before its final
        // upload (SD-INT-10), so a stream still waiting for its batch takes appends and
        // none is unwritable for longer than its own hand-off (D-23).
        tracing::info!("live reads ended; intake stops on each stream as it moves");
    }
    if !replacement {
        // SD-DRN-13: nowhere to move to; everything closes in place and is placed again
        // when a node comes back.
        tracing::warn!("no live schedulable replacement node remains; admitted work completes in place");
    } else {
        match request_own_drain(node, shutdown).await {
            Requested::NoLeader => {
                // SD-REL-3: nothing was cordoned, so nothing is released.
                tracing::warn!("timed out reaching the leader before requesting a graceful shutdown drain");
                outcome = Outcome::Abandoned;
            }
            Requested::Answered(report) => {
                requested = true;
                let moved = report["streams"]
                    .as_array()
                    .map_or(0, |s| s.iter().filter(|m| m["moved"] == true).count());
                let leader = report["leader"].as_str().unwrap_or_default();
                // OBS-8, OBS-10: the leader that acted and its account of each stream.
                if report["finished"] == true {
                    tracing::info!(node_id = %node.me.node, leader, moved, account = %report, "drained local node before graceful shutdown");
                } else if report["timed_out"] == true {
                    tracing::warn!(node_id = %node.me.node, leader, moved, account = %report, "timed out moving scheduled work off the local node before graceful shutdown");
                    outcome = Outcome::Abandoned;
                } else {
                    tracing::warn!(node_id = %node.me.node, leader, moved, account = %report, "failed to drain local node before graceful shutdown");
                    outcome = Outcome::Abandoned;
                }
            }
            Requested::Unanswered { error, leader } => {
                // SD-REL-4: the leader may have received it, so its cordon is released.
                requested = true;
                tracing::warn!(node_id = %node.me.node, leader, error, "the leader did not answer the graceful shutdown drain of the local node");
                outcome = Outcome::Abandoned;
            }
        }
    }
    // Whatever did not move takes no more appends: it closes in place below.
    node.intake_closed.store(true, Ordering::Release);
    tracing::info!("live reads ended and intake stopped");
    let release = async {
        if requested && !operator_cordon {
            release_cordon(node, shutdown).await
        } else {
            true
        }
    };
    let (closed, released) = tokio::join!(close_in_place(node, shutdown), release);
    let confirmed = if closed == Outcome::Completed {
        confirm_nothing_moves(node, shutdown).await
    } else {
        // The closes ran out: what is outstanding is reported as it stands now, a
        // stream busy meanwhile as such, without waiting on it.
        !report_outstanding(node, false).await
    };
    if closed != Outcome::Completed || !confirmed || !released {
        outcome = Outcome::Abandoned;
    }
    outcome
}

/// SD-ADM-12, OBS-11: after every close completed, the confirming pass over every
/// stream, within what is left of the drain timeout (a pass that waits on nothing ends
/// even when none is left). True when it saw no admitted work outstanding.
async fn confirm_nothing_moves(node: &Node, shutdown: &Shutdown) -> bool {
    let bound = shutdown.step(Duration::MAX);
    let pass = async {
        // Failpoint for OBS-11: a confirming pass that cannot finish in time.
        weir_shared::failpoint::pause("confirm_pass").await;
        report_outstanding(node, true).await
    };
    match tokio::time::timeout(bound, pass).await {
        Ok(outstanding) => !outstanding,
        Err(_) => {
            tracing::warn!(timeout = ?bound, "local graph drain timed out before confirming that no admitted work is still moving");
            false
        }
    }
}

/// SD-ADM-9, SD-ADM-12: what each stream still held when the drain stopped; all of it
/// is in the WAL, and failover uploads it after the self-fence. True when any did.
/// Without `wait`, a stream whose state is locked meanwhile is reported `busy`.
async fn report_outstanding(node: &Node, wait: bool) -> bool {
    let mut streams = Vec::new();
    for handle in node.all_streams() {
        let inner = if wait {
            handle.inner.lock().await
        } else {
            match handle.inner.try_lock() {
                Ok(inner) => inner,
                Err(_) => {
                    streams.push(serde_json::json!({ "stream": handle.name, "busy": true }));
                    continue;
                }
            }
        };
        let durable = handle.durable_end();
        let in_flight = inner.next_offset.saturating_sub(durable);
        let buffered = durable.saturating_sub(inner.committed_end);
        let uploading = inner.uploaded_end.saturating_sub(inner.committed_end);
        if in_flight + buffered == 0 {
            continue;
        }
        if buffered > 0 {
            tracing::warn!(stream = %handle.name, buffered_records = buffered, buffered_bytes = inner.buffered_bytes(), "uploader for stream '{}' did not drain before its configured deadline", handle.name);
        }
        streams.push(serde_json::json!({
            "stream": handle.name,
            "in_flight_appends": in_flight,
            "buffered_records": buffered,
            "buffered_bytes": inner.buffered_bytes(),
            "records_in_upload": uploading,
        }));
    }
    if streams.is_empty() {
        return false;
    }
    tracing::warn!(streams = %serde_json::Value::from(streams), "local graph drain timed out with admitted work outstanding");
    true
}

/// SD-DRN-8, SD-DRN-11, SD-REL-3: waits to observe a metadata leader, then asks it to
/// drain this incarnation with the time left, less part 2's share; asks the next
/// leader, within the same budget, when the one asked stops leading.
async fn request_own_drain(node: &Arc<Node>, shutdown: &Shutdown) -> Requested {
    let mut asked: Option<(String, String)> = None;
    // Part 1 ends here, whatever it asks and of whom; the rest is part 2's.
    let end = std::time::Instant::now() + part_1_budget(shutdown, shutdown.step(Duration::MAX));
    let part_1_left = || shutdown.step(end.saturating_duration_since(std::time::Instant::now()));
    loop {
        let left = part_1_left();
        if left.is_zero() {
            return match asked {
                Some((error, leader)) => Requested::Unanswered { error, leader },
                None => Requested::NoLeader,
            };
        }
        let Some(leader) = leader_address(node, left.min(LEADER_PROBE)).await else {
            tokio::time::sleep(part_1_left().min(Duration::from_millis(200))).await;
            continue;
        };
        let left = part_1_left();
        let request = DrainRequest {
            node: String::new(),
            budget_ms: left.as_millis().max(1) as u64,
            requester: serde_json::to_vec(&node.me).expect("an incarnation serializes"),
            principal: String::new(),
        };
        tracing::info!(node_id = %node.me.node, leader, budget = ?left, "requesting a graceful shutdown drain from the metadata leader");
        match node.metad.drain(request, left).await {
            Ok(report) => return Requested::Answered(report),
            Err(ClientError::Unavailable(e)) => {
                // The leader changed, lost leadership or went away mid-drain (or never
                // answered); moves it committed stay committed, and the next leader, asked
                // within the same budget, moves only what this node still owns.
                if !part_1_left().is_zero() {
                    tracing::warn!(leader, error = %e, "stopping-node drain lost leadership; remaining work needs the next leader");
                }
                asked = Some((e, leader));
                tokio::time::sleep(part_1_left().min(Duration::from_millis(200))).await;
            }
            Err(e) => {
                return Requested::Unanswered {
                    error: e.to_string(),
                    leader,
                }
            }
        }
    }
}

/// The leader's address, as some replica names it within `within`.
async fn leader_address(node: &Node, within: Duration) -> Option<String> {
    let status = tokio::time::timeout(within, node.metad.admin("status", 0, 0)).await;
    match status {
        Ok(Ok(s)) => s["leader_addr"].as_str().map(str::to_string),
        _ => None,
    }
}

/// SD-REL-5…10: clears the cordon the drain set, bounded by what is left of the drain
/// timeout (at least [`RELEASE_GRACE`], which alone applies without a live metadata
/// quorum), never past the deadline. True once the release committed.
async fn release_cordon(node: &Arc<Node>, shutdown: &Shutdown) -> bool {
    let quorum = node.view.with(metad_quorum_stays);
    let bound = if quorum {
        shutdown.drain_left().max(RELEASE_GRACE)
    } else {
        RELEASE_GRACE
    }
    .min(shutdown.deadline_left());
    let command = Command::Uncordon {
        node: node.me.node.clone(),
        by: CordonBy::Drain,
    };
    let started = tokio::time::Instant::now();
    let released = node.metad.propose_within(&node.proposer(), command, bound).await;
    // An attempt that got no answer within the bound timed out; any other failure is
    // the leader's (or its connection's) not answering.
    let released = match released {
        Err(_) if started.elapsed() >= bound => Err(None),
        Err(e) => Err(Some(e)),
        Ok(r) => Ok(r),
    };
    match released {
        Ok((index, Ok(_))) => {
            tracing::info!(node_id = %node.me.node, log_index = index, "cleared shutdown drain cordon before graceful shutdown");
            true
        }
        Ok((_, Err(r))) => {
            tracing::warn!(node_id = %node.me.node, rejection = %r, "failed to clear shutdown drain cordon before graceful shutdown");
            false
        }
        Err(Some(e)) => {
            tracing::warn!(node_id = %node.me.node, error = %e, "the leader did not answer the release of the shutdown drain cordon");
            false
        }
        Err(None) => {
            tracing::warn!(node_id = %node.me.node, timeout = ?bound, "timed out clearing shutdown drain cordon");
            false
        }
    }
}

/// SD-REL-7: whether the metad replicas that are live and not terminating form a quorum.
fn metad_quorum_stays(state: &State) -> bool {
    let metads: Vec<_> = state.nodes.values().filter(|n| n.kind == NodeKind::Metad).collect();
    let staying = metads.iter().filter(|n| n.is_live() && !n.terminating).count();
    metads.is_empty() || staying > metads.len() / 2
}

/// SD-ADM-2: closes every stream this node still serves, within the drain budget.
async fn close_in_place(node: &Arc<Node>, shutdown: &Shutdown) -> Outcome {
    use futures::StreamExt;
    // SD-ADM-11: the streams close independently, many at once, each within what is
    // left of the budget: a close that hangs or fails leaves the others theirs. They
    // close in batches, a few metadata entries for all of them (D-23).
    // Every stream open here, whether or not it was used since it opened.
    let open = node.open_here();
    let names: Vec<String> = node.view.with(|s| {
        open.iter()
            .filter_map(|id| s.streams.get(id).map(|r| r.name.clone()))
            .collect()
    });
    let batches: Vec<Vec<String>> = names.chunks(MAX_BATCH).map(<[String]>::to_vec).collect();
    let closed: Vec<Closed> = futures::stream::iter(batches)
        .map(|batch| async move {
            let budget = shutdown.step(Duration::MAX);
            if budget.is_zero() {
                return vec![Closed::NotTried; batch.len()];
            }
            let results = node.close_streams(&batch, budget).await;
            batch
                .iter()
                .zip(results)
                .map(|(name, result)| match result {
                    Ok(end) => {
                        tracing::info!(stream = %name, offset = end, "closed stream for shutdown");
                        Closed::Yes
                    }
                    Err(_) if shutdown.step(Duration::MAX).is_zero() => Closed::NotTried,
                    Err(e) => {
                        tracing::warn!(stream = %name, error = %e, "stream not closed; failover will recover it");
                        Closed::Failed
                    }
                })
                .collect::<Vec<_>>()
        })
        .buffer_unordered(CLOSE_BATCHES)
        .flat_map(futures::stream::iter)
        .collect()
        .await;
    let unfinished = closed.iter().filter(|c| **c == Closed::NotTried).count();
    if unfinished > 0 {
        tracing::warn!(
            streams = unfinished,
            "drain budget spent; failover will recover the rest"
        );
    }
    if closed.iter().all(|c| *c == Closed::Yes) {
        Outcome::Completed
    } else {
        Outcome::Abandoned
    }
}

/// How one stream's close in place ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Closed {
    Yes,
    /// It failed with budget left: its own fault.
    Failed,
    /// The budget ran out before or while it closed.
    NotTried,
}

/// Batches of closes in place under way at once; each close is mostly a wait for its
/// upload.
const CLOSE_BATCHES: usize = 8;
