//! Kafka consumer-group coordination, run by the owner of a group's offsets stream
//! (`__consumer_offsets/N`, the group hashed over a fixed set; as in Kafka, where the
//! coordinator is the leader of the group's offsets partition).
//!
//! gatewayd forwards group requests here as Kafka-encoded bodies. Membership lives in
//! memory and is rebuilt by members rejoining after a move; committed offsets are
//! appended to the offsets stream before they are acknowledged, and a new owner rebuilds
//! them by replaying the stream, so they survive failover with it. Every so often the
//! coordinator appends a snapshot of the whole table and trims the stream to it, so a
//! load replays the groups' current offsets and a short tail, not every commit ever made.

pub mod assignor;
pub mod consumer_group;
mod consumer_wire;
pub mod membership;
mod offset_delete;
pub mod offsets;

use crate::error::StreamdError;
use crate::node::Node;
use crate::state_stream::{self, Loaded, Registry, StateLog};
use bytes::{Bytes, BytesMut};
use consumer_group::ConsumerGroup;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError as Kafka;
use membership::{code, Answer, Group, JoinArgs, JoinOutcome, SyncOutcome};
use offsets::{Change, Committed, OffsetTable};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use weir_shared::ids::StreamEpoch;

const NOT_COORDINATOR: i16 = Kafka::NotCoordinator.code();
const OFFSET_METADATA_TOO_LARGE: i16 = Kafka::OffsetMetadataTooLarge.code();
/// Kafka's `offset.metadata.max.bytes`.
const MAX_METADATA: usize = 4096;
const NON_EMPTY_GROUP: i16 = Kafka::NonEmptyGroup.code();
const GROUP_ID_NOT_FOUND: i16 = Kafka::GroupIdNotFound.code();
/// How often sessions and rebalance deadlines are checked.
const TICK: Duration = Duration::from_millis(250);

/// The coordinators of the offsets streams this node owns.
pub struct Groups {
    node: Arc<Node>,
    coordinators: Registry<GroupCoordinator>,
}

/// The groups of one offsets stream at one stream epoch.
struct GroupCoordinator {
    stream: String,
    epoch: StreamEpoch,
    state: Mutex<State>,
    log: StateLog,
}

#[derive(Default)]
struct State {
    /// Classic groups (JoinGroup and SyncGroup).
    groups: BTreeMap<String, Group>,
    /// KIP-848 groups (ConsumerGroupHeartbeat). A group id names one kind at a time.
    consumer_groups: BTreeMap<String, ConsumerGroup>,
    offsets: OffsetTable,
}

/// Who sent a request (shown by DescribeGroups).
pub struct Client {
    pub id: String,
    pub host: String,
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A request's group instance id (KIP-345); an empty one names none.
fn instance(id: &Option<StrBytes>) -> Option<&str> {
    id.as_deref().filter(|i| !i.is_empty())
}

impl Loaded for GroupCoordinator {
    fn epoch(&self) -> StreamEpoch {
        self.epoch
    }
}

impl GroupCoordinator {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Groups {
    pub fn new(node: Arc<Node>) -> Arc<Self> {
        Arc::new(Self {
            node,
            coordinators: Registry::default(),
        })
    }

