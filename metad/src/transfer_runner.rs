//! Planned transfers and drain node, run by the metad leader (SD-DRN-1…12).
//!
//! A transfer of one stream: choose the destination from the state as it is now, mark
//! it in the log (`BeginTransfer`), ask the owner to close the stream (it stops intake,
//! lets admitted appends become durable, uploads and commits them; its close hands the
//! stream to the destination in the same entry), then wait for the destination to open
//! it at the next epoch. A drain asks the pure `drain_plan::next_step` what to do next
//! and runs one transfer at a time, each bounded by what is left of the budget.

use crate::leader::current_leader;
use crate::metrics::metrics;
use crate::raft_types::Raft;
use crate::store::ViewHub;
use crate::transfer_marks::Running;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tonic::Status;
use weir_meta::drain_plan::{
    next_step, owned_streams, prepare_bound, Budget, DrainPlan, Moved, Reason, Report, Requester, Step, Stopped,
};
use weir_meta::model::{
    check_destination, Command, CordonBy, NodeKind, Outcome, Proposal, Proposer, State, StreamState,
};
use weir_proto::streamd::streamd_client::StreamdClient;
use weir_proto::streamd::CloseStreamRequest;
use weir_shared::error_code::ErrorCode;
use weir_shared::ids::{Epoch, Incarnation, NodeId, StreamId};

/// Runs transfers on this replica while it leads.
#[derive(Clone)]
pub struct TransferRunner {
    raft: Raft,
    hub: Arc<ViewHub>,
    id: u64,
    /// The streams it is moving: their marks are its own (RR-INT-4).
    running: Running,
}

