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
    next_step, owned_streams, prepare_bound, Budget, DrainPlan, Moved, Planned, Reason, Report, Requester, Step,
    Stopped,
};
use weir_meta::model::{
    check_destination, Applied, Command, CordonBy, NodeKind, Outcome, Proposal, Proposer, State, StreamState,
    TransferTo,
};
use weir_proto::streamd::streamd_client::StreamdClient;
use weir_proto::streamd::CloseStreamsRequest;
use weir_shared::error_code::ErrorCode;
use weir_shared::ids::{Epoch, Incarnation, NodeId, StreamEpoch, StreamId};

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

    /// One unit of planned transfers, bounded by `unit` (SD-DRN-2, SD-DRN-6,
    /// SD-DRN-7): what became of each stream, in order.
    async fn move_batch(&self, batch: Vec<Planned>, owner: &Incarnation, unit: Duration, reason: Reason) -> Vec<Moved> {
        let deadline = Instant::now() + unit;
        let moved = self.try_move_batch(&batch, owner, unit, deadline).await;
        for (p, moved) in batch.iter().zip(&moved) {
            let outcome = if moved.moved { "moved" } else { "failed" };
            metrics().transfers.with_label_values(&[outcome, reason.label()]).inc();
            match &moved.error {
                None => {
                    tracing::info!(stream = p.name, from = %owner, to = moved.to.as_deref().unwrap_or(""), reason = reason.label(), closed_at = moved.closed_at, "stream transferred")
                }
                Some(e) => {
                    tracing::warn!(stream = p.name, from = %owner, to = %p.target, reason = reason.label(), error = %e, "stream not transferred")
                }
            }
        }
        moved
    }

    async fn try_move_batch(
        &self,
        batch: &[Planned],
        owner: &Incarnation,
        unit: Duration,
        deadline: Instant,
    ) -> Vec<Moved> {
        let mut out: Vec<Option<Moved>> = vec![None; batch.len()];
        let Some(addr) = self
            .hub
            .with_state(|s| s.nodes.get(&owner.node).map(|n| n.addrs.grpc.clone()))
        else {
            return batch
                .iter()
                .map(|p| Moved::failed(&p.name, format!("node '{}' is not registered", owner.node)))
                .collect();
        };
        // The streams still open on the owner, each held by this transfer alone.
        let mut begun = Vec::new();
        let mut holds = Vec::new();
        for (i, p) in batch.iter().enumerate() {
            let epoch = self.hub.with_state(|s| {
                let row = s.streams.get(&p.stream)?;
                (row.state == StreamState::Open && row.owner.as_ref() == Some(owner)).then_some(row.epoch)
            });
            let Some(epoch) = epoch else {
                out[i] = Some(Moved::failed(
                    &p.name,
                    format!("stream '{}' is no longer open on {owner}", p.name),
                ));
                continue;
            };
            // The mark this transfer sets is its own until it ends (RR-INT-4).
            let Some(holding) = self.running.hold(p.stream) else {
                out[i] = Some(Moved::failed(
                    &p.name,
                    format!("a transfer of stream '{}' is already running", p.name),
                ));
                continue;
            };
            holds.push(holding);
            begun.push((i, epoch));
        }
        let begin = Command::BeginTransfers {
            transfers: begun
                .iter()
                .map(|&(i, stream_epoch)| TransferTo {
                    stream: batch[i].stream,
                    stream_epoch,
                    target: batch[i].target.clone(),
                })
                .collect(),
        };
        let mut gates = Vec::new();
        if !begun.is_empty() {
            match self.propose(self.operator(), begin).await {
                Ok((op, Ok(Applied::Each { outcomes }))) => {
                    for (&(i, epoch), outcome) in begun.iter().zip(outcomes) {
                        match outcome {
                            Ok(_) => gates.push(Gate {
                                i,
                                stream: batch[i].stream,
                                op,
                                epoch,
                                begun: self.begun_with(batch[i].stream),
                            }),
                            Err(r) => {
                                out[i] = Some(Moved::failed(
                                    &batch[i].name,
                                    format!("transfer refused: {}", r.message),
                                ))
                            }
                        }
                    }
                }
                Ok((_, Ok(other))) => {
                    for &(i, _) in &begun {
                        out[i] = Some(Moved::failed(
                            &batch[i].name,
                            format!("unexpected answer to BeginTransfers: {other:?}"),
                        ));
                    }
                }
                Ok((_, Err(r))) => {
                    for &(i, _) in &begun {
                        out[i] = Some(Moved::failed(
                            &batch[i].name,
                            format!("transfer refused: {}", r.message),
                        ));
                    }
                }
                Err(e) => {
                    for &(i, _) in &begun {
                        out[i] = Some(Moved::failed(&batch[i].name, e.message().to_string()));
                    }
                }
            }
        }
        // Preparation: the owner closes the unit's streams; each close hands its stream
        // to its target in the same entry (SD-DRN-2).
        let prepare = prepare_bound(unit);
        let closed = match tokio::time::timeout(prepare, self.prepare(&gates, batch, &addr, prepare)).await {
            Ok(closed) => closed,
            Err(_) => gates
                .iter()
                .map(|_| Err(format!("prepare did not finish within {prepare:?}")))
                .collect(),
        };
        let mut activating = Vec::new();
        for (gate, closed) in gates.iter().zip(closed) {
            let p = &batch[gate.i];
            match closed {
                Ok(end) => activating.push((gate, end)),
                Err(why) => {
                    self.cancel(gate.stream, gate.op).await;
                    // The close may still have landed just as the bound ended.
                    if self.hub.with_state(|s| owned_by(s, gate.stream, owner)) {
                        out[gate.i] = Some(Moved::failed(&p.name, why));
                    } else {
                        tracing::info!(
                            stream = p.name,
                            "the owner's close landed after the prepare bound; waiting for activation"
                        );
                        activating.push((gate, 0));
                    }
                }
            }
        }
        // Activation: each destination opens its streams at the next epoch (SD-DRN-2 step 5).
        let mut applied = self.hub.applied_changes();
        loop {
            activating.retain(|(gate, closed_at)| {
                let p = &batch[gate.i];
                // RR-INT-5: a target restarted since the transfer began makes it void,
                // whatever placement does with the stream next.
                if self.target_restarted(&p.target, &gate.begun) {
                    out[gate.i] = Some(Moved {
                        error: Some(restarted(&p.target)),
                        ..Moved::toward(&p.name, &p.target, Some(*closed_at))
                    });
                    return false;
                }
                let opened = self.hub.with_state(|s| {
                    s.streams.get(&gate.stream).and_then(|r| {
                        (r.state == StreamState::Open && r.epoch > gate.epoch)
                            .then(|| r.owner.as_ref().map(|o| o.node.clone()))
                            .flatten()
                    })
                });
                match opened {
                    Some(at) => {
                        out[gate.i] = Some(Moved {
                            moved: true,
                            ..Moved::toward(&p.name, &at, Some(*closed_at))
                        });
                        false
                    }
                    None => true,
                }
            });
            if activating.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                for (gate, closed_at) in &activating {
                    let p = &batch[gate.i];
                    out[gate.i] = Some(Moved {
                        error: Some(format!(
                            "closed, but '{}' did not open it within the unit's bound",
                            p.target
                        )),
                        ..Moved::toward(&p.name, &p.target, Some(*closed_at))
                    });
                }
                break;
            }
            tokio::select! {
                _ = applied.changed() => {}
                _ = tokio::time::sleep_until(deadline.min(Instant::now() + ACTIVATION_RECHECK)) => {}
            }
        }
        drop(holds);
        out.into_iter()
            .zip(batch)
            .map(|(m, p)| m.unwrap_or_else(|| Moved::failed(&p.name, "not tried")))
            .collect()
    }

    /// Asks the owner to close the gates' streams within `bound`; for each gate, its
    /// committed end, or why it did not close. Not a stream whose target restarted
    /// since the transfer began (RR-INT-5), nor one whose mark is no longer this
    /// transfer's (RR-INT-4): it stays put.
    async fn prepare(
        &self,
        gates: &[Gate],
        batch: &[Planned],
        addr: &str,
        bound: Duration,
    ) -> Vec<Result<u64, String>> {
        let deadline = Instant::now() + bound;
        let mut results: Vec<Result<u64, String>> = gates.iter().map(|_| Err("not asked".to_string())).collect();
        if gates.is_empty() {
            return results;
        }
        weir_shared::failpoint::pause("transfer_prepare").await;
        // A deposed coordinator's mark may already be discarded by the next leader, whose
        // discard its own view has not seen yet: it asks for no close unless a quorum
        // still confirms it leads.
        if let Err(why) = self.confirm_leading(deadline).await {
            return gates.iter().map(|_| Err(why.clone())).collect();
        }
        // Judged after the quorum read, so on a view at least as new as the log it
        // confirmed.
        let mut asked = Vec::new();
        for (k, gate) in gates.iter().enumerate() {
            let target = &batch[gate.i].target;
            if self.target_restarted(target, &gate.begun) {
                results[k] = Err(restarted(target));
                continue;
            }
            let held = self.hub.with_state(|s| {
                s.streams
                    .get(&gate.stream)
                    .is_some_and(|r| r.transfer_target.is_some() && r.transfer_op == Some(gate.op))
            });
            if !held {
                results[k] = Err(format!(
                    "the transfer's mark (operation {}) is no longer in the log",
                    gate.op
                ));
                continue;
            }
            asked.push(k);
        }
        // Only the time this prepare has left; a close asked with (almost) none would
        // get the owner's default instead, so none is asked.
        let left = deadline.saturating_duration_since(Instant::now());
        if left < MIN_CLOSE_TIME || asked.is_empty() {
            for &k in &asked {
                results[k] = Err("no time left in the prepare bound for the close".into());
            }
            return results;
        }
        let channel = match weir_shared::grpc::channel(addr) {
            Ok(c) => c,
            Err(e) => {
                for &k in &asked {
                    results[k] = Err(format!("owner address '{addr}': {e}"));
                }
                return results;
            }
        };
        let request = CloseStreamsRequest {
            streams: asked.iter().map(|&k| batch[gates[k].i].name.clone()).collect(),
            timeout_ms: left.as_millis() as u64,
        };
        match StreamdClient::new(channel).close_streams(request).await {
            Ok(reply) => {
                for (&k, closed) in asked.iter().zip(reply.into_inner().streams) {
                    results[k] = if closed.error.is_empty() {
                        Ok(closed.end_offset)
                    } else {
                        Err(closed.error)
                    };
                }
            }
            Err(status) => {
                for &k in &asked {
                    results[k] = Err(status.message().to_string());
                }
            }
        }
        results
    }

    /// Confirms by a quorum read that this replica still leads. A round that misses its
    /// quorum (one slow or partitioned follower) is tried again while this replica
    /// leads, up to `deadline`.
    async fn confirm_leading(&self, deadline: Instant) -> Result<(), String> {
        let lost = || "lost the metadata leadership before asking the owner to close".to_string();
        let unconfirmed =
            || "the metadata leadership was not confirmed by a quorum within the prepare bound".to_string();
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

/// A begun transfer's gate in the log: its place in the unit, its stream and the
/// stream epoch it was begun at, its operation id (the `BeginTransfers`' log index)
/// and the destination epoch it recorded.
struct Gate {
    i: usize,
    stream: StreamId,
    op: u64,
    epoch: StreamEpoch,
    begun: Option<Epoch>,
}

/// How often activation looks again when nothing is applied.
const ACTIVATION_RECHECK: Duration = Duration::from_millis(100);

/// RR-INT-5: the report of a transfer whose target restarted during it.
fn restarted(target: &NodeId) -> String {
    format!("destination node '{target}' changed process incarnation during ownership handoff")
}
