//! Fetch (stored batches returned byte for byte, long-polling the owners for up to
//! `max_wait_ms` when nothing is there) and ListOffsets (earliest, latest, by timestamp).

use super::errors;
use super::Kafka;
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::records::RecordBatchDecoder;
use std::time::Duration;
use weir_proto::streamd::{ReadRequest, StatusRequest};

/// Longest long poll a Fetch may ask for.
const MAX_WAIT: Duration = Duration::from_secs(30);

struct Part {
    topic: usize,
    partition: i32,
    stream: String,
    offset: i64,
    max_bytes: i32,
    /// Listed before in the same request: answered INVALID_REQUEST and never read, so a
    /// request repeating one partition cannot multiply the reads (issue 19).
    duplicate: bool,
}

#[derive(Default)]
struct Got {
    error: i16,
    high_watermark: i64,
    log_start: i64,
    records: Bytes,
}

async fn read(kafka: &Kafka, p: &Part, wait: Duration) -> Got {
    let failed = |error| Got {
        error,
        high_watermark: -1,
        log_start: -1,
        records: Bytes::new(),
    };
    if p.duplicate {
        return failed(errors::INVALID_REQUEST);
    }
    if p.offset < 0 {
        return failed(errors::OFFSET_OUT_OF_RANGE);
    }
    let result = kafka
        .gw
        .routes
        .call_waiting(&p.stream, true, wait, |mut c| {
            let req = ReadRequest {
                stream: p.stream.clone(),
                offset: p.offset as u64,
                max_bytes: p.max_bytes.max(1) as u32,
                wait_ms: wait.as_millis() as u32,
            };
            async move { c.read(req).await }
        })
        .await;
    match result {
        Ok(r) => Got {
            error: errors::NONE,
            high_watermark: r.end_offset as i64,
            log_start: r.start_offset as i64,
            records: r.batches,
        },
        Err(e) => failed(errors::route(&e)),
    }
}

pub async fn fetch(kafka: &Kafka, r: FetchRequest) -> FetchResponse {
    let max_wait = Duration::from_millis(r.max_wait_ms.max(0) as u64).min(MAX_WAIT);
    let mut parts = vec![];
    let mut listed = std::collections::HashSet::new();
    for (i, t) in r.topics.iter().enumerate() {
        for p in &t.partitions {
            let stream = format!("{}/{}", t.topic.0, p.partition);
            parts.push(Part {
                topic: i,
                partition: p.partition,
                duplicate: !listed.insert((t.topic_id, stream.clone())),
                stream,
                offset: p.fetch_offset,
                // Replies must fit the gRPC message limit (at least one batch still comes back).
                max_bytes: p.partition_max_bytes.min(kafka.gw.max_body_bytes as i32),
            });
        }
    }
    let mut got: Vec<Got> = futures::future::join_all(parts.iter().map(|p| read(kafka, p, Duration::ZERO))).await;
    let nothing = got.iter().all(|g| g.error == errors::NONE && g.records.is_empty());
    if nothing && r.min_bytes > 0 && !max_wait.is_zero() && !parts.is_empty() {
        // Long poll: every partition waits on its owner; the first with data ends it.
        let mut waits: FuturesUnordered<_> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| async move { (i, read(kafka, p, max_wait).await) })
            .collect();
        let deadline = tokio::time::sleep(max_wait);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = waits.next() => match next {
                    Some((i, g)) => {
                        let done = g.error != errors::NONE || !g.records.is_empty();
                        got[i] = g;
                        if done { break }
                    }
                    None => break,
                },
                _ = &mut deadline => break,
                _ = kafka.gw.stopping.cancelled() => {
                    // SD-CS-4: a stopping gateway ends waiting fetches; clients retry elsewhere.
                    for g in got.iter_mut().filter(|g| g.records.is_empty()) {
                        g.error = errors::NOT_LEADER_OR_FOLLOWER;
                    }
                    break;
                }
            }
        }
    }
    // The response's byte limit: the first partition with data is always whole.
    let mut budget = if r.max_bytes > 0 {
        r.max_bytes as usize
    } else {
        usize::MAX
    };
    let mut topics: Vec<FetchableTopicResponse> = r
        .topics
        .iter()
        .map(|t| {
            FetchableTopicResponse::default()
                .with_topic(t.topic.clone())
                .with_topic_id(t.topic_id)
        })
        .collect();
    let mut first = true;
    for (p, g) in parts.iter().zip(got) {
        let mut records = g.records;
        if !records.is_empty() {
            if !first && records.len() > budget {
                records = Bytes::new();
            } else {
                budget = budget.saturating_sub(records.len());
                first = false;
            }
        }
        topics[p.topic].partitions.push(
            PartitionData::default()
                .with_partition_index(p.partition)
                .with_error_code(g.error)
                .with_high_watermark(g.high_watermark)
                .with_last_stable_offset(g.high_watermark)
                .with_log_start_offset(g.log_start)
                .with_aborted_transactions(Some(vec![]))
                .with_preferred_read_replica((-1).into())
                .with_records(Some(records)),
        );
    }
    FetchResponse::default().with_responses(topics)
}

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;

