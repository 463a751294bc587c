//! FindCoordinator: which gateway answers for a group or a transactional id, and the
//! internal topics created on first use; its own file as the lookup, apart from the
//! requests then sent to the coordinator.

use super::s;
use crate::kafka::brokers::{self, OFFSETS_TOPIC};
use crate::kafka::caller::Caller;
use crate::kafka::errors;
use crate::kafka::Kafka;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::Resource;
use weir_meta::model::names::{offsets_stream, OFFSETS_PARTITIONS};
use weir_meta::model::names::{txn_state_stream, TXN_STATE_PARTITIONS, TXN_STATE_TOPIC};
use weir_meta::model::{Command, Proposer, StreamConfig};

const GROUP_KEY: i8 = 0;
/// FindCoordinator's key type for a transactional id.
const TXN_KEY: i8 = 1;

/// Creates an internal topic (the offsets or the transaction-state topic) on first
/// use, with every partition its keys hash over.
pub(in crate::kafka) async fn ensure_internal_topic(kafka: &Kafka, topic: &str, partitions: u32) {
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
    caller: &Caller,
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
                GROUP_KEY if !caller.grants.allows(Operation::Describe, Resource::Group(&key)) => {
                    return refuse(
                        errors::GROUP_AUTHORIZATION_FAILED,
                        "the token has no 'read' scope for this group",
                    )
                }
                GROUP_KEY => offsets_stream(&key),
                // A transactional id is written for: `write` on its name (design 0005).
                TXN_KEY
                    if !caller
                        .grants
                        .allows(Operation::Describe, Resource::TransactionalId(&key)) =>
                {
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
