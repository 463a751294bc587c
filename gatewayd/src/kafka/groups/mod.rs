//! Consumer groups through the gateway: FindCoordinator names a gateway, and every group
//! request is forwarded, as Kafka bytes, to the streamd that owns the group's offsets
//! stream — `__consumer_offsets/N`, N = CRC-32C(group) mod 8 — which runs the group.
//! While that stream has no owner the answer is COORDINATOR_NOT_AVAILABLE, and an owner
//! that no longer has it answers NOT_COORDINATOR; clients look the coordinator up again.
//!
//! The dispatch of every group request is here; finding a coordinator
//! (`coordinator.rs`), sending to it (`calls.rs`), the offset requests' checks
//! (`offsets.rs`) and KIP-848's consumer groups (`consumer.rs`) are submodules.

mod calls;
mod consumer;
mod coordinator;
mod offsets;

use self::calls::{call, call_group, decode, encode, per_group};
use self::consumer::{consumer_heartbeat, hide_unreadable};
pub(super) use self::coordinator::ensure_internal_topic;
pub use self::coordinator::find_coordinator;
use self::offsets::{commit_failed, fetch_failed, offset_fetch_groups, split_unknown, txn_offset_commit};
use super::brokers::OFFSETS_TOPIC;
use super::caller::Caller;
use super::errors;
use super::Kafka;
use bytes::Bytes;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::Resource;

