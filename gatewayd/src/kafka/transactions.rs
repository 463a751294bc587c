//! Transactions through the gateway (issue 23, design 0005). InitProducerId with a
//! transactional id, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn are checked against
//! the token's scopes here and forwarded, as Kafka bytes, to the owner of the id's
//! transaction-state stream (`__transaction_state/N`, N = CRC-32C(id) mod 8), which
//! runs its coordinator. While that stream has no owner the answer is
//! COORDINATOR_NOT_AVAILABLE, and an owner that no longer has it answers
//! NOT_COORDINATOR; clients look the coordinator up again. TxnOffsetCommit goes to the
//! group's coordinator instead (`groups.rs`).

use super::admin;
use super::caller::Caller;
use super::errors;
use super::groups::ensure_internal_topic;
use super::Kafka;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable};
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::Resource;
use weir_meta::model::names::{txn_state_stream, TXN_STATE_PARTITIONS, TXN_STATE_TOPIC};
use weir_meta::model::{Applied, Command};
use weir_proto::streamd::TxnRequest;
use weir_shared::error_code::KafkaApi;

const OPERATION_NOT_ATTEMPTED: i16 = kafka_protocol::ResponseError::OperationNotAttempted.code();

/// Sends one transaction request for `id` to its coordinator; the response body, or an
/// error code for every part of the answer.
async fn call(
    kafka: &Kafka,
    id: &str,
    key: ApiKey,
    version: i16,
    body: Bytes,
    fresh_producer_id: Option<i64>,
) -> Result<Bytes, i16> {
    ensure_internal_topic(kafka, TXN_STATE_TOPIC, TXN_STATE_PARTITIONS).await;
    call_stream(kafka, &txn_state_stream(id), key, version, body, fresh_producer_id).await
}

/// Sends one transaction request to the coordinator of state stream `stream`.
async fn call_stream(
    kafka: &Kafka,
    stream: &str,
    key: ApiKey,
    version: i16,
    body: Bytes,
    fresh_producer_id: Option<i64>,
) -> Result<Bytes, i16> {
    let stream = stream.to_string();
    let result = kafka
        .gw
        .routes
        .call(&stream, false, |mut c| {
            let req = TxnRequest {
                stream: stream.clone(),
                api_key: i32::from(key as i16),
                api_version: i32::from(version),
                body: body.clone(),
                fresh_producer_id,
            };
            async move { c.txn(req).await }
        })
        .await;
    match result {
        Ok(reply) => Ok(reply.body),
        Err(e) => {
            tracing::debug!(stream, error = %e, "transaction request not answered by a coordinator");
            Err(e.code().kafka(KafkaApi::Group).code())
        }
    }
}

fn decode<T: Decodable>(mut body: Bytes, version: i16) -> Result<T, i16> {
    T::decode(&mut body, version).map_err(|_| errors::UNKNOWN_SERVER_ERROR)
}

fn encode<T: Encodable>(m: &T, version: i16) -> Bytes {
    let mut buf = BytesMut::new();
    // Encoding a decoded request at its own version cannot fail.
    let _ = m.encode(&mut buf, version);
    buf.freeze()
}

