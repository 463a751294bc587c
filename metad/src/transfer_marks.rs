//! RR-INT-4: the leader reconciles transfer marks (the durable preparations of planned
//! transfers). A mark survives only while the transfer that set it still runs on this
//! replica; the running coordinator itself cancels it when a participant restarts or
//! the owner's close fails (RR-INT-5). A mark left by a coordinator that died or lost
//! leadership, or whose close reply never came back, is discarded durably, by its
//! operation id, so the discard is exact and idempotent. The stream stays with its
//! owner, unless the owner was already closing it for that transfer: that close then
//! finds no mark and leaves the stream to placement.

use crate::raft_types::Raft;
use crate::store::ViewHub;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use weir_meta::model::{Command, Proposal, Proposer, State, StreamRow};
use weir_shared::ids::StreamId;

/// How often the leader looks for marks no transfer holds.
const RECONCILE_EVERY: Duration = Duration::from_secs(1);
/// Bound on the barrier a new leader commits before its first look.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(5);

/// The streams this replica's transfer runner is moving right now.
#[derive(Clone, Default)]
pub struct Running(Arc<Mutex<HashSet<StreamId>>>);

impl Running {
    /// Held from before a transfer's `BeginTransfer` until it ends; `None` while
    /// another transfer of the stream runs here (one mark per stream: a second would
    /// overwrite the first's, and each would undo the other).
    pub fn hold(&self, stream: StreamId) -> Option<Holding> {
        let fresh = self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(stream);
        fresh.then(|| Holding {
            running: self.clone(),
            stream,
        })
    }

    fn contains(&self, stream: StreamId) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).contains(&stream)
    }
}

/// A running transfer's claim on its stream's mark; released on drop.
pub struct Holding {
    running: Running,
    stream: StreamId,
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.running
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.stream);
    }
}

/// A mark no running transfer holds: its stream, name, operation id and why it is stale.
#[derive(Debug, PartialEq, Eq)]
struct Orphan {
    stream: StreamId,
    name: String,
    op: u64,
    reason: &'static str,
}

/// The marks in `state` that no transfer in `running` holds. The reason names what
/// ended the transfer, as far as the view tells.
fn orphans(state: &State, running: impl Fn(StreamId) -> bool) -> Vec<Orphan> {
    state
        .streams
        .marked()
        .iter()
        .filter_map(|id| state.streams.get(id))
        .filter(|row| row.transfer_target.is_some() && !running(row.id))
        .map(|row| Orphan {
            stream: row.id,
            name: row.name.clone(),
            op: row.transfer_op.unwrap_or(0),
            reason: why_stale(state, row),
        })
        .collect()
}

fn why_stale(state: &State, row: &StreamRow) -> &'static str {
    let target = row.transfer_target.as_ref().and_then(|t| state.nodes.get(t));
    let source_live = row
        .owner
        .as_ref()
        .and_then(|o| state.nodes.get(&o.node).map(|n| n.epoch == o.epoch && n.is_live()));
    match target {
        None => "its destination is no longer registered",
        Some(t) if row.transfer_target_epoch.is_some_and(|e| e != t.epoch) => {
            "its destination changed process incarnation"
        }
        Some(t) if !t.is_live() => "its destination is no longer live",
        _ if source_live != Some(true) => "its source is no longer live",
        _ => "its coordinator is gone",
    }
}