pub use weir_meta::model::names::{offsets_stream, OFFSETS_PARTITIONS};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The response to a group request; `None` for a request that is not one.
pub async fn forward(
    kafka: &Kafka,
    caller: &Caller,
    kind: RequestKind,
    body: Bytes,
    version: i16,
) -> Option<ResponseKind> {
    Some(match kind {
        RequestKind::JoinGroup(r) => {
            match call_group(kafka, caller, &r.group_id.0, ApiKey::JoinGroup, version, body).await {
                Ok(resp) => ResponseKind::JoinGroup(resp),
                Err(code) => ResponseKind::JoinGroup(
                    JoinGroupResponse::default()
                        .with_error_code(code)
                        .with_generation_id(-1)
                        .with_member_id(r.member_id),
                ),
            }
        }
        RequestKind::SyncGroup(r) => {
            match call_group(kafka, caller, &r.group_id.0, ApiKey::SyncGroup, version, body).await {
                Ok(resp) => ResponseKind::SyncGroup(resp),
                Err(code) => ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(code)),
            }
        }
        RequestKind::Heartbeat(r) => {
            match call_group(kafka, caller, &r.group_id.0, ApiKey::Heartbeat, version, body).await {
                Ok(resp) => ResponseKind::Heartbeat(resp),
                Err(code) => ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(code)),
            }
        }
        RequestKind::LeaveGroup(r) => {
            match call_group(kafka, caller, &r.group_id.0, ApiKey::LeaveGroup, version, body).await {
                Ok(resp) => ResponseKind::LeaveGroup(resp),
                Err(code) => ResponseKind::LeaveGroup(
                    LeaveGroupResponse::default().with_error_code(code).with_members(
                        r.members
                            .iter()
                            .map(|m| {
                                MemberResponse::default()
                                    .with_member_id(m.member_id.clone())
                                    .with_group_instance_id(m.group_instance_id.clone())
                                    .with_error_code(code)
                            })
                            .collect(),
                    ),
                ),
            }
        }
        RequestKind::OffsetCommit(mut r) => {
            // Committing needs `read` on each topic too, as Kafka's authorizer asks:
            // the others are answered TOPIC_AUTHORIZATION_FAILED and not sent on.
            let (allowed, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.topics).into_iter().partition(|t| {
                caller
                    .grants
                    .allows(Operation::Read, Resource::Topic(t.name.0.as_str()))
            });
            let (known, unknown) = split_unknown(kafka, allowed);
            r.topics = known;
            let body = if denied.is_empty() && unknown.is_empty() {
                body
            } else {
                encode(&r, version)
            };
            let resp = match call_group(kafka, caller, &r.group_id.0, ApiKey::OffsetCommit, version, body).await {
                Ok(resp) => resp,
                Err(code) => OffsetCommitResponse::default().with_topics(commit_failed(&r.topics, code)),
            };
            let mut resp = resp;
            resp.topics
                .extend(commit_failed(&denied, errors::TOPIC_AUTHORIZATION_FAILED));
            resp.topics
                .extend(commit_failed(&unknown, errors::UNKNOWN_TOPIC_OR_PARTITION));
            ResponseKind::OffsetCommit(resp)
        }
        RequestKind::OffsetDelete(mut r) => {
            // As OffsetCommit: deleting needs `read` on each topic too.
            let (allowed, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.topics).into_iter().partition(|t| {
                caller
                    .grants
                    .allows(Operation::Read, Resource::Topic(t.name.0.as_str()))
            });
            r.topics = allowed;
            let body = if denied.is_empty() { body } else { encode(&r, version) };
            let mut resp = match call_group(kafka, caller, &r.group_id.0, ApiKey::OffsetDelete, version, body).await {
                Ok(resp) => resp,
                Err(code) => OffsetDeleteResponse::default().with_error_code(code),
            };
            resp.topics.extend(denied.into_iter().map(|t| {
                offset_delete_response::OffsetDeleteResponseTopic::default()
                    .with_name(t.name)
                    .with_partitions(
                        t.partitions
                            .iter()
                            .map(|p| {
                                offset_delete_response::OffsetDeleteResponsePartition::default()
                                    .with_partition_index(p.partition_index)
                                    .with_error_code(errors::TOPIC_AUTHORIZATION_FAILED)
                            })
                            .collect(),
                    )
            }));
            ResponseKind::OffsetDelete(resp)
        }
        RequestKind::TxnOffsetCommit(r) => {
            ResponseKind::TxnOffsetCommit(txn_offset_commit(kafka, caller, r, version).await)
        }
        RequestKind::ConsumerGroupHeartbeat(r) => {
            ResponseKind::ConsumerGroupHeartbeat(consumer_heartbeat(kafka, caller, r, body, version).await)
        }
        RequestKind::ConsumerGroupDescribe(r) => {
            let groups = per_group(
                kafka,
                caller,
                (ApiKey::ConsumerGroupDescribe, version),
                &r.group_ids,
                |g| encode(&r.clone().with_group_ids(vec![g.clone()]), version),
                |resp: ConsumerGroupDescribeResponse| resp.groups,
                |g, code| {
                    consumer_group_describe_response::DescribedGroup::default()
                        .with_group_id(g.clone())
                        .with_error_code(code)
                },
            )
            .await;
            let groups = groups.into_iter().map(|g| hide_unreadable(caller, g)).collect();
            ResponseKind::ConsumerGroupDescribe(ConsumerGroupDescribeResponse::default().with_groups(groups))
        }
        RequestKind::OffsetFetch(r) if version >= 8 => {
            ResponseKind::OffsetFetch(offset_fetch_groups(kafka, caller, r, version).await)
        }
        RequestKind::OffsetFetch(mut r) => {
            // Fetching offsets needs `read` on each topic: named topics outside the
            // token's scopes are answered TOPIC_AUTHORIZATION_FAILED, and a request for
            // all of them gets only the readable ones.
            let mut denied = vec![];
            if let Some(topics) = r.topics.as_mut() {
                let (allowed, refused): (Vec<_>, Vec<_>) = std::mem::take(topics).into_iter().partition(|t| {
                    caller
                        .grants
                        .allows(Operation::Describe, Resource::Topic(t.name.0.as_str()))
                });
                *topics = allowed;
                denied = refused;
            }
            let body = if denied.is_empty() { body } else { encode(&r, version) };
            let resp = match call_group(kafka, caller, &r.group_id.0, ApiKey::OffsetFetch, version, body).await {
                Ok(resp) => resp,
                Err(code) => OffsetFetchResponse::default()
                    .with_error_code(code)
                    .with_topics(fetch_failed(r.topics.iter().flatten(), code)),
            };
            let mut resp = resp;
            resp.topics.retain(|t| {
                caller
                    .grants
                    .allows(Operation::Describe, Resource::Topic(t.name.0.as_str()))
            });
            resp.topics
                .extend(fetch_failed(&denied, errors::TOPIC_AUTHORIZATION_FAILED));
            ResponseKind::OffsetFetch(resp)
        }
        RequestKind::DescribeGroups(r) => {
            let groups = per_group(
                kafka,
                caller,
                (ApiKey::DescribeGroups, version),
                &r.groups,
                |g| encode(&r.clone().with_groups(vec![g.clone()]), version),
                |resp: DescribeGroupsResponse| resp.groups,
                |g, code| DescribedGroup::default().with_group_id(g.clone()).with_error_code(code),
            )
            .await;
            ResponseKind::DescribeGroups(DescribeGroupsResponse::default().with_groups(groups))
        }
        RequestKind::DeleteGroups(r) => {
            let results = per_group(
                kafka,
                caller,
                (ApiKey::DeleteGroups, version),
                &r.groups_names,
                |g| {
                    encode(
                        &DeleteGroupsRequest::default().with_groups_names(vec![g.clone()]),
                        version,
                    )
                },
                |resp: DeleteGroupsResponse| resp.results,
                |g, code| {
                    delete_groups_response::DeletableGroupResult::default()
                        .with_group_id(g.clone())
                        .with_error_code(code)
                },
            )
            .await;
            ResponseKind::DeleteGroups(DeleteGroupsResponse::default().with_results(results))
        }
        RequestKind::ListGroups(_) => {
            let mut groups = vec![];
            let mut error = errors::NONE;
            let exists = kafka.gw.routes.view().with(|s| s.topics.contains_key(OFFSETS_TOPIC));
            if exists {
                for p in 0..OFFSETS_PARTITIONS {
                    let stream = format!("{OFFSETS_TOPIC}/{p}");
                    match call(kafka, caller, None, &stream, ApiKey::ListGroups, version, body.clone())
                        .await
                        .and_then(|b| decode::<ListGroupsResponse>(b, version))
                    {
                        // A token lists the groups it may read.
                        Ok(resp) => groups.extend(resp.groups.into_iter().filter(|g| {
                            caller
                                .grants
                                .allows(Operation::Describe, Resource::Group(&g.group_id.0))
                        })),
                        Err(code) => error = code,
                    }
                }
            }
            ResponseKind::ListGroups(ListGroupsResponse::default().with_error_code(error).with_groups(groups))
        }
        _ => return None,
    })
}
