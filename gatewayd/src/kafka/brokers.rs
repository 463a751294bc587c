//! Gateways as Kafka brokers: their ids and addresses from the view, the leader each
//! partition is given, and the Metadata and DescribeCluster answers.
//!
//! Any gateway can serve any partition (it routes to the owner), so a partition's
//! "leader" is a live gateway picked by hashing the partition, which spreads clients
//! over the gateways; its leader epoch grows with every move of the stream and every
//! change of the live gateways (`leader_epochs`).

use super::caller::Caller;
use super::errors;
use super::Kafka;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, DescribeClusterResponse, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::Resource;
use weir_meta::model::{Command, NodeKind, State, StreamConfig, TopicRow};

pub use weir_meta::model::names::OFFSETS_TOPIC;
pub const CLUSTER_ID: &str = "weir";

/// One gateway as a broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broker {
    pub id: i32,
    pub host: String,
    pub port: i32,
}

/// Topics whose names start with `__` are the system's own (Kafka's convention).
pub fn is_internal_topic(name: &str) -> bool {
    name.starts_with("__")
}

/// Whether a stream is a partition of an internal topic.
pub fn is_internal_stream(stream: &str) -> bool {
    stream
        .split_once('/')
        .is_some_and(|(topic, _)| is_internal_topic(topic))
}

/// A stable broker id for a gateway's name.
pub fn broker_id(node: &str) -> i32 {
    (crc32c::crc32c(node.as_bytes()) & 0x7fff_ffff) as i32
}

pub fn split_host_port(addr: &str) -> Option<(String, i32)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| (host.to_string(), i32::from(port)))
}

/// Live gateways (this one always included), ordered by id.
pub fn brokers(kafka: &Kafka) -> Vec<Broker> {
    kafka.gw.routes.view().with(|s| brokers_in(kafka, s))
}

/// [`brokers`] in `state`.
pub(super) fn brokers_in(kafka: &Kafka, state: &State) -> Vec<Broker> {
    let mut out: Vec<Broker> = state
        .nodes
        .values()
        .filter(|n| n.kind == NodeKind::Gatewayd && !n.fenced && !n.terminating)
        .filter_map(|n| {
            let (host, port) = split_host_port(&n.addrs.grpc)?;
            Some(Broker {
                id: broker_id(n.id.as_str()),
                host,
                port,
            })
        })
        .collect();
    if !out.iter().any(|b| b.id == kafka.me.id) {
        out.push(kafka.me.clone());
    }
    out.sort_by_key(|b| b.id);
    out
}