    /// Runs one group request against the coordinator of `stream`, answering with the
    /// encoded response body.
    pub async fn handle(
        self: &Arc<Self>,
        stream: &str,
        api_key: i16,
        version: i16,
        mut body: Bytes,
        client: Client,
    ) -> Result<Bytes, StreamdError> {
        let bad = |e: String| StreamdError::InvalidArgument(e);
        let key = ApiKey::try_from(api_key).map_err(|_| bad(format!("unknown Kafka API key {api_key}")))?;
        let request = RequestKind::decode(key, &mut body, version)
            .map_err(|e| bad(format!("malformed {key:?} v{version}: {e}")))?;
        let c = self.coordinator(stream).await?;
        let response = match request {
            RequestKind::JoinGroup(r) => ResponseKind::JoinGroup(self.join(&c, r, version, client).await),
            RequestKind::SyncGroup(r) => ResponseKind::SyncGroup(sync(&c, r).await),
            RequestKind::Heartbeat(r) => {
                let e = c.with(|st| match st.groups.get_mut(r.group_id.0.as_str()) {
                    Some(g) => g.heartbeat(
                        &r.member_id,
                        instance(&r.group_instance_id),
                        r.generation_id,
                        Instant::now(),
                    ),
                    None => code::UNKNOWN_MEMBER_ID,
                });
                ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(e))
            }
            RequestKind::LeaveGroup(r) => ResponseKind::LeaveGroup(leave(&c, r, version)),
            RequestKind::OffsetCommit(r) => ResponseKind::OffsetCommit(self.commit(&c, r, version).await),
            RequestKind::TxnOffsetCommit(r) => ResponseKind::TxnOffsetCommit(self.txn_commit(&c, r, version).await),
            RequestKind::OffsetFetch(r) => ResponseKind::OffsetFetch(fetch_offsets(&c, r, version)),
            RequestKind::DescribeGroups(r) => ResponseKind::DescribeGroups(describe(&c, r)),
            RequestKind::ListGroups(r) => ResponseKind::ListGroups(list(&c, r)),
            RequestKind::DeleteGroups(r) => ResponseKind::DeleteGroups(self.delete(&c, r).await),
            RequestKind::OffsetDelete(r) => ResponseKind::OffsetDelete(self.delete_offsets(&c, r).await),
            RequestKind::ConsumerGroupHeartbeat(r) => {
                ResponseKind::ConsumerGroupHeartbeat(consumer_wire::heartbeat(&self.node, &c, r, version, client))
            }
            RequestKind::ConsumerGroupDescribe(r) => {
                ResponseKind::ConsumerGroupDescribe(consumer_wire::describe(&self.node, &c, r))
            }
            _ => return Err(bad(format!("{key:?} is not a group request"))),
        };
        if matches!(
            key,
            ApiKey::OffsetCommit | ApiKey::TxnOffsetCommit | ApiKey::DeleteGroups | ApiKey::OffsetDelete
        ) {
            self.maybe_snapshot(&c);
        }
        let mut out = BytesMut::new();
        response
            .encode(&mut out, version)
            .map_err(|e| StreamdError::Internal(format!("cannot encode {key:?} v{version}: {e}")))?;
        Ok(out.freeze())
    }

    /// The coordinator for the offsets stream this node owns, rebuilt from the stream
    /// when the stream was (re)opened since.
    async fn coordinator(self: &Arc<Self>, stream: &str) -> Result<Arc<GroupCoordinator>, StreamdError> {
        let epoch = self.node.stream(stream)?.epoch;
        let load = || async {
            let loading = Instant::now();
            let offsets = self.replay(stream).await?;
            tracing::info!(
                stream,
                epoch = %epoch,
                groups = offsets.groups().count(),
                changes_replayed = offsets.changes_since_snapshot(),
                elapsed_ms = loading.elapsed().as_millis() as u64,
                "group coordinator loaded its offsets stream"
            );
            Ok(GroupCoordinator {
                stream: stream.to_string(),
                epoch,
                state: Mutex::new(State {
                    groups: BTreeMap::new(),
                    consumer_groups: BTreeMap::new(),
                    offsets,
                }),
                log: StateLog::default(),
            })
        };
        let (c, new) = self.coordinators.get_or_load(stream, epoch, load, |_| {}).await?;
        if new {
            let about = Some(c.stream.to_string());
            self.node.tasks.spawn(
                "group",
                "group coordinator tick",
                about,
                tick(Arc::downgrade(self), c.clone()),
            );
            // A stream written before snapshots existed (or long since one) gets one now.
            self.maybe_snapshot(&c);
        }
        Ok(c)
    }

    /// Starts a snapshot of `c`'s table when enough changes were stored since the last.
    fn maybe_snapshot(self: &Arc<Self>, c: &Arc<GroupCoordinator>) {
        let due = c.with(|st| state_stream::snapshot_due(st.offsets.changes_since_snapshot(), st.offsets.entries()));
        if due && c.log.begin_snapshot() {
            let (node, c) = (self.node.clone(), c.clone());
            let about = Some(c.stream.to_string());
            self.node.tasks.spawn("group", "offsets snapshot", about, async move {
                let stored = c
                    .log
                    .snapshot(
                        &node,
                        &c.stream,
                        || {
                            c.with(|st| {
                                let o = &st.offsets;
                                // Pending transactional offsets stay until their marker.
                                (o.snapshot(), o.changes_since_snapshot(), o.first_pending_offset())
                            })
                        },
                        offsets::encode,
                        || c.with(|st| st.offsets.snapshotted()),
                        "group offsets",
                    )
                    .await;
                if let Err(e) = stored {
                    tracing::warn!(stream = %c.stream, error = %e, "offsets snapshot failed; will retry after more commits");
                }
                c.log.end_snapshot();
            });
        }
    }

