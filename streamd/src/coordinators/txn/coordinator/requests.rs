//! The transaction requests a coordinator answers (InitProducerId, AddPartitionsToTxn,
//! AddOffsetsToTxn, EndTxn, KIP-890's verification): each decoded, decided, answered.
//! Its own file: the state and log its decisions go through are its parent's.

use super::{store_error, Txns, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR};
use crate::coordinators::txn::state::{self, code, EndStep, InitRequest, InitStep};
use crate::error::StreamdError;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable};
use std::sync::Arc;
use weir_meta::model::names::{offsets_stream, txn_state_stream};
use weir_meta::model::now_ms;

impl Txns {
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
            let served = self.core.serving_epoch(&state).is_some();
            let answer = if served {
                self.verify(&state, id, pid, epoch, &[partition.to_string()])
                    .await
                    .err()
                    .unwrap_or(code::NONE)
            } else {
                self.peers
                    .verify_remote(&self.core, &state, id, partition, pid, epoch)
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
}
