//! The metadata log's client API: propose, linearizable read, and watch.

use crate::leader::{forwarded, leader_channel, mark_forwarded, PeerChannels};
use crate::metrics::metrics;
use crate::raft_types::Raft;
use crate::store::{StateMachineStore, ViewHub, WatchItem};
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status};
use weir_meta::client::{range_to_proto, MAX_PAGE};
use weir_meta::model::codec;
use weir_meta::model::command::{Command, Outcome, Proposal, Proposer, RejectCode, Rejection};
use weir_meta::model::index::page;
use weir_meta::model::CordonBy;
use weir_meta::model::IndexRead;
use weir_proto::metad::metad_client::MetadClient;
use weir_proto::metad::metad_server::Metad;
use weir_proto::metad::{
    watch_event, LinearizableReadReply, LinearizableReadRequest, ObjectsCommittedReply, ObjectsCommittedRequest,
    ProposeReply, ProposeRequest, ReadRangesReply, ReadRangesRequest, ReleasedObject, ReleasedObjectsReply,
    ReleasedObjectsRequest, SnapshotBegin, SnapshotEnd, WatchEvent, WatchRequest,
};
use weir_shared::failpoint;
use weir_shared::ids::{ObjectKey, Offset, StreamId};

/// Most encoded row bytes in one watch snapshot chunk.
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// Serves the client API from one replica.
pub struct ClientService {
    raft: Raft,
    hub: Arc<ViewHub>,
    /// The state machine's store, for the object index.
    sm: StateMachineStore,
    peers: Arc<PeerChannels>,
    /// Bound on a proposal or read, after which the caller gets a retryable `unavailable`.
    timeout: Duration,
    tasks: TaskTracker,
    cancel: CancellationToken,
    /// One per open Watch stream (`--max-watch-streams`).
    watch_slots: Arc<tokio::sync::Semaphore>,
    /// Free space on this replica's `--data-dir` (issue 60).
    disk: weir_shared::disk_space::DiskWatch,
    /// The users gateways propose for (D-21).
    users: crate::authz::Directory,
}

/// How long a proposal or read may take (`--propose-timeout-ms`), and how many Watch
/// streams are served at once (`--max-watch-streams`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub timeout: Duration,
    pub max_watch_streams: usize,
}

impl ClientService {
    pub fn new(
        raft: Raft,
        sm: StateMachineStore,
        peers: Arc<PeerChannels>,
        limits: Limits,
        tasks: TaskTracker,
        cancel: CancellationToken,
        users: crate::authz::Directory,
    ) -> Self {
        Self {
            disk: weir_shared::disk_space::DiskWatch::new(Vec::new(), Default::default()),
            users,
            raft,
            hub: sm.hub(),
            sm,
            peers,
            timeout: limits.timeout,
            tasks,
            cancel,
            watch_slots: Arc::new(tokio::sync::Semaphore::new(limits.max_watch_streams)),
        }
    }

    /// Watches this replica's disk with `disk` (issue 60); without, nothing is refused.
    pub fn with_disk(mut self, disk: weir_shared::disk_space::DiskWatch) -> Self {
        self.disk = disk;
        self
    }

    /// The leader's client, unless this call was already forwarded or no leader is known.
    fn leader_client(&self, forwarded: bool) -> Result<MetadClient<weir_shared::grpc::Channel>, Status> {
        Ok(MetadClient::new(leader_channel(&self.raft, &self.peers, forwarded)?)
            .max_decoding_message_size(weir_shared::grpc::MAX_MESSAGE)
            .max_encoding_message_size(weir_shared::grpc::MAX_MESSAGE))
    }

