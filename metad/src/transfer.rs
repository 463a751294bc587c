//! Planned transfers and drain node, coordinated by the metad leader (SD-DRN-1…12).
//!
//! A transfer of one stream: choose the destination from the state as it is now, mark
//! it in the log (`BeginTransfer`), ask the owner to close the stream (it stops intake,
//! lets admitted appends become durable, uploads and commits them; its close hands the
//! stream to the destination in the same entry), then wait for the destination to open
//! it at the next epoch. A drain runs transfers one stream at a time in canonical order,
//! each bounded by what is left of the requester's budget.

use crate::leader::current_leader;
use crate::metrics::metrics;
use crate::model::rows::{streams_per_owner, NodeKind, StreamRow, StreamState};
use crate::model::{check_destination, Command, CordonBy, Outcome, Proposal, Proposer, RejectCode, Rejection, State};
use crate::raft_types::Raft;
use crate::store::ViewHub;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tonic::Status;
use weir_proto::streamd::streamd_client::StreamdClient;
use weir_proto::streamd::CloseStreamRequest;
use weir_shared::ids::{Incarnation, NodeId, StreamEpoch, StreamId};

/// What a transfer is for; a label of `metad_transfers_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// An operator's drain node.
    Drain,
    /// A stopping node's drain of itself.
    Shutdown,
    /// An operator's transfer of one stream.
    Transfer,
}

impl Reason {
    fn label(self) -> &'static str {
        match self {
            Reason::Drain => "drain",
            Reason::Shutdown => "shutdown",
            Reason::Transfer => "transfer",
        }
    }
}

/// A request's time budget, from its arrival.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    start: Instant,
    total: Duration,
}

impl Budget {
    pub fn new(total: Duration) -> Self {
        Self {
            start: Instant::now(),
            total,
        }
    }

    fn left_at(&self, now: Instant) -> Duration {
        self.total.saturating_sub(now.saturating_duration_since(self.start))
    }

    /// SD-DRN-6: one unit's bound is the time left less 1/6 of the initial budget
    /// (kept for what follows the moves); none when nothing is left for another unit.
    pub fn unit_bound_at(&self, now: Instant) -> Option<Duration> {
        Some(self.left_at(now).saturating_sub(self.total / 6)).filter(|d| !d.is_zero())
    }

    pub fn unit_bound(&self) -> Option<Duration> {
        self.unit_bound_at(Instant::now())
    }
}

/// SD-DRN-6: preparation (the owner's close) gets at most 4/5 of a unit's bound;
/// activation uses the rest, up to the same unit deadline.
pub fn prepare_bound(unit: Duration) -> Duration {
    unit * 4 / 5
}

/// What happened to one stream.
#[derive(Clone, Debug, Serialize)]
pub struct Moved {
    pub stream: String,
    pub moved: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The committed end the stream closed at on its former owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Moved {
    /// Not moved (yet) toward `to`, without an error.
    fn toward(stream: &str, to: &NodeId, closed_at: Option<u64>) -> Self {
        Self {
            stream: stream.to_string(),
            moved: false,
            to: Some(to.to_string()),
            closed_at,
            error: None,
        }
    }

    fn failed(stream: &str, error: impl Into<String>) -> Self {
        Self {
            stream: stream.to_string(),
            moved: false,
            to: None,
            closed_at: None,
            error: Some(error.into()),
        }
    }
}

/// A drain's report: every stream it tried, in order, and whether it finished.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub node: String,
    /// The metad replica that ran the drain (OBS-10).
    pub leader: String,
    pub reason: Reason,
    pub cordoned: bool,
    pub streams: Vec<Moved>,
    /// True when every stream the node owned was tried and moved.
    pub finished: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// True when the budget ended before every stream was tried.
    pub timed_out: bool,
}

/// Who asked for a drain.
#[derive(Clone, Debug)]
pub enum Requester {
    /// An operator names the node; its cordon is an operator cordon.
    Operator(NodeId),
    /// A stopping node drains itself (`stopping_node_drain`, SD-DRN-10).
    Stopping(Incarnation),
}

/// Runs transfers on this replica while it leads.
#[derive(Clone)]
pub struct Coordinator {
    raft: Raft,
    hub: Arc<ViewHub>,
    id: u64,
}

