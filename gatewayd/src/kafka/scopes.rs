//! Token scopes on the Kafka data APIs that name topics (issue 18): the topics a token
//! may not touch are taken out of the request and answered TOPIC_AUTHORIZATION_FAILED
//! per partition, as a Kafka broker's authorizer does; the rest are served as usual.

use super::errors::TOPIC_AUTHORIZATION_FAILED;
use super::Kafka;
use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::fetch_request::FetchTopic;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse, ListOffsetsRequest, ListOffsetsResponse};
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::{Grants, Resource};

/// Fetch needs `read` on each topic: what a Fetch answers for the topics it may not
/// read (`fetch_sessions::fetch` takes them out first).
pub fn fetch_denied(denied: Vec<FetchTopic>) -> impl Iterator<Item = FetchableTopicResponse> {
    denied.into_iter().map(|t| {
        FetchableTopicResponse::default()
            .with_topic(t.topic)
            .with_topic_id(t.topic_id)
            .with_partitions(
                t.partitions
                    .iter()
                    .map(|p| {
                        PartitionData::default()
                            .with_partition_index(p.partition)
                            .with_error_code(TOPIC_AUTHORIZATION_FAILED)
                            .with_high_watermark(-1)
                            .with_last_stable_offset(-1)
                            .with_log_start_offset(-1)
                            .with_preferred_read_replica((-1).into())
                    })
                    .collect(),
            )
    })
}

/// ListOffsets needs `read` on each topic. Before v4 a partition's answer has no leader
/// epoch: the codec refuses to encode one, and the connection would close (issue 59).
pub async fn list_offsets(
    kafka: &Kafka,
    grants: &Grants,
    mut r: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let (allowed, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.topics)
        .into_iter()
        .partition(|t| grants.allows(Operation::Describe, Resource::Topic(t.name.0.as_str())));
    let mut resp = super::fetch::list_offsets(kafka, r.with_topics(allowed)).await;
    resp.topics.extend(denied.into_iter().map(|t| {
        ListOffsetsTopicResponse::default().with_name(t.name).with_partitions(
            t.partitions
                .iter()
                .map(|p| {
                    ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(TOPIC_AUTHORIZATION_FAILED)
                        .with_offset(-1)
                        .with_timestamp(-1)
                        .with_leader_epoch(-1)
                })
                .collect(),
        )
    }));
    if version < 4 {
        for p in resp.topics.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
            p.leader_epoch = -1;
        }
    }
    resp
}

/// DeleteRecords needs `manage` on each topic.
pub async fn delete_records(kafka: &Kafka, grants: &Grants, mut r: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let (allowed, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.topics)
        .into_iter()
        .partition(|t| grants.allows(Operation::Delete, Resource::Topic(t.name.0.as_str())));
    let mut resp = super::delete_records::delete_records(kafka, r.with_topics(allowed)).await;
    resp.topics.extend(denied.into_iter().map(|t| {
        DeleteRecordsTopicResult::default().with_name(t.name).with_partitions(
            t.partitions
                .iter()
                .map(|p| {
                    DeleteRecordsPartitionResult::default()
                        .with_partition_index(p.partition_index)
                        .with_low_watermark(-1)
                        .with_error_code(TOPIC_AUTHORIZATION_FAILED)
                })
                .collect(),
        )
    }));
    resp
}
