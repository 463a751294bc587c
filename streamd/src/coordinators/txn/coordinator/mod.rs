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

mod completion;
mod requests;
mod upkeep;

use super::log::{self, Change, TxnTable};
use super::peer_calls::PeerCalls;
use super::state::TxnEntry;
use crate::coordinators::state_stream::{self, Loaded, Registry, StateLog};
use crate::error::StreamdError;
use crate::node::core_api::CoreApi;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use upkeep::tick;
use weir_meta::model::names::TXN_STATE_TOPIC;
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
    core: CoreApi,
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
    pub fn new(core: CoreApi, limits: TxnLimits) -> Arc<Self> {
        Arc::new(Self {
            core,
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
                .core
                .view()
                .with(|s| s.topics.get(TXN_STATE_TOPIC).map(|t| t.partitions.clone()))
                .unwrap_or_default();
            for (name, epoch) in partitions.into_iter().filter_map(|id| self.core.serving(id)) {
                if !name.starts_with(&prefix) {
                    continue;
                }
                if self.coordinators.get(&name, epoch).await.is_none() {
                    if let Err(e) = self.coordinator(&name).await {
                        tracing::warn!(stream = %name, error = %e, "transaction coordinator not loaded yet; will retry");
                    }
                }
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
            .store(&self.core, &c.stream, batch, || {
                let mut table = c.table.lock().unwrap_or_else(|p| p.into_inner());
                changes.into_iter().for_each(|ch| table.apply(ch));
            })
            .await
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
        let epoch = self.core.epoch(stream)?;
        let load = || async {
            let started = std::time::Instant::now();
            let mut table = TxnTable::default();
            state_stream::load(&self.core, stream, |batches| table.replay(batches)).await?;
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
            self.core.tasks().spawn(
                "txn",
                "transaction coordinator tick",
                Some(stream.to_string()),
                tick(Arc::downgrade(self), c.clone()),
            );
        }
        Ok(c)
    }
}

impl crate::node::coordination::TxnVerifier for Txns {
    fn verify_write<'a>(
        self: Arc<Self>,
        id: &'a str,
        partition: &'a str,
        pid: i64,
        epoch: i16,
    ) -> futures::future::BoxFuture<'a, Result<(), StreamdError>> {
        Box::pin(async move { Txns::verify_partition(&self, id, partition, pid, epoch).await })
    }
}