/// InitProducerId for a transactional id: a producer id is allocated by metad first,
/// which the coordinator takes when the id is new or its epoch is exhausted.
pub async fn init_producer_id(
    kafka: &Kafka,
    caller: &Caller,
    r: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let failed = |code: i16| {
        InitProducerIdResponse::default()
            .with_error_code(code)
            .with_producer_id((-1).into())
            .with_producer_epoch(-1)
    };
    let id = r.transactional_id.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
    if !caller.grants.allows(Operation::Write, Resource::TransactionalId(&id)) {
        return failed(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
    let fresh = match admin::propose(kafka, caller, Command::AllocateProducerIds { count: 1 }).await {
        Ok(Applied::ProducerIds { first, .. }) => first,
        Err((code, _)) if code == errors::TOPIC_AUTHORIZATION_FAILED => {
            return failed(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        }
        _ => return failed(errors::COORDINATOR_NOT_AVAILABLE),
    };
    let body = encode(&r, version);
    match call(kafka, &id, ApiKey::InitProducerId, version, body, Some(fresh)).await {
        Ok(b) => decode(b, version).unwrap_or_else(failed),
        Err(code) => failed(code),
    }
}

/// AddPartitionsToTxn (v0–3, the clients' versions): the id needs `write`, and so does
/// every partition's topic, which must exist. As Kafka answers, when any partition is
/// refused none is added and the others are OPERATION_NOT_ATTEMPTED.
pub async fn add_partitions(
    kafka: &Kafka,
    caller: &Caller,
    r: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    let topics = &r.v3_and_below_topics;
    let answer = |code_of: &dyn Fn(&AddPartitionsToTxnTopic, i32) -> i16| {
        AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(
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
                                        .with_partition_error_code(code_of(t, *p))
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
    };
    let id = r.v3_and_below_transactional_id.to_string();
    if !caller.grants.allows(Operation::Write, Resource::TransactionalId(&id)) {
        return answer(&|_, _| errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
    let refusal = |t: &AddPartitionsToTxnTopic, p: i32| -> Option<i16> {
        let name = t.name.0.as_str();
        if !caller.grants.allows(Operation::Write, Resource::Topic(name)) {
            return Some(errors::TOPIC_AUTHORIZATION_FAILED);
        }
        if super::brokers::is_internal_topic(name) || kafka.gw.routes.stream(&format!("{name}/{p}")).is_none() {
            return Some(errors::UNKNOWN_TOPIC_OR_PARTITION);
        }
        None
    };
    let refused = topics
        .iter()
        .any(|t| t.partitions.iter().any(|p| refusal(t, *p).is_some()));
    if refused {
        return answer(&|t, p| refusal(t, p).unwrap_or(OPERATION_NOT_ATTEMPTED));
    }
    let body = encode(&r, version);
    match call(kafka, &id, ApiKey::AddPartitionsToTxn, version, body, None).await {
        Ok(b) => decode(b, version).unwrap_or_else(|code| answer(&|_, _| code)),
        Err(code) => answer(&|_, _| code),
    }
}

/// AddOffsetsToTxn: `write` on the id and `read` on the group.
pub async fn add_offsets(
    kafka: &Kafka,
    caller: &Caller,
    r: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let failed = |code: i16| AddOffsetsToTxnResponse::default().with_error_code(code);
    let id = r.transactional_id.to_string();
    if !caller.grants.allows(Operation::Write, Resource::TransactionalId(&id)) {
        return failed(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
    if !caller
        .grants
        .allows(Operation::Read, Resource::Group(r.group_id.0.as_str()))
    {
        return failed(errors::GROUP_AUTHORIZATION_FAILED);
    }
    // The group's offsets stream joins the transaction: it must exist for its marker.
    ensure_internal_topic(
        kafka,
        weir_meta::model::names::OFFSETS_TOPIC,
        super::groups::OFFSETS_PARTITIONS,
    )
    .await;
    let body = encode(&r, version);
    match call(kafka, &id, ApiKey::AddOffsetsToTxn, version, body, None).await {
        Ok(b) => decode(b, version).unwrap_or_else(failed),
        Err(code) => failed(code),
    }
}

/// EndTxn: `write` on the id.
pub async fn end(kafka: &Kafka, caller: &Caller, r: EndTxnRequest, version: i16) -> EndTxnResponse {
    let failed = |code: i16| {
        EndTxnResponse::default()
            .with_error_code(code)
            .with_producer_id(r.producer_id)
            .with_producer_epoch(r.producer_epoch)
    };
    let id = r.transactional_id.to_string();
    if !caller.grants.allows(Operation::Write, Resource::TransactionalId(&id)) {
        return failed(errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
    let body = encode(&r, version);
    match call(kafka, &id, ApiKey::EndTxn, version, body, None).await {
        Ok(b) => decode(b, version).unwrap_or_else(failed),
        Err(code) => failed(code),
    }
}

/// ListTransactions (KIP-664): every coordinator's ids that pass the filters and that
/// the token may see. A coordinator that does not answer makes the answer's error its
/// code, with the others' ids still listed.
pub async fn list_transactions(
    kafka: &Kafka,
    caller: &Caller,
    r: ListTransactionsRequest,
    version: i16,
) -> ListTransactionsResponse {
    let mut out = ListTransactionsResponse::default();
    if !kafka.gw.routes.view().with(|s| s.topics.contains_key(TXN_STATE_TOPIC)) {
        return out;
    }
    let body = encode(&r, version);
    for p in 0..TXN_STATE_PARTITIONS {
        let stream = format!("{TXN_STATE_TOPIC}/{p}");
        match call_stream(kafka, &stream, ApiKey::ListTransactions, version, body.clone(), None)
            .await
            .and_then(|b| decode::<ListTransactionsResponse>(b, version))
        {
            Ok(answer) => {
                out.unknown_state_filters = answer.unknown_state_filters;
                if answer.error_code != errors::NONE {
                    out.error_code = answer.error_code;
                }
                out.transaction_states.extend(
                    answer
                        .transaction_states
                        .into_iter()
                        .filter(|t| super::brokers::visible(caller, Resource::TransactionalId(&t.transactional_id.0))),
                );
            }
            Err(code) => out.error_code = code,
        }
    }
    out
}

/// DescribeTransactions: each id from its coordinator, or
/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED for one the token may not see.
pub async fn describe_transactions(
    kafka: &Kafka,
    caller: &Caller,
    r: DescribeTransactionsRequest,
    version: i16,
) -> DescribeTransactionsResponse {
    use kafka_protocol::messages::describe_transactions_response::TransactionState;
    let failed = |id: &TransactionalId, code: i16| {
        TransactionState::default()
            .with_transactional_id(id.clone())
            .with_error_code(code)
            .with_producer_id((-1).into())
            .with_producer_epoch(-1)
    };
    let mut states = vec![];
    for id in &r.transactional_ids {
        // Any scope on the id, as Kafka's DESCRIBE on it.
        if !super::brokers::visible(caller, Resource::TransactionalId(&id.0)) {
            states.push(failed(id, errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED));
            continue;
        }
        let one = encode(
            &DescribeTransactionsRequest::default().with_transactional_ids(vec![id.clone()]),
            version,
        );
        match call(kafka, &id.0, ApiKey::DescribeTransactions, version, one, None)
            .await
            .and_then(|b| decode::<DescribeTransactionsResponse>(b, version))
        {
            Ok(answer) => states.extend(answer.transaction_states),
            Err(code) => states.push(failed(id, code)),
        }
    }
    DescribeTransactionsResponse::default().with_transaction_states(states)
}
