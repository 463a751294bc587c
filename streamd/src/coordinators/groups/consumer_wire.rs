//! ConsumerGroupHeartbeat and ConsumerGroupDescribe on the wire: request checks as
//! Kafka makes them per version, and the conversions between the protocol's messages and
//! the state machine of `consumer_group/`.

use super::assignor::Assignment;
use super::consumer_group::{self as cg, code, ConsumerGroup, Heartbeat, Settings};
use super::{s, Client, GroupCoordinator};
use crate::node::core_api::CoreApi;
use kafka_protocol::messages::consumer_group_describe_response as describe_response;
use kafka_protocol::messages::consumer_group_heartbeat_response as heartbeat_response;
use kafka_protocol::messages::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use uuid::Uuid;
use weir_meta::model::names::OFFSETS_TOPIC;

/// The topics of a node's metadata view, for resolving subscriptions.
struct ViewTopics<'a>(&'a weir_meta::model::State);

impl cg::Topics for ViewTopics<'_> {
    fn get(&self, name: &str) -> Option<(Uuid, u32)> {
        self.0
            .topics
            .get(name)
            .filter(|t| !t.partitions.is_empty())
            .map(|t| (Uuid::from_bytes(t.topic_id), t.partitions.len() as u32))
    }

    /// Internal topics (the offsets topic) never match a regex, as in Kafka.
    fn matching(&self, re: &regex::Regex) -> Vec<String> {
        self.0
            .topics
            .keys()
            .filter(|n| n.as_str() != OFFSETS_TOPIC && re.is_match(n))
            .cloned()
            .collect()
    }

    fn version(&self) -> u64 {
        self.0.applied_index
    }
}

pub fn settings(core: &CoreApi) -> Settings {
    Settings {
        heartbeat_interval: core.tunables().consumer_heartbeat_interval,
        session_timeout: core.tunables().consumer_session_timeout,
        max_size: core.tunables().max_group_members,
    }
}

/// Kafka's checks of a ConsumerGroupHeartbeat before it reaches the group.
fn invalid(r: &ConsumerGroupHeartbeatRequest, version: i16) -> Option<&'static str> {
    let joining = r.member_epoch == 0;
    if r.group_id.0.is_empty() {
        Some("GroupId can't be empty.")
    } else if r.instance_id.as_ref().is_some_and(|i| i.is_empty()) {
        Some("InstanceId can't be empty.")
    } else if r.rack_id.as_ref().is_some_and(|i| i.is_empty()) {
        Some("RackId can't be empty.")
    } else if r.member_epoch < cg::LEAVE_STATIC_EPOCH {
        Some("MemberEpoch is invalid.")
    } else if (version >= 1 || !joining) && r.member_id.is_empty() {
        Some("MemberId can't be empty.")
    } else if r.member_epoch == cg::LEAVE_STATIC_EPOCH && r.instance_id.is_none() {
        Some("InstanceId can't be null when MemberEpoch is -2.")
    } else if joining && r.rebalance_timeout_ms == -1 {
        Some("RebalanceTimeoutMs must be provided in first request.")
    } else if joining && r.topic_partitions.as_ref().is_none_or(|t| !t.is_empty()) {
        Some("TopicPartitions must be empty when (re-)joining.")
    } else if joining && r.subscribed_topic_names.is_none() && r.subscribed_topic_regex.is_none() {
        Some("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
    } else {
        None
    }
}

fn owned(r: &ConsumerGroupHeartbeatRequest) -> Option<Assignment> {
    r.topic_partitions.as_ref().map(|tps| {
        let mut a = Assignment::new();
        for tp in tps {
            a.entry(tp.topic_id).or_default().extend(tp.partitions.iter().copied());
        }
        a
    })
}

