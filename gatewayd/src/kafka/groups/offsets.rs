//! The offset requests' own checks: OffsetFetch v8+ per group, OffsetCommit's unknown
//! partitions, TxnOffsetCommit, and the per-partition error answers; its own file as the
//! topic-level authorization the coordinator does not do.

use super::calls::{call_group, encode};
use crate::kafka::caller::Caller;
use crate::kafka::errors;
use crate::kafka::Kafka;
use kafka_protocol::messages::offset_commit_request::OffsetCommitRequestTopic;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::offset_fetch_response::{OffsetFetchResponsePartition, OffsetFetchResponseTopic};
use kafka_protocol::messages::*;
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::Resource;

/// OffsetFetch v8+: each group asked for goes to its own coordinator, with the topics
/// the token may read (the others are answered TOPIC_AUTHORIZATION_FAILED).
pub(super) async fn offset_fetch_groups(
    kafka: &Kafka,
    caller: &Caller,
    r: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    use offset_fetch_response::{OffsetFetchResponseGroup, OffsetFetchResponsePartitions, OffsetFetchResponseTopics};
    let mut groups = vec![];
    for mut g in r.groups {
        let id = g.group_id.clone();
        let mut denied = vec![];
        if let Some(topics) = g.topics.as_mut() {
            let (allowed, refused): (Vec<_>, Vec<_>) = std::mem::take(topics).into_iter().partition(|t| {
                caller
                    .grants
                    .allows(Operation::Describe, Resource::Topic(t.name.0.as_str()))
            });
            *topics = allowed;
            denied = refused;
        }
        let one = OffsetFetchRequest::default()
            .with_groups(vec![g])
            .with_require_stable(r.require_stable);
        let answer = call_group::<OffsetFetchResponse>(
            kafka,
            caller,
            &id.0,
            ApiKey::OffsetFetch,
            version,
            encode(&one, version),
        )
        .await;
        let mut group = match answer {
            Ok(resp) => resp
                .groups
                .into_iter()
                .next()
                .unwrap_or_else(|| OffsetFetchResponseGroup::default().with_group_id(id.clone())),
            Err(code) => OffsetFetchResponseGroup::default()
                .with_group_id(id.clone())
                .with_error_code(code),
        };
        group.topics.retain(|t| {
            caller
                .grants
                .allows(Operation::Describe, Resource::Topic(t.name.0.as_str()))
        });
        // A group answered with an error carries no topics, as Kafka's do.
        if group.error_code != errors::NONE {
            groups.push(group);
            continue;
        }
        group.topics.extend(denied.into_iter().map(|t| {
            OffsetFetchResponseTopics::default().with_name(t.name).with_partitions(
                t.partition_indexes
                    .iter()
                    .map(|p| {
                        OffsetFetchResponsePartitions::default()
                            .with_partition_index(*p)
                            .with_committed_offset(-1)
                            .with_error_code(errors::TOPIC_AUTHORIZATION_FAILED)
                    })
                    .collect(),
            )
        }));
        groups.push(group);
    }
    OffsetFetchResponse::default().with_groups(groups)
}

/// Splits an OffsetCommit's partitions into those of existing topics and those that do
/// not exist: as in Kafka, commits for the latter are answered UNKNOWN_TOPIC_OR_PARTITION
/// and never stored, so a typo in a topic name does not pass for a commit.
pub(super) fn split_unknown(
    kafka: &Kafka,
    topics: Vec<OffsetCommitRequestTopic>,
) -> (Vec<OffsetCommitRequestTopic>, Vec<OffsetCommitRequestTopic>) {
    let view = kafka.gw.routes.view();
    let (mut known, mut unknown) = (vec![], vec![]);
    for mut t in topics {
        let count = view.with(|s| s.topics.get(t.name.0.as_str()).map_or(0, |row| row.partitions.len()));
        let (ok, missing): (Vec<_>, Vec<_>) = std::mem::take(&mut t.partitions)
            .into_iter()
            .partition(|p| usize::try_from(p.partition_index).is_ok_and(|i| i < count));
        if !missing.is_empty() {
            unknown.push(t.clone().with_partitions(missing));
        }
        if !ok.is_empty() {
            known.push(t.with_partitions(ok));
        }
    }
    (known, unknown)
}

/// TxnOffsetCommit (issue 23): a transaction's offsets, sent to the group's
/// coordinator, which keeps them pending until the transaction's marker. It needs
/// `write` on the transactional id, `read` on the group and on each topic; as Kafka
/// answers, when any topic is refused nothing is sent and each partition says why.
pub(super) async fn txn_offset_commit(
    kafka: &Kafka,
    caller: &Caller,
    r: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
    use kafka_protocol::messages::txn_offset_commit_response::{
        TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
    };
    let answer = |code_of: &dyn Fn(&str, i32) -> i16| {
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
                                        .with_error_code(code_of(t.name.0.as_str(), p.partition_index))
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
    };
    if !caller
        .grants
        .allows(Operation::Write, Resource::TransactionalId(r.transactional_id.as_str()))
    {
        return answer(&|_, _| errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
    let refusal = |topic: &str, p: i32| -> Option<i16> {
        if !caller.grants.allows(Operation::Read, Resource::Topic(topic)) {
            return Some(errors::TOPIC_AUTHORIZATION_FAILED);
        }
        kafka
            .gw
            .routes
            .stream(&format!("{topic}/{p}"))
            .is_none()
            .then_some(errors::UNKNOWN_TOPIC_OR_PARTITION)
    };
    let refused = r.topics.iter().any(|t| {
        t.partitions
            .iter()
            .any(|p| refusal(t.name.0.as_str(), p.partition_index).is_some())
    });
    if refused {
        let not_attempted = kafka_protocol::ResponseError::OperationNotAttempted.code();
        return answer(&|t, p| refusal(t, p).unwrap_or(not_attempted));
    }
    let body = encode(&r, version);
    match call_group(kafka, caller, &r.group_id.0, ApiKey::TxnOffsetCommit, version, body).await {
        Ok(resp) => resp,
        Err(code) => answer(&|_, _| code),
    }
}

/// Every partition of `topics` failed with `code`, as an OffsetCommit answer.
pub(super) fn commit_failed(topics: &[OffsetCommitRequestTopic], code: i16) -> Vec<OffsetCommitResponseTopic> {
    topics
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
                                .with_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect()
}

/// Every partition of `topics` failed with `code`, as an OffsetFetch answer.
pub(super) fn fetch_failed<'a>(
    topics: impl IntoIterator<Item = &'a OffsetFetchRequestTopic>,
    code: i16,
) -> Vec<OffsetFetchResponseTopic> {
    topics
        .into_iter()
        .map(|t| {
            OffsetFetchResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partition_indexes
                        .iter()
                        .map(|p| {
                            OffsetFetchResponsePartition::default()
                                .with_partition_index(*p)
                                .with_committed_offset(-1)
                                .with_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect()
}
