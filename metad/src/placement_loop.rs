//! The leader's placement loop: once the restart grace is over and while its own row is
//! live (FO-LIV-11), proposes the pure `placement::plan` as `PlaceStreams` batches. It
//! plans on every applied change and at least four times a second, so a stream closed
//! by a move or a takeover is placed in the next entries; a plan visits the orphans and
//! the nodes, never every stream (D-23).

use crate::raft_types::Raft;
use crate::store::ViewHub;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use weir_meta::model::{Applied, Command, Placement, Proposal, Proposer, MAX_BATCH};
use weir_meta::placement::{may_place, plan, RestartGrace};

/// The longest wait between two plans when nothing is applied.
const TICK: Duration = Duration::from_millis(250);

/// On the leader, places orphaned closed streams after the restart grace.
pub async fn placement_loop(raft: Raft, hub: Arc<ViewHub>, id: u64, cancel: CancellationToken) {
    let mut applied = hub.applied_changes();
    let mut grace = RestartGrace::new(std::time::Instant::now());
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
        // Observed on every replica, leader or not, so a leadership change keeps the deadline.
        if hub.with_state(|s| grace.defer(s, std::time::Instant::now())) {
            continue;
        }
        if raft.metrics().borrow().current_leader != Some(id) {
            continue;
        }
        // One batch per round: the next round plans on the state it left.
        let Some(decisions) = hub.with_state(|s| may_place(s, &me).then(|| plan(s, MAX_BATCH))) else {
            continue;
        };
        if decisions.is_empty() {
            continue;
        }
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