impl TransferRunner {
    pub fn new(raft: Raft, hub: Arc<ViewHub>, id: u64) -> Self {
        Self {
            raft,
            hub,
            id,
            running: Running::default(),
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

    /// Drains a node: cordons it, then moves its streams one at a time.
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
                .with_state(|s| next_step(s, &mut plan, &budget, std::time::Instant::now()));
            match step {
                Step::Move {
                    stream,
                    name,
                    target,
                    unit,
                } => {
                    let moved = self.move_stream(stream, &name, &owner, &target, unit, reason).await;
                    report.streams.push(moved);
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
        Ok(self
            .move_stream(row.id, stream, &owner, target, unit, Reason::Transfer)
            .await)
    }

    /// One planned transfer, bounded by `unit` (SD-DRN-2, SD-DRN-6, SD-DRN-7).
    async fn move_stream(
        &self,
        stream: StreamId,
        name: &str,
        owner: &Incarnation,
        target: &NodeId,
        unit: Duration,
        reason: Reason,
    ) -> Moved {
        let deadline = Instant::now() + unit;
        let moved = self.try_move(stream, name, owner, target, unit, deadline).await;
        let outcome = if moved.moved { "moved" } else { "failed" };
        metrics().transfers.with_label_values(&[outcome, reason.label()]).inc();
        match &moved.error {
            None => {
                tracing::info!(stream = name, from = %owner, to = %target, reason = reason.label(), closed_at = moved.closed_at, "stream transferred")
            }
            Some(e) => {
                tracing::warn!(stream = name, from = %owner, to = %target, reason = reason.label(), error = %e, "stream not transferred")
            }
        }
        moved
    }

    async fn try_move(
        &self,
        stream: StreamId,
        name: &str,
        owner: &Incarnation,
        target: &NodeId,
        unit: Duration,
        deadline: Instant,
    ) -> Moved {
        let Some((epoch, addr)) = self.hub.with_state(|s| {
            let row = s.streams.get(&stream)?;
            let node = s.nodes.get(&owner.node)?;
            (row.state == StreamState::Open && row.owner.as_ref() == Some(owner))
                .then(|| (row.epoch, node.addrs.grpc.clone()))
        }) else {
            return Moved::failed(name, format!("stream '{name}' is no longer open on {owner}"));
        };
        // The mark this transfer sets is its own until it ends (RR-INT-4).
        let Some(_holding) = self.running.hold(stream) else {
            return Moved::failed(name, format!("a transfer of stream '{name}' is already running"));
        };
        let begin = Command::BeginTransfer {
            stream,
            stream_epoch: epoch,
            target: target.clone(),
        };
        let op = match self.propose(self.operator(), begin).await {
            Ok((index, Ok(_))) => index,
            Ok((_, Err(r))) => return Moved::failed(name, format!("transfer refused: {}", r.message)),
            Err(s) => return Moved::failed(name, s.message().to_string()),
        };
        let begun = self.begun_with(stream);
        let prepare = prepare_bound(unit);
        let gate = Gate { stream, op, begun };
        let closed = tokio::time::timeout(prepare, self.prepare(&gate, name, target, &addr, prepare)).await;
        let closed_at = match closed {
            Ok(Ok(end)) => end,
            failed => {
                let why = match failed {
                    Ok(Err(Unprepared::Restarted(why))) => why,
                    Ok(Err(Unprepared::Failed(e))) => format!("prepare failed: {e}"),
                    _ => format!("prepare did not finish within {prepare:?}"),
                };
                self.cancel(stream, op).await;
                // The close may still have landed just as the bound ended.
                if self.hub.with_state(|s| owned_by(s, stream, owner)) {
                    return Moved::failed(name, why);
                }
                tracing::info!(
                    stream = name,
                    "the owner's close landed after the prepare bound; waiting for activation"
                );
                0
            }
        };
        // Activation: the destination opens the stream at the next epoch (SD-DRN-2 step 5).
        loop {
            // RR-INT-5: a target restarted since the transfer began makes it void,
            // whatever placement does with the stream next.
            if self.target_restarted(target, &begun) {
                return Moved {
                    error: Some(restarted(target)),
                    ..Moved::toward(name, target, Some(closed_at))
                };
            }
            let opened = self.hub.with_state(|s| {
                s.streams.get(&stream).and_then(|r| {
                    (r.state == StreamState::Open && r.epoch > epoch)
                        .then(|| r.owner.as_ref().map(|o| o.node.clone()))
                        .flatten()
                })
            });
            if let Some(at) = opened {
                return Moved {
                    moved: true,
                    ..Moved::toward(name, &at, Some(closed_at))
                };
            }
            if Instant::now() >= deadline {
                return Moved {
                    error: Some(format!(
                        "closed, but '{target}' did not open it within the unit's bound"
                    )),
                    ..Moved::toward(name, target, Some(closed_at))
                };
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Asks the owner to close the stream within `bound`; its committed end. Not when
    /// the target restarted since the transfer began (RR-INT-5), nor when the mark is no
    /// longer this transfer's (RR-INT-4): the stream stays put.
    async fn prepare(
        &self,
        gate: &Gate,
        name: &str,
        target: &NodeId,
        addr: &str,
        bound: Duration,
    ) -> Result<u64, Unprepared> {
        let deadline = Instant::now() + bound;
        weir_shared::failpoint::pause("transfer_prepare").await;
        // A deposed coordinator's mark may already be discarded by the next leader, whose
        // discard its own view has not seen yet: it asks for no close unless a quorum
        // still confirms it leads.
        self.confirm_leading(deadline).await?;
        // Judged after the quorum read, so on a view at least as new as the log it
        // confirmed.
        if self.target_restarted(target, &gate.begun) {
            return Err(Unprepared::Restarted(restarted(target)));
        }
        let held = self.hub.with_state(|s| {
            s.streams
                .get(&gate.stream)
                .is_some_and(|r| r.transfer_target.is_some() && r.transfer_op == Some(gate.op))
        });
        if !held {
            return Err(Unprepared::Failed(format!(
                "the transfer's mark (operation {}) is no longer in the log",
                gate.op
            )));
        }
        // Only the time this prepare has left; a close asked with (almost) none would
        // get the owner's default instead, so none is asked.
        let left = deadline.saturating_duration_since(Instant::now());
        if left < MIN_CLOSE_TIME {
            return Err(Unprepared::Failed(
                "no time left in the prepare bound for the close".into(),
            ));
        }
        let channel =
            weir_shared::grpc::channel(addr).map_err(|e| Unprepared::Failed(format!("owner address '{addr}': {e}")))?;
        let reply = StreamdClient::new(channel)
            .close_stream(CloseStreamRequest {
                stream: name.to_string(),
                timeout_ms: left.as_millis() as u64,
            })
            .await
            .map_err(|s| Unprepared::Failed(s.message().to_string()))?;
        Ok(reply.into_inner().end_offset)
    }

    /// Confirms by a quorum read that this replica still leads. A round that misses its
    /// quorum (one slow or partitioned follower) is tried again while this replica
    /// leads, up to `deadline`.
    async fn confirm_leading(&self, deadline: Instant) -> Result<(), Unprepared> {
        let lost = || Unprepared::Failed("lost the metadata leadership before asking the owner to close".into());
        let unconfirmed = || {
            Unprepared::Failed("the metadata leadership was not confirmed by a quorum within the prepare bound".into())
        };
        loop {
            if !self.leading() {
                return Err(lost());
            }
            let round = tokio::time::timeout_at(deadline, self.raft.ensure_linearizable()).await;
            match round {
                Ok(Ok(_)) if self.leading() => return Ok(()),
                Ok(Ok(_)) => return Err(lost()),
                Ok(Err(e)) => tracing::debug!(error = %e, "quorum read before a transfer's close failed; trying again"),
                Err(_) => return Err(unconfirmed()),
            }
            if Instant::now() >= deadline {
                return Err(unconfirmed());
            }
            tokio::time::sleep(QUORUM_RETRY).await;
        }
    }

    /// The target incarnation's epoch a begun transfer of `stream` recorded.
    fn begun_with(&self, stream: StreamId) -> Option<Epoch> {
        self.hub
            .with_state(|s| s.streams.get(&stream).and_then(|r| r.transfer_target_epoch))
    }

    /// Whether `target` is no longer at the epoch the transfer began with.
    fn target_restarted(&self, target: &NodeId, begun: &Option<Epoch>) -> bool {
        let Some(begun) = begun else { return false };
        self.hub
            .with_state(|s| s.nodes.get(target).is_none_or(|n| n.epoch != *begun))
    }

    /// Releases this transfer's own mark, exactly by its op: a mark another transfer set
    /// since stays. Best effort: the owner's next close or the leader's reconciliation
    /// clears it otherwise.
    async fn cancel(&self, stream: StreamId, op: u64) {
        let discard = Command::DiscardTransfer {
            stream,
            op,
            reason: "its coordinator cancelled it".into(),
        };
        if let Err(e) = self.propose(self.operator(), discard).await {
            tracing::warn!(stream = %stream, error = %e.message(), "transfer mark not released; the owner's next close or the leader's reconciliation clears it");
        }
    }
}

/// The least time left in a prepare for which the owner is still asked to close.
const MIN_CLOSE_TIME: Duration = Duration::from_millis(100);

/// The pause between quorum reads that missed their quorum.
const QUORUM_RETRY: Duration = Duration::from_millis(50);

fn owned_by(state: &State, stream: StreamId, owner: &Incarnation) -> bool {
    state
        .streams
        .get(&stream)
        .is_some_and(|r| r.state == StreamState::Open && r.owner.as_ref() == Some(owner))
}

/// A begun transfer's gate in the log: its stream, its operation id (the
/// `BeginTransfer`'s log index) and the destination epoch it recorded.
struct Gate {
    stream: StreamId,
    op: u64,
    begun: Option<Epoch>,
}

/// Why a transfer's prepare did not close the stream.
enum Unprepared {
    /// RR-INT-5: the target restarted since the transfer began; the exact report.
    Restarted(String),
    Failed(String),
}

/// RR-INT-5: the report of a transfer whose target restarted during it.
fn restarted(target: &NodeId) -> String {
    format!("destination node '{target}' changed process incarnation during ownership handoff")
}