/// On the leader, once a second: discards every mark no transfer of this replica holds.
/// After each change of leadership it first confirms a quorum read (the barrier), so
/// it judges from a view that holds every mark committed before.
pub async fn reconcile_loop(raft: Raft, hub: Arc<ViewHub>, id: u64, running: Running, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(RECONCILE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut barrier_term = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (leader, term) = {
            let m = raft.metrics();
            let m = m.borrow();
            (m.current_leader, m.current_term)
        };
        if leader != Some(id) {
            barrier_term = None;
            continue;
        }
        if barrier_term != Some(term) {
            match tokio::time::timeout(BARRIER_TIMEOUT, raft.ensure_linearizable()).await {
                Ok(Ok(_)) => barrier_term = Some(term),
                _ => continue,
            }
        }
        let found = hub.with_state(|s| orphans(s, |stream| running.contains(stream)));
        for orphan in found {
            // Judged again at the last moment: a transfer may have begun since.
            if running.contains(orphan.stream) {
                continue;
            }
            let proposal = Proposal {
                proposer: Proposer::Operator {
                    principal: format!("metad-{id}/transfer"),
                },
                command: Command::DiscardTransfer {
                    stream: orphan.stream,
                    op: orphan.op,
                    reason: orphan.reason.to_string(),
                },
            };
            match raft.client_write(proposal).await {
                Ok(r) if r.data.is_ok() => tracing::info!(
                    stream = orphan.name,
                    op = orphan.op,
                    reason = orphan.reason,
                    log_index = r.log_id.index,
                    "discarded a transfer preparation no coordinator holds"
                ),
                Ok(r) => {
                    tracing::debug!(stream = orphan.name, op = orphan.op, outcome = ?r.data, "transfer preparation not discarded")
                }
                Err(e) => {
                    tracing::debug!(error = %e, "transfer preparations not reconciled; lost leadership?");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_meta::model::{Applied, MemIndex};
    use weir_meta::model::{ClusterSettings, NodeAddrs, NodeKind};
    use weir_shared::ids::NodeId;

    fn apply(state: &mut State, index: &mut u64, command: Command, proposer: Proposer) -> Applied {
        *index += 1;
        state
            .apply(*index, &Proposal { proposer, command }, &MemIndex::default())
            .outcome
            .expect("applies")
    }

    fn operator() -> Proposer {
        Proposer::Operator {
            principal: "test".into(),
        }
    }

    /// RR-INT-4: only marks no running transfer holds are orphans, each with its op id
    /// and the reason the view gives.
    #[test]
    fn rr_int_4_marks_no_running_transfer_holds_are_orphans() {
        let (mut state, mut i) = (State::default(), 0);
        let settings = ClusterSettings {
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        apply(&mut state, &mut i, Command::InitCluster { settings }, operator());
        let register = |state: &mut State, i: &mut u64, name: &str| {
            let Applied::Registered { epoch } = apply(
                state,
                i,
                Command::RegisterNode {
                    node: NodeId::new(name),
                    kind: NodeKind::Streamd,
                    addrs: NodeAddrs::default(),
                    heartbeat_interval_sec: 1,
                    node_timeout_sec: 3,
                },
                operator(),
            ) else {
                panic!("registered")
            };
            weir_shared::ids::Incarnation {
                node: NodeId::new(name),
                epoch,
            }
        };
        let a = register(&mut state, &mut i, "a");
        register(&mut state, &mut i, "b");
        let mut streams = Vec::new();
        for name in ["held", "left", "restarted"] {
            let Applied::StreamCreated { stream } = apply(
                &mut state,
                &mut i,
                Command::CreateStream {
                    name: name.into(),
                    config: Default::default(),
                },
                operator(),
            ) else {
                panic!("created")
            };
            let place = Command::PlaceStream {
                stream,
                node: a.node.clone(),
            };
            apply(&mut state, &mut i, place, operator());
            let Applied::StreamOpened { stream_epoch, .. } =
                apply(&mut state, &mut i, Command::open(stream), Proposer::Node(a.clone()))
            else {
                panic!("opened")
            };
            let begin = Command::BeginTransfer {
                stream,
                stream_epoch,
                target: NodeId::new("b"),
            };
            apply(&mut state, &mut i, begin, operator());
            streams.push((stream, i));
        }
        let held = streams[0].0;
        let found = orphans(&state, |s| s == held);
        // RR-INT-4: the marks no running transfer holds are to be discarded, each by its op id.
        assert_eq!(
            found,
            vec![
                Orphan {
                    stream: streams[1].0,
                    name: "left".into(),
                    op: streams[1].1,
                    reason: "its coordinator is gone"
                },
                Orphan {
                    stream: streams[2].0,
                    name: "restarted".into(),
                    op: streams[2].1,
                    reason: "its coordinator is gone"
                },
            ]
        );
        // The destination re-registers: a new incarnation the marks were not set for.
        register(&mut state, &mut i, "b");
        let found = orphans(&state, |s| s == held);
        assert!(found
            .iter()
            .all(|o| o.reason == "its destination changed process incarnation"));
        // RR-INT-4: a mark its running transfer still holds survives.
        assert!(orphans(&state, |_| true).is_empty(), "held marks are never orphans");
    }

    /// D-23: the leader's reconciliation of transfer marks visits the marked streams,
    /// not the 100,000 others.
    #[test]
    fn orphaned_marks_among_100_000_streams_visit_only_the_marked() {
        let (mut state, _) = weir_meta::crowd::open_on_one_node(100_000);
        state.streams.update(&StreamId(9), |r| {
            r.transfer_target = Some(weir_shared::ids::NodeId::new("gone"));
            r.transfer_op = Some(4);
        });
        let before = state.streams.visits();
        let found = orphans(&state, |_| false);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].stream, found[0].op), (StreamId(9), 4));
        assert!(
            state.streams.visits() - before <= 1,
            "visited {} rows",
            state.streams.visits() - before
        );
    }
}
