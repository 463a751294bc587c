//! KIP-848 consumer groups: the heartbeat's topic checks and a described group's
//! unreadable topics hidden; its own file as the new protocol's authorization.

use super::calls::call_group;
use super::s;
use crate::kafka::caller::Caller;
use crate::kafka::errors;
use crate::kafka::Kafka;
use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_meta::model::acls::{Operation, ResourceType};
use weir_meta::model::grants::Resource;

/// A described KIP-848 group names its members' topics: one the token may not read
/// makes the group TOPIC_AUTHORIZATION_FAILED, as Kafka answers, so no topic name or
/// assignment leaks past the token's scopes.
pub(super) fn hide_unreadable(
    caller: &Caller,
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
            .any(|t| !caller.grants.allows(Operation::Read, Resource::Topic(t.0.as_str())))
    });
    if !unreadable {
        return g;
    }
    consumer_group_describe_response::DescribedGroup::default()
        .with_group_id(g.group_id)
        .with_error_code(errors::TOPIC_AUTHORIZATION_FAILED)
        .with_error_message(Some(s("the token may not read every topic of the group")))
}

/// A KIP-848 heartbeat, sent to the group's coordinator. Subscribing by name needs
/// `read` on each topic named (Kafka's DESCRIBE on the subscribed topics).
pub(super) async fn consumer_heartbeat(
    kafka: &Kafka,
    caller: &Caller,
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
        .filter(|t| !caller.grants.allows(Operation::Read, Resource::Topic(t)))
        .collect();
    // A regex may match any topic, and the coordinator resolves it without the token:
    // only a token that reads every topic (`read` with no prefix) subscribes by regex.
    let regex = r.subscribed_topic_regex.as_ref().is_some_and(|re| !re.is_empty());
    if (!denied.is_empty() || (regex && !caller.grants.allows_every(Operation::Read, ResourceType::Topic)))
        && caller.grants.allows(Operation::Read, Resource::Group(&r.group_id.0))
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
        caller,
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
