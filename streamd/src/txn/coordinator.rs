//! The transaction coordinator (KIP-98, design 0005), run by the owner of a
//! transaction-state stream for the transactional ids hashed to it, as a group's
//! coordinator is the owner of its offsets stream.
//!
//! Each request is decided by the pure rules of [`super::state`] from the id's current
//! entry, one decision at a time per state stream; the next entry is appended to the
//! stream and applied only once durable, so what a client was told is what a new owner
//! replays. A decided transaction (`PrepareCommit`/`PrepareAbort`) then has its
//! markers written into every partition by [`PeerCalls`], and is completed. A new
//! owner resumes every decided transaction it replays, and a tick aborts those left
//! open past their timeout.

use super::log::{self, Change, TxnTable};
use super::marker::Marker;
use super::peer_calls::{PeerCalls, Sent};
use super::state::{self, code, EndStep, InitRequest, InitStep, TxnEntry};
use crate::error::StreamdError;
use crate::node::Node;
use crate::state_stream::{self, Loaded, Registry, StateLog};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use weir_meta::model::names::{offsets_stream, txn_state_stream, TXN_STATE_TOPIC};
use weir_meta::model::now_ms;
use weir_shared::ids::StreamEpoch;

const NOT_COORDINATOR: i16 = kafka_protocol::ResponseError::NotCoordinator.code();
const COORDINATOR_NOT_AVAILABLE: i16 = kafka_protocol::ResponseError::CoordinatorNotAvailable.code();
/// How often timeouts are checked and a lost state stream noticed.
const TICK: Duration = Duration::from_millis(500);
/// Longest a request waits for the producer's decided transaction to complete (its
/// markers written) before it is answered CONCURRENT_TRANSACTIONS. A producer's next
/// transaction begins right after EndTxn is answered, while the markers are still
/// being written; waiting here spares the client a retry after its backoff (100 ms in
/// librdkafka), which otherwise bounds a producer to a few transactions a second.
const COMPLETION_WAIT: Duration = Duration::from_secs(2);

/// Coordinator settings (streamd flags).
#[derive(Debug, Clone, Copy)]
pub struct TxnLimits {
    /// Kafka's `transaction.max.timeout.ms`.
    pub max_timeout_ms: u32,
    /// Kafka's `transactional.id.expiration.ms`.
    pub id_expiration_ms: u64,
}

/// The coordinators of the transaction-state streams this node owns.
pub struct Txns {
    node: Arc<Node>,
    limits: TxnLimits,
    coordinators: Registry<TxnCoordinator>,
    peers: PeerCalls,
}

/// The transactional ids of one state stream at one stream epoch.
struct TxnCoordinator {
    stream: String,
    epoch: StreamEpoch,
    table: Mutex<TxnTable>,
    log: StateLog,
    /// Held from reading an entry to storing its successor: decisions are serial.
    decide: tokio::sync::Mutex<()>,
    /// Ids whose markers are being written, so none gets two writers.
    completing: Mutex<HashSet<String>>,
    /// Told each time a transaction's completion is stored.
    completed: tokio::sync::Notify,
    /// Cancelled once the stream is no longer served here at `epoch`: its next owner
    /// resumes what this one left.
    stop: CancellationToken,
}

impl Loaded for TxnCoordinator {
    fn epoch(&self) -> StreamEpoch {
        self.epoch
    }
}