/// The gateway clients are sent to for `key` (a partition's stream or a group).
pub fn leader_for(brokers: &[Broker], key: &str) -> i32 {
    if brokers.is_empty() {
        return -1;
    }
    brokers[(crc32c::crc32c(key.as_bytes()) as usize) % brokers.len()].id
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

pub fn topic_id(t: &TopicRow) -> uuid::Uuid {
    uuid::Uuid::from_bytes(t.topic_id)
}

/// A topic's partitions, their leaders and leader epochs, all from one `state` (the
/// brokers too), so no answer pairs one state's leader with another's epoch.
fn topic_metadata(t: &TopicRow, brokers: &[Broker], state: &State, gateways: u64) -> MetadataResponseTopic {
    let partitions = (0..t.partitions.len() as i32)
        .map(|p| {
            let stream = format!("{}/{p}", t.name);
            let leader = BrokerId(leader_for(brokers, &stream));
            let epoch = super::leader_epochs::in_state(state, gateways, &stream);
            MetadataResponsePartition::default()
                .with_partition_index(p)
                .with_leader_id(leader)
                .with_leader_epoch(epoch.unwrap_or(-1))
                .with_replica_nodes(vec![leader])
                .with_isr_nodes(vec![leader])
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(s(&t.name))))
        .with_topic_id(topic_id(t))
        .with_is_internal(is_internal_topic(&t.name))
        .with_partitions(partitions)
}

pub async fn metadata(kafka: &Kafka, caller: &Caller, r: MetadataRequest, version: i16) -> MetadataResponse {
    let admitted = kafka.gw.routes.is_admitted();
    if admitted && r.topics.is_none() {
        // A token sees the topics it has any scope on.
        let (brokers, topics) = every_topic(kafka, caller);
        return response(&brokers, kafka, topics);
    }
    // The brokers and every topic found, from one read of the view.
    let (brokers, described) = kafka.gw.routes.view().with(|s| {
        let brokers = brokers_in(kafka, s);
        let gateways = weir_meta::model::leader_epochs::gateway_changes(s);
        let described: Vec<Option<(String, MetadataResponseTopic)>> = match &r.topics {
            Some(wanted) if admitted => wanted
                .iter()
                .map(|w| {
                    let t = match &w.name {
                        Some(n) => s.topics.get(n.0.as_str()),
                        None => s.topics.values().find(|t| topic_id(t) == w.topic_id),
                    }?;
                    Some((t.name.clone(), topic_metadata(t, &brokers, s, gateways)))
                })
                .collect(),
            _ => vec![],
        };
        (brokers, described)
    });
    let topics: Vec<MetadataResponseTopic> = match r.topics {
        // RR-FEN-2: before this gateway has caught up with the metadata log its view may
        // be stale or empty, so nothing is answered from it: each named topic is
        // LEADER_NOT_AVAILABLE (retryable), never UNKNOWN_TOPIC_OR_PARTITION, and an
        // empty list asks for brokers only. A request for every topic never gets here
        // then: its connection is closed (conn.rs).
        wanted if !admitted => wanted
            .unwrap_or_default()
            .into_iter()
            .map(|w| {
                MetadataResponseTopic::default()
                    .with_name(w.name)
                    .with_topic_id(w.topic_id)
                    .with_error_code(errors::LEADER_NOT_AVAILABLE)
            })
            .collect(),
        // Answered by `every_topic` above.
        None => vec![],
        Some(wanted) => {
            let mut out = vec![];
            for (w, found) in wanted.into_iter().zip(described) {
                out.push(match (found, w.name) {
                    (Some((t, _)), _) if !visible(caller, Resource::Topic(&t)) => MetadataResponseTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_string(t))))
                        .with_error_code(errors::TOPIC_AUTHORIZATION_FAILED),
                    (Some((_, described)), _) => described,
                    (None, Some(name)) if !visible(caller, Resource::Topic(name.0.as_str())) => {
                        MetadataResponseTopic::default()
                            .with_name(Some(name))
                            .with_error_code(errors::TOPIC_AUTHORIZATION_FAILED)
                    }
                    (None, Some(name)) => {
                        // Before v4 the request cannot say; Kafka then creates when enabled.
                        // Creating needs the `manage` scope.
                        let allowed = (version < 4 || r.allow_auto_topic_creation)
                            && caller
                                .grants
                                .allows(Operation::Create, Resource::Topic(name.0.as_str()));
                        let code = if kafka.auto_create_topics && allowed {
                            auto_create(kafka, caller, name.0.as_str()).await
                        } else {
                            errors::UNKNOWN_TOPIC_OR_PARTITION
                        };
                        MetadataResponseTopic::default()
                            .with_name(Some(name))
                            .with_error_code(code)
                    }
                    (None, None) => MetadataResponseTopic::default()
                        .with_topic_id(w.topic_id)
                        .with_error_code(errors::UNKNOWN_TOPIC_ID),
                });
            }
            out
        }
    };
    response(&brokers, kafka, topics)
}

/// Topics described per hold of the view's lock: describing a million topics in one
/// hold would stall the view's writer, and every reader behind it, for as long (issue 57).
pub(super) const TOPICS_PER_READ: usize = 1_000;

/// Every topic a token sees (any scope on it), read from the view a chunk at a time in
/// name order. Each topic's leader and epoch come from one state; if the live gateways
/// change between chunks, leaders and epochs of earlier chunks would not match later
/// ones, so the listing starts over.
fn every_topic(kafka: &Kafka, caller: &Caller) -> (Vec<Broker>, Vec<MetadataResponseTopic>) {
    use std::ops::Bound::{Excluded, Unbounded};
    'listing: loop {
        let mut first: Option<(Vec<Broker>, u64)> = None;
        let mut topics = vec![];
        let mut after: Option<String> = None;
        loop {
            // Some(the chunk's last topic) while there may be more, None at the end,
            // Err to start over.
            let step = kafka.gw.routes.view().with(|s| {
                let brokers = brokers_in(kafka, s);
                let gateways = weir_meta::model::leader_epochs::gateway_changes(s);
                match &first {
                    Some((b, g)) if (b, *g) != (&brokers, gateways) => return Err(()),
                    Some(_) => {}
                    None => first = Some((brokers, gateways)),
                }
                let brokers = &first.as_ref().expect("set above").0;
                let chunk = match &after {
                    None => s.topics.range::<String, _>(..),
                    Some(a) => s.topics.range::<String, _>((Excluded(a), Unbounded)),
                };
                let (mut read, mut last) = (0, None);
                for t in chunk.map(|(_, t)| t).take(TOPICS_PER_READ) {
                    if visible(caller, Resource::Topic(&t.name)) {
                        topics.push(topic_metadata(t, brokers, s, gateways));
                    }
                    (read, last) = (read + 1, Some(t));
                }
                if let Some(t) = last.filter(|_| read == TOPICS_PER_READ) {
                    return Ok(Some(t.name.clone()));
                }
                Ok(None)
            });
            match step {
                Err(()) => continue 'listing,
                Ok(None) => return (first.expect("set by the first chunk").0, topics),
                // The next chunk starts after the last topic of this one.
                Ok(Some(last)) => after = Some(last),
            }
        }
    }
}

