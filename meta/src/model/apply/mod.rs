//! The apply rules: a pure, deterministic function from (state, index, proposal)
//! to (outcome, changed rows). Every replica runs it and so reaches the same state.
//! A rejected command changes nothing: each rule validates before it mutates.

use super::command::{Applied, Command, Outcome, Proposal, Proposer, RejectCode, Rejection, MAX_BATCH};
use super::index::{IndexChange, IndexRead};
use super::rows::*;
use super::state::{Change, RowKey, State};
use std::collections::BTreeSet;
use weir_shared::ids::{Incarnation, NodeId, StreamEpoch, StreamId};

mod acls;
mod compaction;
mod damage;
mod leases;
mod nodes;
mod objects;
mod quotas;
mod retention;
mod streams;
mod takeover;
#[cfg(test)]
mod test_log;
mod tokens;
mod topics;
mod transfer;

use super::names::validate_name;
pub use retention::validate_config;
pub use transfer::check_destination;

/// Most partitions one topic may have.
pub const MAX_PARTITIONS: u32 = 10_000;
/// Most producer ids one allocation may take.
pub const MAX_PRODUCER_ID_BLOCK: u32 = 10_000;

fn reject(code: RejectCode, message: impl Into<String>) -> Rejection {
    Rejection::new(code, message)
}

/// A command made at `stream_epoch` applies only while the stream is still at it.
fn at_epoch(stream: &StreamRow, stream_epoch: StreamEpoch) -> Result<(), Rejection> {
    if stream.epoch != stream_epoch {
        return Err(reject(
            RejectCode::NotOwner,
            format!(
                "stream '{}' is at epoch {}, not {stream_epoch}",
                stream.name, stream.epoch
            ),
        ));
    }
    Ok(())
}

/// What applying one entry did: its outcome, the view rows it changed (the watch
/// delta), and its writes to the object index.
#[derive(Debug)]
pub struct Effects {
    pub outcome: Outcome,
    pub changes: Vec<Change>,
    pub index: Vec<IndexChange>,
}

impl State {
    /// Applies one proposal at `index` against this view and the object index as
    /// `objects` reads it; the index writes are the caller's to store.
    pub fn apply(&mut self, index: u64, proposal: &Proposal, objects: &dyn IndexRead) -> Effects {
        let mut txn = Txn {
            state: self,
            objects,
            index,
            touched: BTreeSet::new(),
            index_changes: Vec::new(),
        };
        let outcome = txn.apply(&proposal.proposer, &proposal.command);
        let touched = std::mem::take(&mut txn.touched);
        let mut index_changes = std::mem::take(&mut txn.index_changes);
        // Every object that leaves the index is logged for GC (D-23).
        let released: Vec<IndexChange> = index_changes
            .iter()
            .filter_map(|c| match c {
                IndexChange::DeleteObject(key) => Some(IndexChange::Released {
                    index,
                    key: key.clone(),
                }),
                _ => None,
            })
            .collect();
        index_changes.extend(released);
        debug_assert!(
            outcome.is_ok() || (touched.is_empty() && index_changes.is_empty()),
            "a rejection changed rows"
        );
        self.applied_index = index;
        let changes = touched
            .into_iter()
            .map(|key| Change {
                row: self.row(&key),
                key,
            })
            .collect();
        Effects {
            outcome,
            changes,
            index: index_changes,
        }
    }
}

/// One command's application: the view, the object index it reads, the entry's index,
/// and what it changed.
struct Txn<'a> {
    state: &'a mut State,
    objects: &'a dyn IndexRead,
    index: u64,
    touched: BTreeSet<RowKey>,
    index_changes: Vec<IndexChange>,
}

