//! The leader's placement loop: four times a second, once the restart grace is over and
//! while its own row is live (FO-LIV-11), proposes the pure `placement::plan` as
//! `PlaceStream` commands.

use crate::raft_types::Raft;
use crate::store::ViewHub;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use weir_meta::model::{Command, Proposal, Proposer};
use weir_meta::placement::{may_place, plan, RestartGrace};

/// On the leader, places orphaned closed streams four times a second (after the
/// restart grace), so a stream closed by a move or a takeover is reopened quickly.
pub async fn placement_loop(raft: Raft, hub: Arc<ViewHub>, id: u64, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut grace = RestartGrace::new(std::time::Instant::now());
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Observed on every replica, leader or not, so a leadership change keeps the deadline.
        if hub.with_state(|s| grace.defer(s, std::time::Instant::now())) {
            continue;
        }
        if raft.metrics().borrow().current_leader != Some(id) {
            continue;
        }
        let me = weir_shared::ids::NodeId::new(format!("metad-{id}"));
        let Some(decisions) = hub.with_state(|s| may_place(s, &me).then(|| plan(s))) else {
            continue;
        };
        for (stream, node) in decisions {
            let proposal = Proposal {
                proposer: Proposer::Operator {
                    principal: format!("metad-{id}/placement"),
                },
                command: Command::PlaceStream {
                    stream,
                    node: node.clone(),
                },
            };
            match raft.client_write(proposal).await {
                Ok(resp) => match resp.data {
                    Ok(_) => {
                        tracing::info!(stream = %stream, node_id = %node, log_index = resp.log_id.index, "placed stream")
                    }
                    Err(r) => tracing::debug!(stream = %stream, node_id = %node, rejection = %r, "placement refused"),
                },
                Err(e) => {
                    tracing::debug!(error = %e, "placement not proposed");
                    break;
                }
            }
        }
    }
}
