//! Produce: each partition's record batches are checked (v2 format, CRC-32C, size) and
//! appended by the partition's owner, which answers once they are durable in its WAL.
//! acks=1 and acks=all are the same here (the WAL is the replica set); acks=0 gets no
//! response. Batches are stored as sent, compressed or not, unless the topic's
//! `compression.type` names a codec (`recompress`).

use super::errors;
use super::Kafka;
use crate::ordered_appends::{OrderedAppend, OrderedAppends};
use futures::future::join_all;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::{Grants, Resource};
use weir_shared::batch::ProducerBatchError;

/// One partition's outcome: (error code, base offset, message).
type Outcome = (i16, i64, Option<String>);

/// Starts a Produce: each partition's batches are checked and sent to their owners now,
/// behind this connection's earlier appends (D-22); the returned future waits for the
/// answers. The response, or `None` for acks=0.
pub fn start<'k>(
    kafka: &'k Kafka,
    appends: &OrderedAppends,
    grants: &Grants,
    r: ProduceRequest,
) -> impl std::future::Future<Output = Option<ProduceResponse>> + use<'k> {
    let acks = r.acks;
    let transactional_id = r
        .transactional_id
        .as_ref()
        .map(|t| t.0.to_string())
        .filter(|t| !t.is_empty());
    // A transactional producer writes for its transactional id: `write` on it too.
    let id_refused = transactional_id
        .as_deref()
        .is_some_and(|id| !grants.allows(Operation::Write, Resource::TransactionalId(id)));
    let topics: Vec<_> = r
        .topic_data
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let writable = grants.allows(Operation::Write, Resource::Topic(&name));
            let partitions: Vec<_> = t
                .partition_data
                .into_iter()
                .map(|p| {
                    let sent = if !matches!(acks, -1..=1) {
                        Err((
                            errors::INVALID_REQUIRED_ACKS,
                            -1,
                            Some("acks must be -1, 0 or 1".to_string()),
                        ))
                    } else if !writable {
                        Err((
                            errors::TOPIC_AUTHORIZATION_FAILED,
                            -1,
                            Some(format!("the token has no 'write' scope for topic '{name}'")),
                        ))
                    } else if id_refused {
                        Err((
                            errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                            -1,
                            Some("the token has no 'write' scope for this transactional id".to_string()),
                        ))
                    } else {
                        let records = p.records.unwrap_or_default();
                        send(kafka, appends, &name, p.index, records, transactional_id.clone())
                    };
                    (p.index, sent)
                })
                .collect();
            (t.name, partitions)
        })
        .collect();
    async move {
        let mut responses = vec![];
        for (name, partitions) in topics {
            let partitions = join_all(partitions.into_iter().map(|(index, sent)| async move {
                let (code, base_offset, message) = match sent {
                    Ok(append) => append.finish(kafka).await,
                    Err(refused) => refused,
                };
                PartitionProduceResponse::default()
                    .with_index(index)
                    .with_error_code(code)
                    .with_base_offset(base_offset)
                    .with_log_append_time_ms(-1)
                    .with_log_start_offset(-1)
                    .with_error_message(message.map(StrBytes::from_string))
            }))
            .await;
            responses.push(
                TopicProduceResponse::default()
                    .with_name(name)
                    .with_partition_responses(partitions),
            );
        }
        (acks != 0).then(|| ProduceResponse::default().with_responses(responses))
    }
}

/// One partition's batches on their way to its owner.
struct Sent {
    append: OrderedAppend,
    idempotent: bool,
    records: u64,
    started: std::time::Instant,
}

impl Sent {
    async fn finish(self, kafka: &Kafka) -> Outcome {
        let m = crate::metrics::metrics();
        match self.append.finish(&kafka.gw.routes, self.idempotent).await {
            Ok(reply) => {
                m.appends.with_label_values(&["ok"]).inc();
                m.appended_records.inc_by(self.records);
                m.append_latency.observe(self.started.elapsed().as_secs_f64());
                (errors::NONE, reply.base_offset as i64, None)
            }
            Err(e) => {
                m.appends.with_label_values(&["error"]).inc();
                (errors::route(&e), -1, Some(e.to_string()))
            }
        }
    }
}

