//! Produce: each partition's record batches are checked (v2 format, CRC-32C, size) and
//! appended by the partition's owner, which answers once they are durable in its WAL.
//! acks=1 and acks=all are the same here (the WAL is the replica set); acks=0 gets no
//! response. Batches are stored as sent, compressed or not.

use super::errors;
use super::Kafka;
use futures::future::join_all;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use weir_proto::streamd::AppendRequest;

/// The response, or `None` for acks=0.
pub async fn produce(kafka: &Kafka, r: ProduceRequest) -> Option<ProduceResponse> {
    let acks = r.acks;
    let transactional = r.transactional_id.as_ref().is_some_and(|t| !t.0.is_empty());
    let mut topics = vec![];
    for t in r.topic_data {
        let name = t.name.0.to_string();
        let partitions = join_all(t.partition_data.into_iter().map(|p| {
            let name = name.clone();
            async move {
                let (code, base_offset, message) = if !matches!(acks, -1..=1) {
                    (
                        errors::INVALID_REQUIRED_ACKS,
                        -1,
                        Some("acks must be -1, 0 or 1".to_string()),
                    )
                } else if transactional {
                    (
                        errors::INVALID_REQUEST,
                        -1,
                        Some("transactions are not supported".to_string()),
                    )
                } else {
                    append(kafka, &name, p.index, p.records.unwrap_or_default()).await
                };
                PartitionProduceResponse::default()
                    .with_index(p.index)
                    .with_error_code(code)
                    .with_base_offset(base_offset)
                    .with_log_append_time_ms(-1)
                    .with_log_start_offset(-1)
                    .with_error_message(message.map(StrBytes::from_string))
            }
        }))
        .await;
        topics.push(
            TopicProduceResponse::default()
                .with_name(t.name)
                .with_partition_responses(partitions),
        );
    }
    (acks != 0).then(|| ProduceResponse::default().with_responses(topics))
}

/// Appends one partition's batches: (error code, base offset, message).
async fn append(kafka: &Kafka, topic: &str, partition: i32, records: bytes::Bytes) -> (i16, i64, Option<String>) {
    let stream = format!("{topic}/{partition}");
    if super::brokers::is_internal_topic(topic) {
        return (
            errors::INVALID_TOPIC_EXCEPTION,
            -1,
            Some("internal topics are written only by the system".into()),
        );
    }
    if kafka.gw.routes.stream(&stream).is_none() {
        return (errors::UNKNOWN_TOPIC_OR_PARTITION, -1, None);
    }
    let batches = match weir_shared::batch::split_batches(&records) {
        Ok(b) if !b.is_empty() => b,
        Ok(_) => return (errors::CORRUPT_MESSAGE, -1, Some("no record batch".into())),
        Err(e) => return (errors::CORRUPT_MESSAGE, -1, Some(e.to_string())),
    };
    // The topic's max.message.bytes, or the gateway's default, bounds each batch.
    let limit = super::configs::max_message_bytes(kafka, topic);
    if let Some((h, _)) = batches.iter().find(|(h, _)| h.total_len > limit) {
        return (
            errors::MESSAGE_TOO_LARGE,
            -1,
            Some(format!(
                "a record batch of {} bytes is over the limit of {limit} (topic max.message.bytes, or --kafka-max-message-bytes)",
                h.total_len
            )),
        );
    }
    // An idempotent batch is deduplicated by its owner, so it may be sent again when
    // the outcome of a first attempt is unknown.
    let idempotent = batches[0].0.producer_id >= 0;
    let count: u64 = batches.iter().map(|(h, _)| h.record_count.max(0) as u64).sum();
    let m = crate::metrics::metrics();
    let started = std::time::Instant::now();
    let result = kafka
        .gw
        .routes
        .call(&stream, idempotent, |mut c| {
            let req = AppendRequest {
                stream: stream.clone(),
                batches: records.clone(),
                match_next_offset: None,
            };
            async move { c.append(req).await }
        })
        .await;
    match result {
        Ok(reply) => {
            m.appends.with_label_values(&["ok"]).inc();
            m.appended_records.inc_by(count);
            m.append_latency.observe(started.elapsed().as_secs_f64());
            (errors::NONE, reply.base_offset as i64, None)
        }
        Err(e) => {
            m.appends.with_label_values(&["error"]).inc();
            (errors::route(&e), -1, Some(e.to_string()))
        }
    }
}