fn response(brokers: &[Broker], kafka: &Kafka, topics: Vec<MetadataResponseTopic>) -> MetadataResponse {
    MetadataResponse::default()
        .with_brokers(
            brokers
                .iter()
                .map(|b| {
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(b.id))
                        .with_host(s(&b.host))
                        .with_port(b.port)
                })
                .collect(),
        )
        .with_cluster_id(Some(s(CLUSTER_ID)))
        .with_controller_id(BrokerId(kafka.me.id))
        .with_topics(topics)
}

/// Creates a topic a client asked for; the client retries on LEADER_NOT_AVAILABLE.
async fn auto_create(kafka: &Kafka, caller: &Caller, name: &str) -> i16 {
    if weir_meta::model::validate_name("topic", name).is_err() || is_internal_topic(name) {
        return errors::INVALID_TOPIC_EXCEPTION;
    }
    let cmd = Command::CreateTopic {
        name: name.to_string(),
        partitions: kafka.default_partitions,
        config: StreamConfig::default(),
    };
    match kafka.gw.metad.propose(&caller.proposer(), cmd).await {
        Ok((index, _)) => {
            tracing::info!(
                topic = name,
                partitions = kafka.default_partitions,
                "auto-created a topic a Kafka client asked for"
            );
            kafka.gw.settle(index).await;
            errors::LEADER_NOT_AVAILABLE
        }
        // metad refused this user (D-21): retrying would not help.
        Err(e) if e.code() == weir_shared::error_code::ErrorCode::Forbidden => errors::TOPIC_AUTHORIZATION_FAILED,
        Err(_) => errors::LEADER_NOT_AVAILABLE,
    }
}

pub fn describe_cluster(kafka: &Kafka) -> DescribeClusterResponse {
    DescribeClusterResponse::default()
        .with_cluster_id(s(CLUSTER_ID))
        .with_controller_id(BrokerId(kafka.me.id))
        .with_brokers(
            brokers(kafka)
                .into_iter()
                .map(|b| {
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(b.id))
                        .with_host(s(&b.host))
                        .with_port(b.port)
                })
                .collect(),
        )
}

/// Whether the caller may see `resource` (a topic in Metadata, a transactional id in
/// the transaction APIs): DESCRIBE on it, which reading, writing, deleting or altering
/// it implies.
pub(super) fn visible(caller: &Caller, resource: Resource<'_>) -> bool {
    caller.grants.allows(Operation::Describe, resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(split_host_port("gw-1:9092"), Some(("gw-1".into(), 9092)));
        assert_eq!(split_host_port("[::1]:9092"), Some(("::1".into(), 9092)));
        assert_eq!(split_host_port("nope"), None);
        assert_eq!(split_host_port(":9092"), None);
    }

    /// Leaders of `t/0`..`t/7` over brokers 1, 2, 3 (crc32c of the key, modulo 3).
    const PINNED_LEADERS: [i32; 8] = [1, 3, 3, 1, 1, 2, 3, 1];

    #[test]
    fn leaders_are_spread_and_stable() {
        let b = |id| Broker {
            id,
            host: "h".into(),
            port: 1,
        };
        let brokers = vec![b(1), b(2), b(3)];
        let leaders: std::collections::BTreeSet<i32> =
            (0..32).map(|p| leader_for(&brokers, &format!("t/{p}"))).collect();
        assert_eq!(leaders.len(), 3);
        // Stable across processes and releases: every gateway sends a partition's clients
        // to the same broker, so the mapping is pinned, not recomputed here.
        let pinned: Vec<i32> = (0..8).map(|p| leader_for(&brokers, &format!("t/{p}"))).collect();
        assert_eq!(pinned, PINNED_LEADERS, "the partition → gateway mapping changed");
        assert_eq!(leader_for(&[], "t/0"), -1);
        assert!(broker_id("gw-1") >= 0);
    }
}