    /// Makes this replica's store reflect what a read must see: with `linearizable`,
    /// every entry committed before the call (confirmed by the leader with a quorum; a
    /// follower answers `None` and the caller forwards); otherwise `min_applied`.
    async fn read_barrier(&self, linearizable: bool, min_applied: u64) -> Result<Option<()>, Status> {
        let wait = |index: u64| async move {
            tokio::time::timeout(self.timeout, self.hub.wait_durable(index))
                .await
                .map_err(|_| Status::unavailable(format!("this replica has not applied index {index} yet; retry")))
        };
        if !linearizable {
            wait(min_applied).await?;
            return Ok(Some(()));
        }
        match tokio::time::timeout(self.timeout, self.raft.ensure_linearizable()).await {
            Err(_) => Err(Status::unavailable(format!(
                "leadership not confirmed within {:?}: no metadata quorum; retry",
                self.timeout
            ))),
            Ok(Ok(read)) => {
                wait(read.map_or(0, |l| l.index)).await?;
                Ok(Some(()))
            }
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_)))) => Ok(None),
            Ok(Err(e)) => Err(Status::unavailable(format!("metadata log unavailable: {e}"))),
        }
    }

    /// Tests (failpoint `late_<kind>`): the proposal is written once `later` ends,
    /// after its caller was answered as if the answer were lost, as one delayed in a
    /// paused replica or on a slow link lands.
    fn land_late(&self, proposal: Proposal, later: impl std::future::Future<Output = ()> + Send + 'static) -> Status {
        let raft = self.raft.clone();
        let kind = proposal.command.kind();
        self.tasks.spawn(async move {
            later.await;
            match raft.client_write(proposal).await {
                Ok(resp) => match resp.data {
                    Ok(_) => tracing::warn!(kind, "failpoint: the late proposal was applied"),
                    Err(r) => tracing::warn!(kind, rejection = %r, "failpoint: the late proposal was refused"),
                },
                Err(e) => tracing::warn!(kind, error = %e, "failpoint: the late proposal was not written"),
            }
        });
        Status::unavailable(format!("failpoint late_{kind}: the answer was lost"))
    }
}

/// A stopping node's release of its drain cordon (SD-REL-10's failpoints apply to it).
fn is_drain_release(p: &Proposal) -> bool {
    matches!(
        p.command,
        Command::Uncordon {
            by: CordonBy::Drain,
            ..
        }
    )
}

/// Failpoint `release`: `sleep`/`hang` delay the release, `return(err)` refuses it.
async fn release_failpoint() -> Option<Response<ProposeReply>> {
    match failpoint::pause("release").await {
        Some(failpoint::Action::Error) => {
            let refused: Outcome = Err(Rejection::new(RejectCode::Conflict, "failpoint release: refused"));
            Some(Response::new(ProposeReply {
                log_index: 0,
                outcome: codec::encode(&refused),
            }))
        }
        _ => None,
    }
}