pub async fn list_offsets(kafka: &Kafka, r: ListOffsetsRequest) -> ListOffsetsResponse {
    let mut topics = vec![];
    for t in r.topics {
        let mut partitions = vec![];
        for p in &t.partitions {
            let stream = format!("{}/{}", t.name.0, p.partition_index);
            let (error, offset, timestamp) = match lookup(kafka, &stream, p.timestamp).await {
                Ok((o, ts)) => (errors::NONE, o, ts),
                Err(code) => (code, -1, -1),
            };
            partitions.push(
                ListOffsetsPartitionResponse::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(error)
                    .with_offset(offset)
                    .with_timestamp(timestamp)
                    .with_leader_epoch(-1),
            );
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

/// (offset, timestamp) for a ListOffsets spec.
async fn lookup(kafka: &Kafka, stream: &str, spec: i64) -> Result<(i64, i64), i16> {
    let status = kafka
        .gw
        .routes
        .call(stream, true, |mut c| {
            let req = StatusRequest {
                stream: stream.to_string(),
            };
            async move { c.status(req).await }
        })
        .await
        .map_err(|e| errors::route(&e))?;
    match spec {
        LATEST => Ok((status.end_offset as i64, -1)),
        EARLIEST => Ok((status.start_offset as i64, -1)),
        ts if ts >= 0 => by_timestamp(kafka, stream, status.start_offset, status.end_offset, ts).await,
        _ => Err(errors::INVALID_REQUEST),
    }
}

/// The first record at or after `ts`, scanning batch headers and decoding only the
/// batch that holds it; (−1, −1) when there is none, as Kafka answers.
async fn by_timestamp(kafka: &Kafka, stream: &str, start: u64, end: u64, ts: i64) -> Result<(i64, i64), i16> {
    let mut offset = start;
    while offset < end {
        let part = Part {
            topic: 0,
            partition: 0,
            stream: stream.to_string(),
            offset: offset as i64,
            max_bytes: 1 << 20,
            duplicate: false,
        };
        let g = read(kafka, &part, Duration::ZERO).await;
        if g.error != errors::NONE {
            return Err(g.error);
        }
        let batches = weir_shared::batch::split_batches(&g.records).map_err(|_| errors::CORRUPT_MESSAGE)?;
        if batches.is_empty() {
            break;
        }
        for (h, bytes) in &batches {
            let last = h.base_offset + i64::from(h.last_offset_delta);
            if last < offset as i64 || h.max_timestamp < ts {
                continue;
            }
            let mut buf = Bytes::copy_from_slice(bytes);
            if let Ok(sets) = RecordBatchDecoder::decode_all(&mut buf) {
                let hit = sets
                    .iter()
                    .flat_map(|s| s.records.iter())
                    .find(|r| r.offset >= offset as i64 && r.timestamp >= ts && !r.control);
                if let Some(r) = hit {
                    return Ok((r.offset, r.timestamp));
                }
            } else {
                return Ok((h.base_offset.max(offset as i64), h.max_timestamp));
            }
        }
        let (h, _) = batches.last().expect("not empty");
        offset = (h.base_offset + i64::from(h.last_offset_delta) + 1) as u64;
    }
    Ok((-1, -1))
}
