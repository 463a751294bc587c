//! Consumer groups through the gateway: FindCoordinator names a gateway, and every group
//! request is forwarded, as Kafka bytes, to the streamd that owns the group's offsets
//! stream — `__consumer_offsets/N`, N = CRC-32C(group) mod 8 — which runs the group.
//! While that stream has no owner the answer is COORDINATOR_NOT_AVAILABLE, and an owner
//! that no longer has it answers NOT_COORDINATOR; clients look the coordinator up again.

use super::brokers::{self, OFFSETS_TOPIC};
use super::conn::Session;
use super::errors;
use super::Kafka;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::offset_commit_request::OffsetCommitRequestTopic;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::offset_fetch_response::{OffsetFetchResponsePartition, OffsetFetchResponseTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use weir_meta::model::scopes::Access;
use weir_meta::model::{Command, Proposer, StreamConfig};
use weir_proto::streamd::GroupRequest;
use weir_shared::error_code::KafkaApi;

pub use weir_meta::model::names::{offsets_stream, OFFSETS_PARTITIONS};
use weir_meta::model::names::{txn_state_stream, TXN_STATE_PARTITIONS, TXN_STATE_TOPIC};
const GROUP_KEY: i8 = 0;
/// FindCoordinator's key type for a transactional id.
const TXN_KEY: i8 = 1;
/// Longest a JoinGroup or SyncGroup may wait at its coordinator: Kafka's largest
/// session timeout (`group.max.session.timeout.ms`), which bounds a rebalance.
const GROUP_WAIT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Creates an internal topic (the offsets or the transaction-state topic) on first
/// use, with every partition its keys hash over.
pub(super) async fn ensure_internal_topic(kafka: &Kafka, topic: &str, partitions: u32) {
    let have = kafka
        .gw
        .routes
        .view()
        .with(|s| s.topics.get(topic).map(|t| t.partitions.len() as u32));
    let cmd = match have {
        Some(n) if n >= partitions => return,
        Some(_) => Command::CreatePartitions {
            name: topic.into(),
            partitions,
        },
        None => Command::CreateTopic {
            name: topic.into(),
            partitions,
            config: StreamConfig::default(),
        },
    };
    // The gateway's own need, not a user's: proposed as the gateway node (D-21).
    let proposer = Proposer::Node(kafka.gw.me.clone());
    if let Ok((index, _)) = kafka.gw.metad.propose(&proposer, cmd).await {
        tracing::info!(topic, "created an internal topic");
        kafka.gw.settle(index).await;
    }
}

pub async fn find_coordinator(
    kafka: &Kafka,
    session: &Session,
    r: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let keys: Vec<StrBytes> = if version >= 4 {
        r.coordinator_keys.clone()
    } else {
        vec![r.key.clone()]
    };
    match r.key_type {
        GROUP_KEY => ensure_internal_topic(kafka, OFFSETS_TOPIC, OFFSETS_PARTITIONS).await,
        TXN_KEY => ensure_internal_topic(kafka, TXN_STATE_TOPIC, TXN_STATE_PARTITIONS).await,
        _ => {}
    }
    let all = brokers::brokers(kafka);
    let answers: Vec<Coordinator> = keys
        .into_iter()
        .map(|key| {
            let c = Coordinator::default().with_key(key.clone());
            let refuse = |code: i16, why: &str| {
                c.clone()
                    .with_error_code(code)
                    .with_error_message(Some(s(why)))
                    .with_node_id((-1).into())
            };
            let stream = match r.key_type {
                GROUP_KEY if !session.grants.allows(Access::Read, &key) => {
                    return refuse(
                        errors::GROUP_AUTHORIZATION_FAILED,
                        "the token has no 'read' scope for this group",
                    )
                }
                GROUP_KEY => offsets_stream(&key),
                // A transactional id is written for: `write` on its name (design 0005).
                TXN_KEY if !session.grants.allows(Access::Write, &key) => {
                    return refuse(
                        errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                        "the token has no 'write' scope for this transactional id",
                    )
                }
                TXN_KEY => txn_state_stream(&key),
                _ => return refuse(errors::INVALID_REQUEST, "unknown coordinator key type"),
            };
            if !kafka.gw.routes.has_live_owner(&stream) {
                return refuse(
                    errors::COORDINATOR_NOT_AVAILABLE,
                    "the coordinator's state stream is being placed or recovered",
                );
            }
            let id = brokers::leader_for(&all, &stream);
            let b = all.iter().find(|b| b.id == id).unwrap_or(&kafka.me);
            c.with_node_id(b.id.into()).with_host(s(&b.host)).with_port(b.port)
        })
        .collect();
    if version >= 4 {
        return FindCoordinatorResponse::default().with_coordinators(answers);
    }
    let one = answers.into_iter().next().unwrap_or_default();
    FindCoordinatorResponse::default()
        .with_error_code(one.error_code)
        .with_error_message(one.error_message)
        .with_node_id(one.node_id)
        .with_host(one.host)
        .with_port(one.port)
}

/// Sends one group request to the owner of `stream`: the response body, or an error code.
/// Sends a group request for `group` (`None` for ListGroups, which names none) to the
/// coordinator that owns `stream`. The token must have `read` on the group (`manage`
/// to delete it), or the answer is GROUP_AUTHORIZATION_FAILED.
async fn call(
    kafka: &Kafka,
    session: &Session,
    group: Option<&str>,
    stream: &str,
    key: ApiKey,
    version: i16,
    body: Bytes,
) -> Result<Bytes, i16> {
    let access = if key == ApiKey::DeleteGroups {
        Access::Manage
    } else {
        Access::Read
    };
    if group.is_some_and(|g| !session.grants.allows(access, g)) {
        return Err(errors::GROUP_AUTHORIZATION_FAILED);
    }
    // JoinGroup and SyncGroup wait at the coordinator for the rest of the group by
    // design; they are long polls, bounded by the rebalance, not by the node timeout.
    let wait = match key {
        ApiKey::JoinGroup | ApiKey::SyncGroup => GROUP_WAIT,
        _ => std::time::Duration::ZERO,
    };
    let result = kafka
        .gw
        .routes
        .call_waiting(stream, false, wait, |mut c| {
            let req = GroupRequest {
                stream: stream.to_string(),
                api_key: i32::from(key as i16),
                api_version: i32::from(version),
                body: body.clone(),
                client_id: session.client_id.clone(),
                client_host: session.peer.ip().to_string(),
            };
            async move { c.group(req).await }
        })
        .await;
    match result {
        Ok(reply) => Ok(reply.body),
        Err(e) => {
            tracing::debug!(stream, error = %e, "group request not answered by a coordinator");
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

/// The response to a group request; `None` for a request that is not one.
pub async fn forward(
    kafka: &Kafka,
    session: &Session,
    kind: RequestKind,
    body: Bytes,
    version: i16,
) -> Option<ResponseKind> {
    Some(match kind {
        RequestKind::JoinGroup(r) => {
            match call_group(kafka, session, &r.group_id.0, ApiKey::JoinGroup, version, body).await {
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
            match call_group(kafka, session, &r.group_id.0, ApiKey::SyncGroup, version, body).await {
                Ok(resp) => ResponseKind::SyncGroup(resp),
                Err(code) => ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(code)),
            }
        }
        RequestKind::Heartbeat(r) => {
            match call_group(kafka, session, &r.group_id.0, ApiKey::Heartbeat, version, body).await {
                Ok(resp) => ResponseKind::Heartbeat(resp),
                Err(code) => ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(code)),
            }
        }
        RequestKind::LeaveGroup(r) => {
            match call_group(kafka, session, &r.group_id.0, ApiKey::LeaveGroup, version, body).await {
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
            let (allowed, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.topics)
                .into_iter()
                .partition(|t| session.grants.allows(Access::Read, t.name.0.as_str()));
            let (known, unknown) = split_unknown(kafka, allowed);
            r.topics = known;
            let body = if denied.is_empty() && unknown.is_empty() {
                body
            } else {
                encode(&r, version)
            };
            let resp = match call_group(kafka, session, &r.group_id.0, ApiKey::OffsetCommit, version, body).await {
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
            let (allowed, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.topics)
                .into_iter()
                .partition(|t| session.grants.allows(Access::Read, t.name.0.as_str()));
            r.topics = allowed;
            let body = if denied.is_empty() { body } else { encode(&r, version) };
            let mut resp = match call_group(kafka, session, &r.group_id.0, ApiKey::OffsetDelete, version, body).await {
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
            ResponseKind::TxnOffsetCommit(txn_offset_commit(kafka, session, r, version).await)
        }
        RequestKind::ConsumerGroupHeartbeat(r) => {
            ResponseKind::ConsumerGroupHeartbeat(consumer_heartbeat(kafka, session, r, body, version).await)
        }
        RequestKind::ConsumerGroupDescribe(r) => {
            let groups = per_group(
                kafka,
                session,
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
            let groups = groups.into_iter().map(|g| hide_unreadable(session, g)).collect();
            ResponseKind::ConsumerGroupDescribe(ConsumerGroupDescribeResponse::default().with_groups(groups))
        }
        RequestKind::OffsetFetch(r) if version >= 8 => {
            ResponseKind::OffsetFetch(offset_fetch_groups(kafka, session, r, version).await)
        }
        RequestKind::OffsetFetch(mut r) => {
            // Fetching offsets needs `read` on each topic: named topics outside the
            // token's scopes are answered TOPIC_AUTHORIZATION_FAILED, and a request for
            // all of them gets only the readable ones.
            let mut denied = vec![];
            if let Some(topics) = r.topics.as_mut() {
                let (allowed, refused): (Vec<_>, Vec<_>) = std::mem::take(topics)
                    .into_iter()
                    .partition(|t| session.grants.allows(Access::Read, t.name.0.as_str()));
                *topics = allowed;
                denied = refused;
            }
            let body = if denied.is_empty() { body } else { encode(&r, version) };
            let resp = match call_group(kafka, session, &r.group_id.0, ApiKey::OffsetFetch, version, body).await {
                Ok(resp) => resp,
                Err(code) => OffsetFetchResponse::default()
                    .with_error_code(code)
                    .with_topics(fetch_failed(r.topics.iter().flatten(), code)),
            };
            let mut resp = resp;
            resp.topics
                .retain(|t| session.grants.allows(Access::Read, t.name.0.as_str()));
            resp.topics
                .extend(fetch_failed(&denied, errors::TOPIC_AUTHORIZATION_FAILED));
            ResponseKind::OffsetFetch(resp)
        }
        RequestKind::DescribeGroups(r) => {
            let groups = per_group(
                kafka,
                session,
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
                session,
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
                    match call(kafka, session, None, &stream, ApiKey::ListGroups, version, body.clone())
                        .await
                        .and_then(|b| decode::<ListGroupsResponse>(b, version))
                    {
                        // A token lists the groups it may read.
                        Ok(resp) => groups.extend(
                            resp.groups
                                .into_iter()
                                .filter(|g| session.grants.allows(Access::Read, &g.group_id.0)),
                        ),
                        Err(code) => error = code,
                    }
                }
            }
            ResponseKind::ListGroups(ListGroupsResponse::default().with_error_code(error).with_groups(groups))
        }
        _ => return None,
    })
}

/// A described KIP-848 group names its members' topics: one the token may not read
/// makes the group TOPIC_AUTHORIZATION_FAILED, as Kafka answers, so no topic name or
/// assignment leaks past the token's scopes.
fn hide_unreadable(
    session: &Session,
    g: consumer_group_describe_response::DescribedGroup,
) -> consumer_group_describe_response::DescribedGroup {
    let unreadable = g.members.iter().any(|m| {
        let assigned = m
            .assignment
            .topic_partitions
            .iter()
            .chain(&m.target_assignment.topic_partitions)
            .map(|t| &t.topic_name);
        assigned
            .chain(&m.subscribed_topic_names)
            .any(|t| !session.grants.allows(Access::Read, t.0.as_str()))
    });
    if !unreadable {
        return g;
    }
    consumer_group_describe_response::DescribedGroup::default()
        .with_group_id(g.group_id)
        .with_error_code(errors::TOPIC_AUTHORIZATION_FAILED)
        .with_error_message(Some(s("the token may not read every topic of the group")))
}

/// A request for `group`, sent to its coordinator and its answer decoded.
async fn call_group<Resp: Decodable>(
    kafka: &Kafka,
    session: &Session,
    group: &str,
    key: ApiKey,
    version: i16,
    body: Bytes,
) -> Result<Resp, i16> {
    let stream = offsets_stream(group);
    call(kafka, session, Some(group), &stream, key, version, body)
        .await
        .and_then(|b| decode(b, version))
}

/// A request naming many groups, sent as one request per group (`one` encodes it) to
/// each group's coordinator: the answers' entries (`entries`), or `failed` for a group
/// whose coordinator did not answer.
async fn per_group<Resp: Decodable, Entry>(
    kafka: &Kafka,
    session: &Session,
    (key, version): (ApiKey, i16),
    groups: &[GroupId],
    one: impl Fn(&GroupId) -> Bytes,
    entries: impl Fn(Resp) -> Vec<Entry>,
    failed: impl Fn(&GroupId, i16) -> Entry,
) -> Vec<Entry> {
    let mut out = vec![];
    for g in groups {
        match call_group::<Resp>(kafka, session, &g.0, key, version, one(g)).await {
            Ok(resp) => out.extend(entries(resp)),
            Err(code) => out.push(failed(g, code)),
        }
    }
    out
}

/// A KIP-848 heartbeat, sent to the group's coordinator. Subscribing by name needs
/// `read` on each topic named (Kafka's DESCRIBE on the subscribed topics).
async fn consumer_heartbeat(
    kafka: &Kafka,
    session: &Session,
    r: ConsumerGroupHeartbeatRequest,
    body: Bytes,
    version: i16,
) -> ConsumerGroupHeartbeatResponse {
    let failed = |code: i16, message: Option<StrBytes>| {
        ConsumerGroupHeartbeatResponse::default()
            .with_error_code(code)
            .with_error_message(message)
            .with_member_id(Some(r.member_id.clone()))
            .with_member_epoch(-1)
    };
    let denied: Vec<&str> = r
        .subscribed_topic_names
        .iter()
        .flatten()
        .map(|t| t.0.as_str())
        .filter(|t| !session.grants.allows(Access::Read, t))
        .collect();
    // A regex may match any topic, and the coordinator resolves it without the token:
    // only a token that reads every topic (`read` with no prefix) subscribes by regex.
    let regex = r.subscribed_topic_regex.as_ref().is_some_and(|re| !re.is_empty());
    if (!denied.is_empty() || (regex && !session.grants.allows(Access::Read, "")))
        && session.grants.allows(Access::Read, &r.group_id.0)
    {
        let message = if denied.is_empty() {
            "a regex subscription needs a token whose 'read' scope covers every topic".to_string()
        } else {
            format!("the token has no 'read' scope for the subscribed topics {denied:?}")
        };
        return failed(errors::TOPIC_AUTHORIZATION_FAILED, Some(s(&message)));
    }
    match call_group(
        kafka,
        session,
        &r.group_id.0,
        ApiKey::ConsumerGroupHeartbeat,
        version,
        body,
    )
    .await
    {
        Ok(resp) => resp,
        Err(code) => failed(code, None),
    }
}

/// OffsetFetch v8+: each group asked for goes to its own coordinator, with the topics
/// the token may read (the others are answered TOPIC_AUTHORIZATION_FAILED).
async fn offset_fetch_groups(
    kafka: &Kafka,
    session: &Session,
    r: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    use offset_fetch_response::{OffsetFetchResponseGroup, OffsetFetchResponsePartitions, OffsetFetchResponseTopics};
    let mut groups = vec![];
    for mut g in r.groups {
        let id = g.group_id.clone();
        let mut denied = vec![];
        if let Some(topics) = g.topics.as_mut() {
            let (allowed, refused): (Vec<_>, Vec<_>) = std::mem::take(topics)
                .into_iter()
                .partition(|t| session.grants.allows(Access::Read, t.name.0.as_str()));
            *topics = allowed;
            denied = refused;
        }
        let one = OffsetFetchRequest::default()
            .with_groups(vec![g])
            .with_require_stable(r.require_stable);
        let answer = call_group::<OffsetFetchResponse>(
            kafka,
            session,
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
        group
            .topics
            .retain(|t| session.grants.allows(Access::Read, t.name.0.as_str()));
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
fn split_unknown(
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
async fn txn_offset_commit(
    kafka: &Kafka,
    session: &Session,
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
    if !session.grants.allows(Access::Write, r.transactional_id.as_str()) {
        return answer(&|_, _| errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
    let refusal = |topic: &str, p: i32| -> Option<i16> {
        if !session.grants.allows(Access::Read, topic) {
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
    match call_group(kafka, session, &r.group_id.0, ApiKey::TxnOffsetCommit, version, body).await {
        Ok(resp) => resp,
        Err(code) => answer(&|_, _| code),
    }
}

/// Every partition of `topics` failed with `code`, as an OffsetCommit answer.
fn commit_failed(topics: &[OffsetCommitRequestTopic], code: i16) -> Vec<OffsetCommitResponseTopic> {
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
fn fetch_failed<'a>(
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