#[tonic::async_trait]
impl Metad for ClientService {
    #[tracing::instrument(name = "metad.propose", level = "info", skip_all, fields(log_index))]
    async fn propose(&self, req: Request<ProposeRequest>) -> Result<Response<ProposeReply>, Status> {
        let was_forwarded = forwarded(&req);
        let caller = weir_shared::peer::caller(&req)?;
        let mut inner = req.into_inner();
        let mut proposal: Proposal =
            codec::decode(&inner.command).map_err(|e| Status::invalid_argument(format!("malformed command: {e}")))?;
        // D-21: checked where the call arrives, before it is forwarded to the leader
        // (which sees this replica's certificate).
        let checked = self
            .users
            .with(|users| crate::authz::proposal(caller.as_ref(), &proposal, users));
        if let Err(refused) = checked {
            metrics().proposals.with_label_values(&["denied"]).inc();
            tracing::warn!(
                kind = proposal.command.kind(),
                reason = refused.message(),
                "proposal refused"
            );
            return Err(refused);
        }
        // An operator is logged as who authenticated it (its certificate or token),
        // never as who the request says.
        if let (Some(who), Proposer::Operator { principal }) = (&caller, &mut proposal.proposer) {
            if who.role == weir_shared::peer::Role::Operator && *principal != who.id {
                *principal = who.id.clone();
                inner.command = codec::encode(&proposal);
            }
        }
        // Issue 60: under its disk's refuse mark a replica takes no new topics, streams
        // or tokens, and keeps taking everything that keeps the cluster running.
        // Checked by the leader, which appends first: a follower forwards to it.
        let leading = {
            let m = self.raft.metrics().borrow().clone();
            m.current_leader == Some(m.id)
        };
        if leading && proposal.command.adds_state() {
            if let Some(why) = self.disk.refusal() {
                metrics().proposals.with_label_values(&["storage_full"]).inc();
                return Err(weir_shared::error_code::ErrorCode::StorageFull.status(format!(
                    "the metadata leader refuses {}: {why}",
                    proposal.command.kind()
                )));
            }
        }
        let release = is_drain_release(&proposal);
        if release {
            if let Some(refused) = release_failpoint().await {
                return Ok(refused);
            }
        }
        let kind = proposal.command.kind();
        if let Some(later) = failpoint::late_once(&format!("late_{kind}")) {
            return Err(self.land_late(proposal, later));
        }
        let result = tokio::time::timeout(self.timeout, self.raft.client_write(proposal)).await;
        match result {
            Err(_) => {
                metrics().proposals.with_label_values(&["unavailable"]).inc();
                Err(Status::unavailable(format!(
                    "proposal not committed within {:?}: no metadata quorum; retry",
                    self.timeout
                )))
            }
            Ok(Ok(_)) if release && failpoint::action("release_reply") == Some(failpoint::Action::Drop) => {
                Err(Status::unavailable("failpoint release_reply: the reply was dropped"))
            }
            // An applied proposal whose answer is lost: its proposer cannot know it landed.
            Ok(Ok(resp)) if resp.data.is_ok() && failpoint::drop_once(&format!("reply_{kind}")) => Err(
                Status::unavailable(format!("failpoint reply_{kind}: the reply was dropped")),
            ),
            Ok(Ok(resp)) => {
                let result = if resp.data.is_ok() { "applied" } else { "rejected" };
                tracing::Span::current().record("log_index", resp.log_id.index);
                metrics().proposals.with_label_values(&[result]).inc();
                Ok(Response::new(ProposeReply {
                    log_index: resp.log_id.index,
                    outcome: codec::encode(&resp.data),
                }))
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) => {
                metrics().proposals.with_label_values(&["forwarded"]).inc();
                let mut client = self.leader_client(was_forwarded)?;
                client.propose(mark_forwarded(inner, Some(self.timeout))).await
            }
            Ok(Err(e)) => {
                metrics().proposals.with_label_values(&["unavailable"]).inc();
                Err(Status::unavailable(format!("metadata log unavailable: {e}")))
            }
        }
    }