impl TxnCoordinator {
    fn entry(&self, id: &str) -> Option<TxnEntry> {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    /// Waits, up to [`COMPLETION_WAIT`], until `id` has no decided transaction whose
    /// markers are still being written.
    async fn settled(&self, id: &str) {
        let deadline = tokio::time::Instant::now() + COMPLETION_WAIT;
        loop {
            let notified = self.completed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a completion between the two is seen.
            notified.as_mut().enable();
            if !self.entry(id).is_some_and(|e| e.state.is_prepared()) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }
}

/// The error code a failed store or load answers with: the client finds the
/// coordinator again (moved) or retries (unavailable).
fn store_error(e: &StreamdError) -> i16 {
    match e {
        StreamdError::NotOwner { .. } | StreamdError::NotFound(_) | StreamdError::Fenced | StreamdError::Draining => {
            NOT_COORDINATOR
        }
        _ => COORDINATOR_NOT_AVAILABLE,
    }
}

impl Txns {
    pub fn new(node: Arc<Node>, limits: TxnLimits) -> Arc<Self> {
        Arc::new(Self {
            node,
            limits,
            coordinators: Registry::default(),
            peers: PeerCalls::default(),
        })
    }

    /// Loads the coordinator of every transaction-state stream this node serves, as
    /// soon as it serves it: a moved coordinator resumes the markers of decided
    /// transactions, and aborts timed-out ones, without waiting for a client.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let prefix = format!("{TXN_STATE_TOPIC}/");
        loop {
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = cancel.cancelled() => return,
            }
            // The topic's partitions, not every served stream (D-23).
            let partitions: Vec<_> = self
                .node
                .view
                .with(|s| s.topics.get(TXN_STATE_TOPIC).map(|t| t.partitions.clone()))
                .unwrap_or_default();
            for handle in partitions.into_iter().filter_map(|id| self.node.handle(id)) {
                if !handle.name.starts_with(&prefix) || !handle.is_serving() {
                    continue;
                }
                if self.coordinators.get(&handle.name, handle.epoch).await.is_none() {
                    if let Err(e) = self.coordinator(&handle.name).await {
                        tracing::warn!(stream = %handle.name, error = %e, "transaction coordinator not loaded yet; will retry");
                    }
                }
            }
        }
    }

    /// Runs one transaction request (InitProducerId with a transactional id,
    /// AddPartitionsToTxn, AddOffsetsToTxn, EndTxn) against the coordinator of
    /// `stream`, answering with the encoded response body. `fresh_producer_id` is a
    /// producer id the gateway allocated, used by an InitProducerId that needs one.
    pub async fn handle(
        self: &Arc<Self>,
        stream: &str,
        api_key: i16,
        version: i16,
        mut body: Bytes,
        fresh_producer_id: Option<i64>,
    ) -> Result<Bytes, StreamdError> {
        let bad = |e: String| StreamdError::InvalidArgument(e);
        let key = ApiKey::try_from(api_key).map_err(|_| bad(format!("unknown Kafka API key {api_key}")))?;
        let mut out = BytesMut::new();
        let encoded = match key {
            ApiKey::InitProducerId => {
                let r = InitProducerIdRequest::decode(&mut body, version).map_err(|e| bad(e.to_string()))?;
                self.init(stream, r, fresh_producer_id).await.encode(&mut out, version)
            }
            ApiKey::AddPartitionsToTxn => {
                let r = AddPartitionsToTxnRequest::decode(&mut body, version).map_err(|e| bad(e.to_string()))?;
                self.add_partitions(stream, r, version).await.encode(&mut out, version)
            }
            ApiKey::AddOffsetsToTxn => {
                let r = AddOffsetsToTxnRequest::decode(&mut body, version).map_err(|e| bad(e.to_string()))?;
                let added = self
                    .add(
                        stream,
                        &r.transactional_id,
                        r.producer_id.0,
                        r.producer_epoch,
                        &[offsets_stream(&r.group_id)],
                    )
                    .await;
                AddOffsetsToTxnResponse::default()
                    .with_error_code(added.err().unwrap_or(code::NONE))
                    .encode(&mut out, version)
            }
            ApiKey::EndTxn => {
                let r = EndTxnRequest::decode(&mut body, version).map_err(|e| bad(e.to_string()))?;
                let ended = self
                    .end(
                        stream,
                        &r.transactional_id,
                        r.producer_id.0,
                        r.producer_epoch,
                        r.committed,
                    )
                    .await;
                EndTxnResponse::default()
                    .with_error_code(ended.err().unwrap_or(code::NONE))
                    .with_producer_id(r.producer_id)
                    .with_producer_epoch(r.producer_epoch)
                    .encode(&mut out, version)
            }
            ApiKey::ListTransactions => {
                let r = ListTransactionsRequest::decode(&mut body, version).map_err(|e| bad(e.to_string()))?;
                self.list(stream, r).await?.encode(&mut out, version)
            }
            ApiKey::DescribeTransactions => {
                let r = DescribeTransactionsRequest::decode(&mut body, version).map_err(|e| bad(e.to_string()))?;
                self.describe(stream, r).await?.encode(&mut out, version)
            }
            _ => return Err(bad(format!("{key:?} is not a transaction request"))),
        };
        encoded.map_err(|e| StreamdError::Internal(format!("cannot encode {key:?} v{version}: {e}")))?;
        Ok(out.freeze())
    }

