//! Planned transfers and drain node, run by the metad leader (SD-DRN-1…12).
//!
//! A unit of transfers moves up to `--drain-batch-streams` streams: choose each destination
//! from the state as it is now, mark them in the log (one `BeginTransfers`), ask the
//! owner to close them (one `CloseStreams` call; each stream stops intake, lets its
//! admitted appends become durable, uploads and commits them, and its close hands it
//! to its destination in the same entry), then wait for the destinations to open them
//! at the next epoch. A drain asks the pure `drain_plan::next_step` for its next unit,
//! in canonical order, each bounded by what is left of the budget; a transfer of one
//! stream is a unit of one. A stream is unwritable for as long as its unit takes, not
//! for as long as the drain does (D-23).

mod unit;

use crate::leader::current_leader;
use crate::raft_types::Raft;
use crate::store::ViewHub;
use crate::transfer_marks::Running;
use std::sync::Arc;
use tonic::Status;
use weir_meta::drain_plan::{
    next_step, owned_streams, Budget, DrainPlan, Moved, Planned, Reason, Report, Requester, Step, Stopped,
};
use weir_meta::model::{check_destination, Command, CordonBy, NodeKind, Outcome, Proposal, Proposer, StreamState};
use weir_shared::error_code::ErrorCode;
use weir_shared::ids::NodeId;

/// Runs transfers on this replica while it leads.
#[derive(Clone)]
pub struct TransferRunner {
    raft: Raft,
    hub: Arc<ViewHub>,
    id: u64,
    /// The streams it is moving: their marks are its own (RR-INT-4).
    running: Running,
    /// Streams a drain moves in one unit (`--drain-batch-streams`).
    batch: usize,
}

impl TransferRunner {
    pub fn new(raft: Raft, hub: Arc<ViewHub>, id: u64, batch: usize) -> Self {
        Self {
            raft,
            hub,
            id,
            running: Running::default(),
            batch,
        }
    }

    /// Discards, while this replica leads, the marks no transfer of it holds (RR-INT-4).
    pub async fn reconcile_marks(self, cancel: tokio_util::sync::CancellationToken) {
        crate::transfer_marks::reconcile_loop(self.raft, self.hub, self.id, self.running, cancel).await
    }

