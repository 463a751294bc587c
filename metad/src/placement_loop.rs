//! The leader's placement loop: once the restart grace is over and while its own row is
//! live (FO-LIV-11), proposes the pure `placement::plan` as `PlaceStreams` batches. It
//! plans on every applied change and at least four times a second, so a stream closed
//! by a move or a takeover is placed in the next entries; a plan visits the orphans and
//! the nodes, never every stream (D-23).

use crate::raft_types::Raft;
use crate::store::ViewHub;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use weir_meta::model::{Applied, Command, Placement, Proposal, Proposer, State, MAX_BATCH};
use weir_meta::placement::{may_place, plan, RestartGrace};
use weir_shared::ids::{NodeId, StreamId};

/// The longest wait between two plans when nothing is applied.
const TICK: Duration = Duration::from_millis(250);

/// On the leader, places orphaned closed streams after the restart grace.
pub async fn placement_loop(raft: Raft, hub: Arc<ViewHub>, id: u64, cancel: CancellationToken) {
    let mut applied = hub.applied_changes();
    let mut grace = RestartGrace::new(Instant::now());
    let me = weir_shared::ids::NodeId::new(format!("metad-{id}"));
    let proposer = Proposer::Operator {
        principal: format!("metad-{id}/placement"),
    };
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = applied.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(TICK) => {}
        }
        let leading = raft.metrics().borrow().current_leader == Some(id);
        // One batch per round: the next round plans on the state it left.
        let Some(decisions) = hub.with_state(|s| round(&mut grace, s, leading, &me, Instant::now())) else {
            continue;
        };
        let placements: Vec<Placement> = decisions
            .into_iter()
            .map(|(stream, node)| Placement { stream, node })
            .collect();
        let proposal = Proposal {
            proposer: proposer.clone(),
            command: Command::PlaceStreams {
                placements: placements.clone(),
            },
        };
        match raft.client_write(proposal).await {
            Ok(resp) => match resp.data {
                Ok(Applied::Each { outcomes }) => {
                    let log_index = resp.log_id.index;
                    // OBS-18: each placement has its record, with its stream and node.
                    for (p, outcome) in placements.iter().zip(&outcomes) {
                        match outcome {
                            Ok(_) => tracing::info!(stream = %p.stream, node_id = %p.node, log_index, "placed stream"),
                            Err(r) => {
                                tracing::debug!(stream = %p.stream, node_id = %p.node, rejection = %r, "placement refused")
                            }
                        }
                    }
                }
                Ok(other) => tracing::warn!(?other, "unexpected answer to PlaceStreams"),
                Err(r) => tracing::debug!(rejection = %r, "placements refused"),
            },
            Err(e) => tracing::debug!(error = %e, "placement not proposed"),
        }
    }
}

/// One round on `state`: the restart grace observes it on every replica, leader or not,
/// so a replica that becomes leader keeps what it saw while following and the grace's
/// deadline (RR-GRC-2); then, when this replica leads, the grace is over and its own
/// row may place (FO-LIV-11), a batch of placements, if any stream needs one.
fn round(
    grace: &mut RestartGrace,
    state: &State,
    leading: bool,
    me: &NodeId,
    now: Instant,
) -> Option<Vec<(StreamId, NodeId)>> {
    if grace.defer(state, now) || !leading || !may_place(state, me) {
        return None;
    }
    Some(plan(state, MAX_BATCH)).filter(|d| !d.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_meta::model::{ClusterSettings, MemIndex, NodeAddrs, NodeKind};
    use weir_shared::ids::Incarnation;

    struct Log {
        s: State,
        index: u64,
    }

    impl Log {
        fn apply(&mut self, proposer: Proposer, command: Command) -> Applied {
            self.index += 1;
            let proposal = Proposal { proposer, command };
            self.s
                .apply(self.index, &proposal, &MemIndex::default())
                .outcome
                .expect("applied")
        }

        fn register(&mut self, node: &str, kind: NodeKind) -> Incarnation {
            let register = Command::RegisterNode {
                node: NodeId::new(node),
                kind,
                addrs: NodeAddrs::default(),
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            };
            let Applied::Registered { epoch } = self.apply(op(), register) else {
                panic!("registered")
            };
            Incarnation {
                node: NodeId::new(node),
                epoch,
            }
        }
    }

    fn op() -> Proposer {
        Proposer::Operator { principal: "t".into() }
    }

    // RR-GRC-2: a replica records which nodes it saw heartbeat from its own start while
    // it follows, so once it leads it places at once for a node it saw return. A replica
    // that looked only while leading would take the first heartbeat count it saw as
    // leader for the node's last, and wait the whole grace.
    #[test]
    fn rr_grc_2_a_follower_keeps_what_it_saw_for_when_it_leads() {
        let mut log = Log {
            s: State::default(),
            index: 0,
        };
        let settings = ClusterSettings {
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        log.apply(op(), Command::InitCluster { settings });
        log.register("metad-1", NodeKind::Metad);
        let n = log.register("n", NodeKind::Streamd);
        log.apply(
            op(),
            Command::CreateStream {
                name: "orphan".into(),
                config: Default::default(),
            },
        );
        let me = NodeId::new("metad-1");
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut grace = RestartGrace::new(t0);
        let mut only_as_leader = RestartGrace::new(t0);
        // Following: nothing is placed, and the node's heartbeats are watched.
        assert_eq!(round(&mut grace, &log.s, false, &me, at(1)), None);
        log.apply(Proposer::Node(n.clone()), Command::Heartbeat);
        assert_eq!(round(&mut grace, &log.s, false, &me, at(2)), None);
        // RR-GRC-2: leading from here, at once: `n` was seen to return while following.
        let placed = round(&mut grace, &log.s, true, &me, at(3)).expect("placed at once");
        assert_eq!(placed.len(), 1);
        assert_eq!(placed[0].1, n.node);
        // A grace fed only while leading would still wait for `n` to heartbeat again.
        assert_eq!(round(&mut only_as_leader, &log.s, true, &me, at(3)), None);
    }
}
