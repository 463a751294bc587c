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

mod admin;
pub mod assignor;
mod classic_wire;
pub mod consumer_group;
mod consumer_wire;
pub mod membership;
mod offset_commit;
mod offset_delete;
mod offset_fetch;
pub mod offsets;

use crate::coordinators::state_stream::{self, Loaded, Registry, StateLog};
use crate::error::StreamdError;
use crate::node::core_api::CoreApi;
use admin::{describe, list};
use bytes::{Bytes, BytesMut};
use classic_wire::{leave, sync};
use consumer_group::ConsumerGroup;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError as Kafka;
use membership::{code, Group};
use offset_fetch::fetch_offsets;
use offsets::{Change, OffsetTable};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use weir_shared::ids::StreamEpoch;

const NOT_COORDINATOR: i16 = Kafka::NotCoordinator.code();
const NON_EMPTY_GROUP: i16 = Kafka::NonEmptyGroup.code();
const GROUP_ID_NOT_FOUND: i16 = Kafka::GroupIdNotFound.code();
/// How often sessions and rebalance deadlines are checked.
const TICK: Duration = Duration::from_millis(250);

/// The coordinators of the offsets streams this node owns.
pub struct Groups {
    core: CoreApi,
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
    pub fn new(core: CoreApi) -> Arc<Self> {
        Arc::new(Self {
            core,
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
                ResponseKind::ConsumerGroupHeartbeat(consumer_wire::heartbeat(&self.core, &c, r, version, client))
            }
            RequestKind::ConsumerGroupDescribe(r) => {
                ResponseKind::ConsumerGroupDescribe(consumer_wire::describe(&self.core, &c, r))
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
        let epoch = self.core.epoch(stream)?;
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
            self.core.tasks().spawn(
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
            let (core, c) = (self.core.clone(), c.clone());
            let about = Some(c.stream.to_string());
            self.core.tasks().spawn("group", "offsets snapshot", about, async move {
                let stored = c
                    .log
                    .snapshot(
                        &core,
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
        state_stream::load(&self.core, stream, |batches| table.replay(batches)).await?;
        Ok(table)
    }

    /// Appends `changes` to the offsets stream, then applies them to the table.
    async fn store(&self, c: &GroupCoordinator, changes: Vec<Change>) -> Result<(), StreamdError> {
        let batch = offsets::encode(&changes);
        c.log
            .store(&self.core, &c.stream, batch, || {
                c.with(|st| changes.into_iter().for_each(|ch| st.offsets.apply(ch)))
            })
            .await
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
}

/// Expires sessions and ends rebalances until the stream moves away or its epoch
/// changes; then the coordinator is dropped and waiting members are answered
/// NOT_COORDINATOR (their answer channels close).
async fn tick(groups: Weak<Groups>, c: Arc<GroupCoordinator>) {
    loop {
        tokio::time::sleep(TICK).await;
        let Some(groups) = groups.upgrade() else { return };
        let owned = groups.core.epoch(&c.stream).is_ok_and(|e| e == c.epoch);
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
        let session = groups.core.tunables().consumer_session_timeout;
        c.with(|st| {
            st.groups.values_mut().for_each(|g| g.tick(now));
            st.consumer_groups.values_mut().for_each(|g| g.tick(session, now));
            // Membership is all a KIP-848 group keeps here; its offsets stay in the table.
            st.consumer_groups.retain(|_, g| !g.is_empty());
        });
    }
}

/// Markers written into an offsets stream settle a transaction's offsets there.
impl crate::node::coordination::MarkerListener for Groups {
    fn marker_written<'a>(
        self: Arc<Self>,
        stream: &'a str,
        producer_id: i64,
        commit: bool,
        offset: u64,
    ) -> futures::future::BoxFuture<'a, ()> {
        let offsets_stream = stream
            .split_once('/')
            .is_some_and(|(topic, _)| topic == weir_meta::model::names::OFFSETS_TOPIC);
        Box::pin(async move {
            if offsets_stream {
                Groups::marker_written(&self, stream, producer_id, commit, offset).await;
            }
        })
    }
}