    async fn linearizable_read(
        &self,
        req: Request<LinearizableReadRequest>,
    ) -> Result<Response<LinearizableReadReply>, Status> {
        let was_forwarded = forwarded(&req);
        let result = tokio::time::timeout(self.timeout, self.raft.ensure_linearizable()).await;
        match result {
            Err(_) => Err(Status::unavailable(format!(
                "leadership not confirmed within {:?}: no metadata quorum; retry",
                self.timeout
            ))),
            Ok(Ok(log_id)) => Ok(Response::new(LinearizableReadReply {
                committed_index: log_id.map_or(0, |l| l.index),
            })),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_)))) => {
                let mut client = self.leader_client(was_forwarded)?;
                client
                    .linearizable_read(mark_forwarded(LinearizableReadRequest {}, Some(self.timeout)))
                    .await
            }
            Ok(Err(e)) => Err(Status::unavailable(format!("metadata log unavailable: {e}"))),
        }
    }

    async fn read_ranges(&self, req: Request<ReadRangesRequest>) -> Result<Response<ReadRangesReply>, Status> {
        let was_forwarded = forwarded(&req);
        let inner = req.into_inner();
        if self
            .read_barrier(inner.linearizable, inner.min_applied_index)
            .await?
            .is_none()
        {
            return self
                .leader_client(was_forwarded)?
                .read_ranges(mark_forwarded(inner, Some(self.timeout)))
                .await;
        }
        let limit = match inner.limit {
            0 => MAX_PAGE,
            n => n.min(MAX_PAGE),
        } as usize;
        let applied_index = self.hub.durable_index();
        let index = crate::store::index::StoreIndex::new(self.sm.db());
        let (ranges, more) = page(
            &index,
            StreamId(inner.stream),
            Offset(inner.offset),
            inner.reverse,
            limit,
        );
        Ok(Response::new(ReadRangesReply {
            ranges: ranges.iter().map(range_to_proto).collect(),
            applied_index,
            more,
        }))
    }

    async fn objects_committed(
        &self,
        req: Request<ObjectsCommittedRequest>,
    ) -> Result<Response<ObjectsCommittedReply>, Status> {
        let was_forwarded = forwarded(&req);
        let inner = req.into_inner();
        if inner.keys.len() > MAX_PAGE as usize {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_PAGE} object keys per call, got {}",
                inner.keys.len()
            )));
        }
        if self.read_barrier(inner.linearizable, 0).await?.is_none() {
            return self
                .leader_client(was_forwarded)?
                .objects_committed(mark_forwarded(inner, Some(self.timeout)))
                .await;
        }
        let applied_index = self.hub.durable_index();
        let index = crate::store::index::StoreIndex::new(self.sm.db());
        let committed = inner
            .keys
            .into_iter()
            .filter(|k| index.object(&ObjectKey(k.clone())).is_some())
            .collect();
        Ok(Response::new(ObjectsCommittedReply {
            committed,
            applied_index,
        }))
    }

    async fn released_objects(
        &self,
        req: Request<ReleasedObjectsRequest>,
    ) -> Result<Response<ReleasedObjectsReply>, Status> {
        let was_forwarded = forwarded(&req);
        let inner = req.into_inner();
        // Linearizable: a replica behind the leader could miss releases GC must see.
        if self.read_barrier(true, 0).await?.is_none() {
            return self
                .leader_client(was_forwarded)?
                .released_objects(mark_forwarded(inner, Some(self.timeout)))
                .await;
        }
        let limit = match inner.limit {
            0 => MAX_PAGE as usize,
            n => (n as usize).min(MAX_PAGE as usize),
        };
        let applied_index = self.hub.durable_index();
        let (objects, more) = crate::store::index::released(self.sm.db(), inner.after_index, limit);
        Ok(Response::new(ReleasedObjectsReply {
            objects: objects
                .into_iter()
                .map(|(index, key)| ReleasedObject {
                    index,
                    object_key: key.0,
                })
                .collect(),
            applied_index,
            more,
        }))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

    async fn watch(&self, req: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let after = req.into_inner().after_index;
        // Each watcher holds a task and up to 16 frames (issue 19).
        let slot = self.watch_slots.clone().try_acquire_owned().map_err(|_| {
            metrics().watchers_refused.inc();
            Status::resource_exhausted("this metad serves as many Watch streams as it admits (--max-watch-streams)")
        })?;
        // Bounded: a slow watcher holds at most this many frames (a snapshot chunk is ≤ 1 MiB).
        let (tx, rx) = mpsc::channel(16);
        let sm = self.sm.clone();
        let cancel = self.cancel.clone();
        self.tasks.spawn(async move {
            let watchers = &metrics().watchers;
            watchers.inc();
            tokio::select! {
                _ = feed_watcher(sm, after, &tx) => {}
                // A watcher that went away gives its slot back at once.
                _ = tx.closed() => {}
                _ = cancel.cancelled() => {
                    let _ = tx.send(Err(Status::unavailable("metad is shutting down"))).await;
                }
            }
            watchers.dec();
            drop(slot);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Sends a watcher a snapshot or backlog, then every delta in order, starting over
/// from a snapshot when it lags too far or the state is replaced.
async fn feed_watcher(sm: StateMachineStore, after: Option<u64>, tx: &mpsc::Sender<Result<WatchEvent, Status>>) {
    let hub = sm.hub();
    let mut last = after;
    loop {
        let start = hub.subscribe(last);
        let mut rx = start.rx;
        if start.snapshot {
            let Some(index) = send_snapshot(&sm, tx).await else {
                return;
            };
            last = Some(index);
            // The deltas after the snapshot that were applied before this watcher
            // subscribed are among the backlog; without every one of them, again.
            if start.backlog.first().is_some_and(|d| d.index > index + 1) {
                continue;
            }
        }
        for delta in start.backlog {
            if !send_delta(tx, &delta, &mut last).await {
                return;
            }
        }
        loop {
            match rx.recv().await {
                Ok(WatchItem::Delta(delta)) => {
                    if !send_delta(tx, &delta, &mut last).await {
                        return;
                    }
                }
                Ok(WatchItem::Reset) => {
                    last = None;
                    break;
                }
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

/// Failpoint `watch_snapshot_rows` (`return(err)`) marks a watch-snapshot chunk with a
/// format this build does not write, as a newer replica's frame would be.
fn rows_frame(mut frame: Vec<u8>) -> Vec<u8> {
    if failpoint::action("watch_snapshot_rows") == Some(failpoint::Action::Error) {
        frame[1] = codec::FORMAT_VERSION + 1;
    }
    frame
}

/// Sends a snapshot of the stored view in chunks of at most [`SNAPSHOT_CHUNK_BYTES`] of
/// rows, read on a blocking thread as the watcher takes them; the applied index it is
/// at, or `None` when the watcher went away or the store could not be read.
async fn send_snapshot(sm: &StateMachineStore, tx: &mpsc::Sender<Result<WatchEvent, Status>>) -> Option<u64> {
    let (sm, frames) = (sm.clone(), tx.clone());
    let read = tokio::task::spawn_blocking(move || {
        let index = std::cell::Cell::new(0);
        let event = |index: u64, kind| {
            Ok(WatchEvent {
                index,
                kind: Some(kind),
            })
        };
        let begin = |at: u64| {
            index.set(at);
            frames
                .blocking_send(event(at, watch_event::Kind::SnapshotBegin(SnapshotBegin {})))
                .is_ok()
        };
        let frame = |rows: Vec<u8>| {
            frames
                .blocking_send(event(index.get(), watch_event::Kind::SnapshotRows(rows_frame(rows))))
                .is_ok()
        };
        sm.watch_snapshot(SNAPSHOT_CHUNK_BYTES, begin, frame)
    })
    .await;
    let (index, rows) = match read {
        Ok(Ok(Some(sent))) => sent,
        Ok(Ok(None)) => return None,
        Ok(Err(e)) => {
            tracing::error!(error = %format!("{e:#}"), "cannot read a watch snapshot from the store");
            let _ = tx
                .send(Err(Status::internal(format!("cannot read a watch snapshot: {e:#}"))))
                .await;
            return None;
        }
        Err(e) => {
            tracing::error!(error = %e, "watch snapshot task failed");
            return None;
        }
    };
    let end = WatchEvent {
        index,
        kind: Some(watch_event::Kind::SnapshotEnd(SnapshotEnd { rows })),
    };
    tx.send(Ok(end)).await.ok().map(|_| index)
}

async fn send_delta(
    tx: &mpsc::Sender<Result<WatchEvent, Status>>,
    delta: &weir_meta::model::Delta,
    last: &mut Option<u64>,
) -> bool {
    if last.is_some_and(|l| delta.index <= l) {
        return true;
    }
    let event = WatchEvent {
        index: delta.index,
        kind: Some(watch_event::Kind::Delta(codec::encode(delta))),
    };
    *last = Some(delta.index);
    tx.send(Ok(event)).await.is_ok()
}
