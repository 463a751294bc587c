//! Operator views of the metadata state, shared by the admin gRPC service and admin HTTP.

use crate::leader::current_leader;
use crate::leader::{forwarded, leader_channel, mark_forwarded, PeerChannels};
use crate::raft_types::Raft;
use crate::store::StateMachineStore;
use crate::transfer_runner::TransferRunner;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status};
use weir_meta::drain_plan::{Budget, Requester};
use weir_meta::listing::{section_json, stream_json};
use weir_proto::metad::admin_client::AdminClient;
use weir_proto::metad::admin_server::Admin;
use weir_proto::metad::{AdminReply, AdminRequest, DrainRequest, TransferRequest};
use weir_shared::ids::NodeId;

/// Most history entries one dump returns.
pub const MAX_DUMP: u64 = 10_000;

/// Raft's view of this replica.
pub fn status_json(raft: &Raft) -> Value {
    let m = raft.metrics().borrow().clone();
    json!({
        "id": m.id,
        "state": format!("{:?}", m.state),
        "current_term": m.current_term,
        "current_leader": m.current_leader,
        "leader_addr": current_leader(raft).map(|(_, a)| a),
        "last_log_index": m.last_log_index,
        "last_applied": m.last_applied.map(|l| l.index),
        "snapshot": m.snapshot.map(|l| l.index),
        "purged": m.purged.map(|l| l.index),
        "voters": m.membership_config.membership().voter_ids().collect::<Vec<_>>(),
    })
}

/// Most bytes of entries one admin reply carries; the rest is paged (`next_index`).
pub const MAX_REPLY_BYTES: usize = 8 << 20;

/// The applied-command history from `from`, at most `limit` entries and
/// [`MAX_REPLY_BYTES`]; `next_index` says where the next page starts, if any.
pub fn log_json(sm: &StateMachineStore, from: u64, limit: u64) -> Result<Value, String> {
    let limit = limit.clamp(1, MAX_DUMP) as usize;
    let entries = sm.history(from, limit).map_err(|e| e.to_string())?;
    let mut bytes = 0;
    let mut kept = Vec::new();
    let mut next_index = None;
    for entry in entries {
        let mut value = serde_json::to_value(&entry).map_err(|e| e.to_string())?;
        weir_meta::listing::redact_secrets(&mut value);
        bytes += value.to_string().len();
        if bytes > MAX_REPLY_BYTES && !kept.is_empty() {
            next_index = Some(entry.index);
            break;
        }
        kept.push(value);
    }
    Ok(json!({ "entries": kept, "next_index": next_index }))
}

/// The object index's size (design 0002): how many ranges and objects it holds.
pub fn index_json(sm: &StateMachineStore) -> Value {
    let (ranges, objects) = crate::store::index::counts(sm.db());
    json!({ "applied_index": sm.hub().durable_index(), "ranges": ranges, "objects": objects })
}

/// Committed objects in key order, `skip` then at most `limit` (≤ 1,000).
pub fn objects_json(sm: &StateMachineStore, skip: u64, limit: u64) -> Value {
    let limit = limit.clamp(1, 1_000) as usize;
    let objects = crate::store::index::objects(sm.db(), skip as usize, limit);
    json!({ "applied_index": sm.hub().durable_index(), "objects": objects })
}

/// The admin gRPC service.
pub struct AdminService {
    raft: Raft,
    sm: StateMachineStore,
    runner: TransferRunner,
    peers: Arc<PeerChannels>,
    /// Drains and transfers run in tasks of their own (SD-DRN-12); Raft stops only once
    /// they have ended (they propose through it).
    moves: TaskTracker,
    /// The users gateways ask for drains and transfers for (D-21).
    users: crate::authz::Directory,
}

impl AdminService {
    pub fn new(
        raft: Raft,
        sm: StateMachineStore,
        runner: TransferRunner,
        peers: Arc<PeerChannels>,
        moves: TaskTracker,
        users: crate::authz::Directory,
    ) -> Self {
        Self {
            users,
            raft,
            sm,
            runner,
            peers,
            moves,
        }
    }

    /// The leader's admin client, unless this call was already forwarded.
    fn leader(&self, forwarded: bool) -> Result<AdminClient<weir_shared::grpc::Channel>, Status> {
        Ok(AdminClient::new(leader_channel(&self.raft, &self.peers, forwarded)?))
    }
}

fn reply(value: &impl serde::Serialize) -> Result<Response<AdminReply>, Status> {
    Ok(Response::new(AdminReply {
        json: serde_json::to_vec(value).map_err(|e| Status::internal(e.to_string()))?,
    }))
}