pub fn heartbeat(
    core: &CoreApi,
    c: &GroupCoordinator,
    r: ConsumerGroupHeartbeatRequest,
    version: i16,
    client: Client,
) -> ConsumerGroupHeartbeatResponse {
    let settings = settings(core);
    let fail = |error: i16, message: String| {
        ConsumerGroupHeartbeatResponse::default()
            .with_error_code(error)
            .with_error_message(Some(s(&message)))
            .with_member_id(Some(r.member_id.clone()))
            .with_member_epoch(-1)
    };
    if let Some(why) = invalid(&r, version) {
        return fail(code::INVALID_REQUEST, why.to_string());
    }
    let group = r.group_id.0.to_string();
    let hb = Heartbeat {
        member_id: r.member_id.to_string(),
        member_epoch: r.member_epoch,
        instance_id: r.instance_id.as_ref().map(|i| i.to_string()),
        rack_id: r.rack_id.as_ref().map(|i| i.to_string()),
        rebalance_timeout: (r.rebalance_timeout_ms >= 0).then(|| Duration::from_millis(r.rebalance_timeout_ms as u64)),
        subscribed_names: r
            .subscribed_topic_names
            .as_ref()
            .map(|ns| ns.iter().map(|n| n.0.to_string()).collect()),
        subscribed_regex: r.subscribed_topic_regex.as_ref().map(|re| re.to_string()),
        assignor: r.server_assignor.as_ref().map(|a| a.to_string()),
        owned: owned(&r),
        client_id: client.id,
        client_host: client.host,
    };
    // The coordinator's lock, then the view's, held only while this group resolves.
    let answer = c.with(|st| {
        core.view().with(|view| {
            // A classic group with members is not a consumer group; an empty one (only
            // committed offsets) becomes one.
            if st.groups.get(&group).is_some_and(|g| !g.is_empty()) {
                return Err((
                    kafka_protocol::ResponseError::GroupIdNotFound.code(),
                    format!("Group {group} is not a consumer group."),
                ));
            }
            if r.member_epoch < 0 && !st.consumer_groups.contains_key(&group) {
                return Err((
                    kafka_protocol::ResponseError::GroupIdNotFound.code(),
                    format!("Consumer group {group} not found."),
                ));
            }
            st.groups.remove(&group);
            let g = st
                .consumer_groups
                .entry(group.clone())
                .or_insert_with(|| ConsumerGroup::new(&group));
            Ok(g.heartbeat(hb, &ViewTopics(view), settings, Instant::now()))
        })
    });
    let a = match answer {
        Ok(a) => a,
        Err((error, message)) => return fail(error, message),
    };
    if a.error != code::NONE {
        return fail(a.error, a.message.unwrap_or_default());
    }
    ConsumerGroupHeartbeatResponse::default()
        .with_member_id(Some(s(&a.member_id)))
        .with_member_epoch(a.member_epoch)
        .with_heartbeat_interval_ms(settings.heartbeat_interval.as_millis() as i32)
        .with_assignment(a.assignment.map(|parts| {
            heartbeat_response::Assignment::default().with_topic_partitions(
                parts
                    .into_iter()
                    .map(|(t, ps)| {
                        heartbeat_response::TopicPartitions::default()
                            .with_topic_id(t)
                            .with_partitions(ps.into_iter().collect())
                    })
                    .collect(),
            )
        }))
}

