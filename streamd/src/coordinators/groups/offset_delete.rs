//! OffsetDelete (KIP-496): removes a group's committed offsets for partitions none of
//! its members subscribes to, as tombstones in the offsets stream.

use super::membership::Group;
use super::offsets::Change;
use super::{GroupCoordinator, Groups, GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, NOT_COORDINATOR};
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::{ConsumerProtocolSubscription, OffsetDeleteRequest, OffsetDeleteResponse};
use kafka_protocol::protocol::Decodable;
use kafka_protocol::ResponseError as Kafka;
use std::collections::BTreeSet;

const GROUP_SUBSCRIBED_TO_TOPIC: i16 = Kafka::GroupSubscribedToTopic.code();

/// What a group's members subscribe to, as far as OffsetDelete must know.
enum Subscribed {
    /// Every topic may be in use: a non-empty classic group that is not a consumer
    /// group (Kafka answers NON_EMPTY_GROUP).
    Opaque,
    Topics(BTreeSet<String>),
}

/// The topics a classic consumer group's members subscribe to, from the protocol
/// metadata each gave for the group's chosen protocol.
fn classic_subscriptions(g: &Group) -> Subscribed {
    if g.is_empty() {
        return Subscribed::Topics(BTreeSet::new());
    }
    if g.protocol_type.as_deref() != Some("consumer") {
        return Subscribed::Opaque;
    }
    let mut topics = BTreeSet::new();
    for m in g.members.values() {
        let mut metadata = m.metadata(g.protocol.as_deref());
        if metadata.len() < 2 {
            return Subscribed::Opaque;
        }
        let version = bytes::Buf::get_i16(&mut metadata);
        match ConsumerProtocolSubscription::decode(&mut metadata, version.clamp(0, 3)) {
            Ok(sub) => topics.extend(sub.topics.iter().map(|t| t.to_string())),
            // A subscription that does not decode could name any topic.
            Err(_) => return Subscribed::Opaque,
        }
    }
    Subscribed::Topics(topics)
}

impl Groups {
    pub(super) async fn delete_offsets(&self, c: &GroupCoordinator, r: OffsetDeleteRequest) -> OffsetDeleteResponse {
        let group = r.group_id.0.to_string();
        // (known, the top-level error, each requested partition's refusal)
        let checked = c.with(|st| {
            let known = st.groups.contains_key(&group)
                || st.consumer_groups.contains_key(&group)
                || st.offsets.group(&group).is_some();
            let subscribed = match st.groups.get(&group) {
                Some(g) => classic_subscriptions(g),
                None => Subscribed::Topics(BTreeSet::new()),
            };
            let in_use = |topic: &str| match &subscribed {
                Subscribed::Opaque => true,
                Subscribed::Topics(ts) => {
                    ts.contains(topic) || st.consumer_groups.get(&group).is_some_and(|g| g.subscribes_to(topic))
                }
            };
            let opaque = matches!(subscribed, Subscribed::Opaque);
            let refusals: Vec<Vec<i16>> = r
                .topics
                .iter()
                .map(|t| {
                    let code = if in_use(t.name.0.as_str()) {
                        GROUP_SUBSCRIBED_TO_TOPIC
                    } else {
                        0
                    };
                    vec![code; t.partitions.len()]
                })
                .collect();
            let committed: Vec<(String, i32)> = st
                .offsets
                .group(&group)
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            (known, opaque, refusals, committed)
        });
        let (known, opaque, refusals, committed) = checked;
        let top = if !known {
            GROUP_ID_NOT_FOUND
        } else if opaque {
            NON_EMPTY_GROUP
        } else {
            0
        };
        if top != 0 {
            return OffsetDeleteResponse::default().with_error_code(top);
        }
        let changes: Vec<Change> = r
            .topics
            .iter()
            .zip(&refusals)
            .flat_map(|(t, codes)| {
                t.partitions.iter().zip(codes).filter_map(|(p, code)| {
                    let key = (t.name.0.to_string(), p.partition_index);
                    (*code == 0 && committed.contains(&key)).then(|| Change::DeleteOffset {
                        group: group.clone(),
                        topic: key.0,
                        partition: key.1,
                    })
                })
            })
            .collect();
        if !changes.is_empty() {
            if let Err(e) = self.store(c, changes).await {
                tracing::warn!(group = %group, error = %e, "offset deletion was not stored");
                return OffsetDeleteResponse::default().with_error_code(NOT_COORDINATOR);
            }
        }
        OffsetDeleteResponse::default().with_topics(
            r.topics
                .iter()
                .zip(refusals)
                .map(|(t, codes)| {
                    OffsetDeleteResponseTopic::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .zip(codes)
                                .map(|(p, code)| {
                                    OffsetDeleteResponsePartition::default()
                                        .with_partition_index(p.partition_index)
                                        .with_error_code(code)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
    }
}
