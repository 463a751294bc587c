//! Fetch (stored batches returned byte for byte, long-polling the owners for up to
//! `max_wait_ms` when nothing is there) and ListOffsets (earliest, latest, by timestamp).

use super::errors;
use super::owner::owner_status;
use super::Kafka;
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse};
use std::time::Duration;
use weir_proto::streamd::ReadRequest;

/// Longest long poll a Fetch may ask for.
const MAX_WAIT: Duration = Duration::from_secs(30);

struct Part {
    topic: usize,
    partition: i32,
    stream: String,
    offset: i64,
    /// The partition's own limit (`partition_max_bytes`, within the gRPC message limit).
    max_bytes: usize,
    /// Its share of the request's byte budget, reserved in request order before any
    /// read: the read never returns more, and with none it is not read at all.
    reserved: usize,
    /// Listed before in the same request: answered INVALID_REQUEST and never read, so a
    /// request repeating one partition cannot multiply the reads (issue 19).
    duplicate: bool,
    /// The client's `current_leader_epoch` is not this partition's: the error it is
    /// answered with, and it is never read (issue 22).
    stale: i16,
    /// `isolation_level` 1: read up to the last stable offset (issue 23).
    read_committed: bool,
}

#[derive(Default)]
struct Got {
    error: i16,
    high_watermark: i64,
    last_stable: i64,
    log_start: i64,
    records: Bytes,
    aborted: Vec<AbortedTransaction>,
}

impl Got {
    fn failed(error: i16) -> Got {
        Got {
            error,
            high_watermark: -1,
            last_stable: -1,
            log_start: -1,
            records: Bytes::new(),
            aborted: Vec::new(),
        }
    }

    /// The offset the partition's reader can read up to.
    fn readable_end(&self, p: &Part) -> i64 {
        if p.read_committed {
            self.last_stable
        } else {
            self.high_watermark
        }
    }
}

/// How much one read may return.
#[derive(Clone, Copy)]
enum Limit {
    /// At most the part's reservation; none reserved: offsets only, no read.
    Reserved,
    /// Up to `n` bytes, and at least one whole batch (Kafka's rule, so a consumer whose
    /// limits are smaller than a batch still makes progress).
    AtLeastOne(usize),
}

async fn read(kafka: &Kafka, p: &Part, wait: Duration, limit: Limit) -> Got {
    if p.duplicate {
        return Got::failed(errors::INVALID_REQUEST);
    }
    if p.stale != errors::NONE {
        return Got::failed(p.stale);
    }
    if p.offset < 0 {
        return Got::failed(errors::OFFSET_OUT_OF_RANGE);
    }
    let (max_bytes, exact) = match limit {
        Limit::Reserved if p.reserved == 0 => return offsets_only(kafka, p).await,
        Limit::Reserved => (p.reserved, true),
        Limit::AtLeastOne(n) => (n.max(1), false),
    };
    let result = kafka
        .gw
        .routes
        .read_waiting(&p.stream, wait, |mut c| {
            let req = ReadRequest {
                stream: p.stream.clone(),
                offset: p.offset as u64,
                max_bytes: max_bytes.min(u32::MAX as usize) as u32,
                wait_ms: wait.as_millis() as u32,
                exact_max_bytes: exact,
                read_committed: p.read_committed,
            };
            async move { c.read(req).await }
        })
        .await;
    match result {
        Ok(r) => Got {
            error: errors::NONE,
            high_watermark: r.end_offset as i64,
            last_stable: r.last_stable_offset as i64,
            log_start: r.start_offset as i64,
            records: r.batches,
            aborted: r
                .aborted
                .into_iter()
                .map(|a| {
                    AbortedTransaction::default()
                        .with_producer_id(a.producer_id.into())
                        .with_first_offset(a.first_offset as i64)
                })
                .collect(),
        },
        Err(e) => Got::failed(errors::route(&e)),
    }
}

