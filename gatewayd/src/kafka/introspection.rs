//! Read-only cluster introspection that consoles (AKHQ, Kafka UI, Redpanda Console)
//! and operators' scripts send, answered from this gateway's view (issue 59):
//! DescribeLogDirs, DescribeTopicPartitions, ListPartitionReassignments, ElectLeaders
//! and DescribeProducers (the last from each partition's owner).
//!
//! Weir's brokers are its gateways and each partition has one replica, its leader
//! gateway (`brokers`); the data itself lives in object storage, owned by one streamd
//! at a time. So a gateway's "log dirs" are the streamd nodes owning the partitions
//! it leads, a reassignment is a transfer between streamd nodes in flight, and a
//! leader election never has anything to do.

use super::brokers;
use super::caller::Caller;
use super::errors;
use super::Kafka;
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::Resource;
use weir_meta::model::{State, StreamRow};

/// Kafka's "authorized operations not asked for".
const OPERATIONS_NOT_ASKED: i32 = i32::MIN;
/// The log dir of a partition no streamd owns right now (failover is moving it).
const UNOWNED_DIR: &str = "weir:unowned";
/// Kafka's ELECTION_NOT_NEEDED and ELIGIBLE_LEADERS_NOT_AVAILABLE.
const ELECTION_NOT_NEEDED: i16 = 84;
const ELIGIBLE_LEADERS_NOT_AVAILABLE: i16 = 83;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn name(v: &str) -> TopicName {
    TopicName(s(v))
}

/// The log dir of a partition: its owning streamd.
fn log_dir(row: &StreamRow) -> String {
    row.owner
        .as_ref()
        .map_or_else(|| UNOWNED_DIR.to_string(), |o| format!("weir:streamd/{}", o.node))
}

/// A topic's partitions as `(index, row)`, in index order.
fn partitions<'s>(state: &'s State, topic: &str) -> Vec<(i32, &'s StreamRow)> {
    state.topics.get(topic).map_or_else(Vec::new, |t| {
        t.partitions
            .iter()
            .enumerate()
            .filter_map(|(i, id)| Some((i as i32, state.streams.get(id)?)))
            .collect()
    })
}

/// The names of the topics the token sees, in name order from `from` (inclusive), at
/// most `most` of them, read [`brokers::TOPICS_PER_READ`] topics per hold of the view's
/// lock: one hold over a million topics would stall the view's writer (issue 57).
fn visible_topics(kafka: &Kafka, caller: &Caller, from: &str, most: usize) -> Vec<String> {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    let mut out: Vec<String> = vec![];
    let mut after: Option<String> = None;
    loop {
        let start = match &after {
            Some(last) => (Excluded(last.clone()), Unbounded),
            None => (Included(from.to_string()), Unbounded),
        };
        let read = kafka.gw.routes.view().with(|s| {
            let mut read = 0;
            for name in s
                .topics
                .range::<String, _>(start)
                .map(|(n, _)| n)
                .take(brokers::TOPICS_PER_READ)
            {
                read += 1;
                after = Some(name.clone());
                if out.len() < most && brokers::visible(caller, Resource::Topic(name)) {
                    out.push(name.clone());
                }
            }
            read
        });
        if read < brokers::TOPICS_PER_READ || out.len() >= most {
            return out;
        }
    }
}