    async fn replay(&self, stream: &str) -> Result<OffsetTable, StreamdError> {
        let mut table = OffsetTable::default();
        state_stream::load(&self.node, stream, |batches| table.replay(batches)).await?;
        Ok(table)
    }

    /// Appends `changes` to the offsets stream, then applies them to the table.
    async fn store(&self, c: &GroupCoordinator, changes: Vec<Change>) -> Result<(), StreamdError> {
        let batch = offsets::encode(&changes);
        c.log
            .store(&self.node, &c.stream, batch, || {
                c.with(|st| changes.into_iter().for_each(|ch| st.offsets.apply(ch)))
            })
            .await
    }

    async fn join(&self, c: &GroupCoordinator, r: JoinGroupRequest, version: i16, client: Client) -> JoinGroupResponse {
        let args = JoinArgs {
            member_id: r.member_id.to_string(),
            group_instance_id: instance(&r.group_instance_id).map(str::to_string),
            client_id: client.id,
            client_host: client.host,
            session_timeout: Duration::from_millis(r.session_timeout_ms.max(0) as u64),
            // v0 has no rebalance timeout: it is the session timeout.
            rebalance_timeout: Duration::from_millis(if version == 0 {
                r.session_timeout_ms.max(0) as u64
            } else {
                r.rebalance_timeout_ms.max(0) as u64
            }),
            protocol_type: r.protocol_type.to_string(),
            protocols: r
                .protocols
                .iter()
                .map(|p| (p.name.to_string(), p.metadata.clone()))
                .collect(),
            require_known_member_id: version >= 4,
            max_size: self.node.tunables.max_group_members,
            initial_delay: self.node.tunables.group_initial_rebalance_delay,
        };
        let group = r.group_id.0.to_string();
        let answer = c.with(|st| {
            // A KIP-848 group with members is not a classic one (Kafka answers so too
            // when no online migration is allowed); an empty one gives way.
            if st.consumer_groups.get(&group).is_some_and(|g| !g.is_empty()) {
                return Answer::Now(JoinOutcome {
                    error: code::INCONSISTENT_GROUP_PROTOCOL,
                    generation: -1,
                    member_id: args.member_id.clone(),
                    ..Default::default()
                });
            }
            st.consumer_groups.remove(&group);
            st.groups
                .entry(group.clone())
                .or_insert_with(|| Group::new(&group))
                .join(args, Instant::now())
        });
        let o = match answer {
            Answer::Now(o) => o,
            Answer::Later(rx) => rx.await.unwrap_or_else(|_| JoinOutcome {
                error: NOT_COORDINATOR,
                generation: -1,
                member_id: r.member_id.to_string(),
                ..Default::default()
            }),
        };
        // The protocol name is nullable only from v7; older versions get "".
        let protocol = match (o.protocol.as_deref(), version) {
            (None, v) if v < 7 => Some(""),
            (p, _) => p,
        };
        JoinGroupResponse::default()
            .with_error_code(o.error)
            .with_generation_id(o.generation)
            .with_protocol_type(o.protocol_type.as_deref().map(s))
            .with_protocol_name(protocol.map(s))
            .with_leader(s(&o.leader))
            .with_member_id(s(&o.member_id))
            .with_members(
                o.members
                    .into_iter()
                    .map(|(id, instance, metadata)| {
                        JoinGroupResponseMember::default()
                            .with_member_id(s(&id))
                            .with_group_instance_id(instance.as_deref().map(s))
                            .with_metadata(metadata)
                    })
                    .collect(),
            )
    }

