//! DeleteRecords: advances each listed partition's log start offset through its owner,
//! which commits what is below it first and then logs the trim. An offset of -1 means
//! the high watermark, as in Kafka; the answer is the new low watermark.

use super::errors;
use super::Kafka;
use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use weir_proto::streamd::{StatusRequest, TrimRequest};

/// Kafka's "up to the high watermark".
const HIGH_WATERMARK: i64 = -1;

pub async fn delete_records(kafka: &Kafka, r: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut topics = vec![];
    for t in r.topics {
        let topic = t.name.0.to_string();
        let mut partitions = vec![];
        for p in t.partitions {
            let result = DeleteRecordsPartitionResult::default().with_partition_index(p.partition_index);
            partitions.push(match trim(kafka, &topic, p.partition_index, p.offset).await {
                Ok(low) => result.with_low_watermark(low),
                Err(code) => result.with_low_watermark(-1).with_error_code(code),
            });
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

/// Trims one partition; its new low watermark, or a Kafka error code.
async fn trim(kafka: &Kafka, topic: &str, partition: i32, offset: i64) -> Result<i64, i16> {
    if super::brokers::is_internal_topic(topic) {
        return Err(errors::INVALID_TOPIC_EXCEPTION);
    }
    let stream = format!("{topic}/{partition}");
    if kafka.gw.routes.stream(&stream).is_none() {
        return Err(errors::UNKNOWN_TOPIC_OR_PARTITION);
    }
    let offset = match offset {
        HIGH_WATERMARK => {
            let status = kafka
                .gw
                .routes
                .call(&stream, true, |mut c| {
                    let stream = stream.clone();
                    async move { c.status(StatusRequest { stream }).await }
                })
                .await
                .map_err(|e| errors::route(&e))?;
            status.end_offset
        }
        o if o >= 0 => o as u64,
        _ => return Err(errors::OFFSET_OUT_OF_RANGE),
    };
    // A trim never goes back, so sending it again is harmless.
    let reply = kafka
        .gw
        .routes
        .call(&stream, true, |mut c| {
            let request = TrimRequest {
                stream: stream.clone(),
                offset,
            };
            async move { c.trim(request).await }
        })
        .await
        .map_err(|e| errors::route(&e))?;
    Ok(reply.start_offset as i64)
}