/// A partition past the request's byte budget: its offsets, and no records read.
async fn offsets_only(kafka: &Kafka, p: &Part) -> Got {
    match owner_status(kafka, &p.stream).await {
        Ok(s) if (p.offset as u64) < s.start_offset || (p.offset as u64) > s.end_offset => {
            Got::failed(errors::OFFSET_OUT_OF_RANGE)
        }
        Ok(s) => Got {
            error: errors::NONE,
            high_watermark: s.end_offset as i64,
            last_stable: s.last_stable_offset as i64,
            log_start: s.start_offset as i64,
            records: Bytes::new(),
            aborted: Vec::new(),
        },
        Err(code) => Got::failed(code),
    }
}

pub async fn fetch(kafka: &Kafka, r: FetchRequest) -> FetchResponse {
    let max_wait = Duration::from_millis(r.max_wait_ms.max(0) as u64).min(MAX_WAIT);
    // The response's byte budget, shared out before any read (issue 19): the reads of
    // one Fetch together hold at most this much, however many partitions it lists.
    let budget = usize::try_from(r.max_bytes)
        .ok()
        .filter(|b| *b > 0)
        .unwrap_or(usize::MAX)
        .min(kafka.fetch_max_bytes);
    let mut left = budget;
    let mut parts = vec![];
    let mut listed = std::collections::HashSet::new();
    // Every partition's leader-epoch check from one read of the view.
    let asked: Vec<(String, i32)> = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (format!("{}/{}", t.topic.0, p.partition), p.current_leader_epoch))
        })
        .collect();
    let mut checks = super::leader_epochs::check_partitions(kafka, &asked).into_iter();
    let mut streams = asked.into_iter().map(|(stream, _)| stream);
    for (i, t) in r.topics.iter().enumerate() {
        for p in &t.partitions {
            let stream = streams.next().expect("one stream per partition asked");
            let stale = checks.next().expect("one check per partition asked");
            let duplicate = !listed.insert((t.topic_id, stream.clone()));
            // Replies must fit the gRPC message limit.
            let max_bytes = usize::try_from(p.partition_max_bytes)
                .unwrap_or(0)
                .min(kafka.gw.max_body_bytes);
            let reserved = if duplicate || stale != errors::NONE {
                0
            } else {
                max_bytes.min(left)
            };
            left -= reserved;
            parts.push(Part {
                topic: i,
                partition: p.partition,
                duplicate,
                stale,
                stream,
                offset: p.fetch_offset,
                max_bytes,
                reserved,
                read_committed: r.isolation_level == 1,
            });
        }
    }
    let mut got: Vec<Got> =
        futures::future::join_all(parts.iter().map(|p| read(kafka, p, Duration::ZERO, Limit::Reserved))).await;
    if got.iter().all(|g| g.records.is_empty()) {
        // Nothing fit: the first partition that has records gets one whole batch, so a
        // consumer makes progress whatever its limits.
        let pending = parts
            .iter()
            .zip(&got)
            .position(|(p, g)| g.error == errors::NONE && g.readable_end(p) > p.offset);
        if let Some(i) = pending {
            let limit = Limit::AtLeastOne(parts[i].max_bytes.min(budget));
            got[i] = read(kafka, &parts[i], Duration::ZERO, limit).await;
        }
    }
    let nothing = got.iter().all(|g| g.error == errors::NONE && g.records.is_empty());
    if nothing && r.min_bytes > 0 && !max_wait.is_zero() && !parts.is_empty() {
        // Long poll: every partition waits on its owner; the first with data ends it,
        // and the others' reads are dropped unanswered.
        let mut waits: FuturesUnordered<_> = parts
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.duplicate && p.stale == errors::NONE)
            .map(|(i, p)| async move {
                let limit = Limit::AtLeastOne(p.max_bytes.min(budget));
                (i, read(kafka, p, max_wait, limit).await)
            })
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
    let mut topics: Vec<FetchableTopicResponse> = r
        .topics
        .iter()
        .map(|t| {
            FetchableTopicResponse::default()
                .with_topic(t.topic.clone())
                .with_topic_id(t.topic_id)
        })
        .collect();
    for (p, g) in parts.iter().zip(got) {
        // Kafka answers no list at all in read_uncommitted.
        let aborted = p.read_committed.then_some(g.aborted);
        topics[p.topic].partitions.push(
            PartitionData::default()
                .with_partition_index(p.partition)
                .with_error_code(g.error)
                .with_high_watermark(g.high_watermark)
                .with_last_stable_offset(g.last_stable)
                .with_log_start_offset(g.log_start)
                .with_aborted_transactions(aborted)
                .with_preferred_read_replica((-1).into())
                .with_records(Some(g.records)),
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
            let stale = super::leader_epochs::check_partition(kafka, &stream, p.current_leader_epoch);
            let found = match stale {
                errors::NONE => lookup(kafka, &stream, p.timestamp, r.isolation_level == 1).await,
                fenced => Err(fenced),
            };
            let (error, found) = match found {
                Ok(found) => (errors::NONE, found),
                Err(code) => (code, Found::NONE),
            };
            partitions.push(
                ListOffsetsPartitionResponse::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(error)
                    .with_offset(found.offset)
                    .with_timestamp(found.timestamp)
                    .with_leader_epoch(found.leader_epoch),
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

/// A ListOffsets answer for one partition.
struct Found {
    offset: i64,
    timestamp: i64,
    /// The epoch of the record at `offset` (issue 22), from the owner's or the batch's
    /// own word, never from the view, whose current epoch may be a later owner's: a
    /// position with an epoch too early for its offset would read as truncated.
    leader_epoch: i32,
}

impl Found {
    const NONE: Found = Found {
        offset: -1,
        timestamp: -1,
        leader_epoch: -1,
    };
}

/// The answer to a ListOffsets spec. The earliest offset's epoch is not known
/// consistently with it, so it is −1 (the client then validates nothing). In
/// `read_committed` the latest offset is the last stable offset (issue 23).
async fn lookup(kafka: &Kafka, stream: &str, spec: i64, read_committed: bool) -> Result<Found, i16> {
    let status = owner_status(kafka, stream).await?;
    match spec {
        LATEST => Ok(Found {
            offset: if read_committed {
                status.last_stable_offset
            } else {
                status.end_offset
            } as i64,
            timestamp: -1,
            leader_epoch: status.leader_epoch.unwrap_or(-1),
        }),
        EARLIEST => Ok(Found {
            offset: status.start_offset as i64,
            ..Found::NONE
        }),
        ts if ts >= 0 => by_timestamp(kafka, stream, status.start_offset, status.end_offset, ts).await,
        _ => Err(errors::INVALID_REQUEST),
    }
}

/// The first record at or after `ts`, scanning batch headers and decoding only the
/// batch that holds it, with its batch's epoch; (−1, −1) when there is none, as Kafka
/// answers.
async fn by_timestamp(kafka: &Kafka, stream: &str, start: u64, end: u64, ts: i64) -> Result<Found, i16> {
    let mut offset = start;
    while offset < end {
        let part = Part {
            topic: 0,
            partition: 0,
            stream: stream.to_string(),
            offset: offset as i64,
            max_bytes: 1 << 20,
            reserved: 1 << 20,
            duplicate: false,
            stale: errors::NONE,
            read_committed: false,
        };
        let g = read(kafka, &part, Duration::ZERO, Limit::AtLeastOne(1 << 20)).await;
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
            let leader_epoch = weir_shared::batch::partition_leader_epoch(bytes);
            let mut buf = Bytes::copy_from_slice(bytes);
            if let Ok(sets) = weir_shared::inflate::decode_all(&mut buf, kafka.gw.max_decompressed_bytes) {
                let hit = sets
                    .iter()
                    .flat_map(|s| s.records.iter())
                    .find(|r| r.offset >= offset as i64 && r.timestamp >= ts && !r.control);
                if let Some(r) = hit {
                    return Ok(Found {
                        offset: r.offset,
                        timestamp: r.timestamp,
                        leader_epoch,
                    });
                }
            } else {
                return Ok(Found {
                    offset: h.base_offset.max(offset as i64),
                    timestamp: h.max_timestamp,
                    leader_epoch,
                });
            }
        }
        let (h, _) = batches.last().expect("not empty");
        offset = (h.base_offset + i64::from(h.last_offset_delta) + 1) as u64;
    }
    Ok(Found::NONE)
}