    async fn commit(&self, c: &GroupCoordinator, r: OffsetCommitRequest, version: i16) -> OffsetCommitResponse {
        let group = r.group_id.0.to_string();
        let check = c.with(|st| {
            if let Some(g) = st.consumer_groups.get(&group) {
                return g.check_member(&r.member_id, r.generation_id_or_member_epoch, Some(version));
            }
            match st.groups.get_mut(&group) {
                Some(g) => g.check_commit(
                    &r.member_id,
                    instance(&r.group_instance_id),
                    r.generation_id_or_member_epoch,
                    Instant::now(),
                ),
                None if r.generation_id_or_member_epoch < 0 => code::NONE,
                None => code::UNKNOWN_MEMBER_ID,
            }
        });
        let mut changes = vec![];
        for t in &r.topics {
            for p in &t.partitions {
                changes.push(Change::Commit {
                    group: group.clone(),
                    topic: t.name.0.to_string(),
                    partition: p.partition_index,
                    committed: Committed {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                    },
                });
            }
        }
        let too_large = changes.iter().any(|ch| match ch {
            Change::Commit { committed, .. } => committed.metadata.as_ref().is_some_and(|m| m.len() > MAX_METADATA),
            Change::DeleteGroup { .. } | Change::DeleteOffset { .. } => false,
        });
        let error = if too_large {
            OFFSET_METADATA_TOO_LARGE
        } else if check != code::NONE || changes.is_empty() {
            check
        } else {
            match self.store(c, changes).await {
                Ok(()) => code::NONE,
                Err(e) => {
                    tracing::warn!(group = %group, error = %e, "offset commit was not stored");
                    NOT_COORDINATOR
                }
            }
        };
        OffsetCommitResponse::default().with_topics(
            r.topics
                .iter()
                .map(|t| {
                    OffsetCommitResponseTopic::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    OffsetCommitResponsePartition::default()
                                        .with_partition_index(p.partition_index)
                                        .with_error_code(error)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
    }

    /// TxnOffsetCommit (issue 23): the offsets are appended as a transactional batch of
    /// the producer, which the stream admits only once the transaction's coordinator
    /// confirms this stream is in the transaction (AddOffsetsToTxn, KIP-890); they are
    /// held pending until the transaction's marker reaches this stream.
    async fn txn_commit(
        &self,
        c: &GroupCoordinator,
        r: TxnOffsetCommitRequest,
        version: i16,
    ) -> TxnOffsetCommitResponse {
        use kafka_protocol::messages::txn_offset_commit_response::{
            TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
        };
        let group = r.group_id.0.to_string();
        // From v3 a producer may name the consumer's member and generation, checked as
        // OffsetCommit's; without them nothing is checked, as in Kafka.
        let named = version >= 3 && (!r.member_id.is_empty() || r.generation_id >= 0);
        let check = if named {
            c.with(|st| {
                if let Some(g) = st.consumer_groups.get(&group) {
                    return g.check_member(&r.member_id, r.generation_id, None);
                }
                match st.groups.get_mut(&group) {
                    Some(g) => g.check_commit(
                        &r.member_id,
                        instance(&r.group_instance_id),
                        r.generation_id,
                        Instant::now(),
                    ),
                    None => code::UNKNOWN_MEMBER_ID,
                }
            })
        } else {
            code::NONE
        };
        let changes: Vec<Change> = r
            .topics
            .iter()
            .flat_map(|t| {
                let group = &group;
                t.partitions.iter().map(move |p| Change::Commit {
                    group: group.clone(),
                    topic: t.name.0.to_string(),
                    partition: p.partition_index,
                    committed: Committed {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                    },
                })
            })
            .collect();
        let too_large = changes.iter().any(|ch| match ch {
            Change::Commit { committed, .. } => committed.metadata.as_ref().is_some_and(|m| m.len() > MAX_METADATA),
            Change::DeleteGroup { .. } | Change::DeleteOffset { .. } => false,
        });
        let error = if too_large {
            OFFSET_METADATA_TOO_LARGE
        } else if check != code::NONE || changes.is_empty() {
            check
        } else {
            let producer = (r.producer_id.0, r.producer_epoch);
            let batch = offsets::encode_as(&changes, Some(producer));
            let stored = c
                .log
                .store_as(&self.node, &c.stream, batch, Some(&r.transactional_id), |base| {
                    c.with(|st| st.offsets.add_pending(producer.0, base, changes))
                })
                .await;
            match stored {
                Ok(()) => code::NONE,
                Err(StreamdError::InvalidTxnState(_)) => Kafka::InvalidTxnState.code(),
                Err(StreamdError::InvalidProducerEpoch(_)) => Kafka::InvalidProducerEpoch.code(),
                Err(e) => {
                    tracing::warn!(group = %group, error = %e, "transactional offset commit was not stored");
                    NOT_COORDINATOR
                }
            }
        };
        TxnOffsetCommitResponse::default().with_topics(
            r.topics
                .iter()
                .map(|t| {
                    TxnOffsetCommitResponseTopic::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    TxnOffsetCommitResponsePartition::default()
                                        .with_partition_index(p.partition_index)
                                        .with_error_code(error)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
    }

    /// A transaction marker was written at `offset` of `stream` (`Node::write_marker`):
    /// the coordinator of that stream commits or drops the producer's pending offsets.
    /// One being loaded is waited for; its load may have replayed the marker already,
    /// which [`OffsetTable::end_txn`] tells by the offset.
    pub async fn marker_written(self: &Arc<Self>, stream: &str, producer_id: i64, commit: bool, offset: u64) {
        match self.coordinator(stream).await {
            Ok(c) => {
                c.with(|st| st.offsets.end_txn(producer_id, commit, offset));
                // The oldest pending record may have moved on: the stream can be trimmed.
                self.maybe_snapshot(&c);
            }
            // Not served here any more: its next owner replays the marker.
            Err(e) => tracing::debug!(stream, error = %e, "offsets coordinator not loaded for a marker"),
        }
    }

    async fn delete(&self, c: &GroupCoordinator, r: DeleteGroupsRequest) -> DeleteGroupsResponse {
        let mut results = vec![];
        for name in r.groups_names {
            let group = name.0.to_string();
            let state = c.with(|st| {
                let members = st.groups.get(&group).is_some_and(|g| !g.is_empty())
                    || st.consumer_groups.get(&group).is_some_and(|g| !g.is_empty());
                let known = st.groups.contains_key(&group)
                    || st.consumer_groups.contains_key(&group)
                    || st.offsets.group(&group).is_some();
                (members, known)
            });
            let error = match state {
                (true, _) => NON_EMPTY_GROUP,
                (false, false) => GROUP_ID_NOT_FOUND,
                (false, true) => match self.store(c, vec![Change::DeleteGroup { group: group.clone() }]).await {
                    Ok(()) => {
                        c.with(|st| {
                            st.groups.remove(&group);
                            st.consumer_groups.remove(&group);
                        });
                        code::NONE
                    }
                    Err(_) => NOT_COORDINATOR,
                },
            };
            results.push(
                DeletableGroupResult::default()
                    .with_group_id(name)
                    .with_error_code(error),
            );
        }
        DeleteGroupsResponse::default().with_results(results)
    }
}

/// Expires sessions and ends rebalances until the stream moves away or its epoch
/// changes; then the coordinator is dropped and waiting members are answered
/// NOT_COORDINATOR (their answer channels close).
async fn tick(groups: Weak<Groups>, c: Arc<GroupCoordinator>) {
    loop {
        tokio::time::sleep(TICK).await;
        let Some(groups) = groups.upgrade() else { return };
        let owned = groups.node.stream(&c.stream).is_ok_and(|h| h.epoch == c.epoch);
        if !owned {
            groups.coordinators.remove(&c.stream, &c).await;
            c.with(|st| {
                st.groups.clear();
                st.consumer_groups.clear();
            });
            tracing::info!(stream = %c.stream, "group coordinator moved away with its offsets stream");
            return;
        }
        let now = Instant::now();
        let session = groups.node.tunables.consumer_session_timeout;
        c.with(|st| {
            st.groups.values_mut().for_each(|g| g.tick(now));
            st.consumer_groups.values_mut().for_each(|g| g.tick(session, now));
            // Membership is all a KIP-848 group keeps here; its offsets stay in the table.
            st.consumer_groups.retain(|_, g| !g.is_empty());
        });
    }
}

async fn sync(c: &GroupCoordinator, r: SyncGroupRequest) -> SyncGroupResponse {
    let assignments = r
        .assignments
        .iter()
        .map(|a| (a.member_id.to_string(), a.assignment.clone()))
        .collect();
    let answer = c.with(|st| match st.groups.get_mut(r.group_id.0.as_str()) {
        Some(g) => g.sync(
            &r.member_id,
            instance(&r.group_instance_id),
            r.generation_id,
            assignments,
            Instant::now(),
        ),
        None => Answer::Now(SyncOutcome {
            error: code::UNKNOWN_MEMBER_ID,
            ..Default::default()
        }),
    });
    let o = match answer {
        Answer::Now(o) => o,
        Answer::Later(rx) => rx.await.unwrap_or(SyncOutcome {
            error: NOT_COORDINATOR,
            ..Default::default()
        }),
    };
    SyncGroupResponse::default()
        .with_error_code(o.error)
        .with_protocol_type(o.protocol_type.as_deref().map(s))
        .with_protocol_name(o.protocol.as_deref().map(s))
        .with_assignment(o.assignment)
}

fn leave(c: &GroupCoordinator, r: LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
    let now = Instant::now();
    c.with(|st| {
        let group = st.groups.get_mut(r.group_id.0.as_str());
        if version < 3 {
            let e = group.map_or(code::UNKNOWN_MEMBER_ID, |g| g.leave(&r.member_id, None, now));
            return LeaveGroupResponse::default().with_error_code(e);
        }
        let Some(g) = group else {
            return LeaveGroupResponse::default().with_error_code(code::UNKNOWN_MEMBER_ID);
        };
        let members = r
            .members
            .iter()
            .map(|m| {
                MemberResponse::default()
                    .with_member_id(m.member_id.clone())
                    .with_group_instance_id(m.group_instance_id.clone())
                    .with_error_code(g.leave(&m.member_id, instance(&m.group_instance_id), now))
            })
            .collect();
        LeaveGroupResponse::default().with_members(members)
    })
}

/// One partition's committed offset as OffsetFetch answers it: (partition, offset,
/// leader epoch, metadata); −1 when nothing is committed.
type Found = (i32, i64, i32, String);

/// The committed offsets of `group` for `wanted` topics (every committed one if `None`).
fn committed(st: &State, group: &str, wanted: Option<Vec<(TopicName, Vec<i32>)>>) -> Vec<(TopicName, Vec<Found>)> {
    let committed = st.offsets.group(group);
    let wanted = wanted.unwrap_or_else(|| {
        let mut all: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (topic, p) in committed.into_iter().flat_map(|m| m.keys()) {
            all.entry(topic.clone()).or_default().push(*p);
        }
        all.into_iter().map(|(t, ps)| (TopicName(s(&t)), ps)).collect()
    });
    wanted
        .into_iter()
        .map(|(name, partitions)| {
            let found = partitions
                .into_iter()
                .map(|p| match committed.and_then(|m| m.get(&(name.0.to_string(), p))) {
                    Some(c) => (p, c.offset, c.leader_epoch, c.metadata.clone().unwrap_or_default()),
                    None => (p, -1, -1, String::new()),
                })
                .collect();
            (name, found)
        })
        .collect()
}

/// UNSTABLE_OFFSET_COMMIT for a partition an open transaction holds an offset for,
/// when the client asked for stable offsets (KIP-447: a read_committed consumer
/// retries until the transaction ends, rather than start from an offset about to
/// change); else none.
fn unstable(st: &State, require_stable: bool, group: &str, topic: &TopicName, partition: i32) -> i16 {
    if require_stable && st.offsets.is_pending(group, topic.0.as_str(), partition) {
        Kafka::UnstableOffsetCommit.code()
    } else {
        code::NONE
    }
}

/// OffsetFetch: one group before v8, a list of them from v8 (the gateway sends each to
/// its own coordinator). From v9 a KIP-848 member names itself and its epoch, which
/// must be current (STALE_MEMBER_EPOCH otherwise).
fn fetch_offsets(c: &GroupCoordinator, r: OffsetFetchRequest, version: i16) -> OffsetFetchResponse {
    c.with(|st| {
        if version < 8 {
            let wanted = r.topics.as_ref().map(|topics| {
                topics
                    .iter()
                    .map(|t| (t.name.clone(), t.partition_indexes.clone()))
                    .collect()
            });
            let topics = committed(st, r.group_id.0.as_str(), wanted)
                .into_iter()
                .map(|(name, found)| {
                    let group = r.group_id.0.as_str();
                    OffsetFetchResponseTopic::default()
                        .with_name(name.clone())
                        .with_partitions(
                            found
                                .into_iter()
                                .map(|(p, offset, epoch, metadata)| {
                                    OffsetFetchResponsePartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(offset)
                                        .with_committed_leader_epoch(epoch)
                                        .with_metadata(Some(s(&metadata)))
                                        .with_error_code(unstable(st, r.require_stable, group, &name, p))
                                })
                                .collect(),
                        )
                })
                .collect();
            return OffsetFetchResponse::default().with_topics(topics);
        }
        let groups = r
            .groups
            .iter()
            .map(|g| {
                let id = g.group_id.0.as_str();
                let member = g.member_id.as_deref().unwrap_or("");
                let error = match st.consumer_groups.get(id) {
                    Some(cg) if !member.is_empty() || g.member_epoch >= 0 => {
                        cg.check_member(member, g.member_epoch, None)
                    }
                    _ => code::NONE,
                };
                let answer = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
                if error != code::NONE {
                    return answer.with_error_code(error);
                }
                let wanted = g.topics.as_ref().map(|topics| {
                    topics
                        .iter()
                        .map(|t| (t.name.clone(), t.partition_indexes.clone()))
                        .collect()
                });
                answer.with_topics(
                    committed(st, id, wanted)
                        .into_iter()
                        .map(|(name, found)| {
                            OffsetFetchResponseTopics::default()
                                .with_name(name.clone())
                                .with_partitions(
                                    found
                                        .into_iter()
                                        .map(|(p, offset, epoch, metadata)| {
                                            OffsetFetchResponsePartitions::default()
                                                .with_partition_index(p)
                                                .with_committed_offset(offset)
                                                .with_committed_leader_epoch(epoch)
                                                .with_metadata(Some(s(&metadata)))
                                                .with_error_code(unstable(st, r.require_stable, id, &name, p))
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                )
            })
            .collect();
        OffsetFetchResponse::default().with_groups(groups)
    })
}

fn describe(c: &GroupCoordinator, r: DescribeGroupsRequest) -> DescribeGroupsResponse {
    c.with(|st| {
        let groups = r
            .groups
            .into_iter()
            .map(|id| match st.groups.get(id.0.as_str()) {
                // A KIP-848 group is described by ConsumerGroupDescribe; to DescribeGroups
                // before v6 it is no classic group: Dead, as Kafka answers.
                _ if st.consumer_groups.contains_key(id.0.as_str()) => {
                    DescribedGroup::default().with_group_id(id).with_group_state(s("Dead"))
                }
                Some(g) => DescribedGroup::default()
                    .with_group_id(id.clone())
                    .with_group_state(s(g.phase.name()))
                    .with_protocol_type(s(g.protocol_type.as_deref().unwrap_or("")))
                    .with_protocol_data(s(g.protocol.as_deref().unwrap_or("")))
                    .with_members(
                        g.members
                            .values()
                            .map(|m| {
                                DescribedGroupMember::default()
                                    .with_member_id(s(&m.id))
                                    .with_group_instance_id(m.group_instance_id.as_deref().map(s))
                                    .with_client_id(s(&m.client_id))
                                    .with_client_host(s(&m.client_host))
                                    .with_member_metadata(m.metadata(g.protocol.as_deref()))
                                    .with_member_assignment(m.assignment.clone())
                            })
                            .collect(),
                    ),
                None if st.offsets.group(id.0.as_str()).is_some() => DescribedGroup::default()
                    .with_group_id(id)
                    .with_group_state(s("Empty"))
                    .with_protocol_type(s("consumer")),
                None => DescribedGroup::default().with_group_id(id).with_group_state(s("Dead")),
            })
            .collect();
        DescribeGroupsResponse::default().with_groups(groups)
    })
}

fn list(c: &GroupCoordinator, r: ListGroupsRequest) -> ListGroupsResponse {
    c.with(|st| {
        let mut listed: BTreeMap<String, (String, &'static str, &'static str)> = BTreeMap::new();
        for g in st.offsets.groups() {
            listed.insert(g.clone(), ("consumer".into(), "Empty", "classic"));
        }
        for g in st.consumer_groups.values() {
            listed.insert(g.id.clone(), ("consumer".into(), g.state_name(), "consumer"));
        }
        for g in st.groups.values() {
            if g.is_empty() && st.offsets.group(&g.id).is_none() {
                continue;
            }
            listed.insert(
                g.id.clone(),
                (g.protocol_type.clone().unwrap_or_default(), g.phase.name(), "classic"),
            );
        }
        let groups = listed
            .into_iter()
            .filter(|(_, (_, state, _))| {
                r.states_filter.is_empty() || r.states_filter.iter().any(|f| f.eq_ignore_ascii_case(state))
            })
            .map(|(id, (protocol_type, state, kind))| {
                ListedGroup::default()
                    .with_group_id(GroupId(s(&id)))
                    .with_protocol_type(s(&protocol_type))
                    .with_group_state(s(state))
                    .with_group_type(s(kind))
            })
            .collect();
        ListGroupsResponse::default().with_groups(groups)
    })
}
