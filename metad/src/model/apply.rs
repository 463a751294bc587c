//! The apply rules: a pure, deterministic function from (state, index, proposal)
//! to (outcome, changed rows). Every replica runs it and so reaches the same state.
//! A rejected command changes nothing: each rule validates before it mutates.

use super::command::{Applied, Command, CommitRange, Outcome, Proposal, Proposer, RejectCode, Rejection};
use super::rows::*;
use super::state::{Change, RowKey, State};
use std::collections::BTreeSet;
use weir_shared::ids::{Epoch, Incarnation, NodeId, ObjectKey, Offset, StreamEpoch, StreamId};

mod transfer;
pub use transfer::check_destination;

/// Longest accepted stream or topic name (Kafka allows 249 for topics).
pub const MAX_NAME_LEN: usize = 249;
/// Most partitions one topic may have.
pub const MAX_PARTITIONS: u32 = 10_000;
/// Most producer ids one allocation may take.
pub const MAX_PRODUCER_ID_BLOCK: u32 = 10_000;

fn reject(code: RejectCode, message: impl Into<String>) -> Rejection {
    Rejection::new(code, message)
}

/// Checks a stream or topic name: Kafka's legal characters, so a name works on both APIs.
pub fn validate_name(what: &str, name: &str) -> Result<(), Rejection> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(reject(
            RejectCode::InvalidArgument,
            format!("{what} name must be 1 to {MAX_NAME_LEN} characters, got {}", name.len()),
        ));
    }
    if name == "." || name == ".." {
        return Err(reject(
            RejectCode::InvalidArgument,
            format!("{what} name '{name}' is reserved"),
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(reject(
            RejectCode::InvalidArgument,
            format!("{what} name '{name}' has '{c}'; use letters, digits, '.', '_' and '-'"),
        ));
    }
    Ok(())
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

impl State {
    /// Applies one proposal at `index`, returning its outcome and the rows it changed.
    pub fn apply(&mut self, index: u64, proposal: &Proposal) -> (Outcome, Vec<Change>) {
        let mut txn = Txn {
            state: self,
            index,
            touched: BTreeSet::new(),
        };
        let outcome = txn.apply(&proposal.proposer, &proposal.command);
        let touched = std::mem::take(&mut txn.touched);
        debug_assert!(outcome.is_ok() || touched.is_empty(), "a rejection changed rows");
        self.applied_index = index;
        let changes = touched
            .into_iter()
            .map(|key| Change {
                row: self.row(&key),
                key,
            })
            .collect();
        (outcome, changes)
    }
}

/// One command's application: the state, the entry's index, and the rows touched.
struct Txn<'a> {
    state: &'a mut State,
    index: u64,
    touched: BTreeSet<RowKey>,
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
            Command::MarkTerminating => self.mark_terminating(proposer),
            Command::Cordon { node, by } => self.cordon(proposer, node, *by),
            Command::Uncordon { node, by } => self.uncordon(proposer, node, *by),
            Command::CreateTopic {
                name,
                partitions,
                config,
            } => self.create_topic(proposer, name, *partitions, config),
            Command::DeleteTopic { name } => self.delete_topic(proposer, name),
            Command::CreatePartitions { name, partitions } => self.create_partitions(proposer, name, *partitions),
            Command::CreateStream { name, config } => self.create_stream(proposer, name, config),
            Command::DeleteStream { name } => self.delete_stream(proposer, name),
            Command::DestroyStream { stream } => self.destroy_stream(proposer, *stream),
            Command::PlaceStream { stream, node } => self.place_stream(proposer, *stream, node),
            Command::BeginTransfer {
                stream,
                stream_epoch,
                target,
            } => self.begin_transfer(proposer, *stream, *stream_epoch, target),
            Command::CancelTransfer { stream, stream_epoch } => self.cancel_transfer(proposer, *stream, *stream_epoch),
            Command::OpenStream { stream } => self.open_stream(proposer, *stream),
            Command::CloseStream { stream, stream_epoch } => self.close_stream(proposer, *stream, *stream_epoch),
            Command::CommitObjects { key, size, ranges } => self.commit_objects(proposer, key, *size, ranges),
            Command::AcquireLease { name, expected } => self.acquire_lease(proposer, name, expected.as_ref()),
            Command::RenewLease { name } => self.renew_lease(proposer, name),
            Command::IssueToken {
                name,
                secret_sha256,
                scopes,
            } => self.issue_token(proposer, name, secret_sha256, scopes),
            Command::RevokeToken { name } => self.revoke_token(proposer, name),
            Command::AllocateProducerIds { count } => self.allocate_producer_ids(proposer, *count),
            Command::BeginTakeover { node, epoch, agent } => self.begin_takeover(proposer, node, *epoch, agent),
            Command::CompleteTakeover { node, epoch } => self.complete_takeover(proposer, node, *epoch),
        }
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

    // ---- cluster and nodes ----

    fn init_cluster(&mut self, proposer: &Proposer, settings: ClusterSettings) -> Outcome {
        self.privileged(proposer)?;
        if let Err(e) =
            weir_shared::config::check_heartbeat_timing(settings.heartbeat_interval_sec, settings.node_timeout_sec)
        {
            return Err(reject(RejectCode::InvalidArgument, e.message));
        }
        match self.state.settings {
            Some(current) if current == settings => Ok(Applied::Done),
            Some(current) => Err(reject(
                RejectCode::Conflict,
                format!(
                    "cluster already initialized with --heartbeat-interval-sec {} and --node-timeout-sec {}",
                    current.heartbeat_interval_sec, current.node_timeout_sec
                ),
            )),
            None => {
                self.state.settings = Some(settings);
                self.touch(RowKey::Settings);
                Ok(Applied::Done)
            }
        }
    }

    fn register(
        &mut self,
        node: &NodeId,
        kind: NodeKind,
        addrs: &NodeAddrs,
        heartbeat_interval_sec: u64,
        node_timeout_sec: u64,
    ) -> Outcome {
        validate_name("node", node.as_str())?;
        let Some(settings) = self.state.settings else {
            return Err(reject(RejectCode::NotReady, "cluster settings are not initialized yet"));
        };
        // FO-LIV-14: one clock for the whole cluster.
        if settings.heartbeat_interval_sec != heartbeat_interval_sec || settings.node_timeout_sec != node_timeout_sec {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!(
                    "node '{node}' runs --heartbeat-interval-sec {heartbeat_interval_sec} and --node-timeout-sec {node_timeout_sec}, \
                     but the cluster runs --heartbeat-interval-sec {} and --node-timeout-sec {}",
                    settings.heartbeat_interval_sec, settings.node_timeout_sec
                ),
            ));
        }
        let previous = self.state.nodes.get(node);
        if let Some(prev) = previous {
            if prev.kind != kind {
                return Err(reject(
                    RejectCode::Conflict,
                    format!("node id '{node}' is registered as {:?}, not {kind:?}", prev.kind),
                ));
            }
        }
        // FO-LIV-10: strictly above every earlier epoch of this id.
        let epoch = previous.map_or(Epoch(1), |p| p.epoch.next());
        let row = NodeRow {
            id: node.clone(),
            kind,
            epoch,
            addrs: addrs.clone(),
            heartbeats: 0,
            registered_index: self.index,
            last_heartbeat_index: self.index,
            fenced: false,
            fenced_index: None,
            // An operator's cordon survives restarts; so does a drain's until it releases it.
            cordon: previous.and_then(|p| p.cordon),
            terminating: false,
        };
        self.state.nodes.insert(node.clone(), row);
        self.touch(RowKey::Node(node.clone()));
        Ok(Applied::Registered { epoch })
    }

    fn heartbeat(&mut self, proposer: &Proposer) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let index = self.index;
        let row = self.state.nodes.get_mut(&who.node).expect("checked live");
        row.heartbeats += 1;
        row.last_heartbeat_index = index;
        self.touch(RowKey::Node(who.node));
        Ok(Applied::Done)
    }

    /// FO-FEN-1, FO-FEN-2, INV-4: applies only on an exact match of an unfenced row.
    fn fence_node(&mut self, proposer: &Proposer, node: &NodeId, epoch: Epoch, seen_heartbeats: u64) -> Outcome {
        self.privileged(proposer)?;
        let row = self.node_row(node)?;
        if row.epoch != epoch || row.heartbeats != seen_heartbeats || row.fenced {
            return Err(reject(
                RejectCode::Conflict,
                format!(
                    "node '{node}' is at epoch {} with {} heartbeats (fenced: {}), not epoch {epoch} with {seen_heartbeats}",
                    row.epoch, row.heartbeats, row.fenced
                ),
            ));
        }
        self.set_fenced(node);
        Ok(Applied::Done)
    }

    /// FO-FEN-3: unconditional on the count, but only for the current incarnation (FO-FEN-4).
    fn fence_self(&mut self, proposer: &Proposer) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        self.set_fenced(&who.node);
        Ok(Applied::Done)
    }

    fn set_fenced(&mut self, node: &NodeId) {
        let index = self.index;
        let row = self.state.nodes.get_mut(node).expect("caller checked the row");
        row.fenced = true;
        row.fenced_index = Some(index);
        self.touch(RowKey::Node(node.clone()));
    }

    fn mark_terminating(&mut self, proposer: &Proposer) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let row = self.state.nodes.get_mut(&who.node).expect("checked live");
        if !row.terminating {
            row.terminating = true;
            self.touch(RowKey::Node(who.node));
        }
        Ok(Applied::Done)
    }

    fn cordon(&mut self, proposer: &Proposer, node: &NodeId, by: CordonBy) -> Outcome {
        self.check_cordon_proposer(proposer, node, by)?;
        let row = self.node_row(node)?;
        match (row.cordon, by) {
            // Already cordoned: an operator's cordon is remembered, never downgraded.
            (Some(CordonBy::Operator), _) | (Some(CordonBy::Drain), CordonBy::Drain) => Ok(Applied::Done),
            _ => {
                self.state.nodes.get_mut(node).expect("checked").cordon = Some(by);
                self.touch(RowKey::Node(node.clone()));
                Ok(Applied::Done)
            }
        }
    }

    fn uncordon(&mut self, proposer: &Proposer, node: &NodeId, by: CordonBy) -> Outcome {
        self.check_cordon_proposer(proposer, node, by)?;
        let row = self.node_row(node)?;
        match (row.cordon, by) {
            // A drain releases only the cordon it set (SD-REL).
            (Some(CordonBy::Operator), CordonBy::Drain) | (None, _) => Ok(Applied::Done),
            _ => {
                self.state.nodes.get_mut(node).expect("checked").cordon = None;
                self.touch(RowKey::Node(node.clone()));
                Ok(Applied::Done)
            }
        }
    }

    /// Operators cordon any node; a node sets or releases only its own drain cordon (SD-DRN-10).
    fn check_cordon_proposer(&self, proposer: &Proposer, node: &NodeId, by: CordonBy) -> Result<(), Rejection> {
        match (proposer, by) {
            (Proposer::Operator { .. }, CordonBy::Operator) => Ok(()),
            (Proposer::Node(who), CordonBy::Drain) if &who.node == node => self.live_node(who).map(|_| ()),
            (Proposer::Node(who), CordonBy::Drain) => Err(reject(
                RejectCode::InvalidArgument,
                format!("node '{}' may drain only itself, not '{node}'", who.node),
            )),
            (_, CordonBy::Operator) => Err(reject(
                RejectCode::InvalidArgument,
                "only an operator sets or clears an operator cordon",
            )),
            (Proposer::Operator { .. }, CordonBy::Drain) => Err(reject(
                RejectCode::InvalidArgument,
                "a drain cordon is set only by the draining node",
            )),
        }
    }

    // ---- topics and streams ----

    fn new_stream(&mut self, name: String, topic: Option<(&str, u32)>, config: &StreamConfig) -> StreamId {
        let id = StreamId(self.state.counters.next_stream_id);
        self.state.counters.next_stream_id += 1;
        self.touch(RowKey::Counters);
        let row = StreamRow {
            id,
            name,
            topic: topic.map(|(t, _)| t.to_string()),
            partition: topic.map(|(_, p)| p),
            state: StreamState::Closed,
            owner: None,
            epoch: StreamEpoch(0),
            transfer_target: None,
            start_offset: Offset(0),
            committed_end: Offset(0),
            objects: Vec::new(),
            config: config.clone(),
        };
        self.state
            .set_row(&RowKey::Stream(id), Some(super::state::Row::Stream(row)));
        self.touch(RowKey::Stream(id));
        id
    }

    fn create_topic(&mut self, proposer: &Proposer, name: &str, partitions: u32, config: &StreamConfig) -> Outcome {
        self.privileged(proposer)?;
        validate_name("topic", name)?;
        if partitions == 0 || partitions > MAX_PARTITIONS {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("partitions must be 1 to {MAX_PARTITIONS}, got {partitions}"),
            ));
        }
        if self.state.topics.contains_key(name) {
            return Err(reject(
                RejectCode::AlreadyExists,
                format!("topic '{name}' already exists"),
            ));
        }
        let streams = (0..partitions)
            .map(|p| self.new_stream(format!("{name}/{p}"), Some((name, p)), config))
            .collect::<Vec<_>>();
        let topic = TopicRow {
            name: name.to_string(),
            topic_id: topic_id(name, self.index),
            partitions: streams.clone(),
            config: config.clone(),
        };
        self.state.topics.insert(name.to_string(), topic);
        self.touch(RowKey::Topic(name.to_string()));
        Ok(Applied::TopicCreated { streams })
    }

    fn delete_topic(&mut self, proposer: &Proposer, name: &str) -> Outcome {
        self.privileged(proposer)?;
        let topic = self
            .state
            .topics
            .remove(name)
            .ok_or_else(|| reject(RejectCode::NotFound, format!("topic '{name}' does not exist")))?;
        self.touch(RowKey::Topic(name.to_string()));
        for id in topic.partitions {
            self.mark_deleted(id);
        }
        Ok(Applied::Done)
    }

    fn mark_deleted(&mut self, id: StreamId) {
        if let Some(mut row) = self.state.streams.get(&id).cloned() {
            row.state = StreamState::Deleted;
            row.transfer_target = None;
            self.state
                .set_row(&RowKey::Stream(id), Some(super::state::Row::Stream(row)));
            self.touch(RowKey::Stream(id));
        }
    }

    fn create_partitions(&mut self, proposer: &Proposer, name: &str, partitions: u32) -> Outcome {
        self.privileged(proposer)?;
        let topic = self
            .state
            .topics
            .get(name)
            .ok_or_else(|| reject(RejectCode::NotFound, format!("topic '{name}' does not exist")))?;
        let current = topic.partitions.len() as u32;
        if partitions <= current || partitions > MAX_PARTITIONS {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("topic '{name}' has {current} partitions; the new count must be above that and at most {MAX_PARTITIONS}, got {partitions}"),
            ));
        }
        let config = topic.config.clone();
        let added = (current..partitions)
            .map(|p| self.new_stream(format!("{name}/{p}"), Some((name, p)), &config))
            .collect::<Vec<_>>();
        let topic = self.state.topics.get_mut(name).expect("checked above");
        topic.partitions.extend(added.iter().copied());
        self.touch(RowKey::Topic(name.to_string()));
        Ok(Applied::TopicCreated { streams: added })
    }

    fn create_stream(&mut self, proposer: &Proposer, name: &str, config: &StreamConfig) -> Outcome {
        self.privileged(proposer)?;
        validate_name("stream", name)?;
        if self.state.stream_names.contains_key(name) {
            return Err(reject(
                RejectCode::AlreadyExists,
                format!("stream '{name}' already exists"),
            ));
        }
        let stream = self.new_stream(name.to_string(), None, config);
        Ok(Applied::StreamCreated { stream })
    }

    fn delete_stream(&mut self, proposer: &Proposer, name: &str) -> Outcome {
        self.privileged(proposer)?;
        let row = self
            .state
            .stream_by_name(name)
            .ok_or_else(|| reject(RejectCode::NotFound, format!("stream '{name}' does not exist")))?;
        if row.topic.is_some() {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("stream '{name}' is a topic partition; delete the topic instead"),
            ));
        }
        let id = row.id;
        self.mark_deleted(id);
        Ok(Applied::Done)
    }

    fn destroy_stream(&mut self, proposer: &Proposer, id: StreamId) -> Outcome {
        self.privileged(proposer)?;
        let row = self.stream(id)?;
        if row.state != StreamState::Deleted {
            return Err(reject(RejectCode::Conflict, format!("stream {id} is not deleted")));
        }
        // A live owner destroys it itself once it has stopped serving it; anyone else waits.
        if let Some(owner) = &row.owner {
            let by_owner = matches!(proposer, Proposer::Node(who) if who == owner);
            if self.incarnation_live(owner) && !by_owner {
                return Err(reject(
                    RejectCode::Conflict,
                    format!("stream {id} is still held by live owner {owner}"),
                ));
            }
        }
        let keys: Vec<ObjectKey> = row.objects.iter().map(|o| o.key.clone()).collect();
        for key in keys {
            if let Some(obj) = self.state.objects.get_mut(&key) {
                obj.streams.retain(|s| *s != id);
                if obj.streams.is_empty() {
                    self.state.objects.remove(&key);
                }
                self.touch(RowKey::Object(key));
            }
        }
        self.state.set_row(&RowKey::Stream(id), None);
        self.touch(RowKey::Stream(id));
        Ok(Applied::Done)
    }

    fn place_stream(&mut self, proposer: &Proposer, id: StreamId, node: &NodeId) -> Outcome {
        self.privileged(proposer)?;
        // The target's checks come first: a refusal names the first failing one (OBS-14).
        let target = check_destination(self.state, node)?;
        let stream = self.stream_in(id, StreamState::Closed, "only a closed stream is placed")?;
        if let Some(owner) = &stream.owner {
            if self.incarnation_live(owner) && &owner.node != node {
                return Err(reject(
                    RejectCode::Conflict,
                    format!("stream '{}' is already placed on live {owner}", stream.name),
                ));
            }
        }
        let owner = target.incarnation();
        let row = self.state.streams.get_mut(&id).expect("checked");
        row.owner = Some(owner);
        row.transfer_target = None;
        self.touch(RowKey::Stream(id));
        Ok(Applied::Done)
    }

    fn open_stream(&mut self, proposer: &Proposer, id: StreamId) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let stream = self.stream(id)?;
        if stream.owner.as_ref() != Some(&who) {
            return Err(reject(
                RejectCode::NotOwner,
                format!("stream '{}' is not placed on {who}", stream.name),
            ));
        }
        match stream.state {
            // A retried open after an unknown outcome gets the same answer.
            StreamState::Open => Ok(Applied::StreamOpened {
                stream_epoch: stream.epoch,
                committed_end: stream.committed_end,
            }),
            StreamState::Deleted => Err(reject(
                RejectCode::NotFound,
                format!("stream '{}' is deleted", stream.name),
            )),
            StreamState::Closed => {
                let row = self.state.streams.get_mut(&id).expect("checked");
                row.state = StreamState::Open;
                row.epoch = row.epoch.next();
                let applied = Applied::StreamOpened {
                    stream_epoch: row.epoch,
                    committed_end: row.committed_end,
                };
                self.touch(RowKey::Stream(id));
                Ok(applied)
            }
        }
    }

    /// The owner closes its stream; another privileged proposer may close a dead
    /// owner's open stream only once that owner's WAL takeover has recovered it.
    fn close_stream(&mut self, proposer: &Proposer, id: StreamId, stream_epoch: StreamEpoch) -> Outcome {
        self.privileged(proposer)?;
        let stream = self.stream(id)?;
        at_epoch(stream, stream_epoch)?;
        let owner = stream.owner.clone();
        let by_owner = matches!(proposer, Proposer::Node(who) if Some(who) == owner.as_ref());
        if !by_owner {
            let Some(owner) = owner.as_ref() else {
                return Err(reject(
                    RejectCode::Conflict,
                    format!("stream '{}' has no owner", stream.name),
                ));
            };
            if self.incarnation_live(owner) {
                return Err(reject(
                    RejectCode::NotOwner,
                    format!(
                        "stream '{}' is owned by live {owner}; only it may close it",
                        stream.name
                    ),
                ));
            }
            if stream.state == StreamState::Open {
                let recovered = self
                    .state
                    .takeovers
                    .get(&(owner.node.clone(), owner.epoch))
                    .is_some_and(|t| t.state != TakeoverState::Pending);
                if !recovered {
                    return Err(reject(
                        RejectCode::Conflict,
                        format!(
                            "stream '{}' is open on dead {owner} whose WAL is not recovered yet",
                            stream.name
                        ),
                    ));
                }
            }
        }
        if stream.state == StreamState::Deleted {
            return Err(reject(
                RejectCode::NotFound,
                format!("stream '{}' is deleted", stream.name),
            ));
        }
        // A planned transfer (or one a takeover interrupted) completes to its target in
        // this same entry, if the target can still take it; otherwise placement decides.
        let handed_to = stream
            .transfer_target
            .as_ref()
            .and_then(|t| check_destination(self.state, t).ok())
            .map(NodeRow::incarnation);
        let row = self.state.streams.get_mut(&id).expect("checked");
        row.state = StreamState::Closed;
        row.owner = handed_to;
        row.transfer_target = None;
        self.touch(RowKey::Stream(id));
        Ok(Applied::Done)
    }

    /// RR-WAL-4: objects become visible only here, from the owner (or its takeover agent)
    /// at the stream's current epoch, each range continuing the committed end.
    fn commit_objects(&mut self, proposer: &Proposer, key: &ObjectKey, size: u64, ranges: &[CommitRange]) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        if ranges.is_empty() {
            return Err(reject(RejectCode::InvalidArgument, "a commit needs at least one range"));
        }
        if self.state.objects.contains_key(key) {
            return Err(reject(
                RejectCode::AlreadyExists,
                format!("object '{key}' is already committed"),
            ));
        }
        let mut updated: std::collections::BTreeMap<StreamId, StreamRow> = Default::default();
        for range in ranges {
            let mut row = match updated.get(&range.stream) {
                Some(r) => r.clone(),
                None => self.stream(range.stream)?.clone(),
            };
            if row.state != StreamState::Open {
                return Err(reject(
                    RejectCode::NotOwner,
                    format!("stream '{}' is not open", row.name),
                ));
            }
            let owner = row.owner.clone().expect("an open stream has an owner");
            let agent_of_owner = self
                .state
                .takeovers
                .get(&(owner.node.clone(), owner.epoch))
                .is_some_and(|t| t.state == TakeoverState::Pending && t.agent.as_ref() == Some(&who));
            if owner != who && !agent_of_owner {
                return Err(reject(
                    RejectCode::NotOwner,
                    format!("stream '{}' is owned by {owner}, not {who}", row.name),
                ));
            }
            if row.epoch != range.stream_epoch {
                return Err(reject(
                    RejectCode::NotOwner,
                    format!(
                        "stream '{}' is at epoch {}, not {}",
                        row.name, row.epoch, range.stream_epoch
                    ),
                ));
            }
            if range.start != row.committed_end || range.end <= range.start {
                return Err(reject(
                    RejectCode::Conflict,
                    format!(
                        "stream '{}' range {}..{} does not continue its committed end {}",
                        row.name, range.start, range.end, row.committed_end
                    ),
                ));
            }
            if range.pos.checked_add(range.len).is_none_or(|end| end > size) {
                return Err(reject(
                    RejectCode::InvalidArgument,
                    format!("range of stream '{}' lies outside the object", row.name),
                ));
            }
            row.committed_end = range.end;
            row.objects.push(ObjectRange {
                key: key.clone(),
                start: range.start,
                end: range.end,
                pos: range.pos,
                len: range.len,
                crc: range.crc,
            });
            updated.insert(range.stream, row);
        }
        let streams: Vec<StreamId> = updated.keys().copied().collect();
        for (id, row) in updated {
            self.state.streams.insert(id, row);
            self.touch(RowKey::Stream(id));
        }
        self.state.objects.insert(
            key.clone(),
            ObjectRow {
                key: key.clone(),
                size,
                committed_index: self.index,
                streams,
            },
        );
        self.touch(RowKey::Object(key.clone()));
        Ok(Applied::Done)
    }

    // ---- leases, tokens, producer ids, takeovers ----

    fn acquire_lease(&mut self, proposer: &Proposer, name: &str, expected: Option<&Incarnation>) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let index = self.index;
        let current = self.state.leases.get(name);
        let holder = current.map(|l| &l.holder);
        if holder == Some(&who) {
            return self.renew_lease(proposer, name);
        }
        if holder != expected {
            return Err(reject(
                RejectCode::Conflict,
                format!(
                    "lease '{name}' is held by {}",
                    holder.map_or("nobody".into(), |h| h.to_string())
                ),
            ));
        }
        let generation = current.map_or(1, |l| l.generation + 1);
        self.state.leases.insert(
            name.to_string(),
            LeaseRow {
                name: name.to_string(),
                holder: who,
                generation,
                acquired_index: index,
                renewed_index: index,
            },
        );
        self.touch(RowKey::Lease(name.to_string()));
        Ok(Applied::LeaseHeld { generation })
    }

    fn renew_lease(&mut self, proposer: &Proposer, name: &str) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let index = self.index;
        match self.state.leases.get_mut(name) {
            Some(lease) if lease.holder == who => {
                lease.renewed_index = index;
                let generation = lease.generation;
                self.touch(RowKey::Lease(name.to_string()));
                Ok(Applied::LeaseHeld { generation })
            }
            Some(lease) => Err(reject(
                RejectCode::Conflict,
                format!("lease '{name}' is held by {}", lease.holder),
            )),
            None => Err(reject(RejectCode::NotFound, format!("lease '{name}' is not held"))),
        }
    }

    fn issue_token(&mut self, proposer: &Proposer, name: &str, secret_sha256: &str, scopes: &[String]) -> Outcome {
        if !matches!(proposer, Proposer::Operator { .. }) {
            return Err(reject(RejectCode::InvalidArgument, "only an operator issues tokens"));
        }
        validate_name("token", name)?;
        if secret_sha256.len() != 64 || !secret_sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(reject(
                RejectCode::InvalidArgument,
                "secret_sha256 must be 64 hex digits",
            ));
        }
        if self.state.tokens.get(name).is_some_and(|t| !t.revoked) {
            return Err(reject(
                RejectCode::AlreadyExists,
                format!("token '{name}' already exists"),
            ));
        }
        self.state.tokens.insert(
            name.to_string(),
            TokenRow {
                name: name.to_string(),
                secret_sha256: secret_sha256.to_ascii_lowercase(),
                scopes: scopes.to_vec(),
                revoked: false,
                issued_index: self.index,
            },
        );
        self.touch(RowKey::Token(name.to_string()));
        Ok(Applied::Done)
    }

    fn revoke_token(&mut self, proposer: &Proposer, name: &str) -> Outcome {
        if !matches!(proposer, Proposer::Operator { .. }) {
            return Err(reject(RejectCode::InvalidArgument, "only an operator revokes tokens"));
        }
        let token = self
            .state
            .tokens
            .get_mut(name)
            .ok_or_else(|| reject(RejectCode::NotFound, format!("token '{name}' does not exist")))?;
        if !token.revoked {
            token.revoked = true;
            self.touch(RowKey::Token(name.to_string()));
        }
        Ok(Applied::Done)
    }

    fn allocate_producer_ids(&mut self, proposer: &Proposer, count: u32) -> Outcome {
        self.privileged(proposer)?;
        if count == 0 || count > MAX_PRODUCER_ID_BLOCK {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("count must be 1 to {MAX_PRODUCER_ID_BLOCK}, got {count}"),
            ));
        }
        let first = self.state.counters.next_producer_id;
        self.state.counters.next_producer_id = first + i64::from(count);
        self.touch(RowKey::Counters);
        Ok(Applied::ProducerIds { first, count })
    }

    fn begin_takeover(&mut self, proposer: &Proposer, node: &NodeId, epoch: Epoch, agent: &NodeId) -> Outcome {
        self.privileged(proposer)?;
        let dead = Incarnation {
            node: node.clone(),
            epoch,
        };
        if self.incarnation_live(&dead) {
            return Err(reject(
                RejectCode::Conflict,
                format!("{dead} is live; only a fenced or replaced incarnation is taken over"),
            ));
        }
        let agent_row = self.node_row(agent)?;
        if agent_row.kind != NodeKind::Streamd || !agent_row.is_live() {
            return Err(reject(
                RejectCode::Conflict,
                format!("agent '{agent}' is not a live streamd"),
            ));
        }
        let agent = agent_row.incarnation();
        let key = (node.clone(), epoch);
        match self.state.takeovers.get(&key) {
            Some(t) if t.state != TakeoverState::Pending => Ok(Applied::Done),
            Some(t) if t.agent.as_ref() == Some(&agent) => Ok(Applied::Done),
            _ => {
                self.state.takeovers.insert(
                    key,
                    TakeoverRow {
                        dead,
                        agent: Some(agent),
                        state: TakeoverState::Pending,
                    },
                );
                self.touch(RowKey::Takeover(node.clone(), epoch));
                Ok(Applied::Done)
            }
        }
    }

    fn complete_takeover(&mut self, proposer: &Proposer, node: &NodeId, epoch: Epoch) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let key = (node.clone(), epoch);
        let takeover = self
            .state
            .takeovers
            .get_mut(&key)
            .ok_or_else(|| reject(RejectCode::NotFound, format!("no takeover of ({node}, {epoch})")))?;
        if takeover.agent.as_ref() != Some(&who) {
            return Err(reject(
                RejectCode::NotOwner,
                format!("{who} is not the agent of the takeover of ({node}, {epoch})"),
            ));
        }
        if takeover.state == TakeoverState::Pending {
            takeover.state = TakeoverState::Recovered;
            self.touch(RowKey::Takeover(node.clone(), epoch));
        }
        Ok(Applied::Done)
    }
}

/// A Kafka topic id: deterministic per (name, creating index), so every replica agrees.
fn topic_id(name: &str, index: u64) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(name.as_bytes())
        .chain_update(index.to_be_bytes())
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    // Version-4-shaped UUID bits so clients print it as a UUID; never all zeros.
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}