/// DescribeLogDirs: the partitions this gateway leads (each partition is reported by
/// exactly one broker, so a console summing over brokers counts it once), grouped by
/// the streamd that owns them, each with the bytes its committed ranges hold. The
/// object store's capacity is not known, so v4's totals are −1.
pub fn describe_log_dirs(kafka: &Kafka, caller: &Caller, r: DescribeLogDirsRequest) -> DescribeLogDirsResponse {
    let wanted: Vec<(String, Option<Vec<i32>>)> = match &r.topics {
        None => visible_topics(kafka, caller, "", usize::MAX)
            .into_iter()
            .map(|t| (t, None))
            .collect(),
        Some(topics) => topics
            .iter()
            .map(|t| (t.topic.0.to_string(), Some(t.partitions.clone())))
            .collect(),
    };
    // dir → topic → partitions, filled a chunk of topics per hold of the view's lock.
    let mut dirs: BTreeMap<String, BTreeMap<String, Vec<DescribeLogDirsPartition>>> = BTreeMap::new();
    for chunk in wanted.chunks(brokers::TOPICS_PER_READ) {
        kafka.gw.routes.view().with(|state| {
            let brokers = brokers::brokers_in(kafka, state);
            for (topic, only) in chunk {
                if !brokers::visible(caller, Resource::Topic(topic)) {
                    continue;
                }
                for (index, row) in partitions(state, topic) {
                    if only.as_ref().is_some_and(|o| !o.contains(&index)) {
                        continue;
                    }
                    if brokers::leader_for(&brokers, &row.name) != kafka.me.id {
                        continue;
                    }
                    dirs.entry(log_dir(row))
                        .or_default()
                        .entry(topic.clone())
                        .or_default()
                        .push(
                            DescribeLogDirsPartition::default()
                                .with_partition_index(index)
                                .with_partition_size(i64::try_from(row.bytes).unwrap_or(i64::MAX))
                                .with_offset_lag(0),
                        );
                }
            }
        });
    }
    let results = dirs
        .into_iter()
        .map(|(dir, topics)| {
            DescribeLogDirsResult::default()
                .with_log_dir(s(&dir))
                .with_total_bytes(-1)
                .with_usable_bytes(-1)
                .with_topics(
                    topics
                        .into_iter()
                        .map(|(t, ps)| DescribeLogDirsTopic::default().with_name(name(&t)).with_partitions(ps))
                        .collect(),
                )
        })
        .collect();
    DescribeLogDirsResponse::default().with_results(results)
}

/// DescribeTopicPartitions (KIP-966): Metadata's partition view, paged by a cursor
/// and a partition limit, the topics in name order. An empty list asks for every
/// topic the token sees.
pub fn describe_topic_partitions(
    kafka: &Kafka,
    caller: &Caller,
    r: DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    let limit = usize::try_from(r.response_partition_limit.clamp(1, 2000)).unwrap_or(2000);
    // Every topic has a partition, so no page holds more than `limit` topics: an empty
    // list reads that many names from the cursor on, never every topic.
    let asked: Vec<String> = if r.topics.is_empty() {
        let from = r.cursor.as_ref().map_or(String::new(), |c| c.topic_name.0.to_string());
        visible_topics(kafka, caller, &from, limit + 1)
    } else {
        r.topics.iter().map(|t| t.name.0.to_string()).collect()
    };
    kafka.gw.routes.view().with(|state| {
        let brokers = brokers::brokers_in(kafka, state);
        let gateways = weir_meta::model::leader_epochs::gateway_changes(state);
        let mut wanted = asked.clone();
        wanted.sort();
        wanted.dedup();
        let (start_topic, start_partition) = r.cursor.as_ref().map_or((String::new(), 0), |c| {
            (c.topic_name.0.to_string(), c.partition_index.max(0))
        });
        let mut topics = vec![];
        let mut room = limit;
        let mut next_cursor = None;
        for topic in wanted.into_iter().filter(|t| *t >= start_topic) {
            let first = if topic == start_topic { start_partition } else { 0 };
            let row = state.topics.get(&topic);
            let answer = DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(name(&topic)))
                .with_topic_authorized_operations(OPERATIONS_NOT_ASKED);
            let Some(row) = row.filter(|_| brokers::visible(caller, Resource::Topic(&topic))) else {
                let code = if brokers::visible(caller, Resource::Topic(&topic)) {
                    errors::UNKNOWN_TOPIC_OR_PARTITION
                } else {
                    errors::TOPIC_AUTHORIZATION_FAILED
                };
                topics.push(answer.with_error_code(code));
                continue;
            };
            if room == 0 {
                next_cursor = Some(
                    Cursor::default()
                        .with_topic_name(name(&topic))
                        .with_partition_index(first),
                );
                break;
            }
            let mut parts = vec![];
            for (index, stream) in partitions(state, &topic).into_iter().filter(|(i, _)| *i >= first) {
                if room == 0 {
                    next_cursor = Some(
                        Cursor::default()
                            .with_topic_name(name(&topic))
                            .with_partition_index(index),
                    );
                    break;
                }
                let leader = BrokerId(brokers::leader_for(&brokers, &stream.name));
                let epoch = super::leader_epochs::in_state(state, gateways, &stream.name).unwrap_or(-1);
                parts.push(
                    DescribeTopicPartitionsResponsePartition::default()
                        .with_partition_index(index)
                        .with_leader_id(leader)
                        .with_leader_epoch(epoch)
                        .with_replica_nodes(vec![leader])
                        .with_isr_nodes(vec![leader])
                        .with_eligible_leader_replicas(Some(vec![]))
                        .with_last_known_elr(Some(vec![])),
                );
                room -= 1;
            }
            topics.push(
                answer
                    .with_topic_id(brokers::topic_id(row))
                    .with_is_internal(brokers::is_internal_topic(&topic))
                    .with_partitions(parts),
            );
            if next_cursor.is_some() {
                break;
            }
        }
        DescribeTopicPartitionsResponse::default()
            .with_topics(topics)
            .with_next_cursor(next_cursor)
    })
}

