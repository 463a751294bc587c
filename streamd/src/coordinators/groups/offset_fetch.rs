//! OffsetFetch: a group's committed offsets as each version asks for them, with the
//! checks of a KIP-848 member's epoch and of offsets an open transaction holds (KIP-447).

use super::membership::code;
use super::{s, GroupCoordinator, State};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{OffsetFetchRequest, OffsetFetchResponse, TopicName};
use kafka_protocol::ResponseError as Kafka;
use std::collections::BTreeMap;

/// One partition's committed offset as OffsetFetch answers it: (partition, offset,
/// leader epoch, metadata); −1 when nothing is committed.
type Found = (i32, i64, i32, String);

/// The committed offsets of `group` for `wanted` topics (every committed one if `None`).
fn committed(st: &State, group: &str, wanted: Option<Vec<(TopicName, Vec<i32>)>>) -> Vec<(TopicName, Vec<Found>)> {
    let committed = st.offsets.group(group);
    let wanted = wanted.unwrap_or_else(|| {
        let mut all: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (topic, p) in committed.into_iter().flat_map(|m| m.keys()) {
            all.entry(topic.clone()).or_default().push(*p);
        }
        all.into_iter().map(|(t, ps)| (TopicName(s(&t)), ps)).collect()
    });
    wanted
        .into_iter()
        .map(|(name, partitions)| {
            let found = partitions
                .into_iter()
                .map(|p| match committed.and_then(|m| m.get(&(name.0.to_string(), p))) {
                    Some(c) => (p, c.offset, c.leader_epoch, c.metadata.clone().unwrap_or_default()),
                    None => (p, -1, -1, String::new()),
                })
                .collect();
            (name, found)
        })
        .collect()
}

/// UNSTABLE_OFFSET_COMMIT for a partition an open transaction holds an offset for,
/// when the client asked for stable offsets (KIP-447: a read_committed consumer
/// retries until the transaction ends, rather than start from an offset about to
/// change); else none.
fn unstable(st: &State, require_stable: bool, group: &str, topic: &TopicName, partition: i32) -> i16 {
    if require_stable && st.offsets.is_pending(group, topic.0.as_str(), partition) {
        Kafka::UnstableOffsetCommit.code()
    } else {
        code::NONE
    }
}

/// OffsetFetch: one group before v8, a list of them from v8 (the gateway sends each to
/// its own coordinator). From v9 a KIP-848 member names itself and its epoch, which
/// must be current (STALE_MEMBER_EPOCH otherwise).
pub(super) fn fetch_offsets(c: &GroupCoordinator, r: OffsetFetchRequest, version: i16) -> OffsetFetchResponse {
    c.with(|st| {
        if version < 8 {
            let wanted = r.topics.as_ref().map(|topics| {
                topics
                    .iter()
                    .map(|t| (t.name.clone(), t.partition_indexes.clone()))
                    .collect()
            });
            let topics = committed(st, r.group_id.0.as_str(), wanted)
                .into_iter()
                .map(|(name, found)| {
                    let group = r.group_id.0.as_str();
                    OffsetFetchResponseTopic::default()
                        .with_name(name.clone())
                        .with_partitions(
                            found
                                .into_iter()
                                .map(|(p, offset, epoch, metadata)| {
                                    OffsetFetchResponsePartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(offset)
                                        .with_committed_leader_epoch(epoch)
                                        .with_metadata(Some(s(&metadata)))
                                        .with_error_code(unstable(st, r.require_stable, group, &name, p))
                                })
                                .collect(),
                        )
                })
                .collect();
            return OffsetFetchResponse::default().with_topics(topics);
        }
        let groups = r
            .groups
            .iter()
            .map(|g| {
                let id = g.group_id.0.as_str();
                let member = g.member_id.as_deref().unwrap_or("");
                let error = match st.consumer_groups.get(id) {
                    Some(cg) if !member.is_empty() || g.member_epoch >= 0 => {
                        cg.check_member(member, g.member_epoch, None)
                    }
                    _ => code::NONE,
                };
                let answer = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
                if error != code::NONE {
                    return answer.with_error_code(error);
                }
                let wanted = g.topics.as_ref().map(|topics| {
                    topics
                        .iter()
                        .map(|t| (t.name.clone(), t.partition_indexes.clone()))
                        .collect()
                });
                answer.with_topics(
                    committed(st, id, wanted)
                        .into_iter()
                        .map(|(name, found)| {
                            OffsetFetchResponseTopics::default()
                                .with_name(name.clone())
                                .with_partitions(
                                    found
                                        .into_iter()
                                        .map(|(p, offset, epoch, metadata)| {
                                            OffsetFetchResponsePartitions::default()
                                                .with_partition_index(p)
                                                .with_committed_offset(offset)
                                                .with_committed_leader_epoch(epoch)
                                                .with_metadata(Some(s(&metadata)))
                                                .with_error_code(unstable(st, r.require_stable, id, &name, p))
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                )
            })
            .collect();
        OffsetFetchResponse::default().with_groups(groups)
    })
}