/// Checks one partition's batches and sends them to its owner.
fn send(
    kafka: &Kafka,
    appends: &OrderedAppends,
    topic: &str,
    partition: i32,
    records: bytes::Bytes,
    transactional_id: Option<String>,
) -> Result<Sent, Outcome> {
    let stream = format!("{topic}/{partition}");
    if super::brokers::is_internal_topic(topic) {
        return Err((
            errors::INVALID_TOPIC_EXCEPTION,
            -1,
            Some("internal topics are written only by the system".into()),
        ));
    }
    if kafka.gw.routes.stream(&stream).is_none() {
        return Err((errors::UNKNOWN_TOPIC_OR_PARTITION, -1, None));
    }
    let batches = match weir_shared::batch::split_batches(&records) {
        Ok(b) => b,
        Err(e) => return Err((errors::CORRUPT_MESSAGE, -1, Some(e.to_string()))),
    };
    // Kafka's rule for Produce v3 and later (the only versions served): exactly one
    // record batch per partition, so a producer's sequence numbers and (later) its
    // transaction verification apply to one batch at a time.
    if batches.len() != 1 {
        return Err((
            errors::INVALID_RECORD,
            -1,
            Some(format!(
                "a Produce request carries exactly one record batch per partition, not {}",
                batches.len()
            )),
        ));
    }
    // Kafka's answers: a marker is an invalid record; transactional data without a
    // transactional id is not authorized for any. With one, the owner checks the
    // batch is in the producer's ongoing transaction (KIP-890).
    for (h, _) in &batches {
        let code = match weir_shared::batch::check_producer_batch(h) {
            Ok(()) => continue,
            Err(ProducerBatchError::Transactional) if transactional_id.is_some() => continue,
            Err(e @ ProducerBatchError::Control) => (errors::INVALID_RECORD, e),
            Err(e @ ProducerBatchError::Transactional) => (errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED, e),
        };
        return Err((code.0, -1, Some(code.1.to_string())));
    }
    // The topic's max.message.bytes, or the gateway's default, bounds each batch.
    let limit = super::configs::max_message_bytes(kafka, topic);
    if let Some((h, _)) = batches.iter().find(|(h, _)| h.total_len > limit) {
        return Err((
            errors::MESSAGE_TOO_LARGE,
            -1,
            Some(format!(
                "a record batch of {} bytes is over the limit of {limit} (topic max.message.bytes, or --kafka-max-message-bytes)",
                h.total_len
            )),
        ));
    }
    // An idempotent batch is deduplicated by its owner, so it may be sent again when
    // the outcome of a first attempt is unknown.
    let idempotent = batches[0].0.producer_id >= 0;
    let count: u64 = batches.iter().map(|(h, _)| h.record_count.max(0) as u64).sum();
    // The topic's compression.type, when it names a codec, is the one stored.
    let records = match super::configs::compression(kafka, topic) {
        None => records,
        Some(codec) => match super::recompress::recompress(records, codec) {
            Ok(stored) if stored.len() > limit => {
                return Err((
                    errors::MESSAGE_TOO_LARGE,
                    -1,
                    Some(format!(
                        "the batch is {} bytes in the topic's compression.type, over the limit of {limit}",
                        stored.len()
                    )),
                ))
            }
            Ok(stored) => stored,
            Err(why) => return Err((errors::CORRUPT_MESSAGE, -1, Some(why))),
        },
    };
    Ok(Sent {
        append: appends.send(&kafka.gw.routes, &stream, records, transactional_id),
        idempotent,
        records: count,
        started: std::time::Instant::now(),
    })
}