/// The streams `owner` holds open, in canonical order: topics by (name, partition),
/// then HTTP streams by name (SD-DRN-1).
fn owned_streams(state: &State, owner: &Incarnation) -> Vec<(StreamId, String)> {
    let mut owned: Vec<&StreamRow> = state
        .streams
        .values()
        .filter(|s| s.state == StreamState::Open && s.owner.as_ref() == Some(owner))
        .collect();
    owned.sort_by(|a, b| {
        let key = |s: &StreamRow| {
            (
                s.topic.is_none(),
                s.topic.clone().unwrap_or_default(),
                s.partition,
                s.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    owned.into_iter().map(|s| (s.id, s.name.clone())).collect()
}

/// The least loaded node that may receive a stream, other than `source`.
pub fn choose_destination(state: &State, source: &NodeId) -> Option<NodeId> {
    let load = streams_per_owner(&state.streams);
    state
        .nodes
        .values()
        .filter(|n| n.kind == NodeKind::Streamd && &n.id != source && check_destination(state, &n.id).is_ok())
        .min_by_key(|n| (load.get(&n.id).copied().unwrap_or(0), n.id.clone()))
        .map(|n| n.id.clone())
}

impl Coordinator {
    pub fn new(raft: Raft, hub: Arc<ViewHub>, id: u64) -> Self {
        Self { raft, hub, id }
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
        tracing::info!(node_id = %node, epoch = %owner.epoch, reason = reason.label(), log_index = index, budget = ?budget.total, "drain started; node cordoned");
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
        let planned = self.hub.with_state(|s| owned_streams(s, &owner));
        for (stream, name) in planned {
            if !self.leading() {
                let msg = if reason == Reason::Shutdown {
                    "stopping-node drain lost leadership; remaining work needs the next leader"
                } else {
                    "drain lost leadership; remaining work needs the next leader"
                };
                tracing::warn!(node_id = %node, moved = report.streams.iter().filter(|m| m.moved).count(), report = %serde_json::to_string(&report).unwrap_or_default(), "{msg}");
                return Err(Status::unavailable(msg));
            }
            // SD-TRM-8: the source's restart or loss invalidates the plan.
            let same_source = self.hub.with_state(|s| {
                s.nodes
                    .get(&node)
                    .is_some_and(|n| n.epoch == owner.epoch && n.is_live())
            });
            if !same_source {
                report.error = Some(format!(
                    "node '{node}' restarted or was fenced during the drain; the plan was dropped"
                ));
                break;
            }
            let Some(unit) = budget.unit_bound() else {
                report.error = Some("the drain budget is spent; the remaining streams were not tried".into());
                report.timed_out = true;
                break;
            };
            let target = self.hub.with_state(|s| choose_destination(s, &node));
            let Some(target) = target else {
                report.error = Some("no live schedulable replacement node remains".into());
                break;
            };
            let moved = self.move_stream(stream, &name, &owner, &target, unit, reason).await;
            report.streams.push(moved);
        }
        let untried = self.hub.with_state(|s| owned_streams(s, &owner)).len();
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
            .map_err(status_of)?;
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
            .unit_bound()
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
        let begin = Command::BeginTransfer {
            stream,
            stream_epoch: epoch,
            target: target.clone(),
        };
        match self.propose(self.operator(), begin).await {
            Ok((_, Ok(_))) => {}
            Ok((_, Err(r))) => return Moved::failed(name, format!("transfer refused: {}", r.message)),
            Err(s) => return Moved::failed(name, s.message().to_string()),
        }
        let prepare = prepare_bound(unit);
        let closed = tokio::time::timeout(prepare, self.prepare(name, &addr, prepare)).await;
        let closed_at = match closed {
            Ok(Ok(end)) => end,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => format!("prepare failed: {e}"),
                    _ => format!("prepare did not finish within {prepare:?}"),
                };
                self.cancel(stream, epoch).await;
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

    /// Asks the owner to close the stream within `bound`; its committed end.
    async fn prepare(&self, name: &str, addr: &str, bound: Duration) -> Result<u64, String> {
        weir_shared::failpoint::pause("transfer_prepare").await;
        let channel = crate::network::channel(addr).map_err(|e| format!("owner address '{addr}': {e}"))?;
        let reply = StreamdClient::new(channel)
            .close_stream(CloseStreamRequest {
                stream: name.to_string(),
                timeout_ms: bound.as_millis() as u64,
            })
            .await
            .map_err(|s| s.message().to_string())?;
        Ok(reply.into_inner().end_offset)
    }

    /// Releases a transfer's mark; best effort (the owner's next close clears it anyway).
    async fn cancel(&self, stream: StreamId, stream_epoch: StreamEpoch) {
        let cancel = Command::CancelTransfer { stream, stream_epoch };
        if let Err(e) = self.propose(self.operator(), cancel).await {
            tracing::warn!(stream = %stream, error = %e.message(), "transfer mark not released; the owner's next close clears it");
        }
    }
}

/// A rejection as the gRPC status its caller reacts to.
fn status_of(r: Rejection) -> Status {
    match r.code {
        RejectCode::NotFound | RejectCode::UnknownNode => Status::not_found(r.message),
        RejectCode::InvalidArgument => Status::invalid_argument(r.message),
        _ => Status::failed_precondition(r.message),
    }
}

fn owned_by(state: &State, stream: StreamId, owner: &Incarnation) -> bool {
    state
        .streams
        .get(&stream)
        .is_some_and(|r| r.state == StreamState::Open && r.owner.as_ref() == Some(owner))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SD-DRN-6: with a 30 s budget, a unit is bounded by 30 − 5 = 25 s and its
    /// preparation by 4/5 of that, 20 s; later units get what is left less the reserve.
    #[test]
    fn unit_bounds_follow_the_budget() {
        let budget = Budget::new(Duration::from_secs(30));
        let start = budget.start;
        let unit = budget.unit_bound_at(start).unwrap();
        assert_eq!(unit, Duration::from_secs(25));
        assert_eq!(prepare_bound(unit), Duration::from_secs(20));
        assert_eq!(
            budget.unit_bound_at(start + Duration::from_secs(10)),
            Some(Duration::from_secs(15))
        );
        assert_eq!(budget.unit_bound_at(start + Duration::from_secs(25)), None);
        assert_eq!(budget.unit_bound_at(start + Duration::from_secs(40)), None);
    }
}