    async fn init(
        self: &Arc<Self>,
        stream: &str,
        r: InitProducerIdRequest,
        fresh: Option<i64>,
    ) -> InitProducerIdResponse {
        let answer = |error: i16, pid: i64, epoch: i16| {
            InitProducerIdResponse::default()
                .with_error_code(error)
                .with_producer_id(pid.into())
                .with_producer_epoch(epoch)
        };
        let Some(id) = r.transactional_id.as_deref().filter(|id| !id.is_empty()) else {
            return answer(code::INVALID_REQUEST, -1, -1);
        };
        let req = InitRequest {
            timeout_ms: u32::try_from(r.transaction_timeout_ms).unwrap_or(0),
            expected: (r.producer_id.0 >= 0).then_some((r.producer_id.0, r.producer_epoch)),
        };
        let c = match self.coordinator(stream).await {
            Ok(c) => c,
            Err(e) => return answer(store_error(&e), -1, -1),
        };
        c.settled(id).await;
        let _decide = c.decide.lock().await;
        let now = now_ms();
        let current = c.entry(id);
        let step = match state::init(current.as_ref(), req, self.limits.max_timeout_ms, now) {
            Ok(step) => step,
            Err(code) => return answer(code, -1, -1),
        };
        let (next, fenced) = match step {
            InitStep::AllocateProducerId => match fresh.filter(|p| *p >= 0) {
                Some(pid) => (state::init_with_new_id(current.as_ref(), pid, req, now), false),
                None => return answer(code::INVALID_REQUEST, -1, -1),
            },
            InitStep::Write(e) => (e, false),
            InitStep::FenceAndAbort(e) => (e, true),
        };
        if let Err(e) = self.store(&c, id, &next).await {
            return answer(store_error(&e), -1, -1);
        }
        if fenced {
            // The ongoing transaction is aborted first; the client retries for its bump.
            self.complete_later(&c, id);
            return answer(code::CONCURRENT_TRANSACTIONS, -1, -1);
        }
        answer(code::NONE, next.producer_id, next.epoch)
    }