pub fn describe(
    core: &CoreApi,
    c: &GroupCoordinator,
    r: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    let names: BTreeMap<Uuid, String> = core.view().with(|v| {
        v.topics
            .values()
            .map(|t| (Uuid::from_bytes(t.topic_id), t.name.clone()))
            .collect()
    });
    let wire = |a: &Assignment| {
        describe_response::Assignment::default().with_topic_partitions(
            a.iter()
                .map(|(t, ps)| {
                    describe_response::TopicPartitions::default()
                        .with_topic_id(*t)
                        .with_topic_name(TopicName(s(names.get(t).map_or("", String::as_str))))
                        .with_partitions(ps.iter().copied().collect())
                })
                .collect(),
        )
    };
    c.with(|st| {
        let groups = r
            .group_ids
            .iter()
            .map(|id| {
                let described = describe_response::DescribedGroup::default().with_group_id(id.clone());
                match st.consumer_groups.get(id.0.as_str()) {
                    Some(g) => described
                        .with_group_state(s(g.state_name()))
                        .with_group_epoch(g.epoch)
                        .with_assignment_epoch(g.assignment_epoch)
                        .with_assignor_name(s(&g.assignor_name()))
                        .with_members(
                            g.members
                                .values()
                                .map(|m| {
                                    describe_response::Member::default()
                                        .with_member_id(s(&m.id))
                                        .with_instance_id(m.instance_id.as_deref().map(s))
                                        .with_rack_id(m.rack_id.as_deref().map(s))
                                        .with_member_epoch(m.epoch)
                                        .with_client_id(s(&m.client_id))
                                        .with_client_host(s(&m.client_host))
                                        .with_subscribed_topic_names(
                                            m.subscribed_names.iter().map(|n| TopicName(s(n))).collect(),
                                        )
                                        .with_subscribed_topic_regex(m.subscribed_regex.as_deref().map(s))
                                        .with_member_type(1)
                                        .with_assignment(wire(&m.assigned))
                                        .with_target_assignment(wire(g.target.get(&m.id).unwrap_or(&Assignment::new())))
                                })
                                .collect(),
                        ),
                    None if st.groups.get(id.0.as_str()).is_some_and(|g| !g.is_empty()) => described
                        .with_error_code(kafka_protocol::ResponseError::GroupIdNotFound.code())
                        .with_error_message(Some(s(&format!("Group {} is not a consumer group.", id.0)))),
                    None => described
                        .with_error_code(kafka_protocol::ResponseError::GroupIdNotFound.code())
                        .with_error_message(Some(s(&format!("Group {} not found.", id.0)))),
                }
            })
            .collect();
        ConsumerGroupDescribeResponse::default().with_groups(groups)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::StrBytes;

    fn join(version_member: &str) -> ConsumerGroupHeartbeatRequest {
        ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_member_id(StrBytes::from_string(version_member.to_string()))
            .with_member_epoch(0)
            .with_rebalance_timeout_ms(300_000)
            .with_subscribed_topic_names(Some(vec![]))
            .with_subscribed_topic_regex(Some(StrBytes::from_static_str("")))
            .with_topic_partitions(Some(vec![]))
    }

    // Issue 22 (KIP-848): the request checks Kafka makes per version, as librdkafka
    // sends its joins (its own member id, v1; an empty regex for none).
    #[test]
    fn heartbeats_are_checked_as_kafka_checks_them() {
        assert_eq!(invalid(&join("m-1"), 1), None);
        assert_eq!(invalid(&join(""), 0), None, "v0 lets the coordinator name the member");
        assert_eq!(invalid(&join(""), 1), Some("MemberId can't be empty."));
        assert!(invalid(&join("m").with_rebalance_timeout_ms(-1), 1).is_some());
        assert!(invalid(&join("m").with_topic_partitions(None), 1).is_some());
        let no_subscription = join("m")
            .with_subscribed_topic_names(None)
            .with_subscribed_topic_regex(None);
        assert!(invalid(&no_subscription, 1).is_some());
        let static_leave = join("m").with_member_epoch(cg::LEAVE_STATIC_EPOCH);
        assert!(invalid(&static_leave, 1).is_some(), "-2 needs an instance id");
        assert_eq!(
            invalid(&join("m").with_member_epoch(-3), 1),
            Some("MemberEpoch is invalid.")
        );
        let plain = ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_member_id(StrBytes::from_static_str("m"))
            .with_member_epoch(4)
            .with_rebalance_timeout_ms(-1);
        assert_eq!(invalid(&plain, 1), None, "a plain heartbeat leaves the rest null");
    }
}