    pub fn leading(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.id)
    }

    fn not_leading(&self) -> Status {
        match current_leader(&self.raft) {
            Some((id, addr)) => Status::unavailable(format!("not the metadata leader; the leader is {id} at {addr}")),
            None => Status::unavailable("not the metadata leader and no leader is known; retry"),
        }
    }

    fn operator(&self) -> Proposer {
        Proposer::Operator {
            principal: format!("metad-{}/transfer", self.id),
        }
    }

    /// Proposes on this replica; a lost leadership or quorum is `unavailable`.
    async fn propose(&self, proposer: Proposer, command: Command) -> Result<(u64, Outcome), Status> {
        if !self.leading() {
            return Err(self.not_leading());
        }
        self.raft
            .client_write(Proposal { proposer, command })
            .await
            .map(|r| (r.log_id.index, r.data))
            .map_err(|e| Status::unavailable(format!("metadata log unavailable: {e}")))
    }

    /// Drains a node: cordons it, then moves its streams in units of `--drain-batch-streams`.
    pub async fn drain(&self, requester: Requester, budget: Budget) -> Result<Report, Status> {
        if !self.leading() {
            return Err(self.not_leading());
        }
        let (node, reason) = match &requester {
            Requester::Operator(node) => (node.clone(), Reason::Drain),
            Requester::Stopping(me) => (me.node.clone(), Reason::Shutdown),
        };
        let source = self.hub.with_state(|s| s.nodes.get(&node).cloned());
        let source = match source {
            None => return Err(Status::not_found(format!("node '{node}' is not registered"))),
            Some(row) if row.kind != NodeKind::Streamd => {
                return Err(Status::invalid_argument(format!(
                    "node '{node}' is not a streamd; only streamd nodes own streams"
                )))
            }
            Some(row) => row,
        };
        // A stopping node drains only the incarnation that asked (SD-DRN-10).
        let (cordon_by, proposer) = match &requester {
            Requester::Operator(_) => (CordonBy::Operator, self.operator()),
            Requester::Stopping(me) => {
                if source.epoch != me.epoch || source.fenced {
                    return Err(Status::failed_precondition(format!(
                        "{me} is not the live incarnation of node '{node}'"
                    )));
                }
                (CordonBy::Drain, Proposer::Node(me.clone()))
            }
        };
        let (index, cordoned) = self
            .propose(
                proposer,
                Command::Cordon {
                    node: node.clone(),
                    by: cordon_by,
                },
            )
            .await?;
        if let Err(r) = cordoned {
            return Err(Status::failed_precondition(format!(
                "cannot cordon '{node}': {}",
                r.message
            )));
        }
        let owner = source.incarnation();
        tracing::info!(node_id = %node, epoch = %owner.epoch, reason = reason.label(), log_index = index, budget = ?budget.total(), "drain started; node cordoned");
        let mut report = Report {
            node: node.to_string(),
            leader: format!("metad-{}", self.id),
            reason,
            cordoned: true,
            streams: Vec::new(),
            finished: false,
            error: None,
            timed_out: false,
        };
        let mut plan = self.hub.with_state(|s| DrainPlan::new(s, owner.clone()));
        loop {
            if !self.leading() {
                let msg = if reason == Reason::Shutdown {
                    "stopping-node drain lost leadership; remaining work needs the next leader"
                } else {
                    "drain lost leadership; remaining work needs the next leader"
                };
                tracing::warn!(node_id = %node, moved = report.streams.iter().filter(|m| m.moved).count(), report = %serde_json::to_string(&report).unwrap_or_default(), "{msg}");
                return Err(Status::unavailable(msg));
            }
            let step = self
                .hub
                .with_state(|s| next_step(s, &mut plan, &budget, std::time::Instant::now(), self.batch));
            match step {
                Step::Move { batch, unit } => {
                    let moved = self.move_batch(batch, &owner, unit, reason).await;
                    report.streams.extend(moved);
                }
                Step::Done => break,
                Step::Stop(stopped) => {
                    report.timed_out = stopped == Stopped::BudgetSpent;
                    report.error = Some(stopped.message(&node));
                    break;
                }
            }
        }
        let untried = self.hub.with_state(|s| owned_streams(s, &owner).len());
        report.finished = report.error.is_none() && untried == 0 && report.streams.iter().all(|m| m.moved);
        let moved = report.streams.iter().filter(|m| m.moved).count();
        let failed = report.streams.len() - moved;
        if report.finished {
            tracing::info!(node_id = %node, reason = reason.label(), moved, "drain finished");
        } else {
            tracing::warn!(node_id = %node, reason = reason.label(), moved, failed, remaining = untried, error = report.error.as_deref().unwrap_or(""), "drain unfinished");
        }
        Ok(report)
    }

    /// An operator's transfer of one stream to a chosen node, or its dry run.
    pub async fn transfer(
        &self,
        stream: &str,
        target: &NodeId,
        dry_run: bool,
        budget: Budget,
    ) -> Result<Moved, Status> {
        if !self.leading() {
            return Err(self.not_leading());
        }
        let row = self
            .hub
            .with_state(|s| s.stream_by_name(stream).cloned())
            .ok_or_else(|| Status::not_found(format!("stream '{stream}' does not exist")))?;
        // SD-TRM-6: the destination's checks, in order, come first.
        self.hub
            .with_state(|s| check_destination(s, target).map(|_| ()))
            .map_err(|r| ErrorCode::from(r.code).status(r.message))?;
        let owner = match (&row.owner, row.state) {
            (Some(owner), StreamState::Open) => owner.clone(),
            _ => {
                return Err(Status::failed_precondition(format!(
                    "stream '{stream}' is not open on a node; only an open stream is transferred"
                )))
            }
        };
        if &owner.node == target {
            return Err(Status::invalid_argument(format!(
                "stream '{stream}' is already on node '{target}'"
            )));
        }
        if dry_run {
            return Ok(Moved::toward(stream, target, None));
        }
        let unit = budget
            .unit_bound_at(std::time::Instant::now())
            .ok_or_else(|| Status::invalid_argument("the budget is too small for a transfer"))?;
        let planned = Planned {
            stream: row.id,
            name: stream.to_string(),
            target: target.clone(),
        };
        let mut moved = self.move_batch(vec![planned], &owner, unit, Reason::Transfer).await;
        Ok(moved.pop().expect("one stream moved or not"))
    }
}