impl Txn<'_> {
    fn apply(&mut self, proposer: &Proposer, command: &Command) -> Outcome {
        match command {
            Command::InitCluster { settings } => self.init_cluster(proposer, *settings),
            Command::RegisterNode {
                node,
                kind,
                addrs,
                heartbeat_interval_sec,
                node_timeout_sec,
            } => self.register(node, *kind, addrs, *heartbeat_interval_sec, *node_timeout_sec),
            Command::Heartbeat => self.heartbeat(proposer),
            Command::FenceNode {
                node,
                epoch,
                seen_heartbeats,
            } => self.fence_node(proposer, node, *epoch, *seen_heartbeats),
            Command::FenceSelf => self.fence_self(proposer),
            Command::ReapNode { node, epoch } => self.reap_node(proposer, node, *epoch),
            Command::MarkTerminating => self.mark_terminating(proposer),
            Command::Cordon { node, by } => self.cordon(proposer, node, *by),
            Command::Uncordon { node, by } => self.uncordon(proposer, node, *by),
            Command::CreateTopic {
                name,
                partitions,
                config,
            } => self.create_topic(proposer, name, *partitions, config),
            Command::DeleteTopic { name, topic_id } => self.delete_topic(proposer, name, topic_id.as_ref()),
            Command::CreatePartitions { name, partitions } => self.create_partitions(proposer, name, *partitions),
            Command::CreateStream { name, config } => self.create_stream(proposer, name, config),
            Command::DeleteStream { name, id } => self.delete_stream(proposer, name, *id),
            Command::DestroyStream { stream } => self.destroy_stream(proposer, *stream),
            Command::ForgetReleased { through } => {
                self.privileged(proposer)?;
                self.index_changes
                    .push(IndexChange::ForgetReleased { through: *through });
                Ok(Applied::Done)
            }
            Command::PlaceStream { stream, node } => self.place_stream(proposer, *stream, node),
            Command::PlaceStreams { placements } => {
                self.privileged(proposer)?;
                self.each(placements, |txn, p| txn.place_stream(proposer, p.stream, &p.node))
            }
            Command::BeginTransfer {
                stream,
                stream_epoch,
                target,
            } => self.begin_transfer(proposer, *stream, *stream_epoch, target),
            Command::BeginTransfers { transfers } => {
                self.privileged(proposer)?;
                self.each(transfers, |txn, t| {
                    txn.begin_transfer(proposer, t.stream, t.stream_epoch, &t.target)
                })
            }
            Command::CancelTransfer { stream, stream_epoch } => self.cancel_transfer(proposer, *stream, *stream_epoch),
            Command::DiscardTransfer { stream, op, .. } => self.discard_transfer(proposer, *stream, *op),
            Command::OpenStream {
                stream,
                stamps_leader_epochs,
            } => self.open_stream(proposer, *stream, *stamps_leader_epochs),
            Command::OpenStreams {
                streams,
                stamps_leader_epochs,
            } => {
                self.node_proposer(proposer)?;
                self.each(streams, |txn, id| txn.open_stream(proposer, *id, *stamps_leader_epochs))
            }
            Command::CloseStream { stream, stream_epoch } => self.close_stream(proposer, *stream, *stream_epoch),
            Command::CloseStreams { streams } => {
                self.privileged(proposer)?;
                self.each(streams, |txn, s| txn.close_stream(proposer, s.stream, s.stream_epoch))
            }
            Command::CommitObjects { key, size, ranges } => self.commit_objects(proposer, key, *size, ranges),
            Command::TrimStream { stream, start } => self.trim_stream(proposer, *stream, *start),
            Command::CompactObjects {
                stream,
                replaced,
                objects,
            } => self.compact_objects(proposer, *stream, replaced, objects),
            Command::CompactStreams { objects, swaps } => self.compact_streams(proposer, objects, swaps),
            Command::AlterConfig {
                target,
                config,
                expected,
                topic_id,
            } => self.alter_config(proposer, target, config, expected.as_ref(), topic_id.as_ref()),
            Command::AcquireLease { name, expected } => self.acquire_lease(proposer, name, expected.as_ref()),
            Command::RenewLease { name } => self.renew_lease(proposer, name),
            Command::IssueToken {
                name,
                secret_sha256,
                scopes,
                expires_at_ms,
                scram,
            } => self.issue_token(proposer, name, secret_sha256, scopes, *expires_at_ms, scram.as_ref()),
            Command::RevokeToken { name } => self.revoke_token(proposer, name),
            Command::SetScramCredential { name, mechanism, scram } => {
                self.set_scram_credential(proposer, name, mechanism, scram.as_ref())
            }
            Command::CreateAcls { bindings } => self.create_acls(proposer, bindings),
            Command::DeleteAcls { filters } => self.delete_acls(proposer, filters),
            Command::AlterClientQuotas { entity, set, remove } => {
                self.alter_client_quotas(proposer, entity, set, remove)
            }
            Command::AllocateProducerIds { count } => self.allocate_producer_ids(proposer, *count),
            Command::BeginTakeover { node, epoch, agent } => self.begin_takeover(proposer, node, *epoch, agent),
            Command::CompleteTakeover { node, epoch } => self.complete_takeover(proposer, node, *epoch),
            Command::ReportDamage {
                stream,
                from,
                until,
                what,
            } => self.report_damage(proposer, *stream, *from, *until, what),
            Command::ResolveDamage { stream, remedy } => self.resolve_damage(proposer, *stream, *remedy),
        }
    }

    /// A batch command: each item applied in order as its single command would be, its
    /// refusal its own (a refused item changes nothing, as every rule checks first).
    fn each<T>(&mut self, items: &[T], mut one: impl FnMut(&mut Self, &T) -> Outcome) -> Outcome {
        if items.is_empty() || items.len() > MAX_BATCH {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("a batch holds 1 to {MAX_BATCH} items, not {}", items.len()),
            ));
        }
        let outcomes = items.iter().map(|item| one(self, item)).collect();
        Ok(Applied::Each { outcomes })
    }

    // ---- proposer checks ----

    /// A node proposer must be registered at its current epoch and not fenced
    /// (FO-FEN-4, FO-FEN-5, INV-5).
    fn live_node(&self, who: &Incarnation) -> Result<&NodeRow, Rejection> {
        let row = self.state.nodes.get(&who.node).ok_or_else(|| {
            reject(
                RejectCode::UnknownNode,
                format!("node '{}' is not registered", who.node),
            )
        })?;
        if row.epoch != who.epoch {
            return Err(reject(
                RejectCode::Superseded,
                format!(
                    "node '{}' epoch {} was replaced by epoch {}",
                    who.node, who.epoch, row.epoch
                ),
            ));
        }
        if row.fenced {
            return Err(reject(
                RejectCode::Fenced,
                format!("node '{}' epoch {} is fenced", who.node, who.epoch),
            ));
        }
        Ok(row)
    }

    /// Commands any operator or live node may propose.
    fn privileged(&self, proposer: &Proposer) -> Result<(), Rejection> {
        match proposer {
            Proposer::Operator { .. } => Ok(()),
            Proposer::Node(who) => self.live_node(who).map(|_| ()),
        }
    }

    fn node_proposer<'p>(&self, proposer: &'p Proposer) -> Result<&'p Incarnation, Rejection> {
        match proposer {
            Proposer::Node(who) => {
                self.live_node(who)?;
                Ok(who)
            }
            Proposer::Operator { principal } => Err(reject(
                RejectCode::InvalidArgument,
                format!("only a node may propose this command, not operator '{principal}'"),
            )),
        }
    }

    /// Whether `(node, epoch)` is the live current incarnation of its node.
    fn incarnation_live(&self, who: &Incarnation) -> bool {
        self.live_node(who).is_ok()
    }

    fn touch(&mut self, key: RowKey) {
        self.touched.insert(key);
    }

    fn stream(&self, id: StreamId) -> Result<&StreamRow, Rejection> {
        self.state
            .streams
            .get(&id)
            .ok_or_else(|| reject(RejectCode::NotFound, format!("stream {id} does not exist")))
    }

    /// The stream's row if it is in `state`; otherwise a conflict saying `rule`.
    fn stream_in(&self, id: StreamId, state: StreamState, rule: &str) -> Result<&StreamRow, Rejection> {
        let stream = self.stream(id)?;
        if stream.state != state {
            return Err(reject(
                RejectCode::Conflict,
                format!("stream '{}' is {:?}; {rule}", stream.name, stream.state),
            ));
        }
        Ok(stream)
    }

    fn node_row(&self, node: &NodeId) -> Result<&NodeRow, Rejection> {
        self.state
            .nodes
            .get(node)
            .ok_or_else(|| reject(RejectCode::NotFound, format!("node '{node}' is not registered")))
    }
}