/// Longest budget a drain or transfer request may ask for.
const MAX_BUDGET: Duration = Duration::from_secs(3600);

fn budget(ms: u64) -> Result<Budget, Status> {
    let total = Duration::from_millis(ms);
    if total.is_zero() || total > MAX_BUDGET {
        return Err(Status::invalid_argument(format!(
            "budget_ms must be between 1 and {}, got {ms}",
            MAX_BUDGET.as_millis()
        )));
    }
    Ok(Budget::new(total, std::time::Instant::now()))
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn query(&self, req: Request<AdminRequest>) -> Result<Response<AdminReply>, Status> {
        let req = req.into_inner();
        let value = match req.what.as_str() {
            "status" => status_json(&self.raft),
            "log" => log_json(&self.sm, req.from_index, if req.limit == 0 { 1000 } else { req.limit })
                .map_err(Status::internal)?,
            "index" => index_json(&self.sm),
            "objects" => objects_json(&self.sm, req.from_index, if req.limit == 0 { 1000 } else { req.limit }),
            "stream" => self.sm.hub().with_state(|s| stream_json(s, &req.name)),
            what => self
                .sm
                .hub()
                .with_state(|s| section_json(s, what, req.from_index, req.limit as usize))
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "unknown query '{what}'; use status, nodes, streams, damaged, stream, topics, leases, tokens, takeovers, settings, state, index, objects or log"
                    ))
                })?,
        };
        reply(&value)
    }

    async fn drain(&self, req: Request<DrainRequest>) -> Result<Response<AdminReply>, Status> {
        let was_forwarded = forwarded(&req);
        let caller = weir_shared::peer::caller(&req)?;
        let inner = req.into_inner();
        let requester: Option<weir_shared::ids::Incarnation> = if inner.requester.is_empty() {
            None
        } else {
            Some(
                serde_json::from_slice(&inner.requester)
                    .map_err(|e| Status::invalid_argument(format!("malformed requester: {e}")))?,
            )
        };
        self.users.with(|users| {
            crate::authz::drain(
                caller.as_ref(),
                &inner.node,
                requester.as_ref(),
                &inner.principal,
                users,
            )
        })?;
        if !self.runner.leading() {
            return self.leader(was_forwarded)?.drain(mark_forwarded(inner, None)).await;
        }
        let budget = budget(inner.budget_ms)?;
        let requester =
            match (inner.node.as_str(), inner.requester.is_empty()) {
                (node, true) if !node.is_empty() => Requester::Operator(NodeId::new(node)),
                ("", false) => Requester::Stopping(
                    serde_json::from_slice(&inner.requester)
                        .map_err(|e| Status::invalid_argument(format!("malformed requester: {e}")))?,
                ),
                _ => return Err(Status::invalid_argument(
                    "name either a node (an operator's drain) or the requester (a stopping node's own drain), not both",
                )),
            };
        // SD-DRN-12: the drain runs in a task of its own, so it finishes (and releases
        // what it holds) even when the requester stops waiting.
        let runner = self.runner.clone();
        let report = self
            .moves
            .spawn(async move { runner.drain(requester, budget).await })
            .await
            .map_err(|e| Status::internal(format!("drain task failed: {e}")))??;
        if weir_shared::failpoint::action("drain_reply") == Some(weir_shared::failpoint::Action::Drop) {
            tracing::warn!("failpoint drain_reply: not answering");
            std::future::pending::<()>().await;
        }
        reply(&report)
    }

    async fn transfer(&self, req: Request<TransferRequest>) -> Result<Response<AdminReply>, Status> {
        // An operator's or a user's (through a gateway) move of any stream: not a node's.
        let caller = weir_shared::peer::caller(&req)?;
        let was_forwarded = forwarded(&req);
        let inner = req.into_inner();
        self.users
            .with(|users| crate::authz::transfer(caller.as_ref(), &inner.stream, &inner.principal, users))?;
        if !self.runner.leading() {
            return self.leader(was_forwarded)?.transfer(mark_forwarded(inner, None)).await;
        }
        let budget = budget(inner.budget_ms)?;
        let runner = self.runner.clone();
        let target = NodeId::new(inner.target.as_str());
        let moved = self
            .moves
            .spawn(async move { runner.transfer(&inner.stream, &target, inner.dry_run, budget).await })
            .await
            .map_err(|e| Status::internal(format!("transfer task failed: {e}")))??;
        reply(&moved)
    }
}