/// ListPartitionReassignments: Weir's transfers in flight (a stream marked to move to
/// another streamd). The partition's broker-level replica set does not change in a
/// transfer (its one replica is its leader gateway), so nothing is adding or removing.
pub fn list_partition_reassignments(
    kafka: &Kafka,
    caller: &Caller,
    r: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    let moving = kafka.gw.routes.view().with(|state| {
        let brokers = brokers::brokers_in(kafka, state);
        let mut by_topic: BTreeMap<String, Vec<OngoingPartitionReassignment>> = BTreeMap::new();
        for id in state.streams.marked() {
            let Some(row) = state.streams.get(id) else { continue };
            let (Some(topic), Some(index)) = (&row.topic, row.partition) else {
                continue;
            };
            let asked = r.topics.as_ref().is_none_or(|ts| {
                ts.iter()
                    .any(|t| t.name.0.as_str() == topic && t.partition_indexes.contains(&(index as i32)))
            });
            if !asked || !brokers::visible(caller, Resource::Topic(topic)) {
                continue;
            }
            let leader = BrokerId(brokers::leader_for(&brokers, &row.name));
            by_topic.entry(topic.clone()).or_default().push(
                OngoingPartitionReassignment::default()
                    .with_partition_index(index as i32)
                    .with_replicas(vec![leader]),
            );
        }
        by_topic
    });
    ListPartitionReassignmentsResponse::default().with_topics(
        moving
            .into_iter()
            .map(|(t, ps)| {
                OngoingTopicReassignment::default()
                    .with_name(name(&t))
                    .with_partitions(ps)
            })
            .collect(),
    )
}

/// ElectLeaders: each partition's leader is already its one replica, so there is no
/// election to hold (ELECTION_NOT_NEEDED), unless no streamd owns it right now
/// (ELIGIBLE_LEADERS_NOT_AVAILABLE, until failover places it). Asking needs `manage`.
pub fn elect_leaders(kafka: &Kafka, caller: &Caller, r: ElectLeadersRequest) -> ElectLeadersResponse {
    // (topic, its partitions asked for; None: all of them)
    let wanted: Vec<(String, Option<Vec<i32>>)> = match &r.topic_partitions {
        Some(tps) => tps
            .iter()
            .map(|t| (t.topic.0.to_string(), Some(t.partitions.clone())))
            .collect(),
        None => visible_topics(kafka, caller, "", usize::MAX)
            .into_iter()
            .map(|t| (t, None))
            .collect(),
    };
    let mut results = vec![];
    for chunk in wanted.chunks(brokers::TOPICS_PER_READ) {
        results.extend(kafka.gw.routes.view().with(|state| elect_in(state, caller, chunk)));
    }
    ElectLeadersResponse::default().with_replica_election_results(results)
}