    async fn add_partitions(
        self: &Arc<Self>,
        stream: &str,
        r: AddPartitionsToTxnRequest,
        version: i16,
    ) -> AddPartitionsToTxnResponse {
        let by_topic = |topics: &[add_partitions_to_txn_request::AddPartitionsToTxnTopic], error: i16| {
            topics
                .iter()
                .map(|t| {
                    AddPartitionsToTxnTopicResult::default()
                        .with_name(t.name.clone())
                        .with_results_by_partition(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    AddPartitionsToTxnPartitionResult::default()
                                        .with_partition_index(*p)
                                        .with_partition_error_code(error)
                                })
                                .collect(),
                        )
                })
                .collect::<Vec<_>>()
        };
        let streams = |topics: &[add_partitions_to_txn_request::AddPartitionsToTxnTopic]| {
            topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |p| format!("{}/{p}", t.name.0)))
                .collect::<Vec<_>>()
        };
        if version <= 3 {
            let topics = &r.v3_and_below_topics;
            let added = self
                .add(
                    stream,
                    &r.v3_and_below_transactional_id,
                    r.v3_and_below_producer_id.0,
                    r.v3_and_below_producer_epoch,
                    &streams(topics),
                )
                .await;
            return AddPartitionsToTxnResponse::default()
                .with_results_by_topic_v3_and_below(by_topic(topics, added.err().unwrap_or(code::NONE)));
        }
        let mut results = Vec::with_capacity(r.transactions.len());
        for t in &r.transactions {
            // KIP-890: verify-only asks whether the partitions are already in the
            // transaction, and adds nothing.
            let outcome = if t.verify_only {
                self.verify(
                    stream,
                    &t.transactional_id,
                    t.producer_id.0,
                    t.producer_epoch,
                    &streams(&t.topics),
                )
                .await
            } else {
                self.add(
                    stream,
                    &t.transactional_id,
                    t.producer_id.0,
                    t.producer_epoch,
                    &streams(&t.topics),
                )
                .await
            };
            results.push(
                AddPartitionsToTxnResult::default()
                    .with_transactional_id(t.transactional_id.clone())
                    .with_topic_results(by_topic(&t.topics, outcome.err().unwrap_or(code::NONE))),
            );
        }
        AddPartitionsToTxnResponse::default().with_results_by_transaction(results)
    }

    /// Adds `partitions` (streams) to the producer's ongoing transaction, beginning one
    /// when none is.
    async fn add(
        self: &Arc<Self>,
        stream: &str,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[String],
    ) -> Result<(), i16> {
        let c = self.coordinator(stream).await.map_err(|e| store_error(&e))?;
        c.settled(id).await;
        let _decide = c.decide.lock().await;
        let current = c.entry(id);
        if let Some(next) = state::add_partitions(current.as_ref(), pid, epoch, partitions, now_ms())? {
            self.store(&c, id, &next).await.map_err(|e| store_error(&e))?;
        }
        Ok(())
    }

    /// Whether `partitions` are all in the producer's ongoing transaction (KIP-890):
    /// `INVALID_TXN_STATE` when one is not.
    pub async fn verify(
        self: &Arc<Self>,
        stream: &str,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[String],
    ) -> Result<(), i16> {
        let c = self.coordinator(stream).await.map_err(|e| store_error(&e))?;
        let e = c.entry(id).ok_or(code::INVALID_PRODUCER_ID_MAPPING)?;
        if e.producer_id != pid {
            return Err(code::INVALID_PRODUCER_ID_MAPPING);
        }
        if e.epoch != epoch {
            return Err(code::PRODUCER_FENCED);
        }
        let ongoing = e.state == state::TxnState::Ongoing && partitions.iter().all(|p| e.partitions.contains(p));
        if ongoing {
            Ok(())
        } else {
            Err(code::INVALID_TXN_STATE)
        }
    }

    /// KIP-890, at a partition's owner: whether `partition` is in the ongoing
    /// transaction of `id`'s producer at `epoch`, asked of the id's coordinator (this
    /// node's, or another's over `VerifyTxnPartition`).
    ///
    /// Boxed: admission awaits it, and the coordinator's own appends go through
    /// admission, so its future type would otherwise contain itself.
    pub fn verify_partition<'a>(
        self: &'a Arc<Self>,
        id: &'a str,
        partition: &'a str,
        pid: i64,
        epoch: i16,
    ) -> futures::future::BoxFuture<'a, Result<(), StreamdError>> {
        Box::pin(async move {
            let state = txn_state_stream(id);
            let served = self.node.stream(&state).is_ok_and(|h| h.is_serving());
            let answer = if served {
                self.verify(&state, id, pid, epoch, &[partition.to_string()])
                    .await
                    .err()
                    .unwrap_or(code::NONE)
            } else {
                self.peers
                    .verify_remote(&self.node, &state, id, partition, pid, epoch)
                    .await?
            };
            match answer {
                code::NONE => Ok(()),
                code::PRODUCER_FENCED => Err(StreamdError::InvalidProducerEpoch(format!(
                    "producer {pid} epoch {epoch} of transactional id '{id}' is fenced"
                ))),
                NOT_COORDINATOR | COORDINATOR_NOT_AVAILABLE => Err(StreamdError::Unavailable(format!(
                    "the coordinator of transactional id '{id}' is moving"
                ))),
                other => Err(StreamdError::InvalidTxnState(format!(
                    "stream '{partition}' is not in the ongoing transaction of transactional id '{id}' (producer {pid}, epoch {epoch}; Kafka error {other})"
                ))),
            }
        })
    }

    /// EndTxn: decides the transaction, answered once the decision is durable; its
    /// markers are written after.
    async fn end(self: &Arc<Self>, stream: &str, id: &str, pid: i64, epoch: i16, commit: bool) -> Result<(), i16> {
        let c = self.coordinator(stream).await.map_err(|e| store_error(&e))?;
        c.settled(id).await;
        let _decide = c.decide.lock().await;
        let current = c.entry(id);
        match state::end(current.as_ref(), pid, epoch, commit, now_ms())? {
            EndStep::AlreadyDone => Ok(()),
            EndStep::Prepare(next) => {
                self.store(&c, id, &next).await.map_err(|e| store_error(&e))?;
                self.complete_later(&c, id);
                Ok(())
            }
        }
    }

    /// Appends `entry` for `id` to the state stream, then applies it.
    async fn store(&self, c: &TxnCoordinator, id: &str, entry: &TxnEntry) -> Result<(), StreamdError> {
        let changes = vec![Change::Put {
            id: id.to_string(),
            entry: entry.clone(),
        }];
        self.store_changes(c, changes).await
    }

    async fn store_changes(&self, c: &TxnCoordinator, changes: Vec<Change>) -> Result<(), StreamdError> {
        let batch = log::encode(&changes);
        c.log
            .store(&self.node, &c.stream, batch, || {
                let mut table = c.table.lock().unwrap_or_else(|p| p.into_inner());
                changes.into_iter().for_each(|ch| table.apply(ch));
            })
            .await
    }

    /// Writes the markers of `id`'s decided transaction, then completes it, on a task
    /// of its own (unless one is already at it).
    fn complete_later(self: &Arc<Self>, c: &Arc<TxnCoordinator>, id: &str) {
        if !c
            .completing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string())
        {
            return;
        }
        let (txns, c, id) = (self.clone(), c.clone(), id.to_string());
        let about = Some(format!("{} {id}", c.stream));
        self.node.tasks.spawn("txn", "transaction markers", about, async move {
            txns.complete(&c, &id).await;
            c.completing.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        });
    }

    async fn complete(&self, c: &Arc<TxnCoordinator>, id: &str) {
        let Some(decided) = c.entry(id).filter(|e| e.state.is_prepared()) else {
            return;
        };
        let marker = Marker {
            producer_id: decided.producer_id,
            epoch: decided.epoch,
            commit: decided.state == state::TxnState::PrepareCommit,
            coordinator_epoch: i32::try_from(c.epoch.0).unwrap_or(i32::MAX),
        };
        let writes = decided
            .partitions
            .iter()
            .map(|stream| async move { (stream, self.peers.send(&self.node, stream, marker, &c.stop).await) });
        for (stream, sent) in futures::future::join_all(writes).await {
            match sent {
                Some(Sent::Written) => {}
                Some(Sent::Obsolete(why)) => {
                    tracing::warn!(transactional_id = id, stream = %stream, reason = %why, "transaction marker not written: obsolete")
                }
                // The state stream moved: its next owner resumes the markers.
                None => return,
            }
        }
        let _decide = c.decide.lock().await;
        let Some(done) = c
            .entry(id)
            .filter(|e| *e == decided)
            .and_then(|e| state::complete(&e, now_ms()))
        else {
            return;
        };
        let stored = if weir_shared::failpoint::fails("txn_completion") {
            // Tests: the completion cannot be stored (the state stream refuses it).
            Err(StreamdError::Unavailable("failpoint txn_completion".into()))
        } else {
            self.store(c, id, &done).await
        };
        match stored {
            Ok(()) => {
                c.completed.notify_waiters();
                tracing::info!(
                    transactional_id = id,
                    producer_id = decided.producer_id,
                    epoch = decided.epoch,
                    outcome = done.state.name(),
                    partitions = decided.partitions.len(),
                    "transaction completed"
                )
            }
            Err(e) => {
                tracing::warn!(transactional_id = id, error = %e, "transaction completion not stored; its next coordinator completes it")
            }
        }
    }

    /// `f` of the table of the coordinator of `stream` (introspection).
    pub(super) async fn with_table<R>(
        self: &Arc<Self>,
        stream: &str,
        f: impl FnOnce(&TxnTable) -> R,
    ) -> Result<R, StreamdError> {
        let c = self.coordinator(stream).await?;
        let table = c.table.lock().unwrap_or_else(|p| p.into_inner());
        Ok(f(&table))
    }

    /// The coordinator of the state stream this node owns, loaded from the stream when
    /// the stream was (re)opened since.
    async fn coordinator(self: &Arc<Self>, stream: &str) -> Result<Arc<TxnCoordinator>, StreamdError> {
        let epoch = self.node.stream(stream)?.epoch;
        let load = || async {
            let started = std::time::Instant::now();
            let mut table = TxnTable::default();
            state_stream::load(&self.node, stream, |batches| table.replay(batches)).await?;
            tracing::info!(
                stream,
                epoch = %epoch,
                transactional_ids = table.len(),
                changes_replayed = table.changes_since_snapshot(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "transaction coordinator loaded its state stream"
            );
            Ok(TxnCoordinator {
                stream: stream.to_string(),
                epoch,
                table: Mutex::new(table),
                log: StateLog::default(),
                decide: Default::default(),
                completing: Default::default(),
                completed: Default::default(),
                stop: CancellationToken::new(),
            })
        };
        let (c, new) = self
            .coordinators
            .get_or_load(stream, epoch, load, |old| old.stop.cancel())
            .await?;
        if new {
            // Decided before the move: their markers are written now.
            let prepared: Vec<String> = {
                let table = c.table.lock().unwrap_or_else(|p| p.into_inner());
                table
                    .iter()
                    .filter(|(_, e)| e.state.is_prepared())
                    .map(|(id, _)| id.clone())
                    .collect()
            };
            for id in &prepared {
                self.complete_later(&c, id);
            }
            self.node.tasks.spawn(
                "txn",
                "transaction coordinator tick",
                Some(stream.to_string()),
                tick(Arc::downgrade(self), c.clone()),
            );
        }
        Ok(c)
    }

    /// Completes decided transactions nobody is completing, aborts transactions past
    /// their timeout, forgets ids idle past their expiration, and snapshots the table
    /// when due.
    async fn expire(self: &Arc<Self>, c: &Arc<TxnCoordinator>) {
        let now = now_ms();
        let (prepared, timed_out, expired): (Vec<_>, Vec<_>, Vec<_>) = {
            let table = c.table.lock().unwrap_or_else(|p| p.into_inner());
            let prepared = table
                .iter()
                .filter(|(_, e)| e.state.is_prepared())
                .map(|(id, _)| id.clone())
                .collect();
            let timed_out = table
                .iter()
                .filter(|(_, e)| state::abort_if_timed_out(e, now).is_some())
                .map(|(id, _)| id.clone())
                .collect();
            let expired = table
                .iter()
                .filter(|(_, e)| state::expired(e, self.limits.id_expiration_ms, now))
                .map(|(id, _)| id.clone())
                .collect();
            (prepared, timed_out, expired)
        };
        // A decided transaction whose completion could not be stored (its writer gave
        // up) is taken up again; one being written is left to its writer.
        for id in &prepared {
            self.complete_later(c, id);
        }
        for id in timed_out {
            let _decide = c.decide.lock().await;
            let Some(aborting) = c.entry(&id).and_then(|e| state::abort_if_timed_out(&e, now_ms())) else {
                continue;
            };
            match self.store(c, &id, &aborting).await {
                Ok(()) => {
                    tracing::info!(transactional_id = %id, producer_id = aborting.producer_id, epoch = aborting.epoch, "transaction timed out; aborting it");
                    self.complete_later(c, &id);
                }
                Err(e) => tracing::warn!(transactional_id = %id, error = %e, "timed-out transaction not aborted yet"),
            }
        }
        if !expired.is_empty() {
            let _decide = c.decide.lock().await;
            let still: Vec<Change> = expired
                .into_iter()
                .filter(|id| {
                    c.entry(id)
                        .is_some_and(|e| state::expired(&e, self.limits.id_expiration_ms, now_ms()))
                })
                .map(|id| Change::Forget { id })
                .collect();
            if let Err(e) = self.store_changes(c, still).await {
                tracing::warn!(stream = %c.stream, error = %e, "expired transactional ids not forgotten yet");
            }
        }
        self.maybe_snapshot(c);
    }

    fn maybe_snapshot(&self, c: &Arc<TxnCoordinator>) {
        let due = {
            let table = c.table.lock().unwrap_or_else(|p| p.into_inner());
            state_stream::snapshot_due(table.changes_since_snapshot(), table.len() as u64)
        };
        if due && c.log.begin_snapshot() {
            let (node, c) = (self.node.clone(), c.clone());
            let about = Some(c.stream.clone());
            self.node
                .tasks
                .spawn("txn", "transaction state snapshot", about, async move {
                    let table = || c.table.lock().unwrap_or_else(|p| p.into_inner());
                    let stored = c
                        .log
                        .snapshot(
                            &node,
                            &c.stream,
                            || {
                                let t = table();
                                (t.snapshot(), t.changes_since_snapshot(), None)
                            },
                            log::encode,
                            || table().snapshotted(),
                            "transaction state",
                        )
                        .await;
                    if let Err(e) = stored {
                        tracing::warn!(stream = %c.stream, error = %e, "transaction state snapshot failed; will retry");
                    }
                    c.log.end_snapshot();
                });
        }
    }
}

/// Runs [`Txns::expire`] every [`TICK`] while the coordinator's stream is served here
/// at its epoch; then stops it, so its successor alone writes what is left.
async fn tick(txns: Weak<Txns>, c: Arc<TxnCoordinator>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = c.stop.cancelled() => return,
        }
        let Some(txns) = txns.upgrade() else { return };
        let served = txns
            .node
            .stream(&c.stream)
            .is_ok_and(|h| h.epoch == c.epoch && h.is_serving());
        if !served {
            c.stop.cancel();
            txns.coordinators.remove(&c.stream, &c).await;
            return;
        }
        txns.expire(&c).await;
    }
}