/// ElectLeaders' answers for `wanted` topics, from one state.
fn elect_in(state: &State, caller: &Caller, wanted: &[(String, Option<Vec<i32>>)]) -> Vec<ReplicaElectionResult> {
    wanted
        .iter()
        .map(|(topic, asked)| {
            let rows = partitions(state, topic);
            let indexes = asked.clone().unwrap_or_else(|| rows.iter().map(|(i, _)| *i).collect());
            let results = indexes
                .into_iter()
                .map(|index| {
                    let (code, message) = if !caller.grants.allows(Operation::Alter, Resource::Topic(topic)) {
                        (
                            errors::TOPIC_AUTHORIZATION_FAILED,
                            format!("user may not alter topic '{topic}'"),
                        )
                    } else {
                        match rows.iter().find(|(i, _)| *i == index) {
                            None => (
                                errors::UNKNOWN_TOPIC_OR_PARTITION,
                                format!("{topic}/{index} does not exist"),
                            ),
                            Some((_, row)) if row.owner.is_none() => (
                                ELIGIBLE_LEADERS_NOT_AVAILABLE,
                                "no streamd owns the partition now; failover is placing it".to_string(),
                            ),
                            Some(_) => (
                                ELECTION_NOT_NEEDED,
                                "the partition's one replica is its leader".to_string(),
                            ),
                        }
                    };
                    PartitionResult::default()
                        .with_partition_id(index)
                        .with_error_code(code)
                        .with_error_message(Some(s(&message)))
                })
                .collect();
            ReplicaElectionResult::default()
                .with_topic(name(topic))
                .with_partition_result(results)
        })
        .collect()
}

/// DescribeProducers: the producers each partition's owner remembers (idempotent and
/// transactional, with the open transaction's first offset). Needs `read` on the topic.
/// Weir keeps no per-producer timestamp or coordinator epoch: both are −1.
pub async fn describe_producers(
    kafka: &Kafka,
    caller: &Caller,
    r: DescribeProducersRequest,
) -> DescribeProducersResponse {
    use describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
    let mut topics = vec![];
    for t in r.topics {
        let topic = t.name.0.to_string();
        let known = kafka
            .gw
            .routes
            .view()
            .with(|s| s.topics.get(&topic).map(|t| t.partitions.len()));
        let mut partitions = vec![];
        for index in t.partition_indexes {
            let answer = PartitionResponse::default().with_partition_index(index);
            let failed =
                |code: i16, why: String| answer.clone().with_error_code(code).with_error_message(Some(s(&why)));
            if !caller.grants.allows(Operation::Read, Resource::Topic(&topic)) {
                partitions.push(failed(
                    errors::TOPIC_AUTHORIZATION_FAILED,
                    format!("user may not read topic '{topic}'"),
                ));
                continue;
            }
            if !known.is_some_and(|n| (0..n as i32).contains(&index)) {
                partitions.push(failed(
                    errors::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("{topic}/{index} does not exist"),
                ));
                continue;
            }
            let stream = format!("{topic}/{index}");
            let asked = kafka
                .gw
                .routes
                .call(&stream, true, |mut c| {
                    let req = weir_proto::streamd::ProducersRequest { stream: stream.clone() };
                    async move { c.producers(req).await }
                })
                .await;
            partitions.push(match asked {
                Ok(reply) => answer.with_active_producers(
                    reply
                        .producers
                        .into_iter()
                        .map(|p| {
                            ProducerState::default()
                                .with_producer_id(p.producer_id.into())
                                .with_producer_epoch(p.producer_epoch)
                                .with_last_sequence(p.last_sequence)
                                .with_last_timestamp(-1)
                                .with_coordinator_epoch(-1)
                                .with_current_txn_start_offset(p.current_txn_start_offset)
                        })
                        .collect(),
                ),
                Err(e) => failed(errors::route(&e), e.to_string()),
            });
        }
        topics.push(TopicResponse::default().with_name(t.name).with_partitions(partitions));
    }
    DescribeProducersResponse::default().with_topics(topics)
}
