//! The owner's side of the data lifecycle: explicit trims (Kafka DeleteRecords, HTTP
//! trim) and retention (`retention.ms`, `retention.bytes`) advance a stream's start
//! offset by a `TrimStream` in the metadata log. Only committed offsets are trimmed, so
//! the log's rule that every offset at or above the start is in exactly one range holds;
//! the index then drops the ranges below, and GC the objects nothing references.

use super::Node;
use crate::error::StreamdError;
use crate::stream::StreamHandle;
use std::sync::Arc;
use std::time::Duration;
use weir_meta::client::ClientError;
use weir_meta::model::{Applied, Command, ObjectRange, RejectCode, StreamConfig, NO_TIMESTAMP};
use weir_shared::ids::Offset;

/// How long an explicit trim above the committed end waits for the upload.
const COMMIT_WAIT: Duration = Duration::from_secs(30);

/// What retention lets go, walking a stream's ranges oldest first: a range goes while
/// the bytes after it still meet `retention.bytes`, or while its newest record is older
/// than `retention.ms` (ranges of unknown age stay). The walk stops at the first range
/// that must stay, as Kafka deletes only a prefix of segments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Bytes retained above `retention.bytes`.
    excess_bytes: Option<u64>,
    /// Ranges whose newest record is older than this (ms) have expired.
    cutoff_ms: Option<i64>,
}

impl Retention {
    /// The retention `config` asks of a stream holding `retained_bytes`, at `now_ms`;
    /// `None` when it asks nothing.
    pub fn new(config: &StreamConfig, retained_bytes: u64, now_ms: i64) -> Option<Self> {
        if config.retention_bytes.is_none() && config.retention_ms.is_none() {
            return None;
        }
        Some(Self {
            excess_bytes: config.retention_bytes.map(|limit| retained_bytes.saturating_sub(limit)),
            cutoff_ms: config
                .retention_ms
                .map(|ms| now_ms.saturating_sub(i64::try_from(ms).unwrap_or(i64::MAX))),
        })
    }

    /// Whether `range`, the oldest left, may go; counts it against the byte budget.
    pub fn lets_go(&mut self, range: &ObjectRange) -> bool {
        let by_bytes = self.excess_bytes.is_some_and(|excess| range.len <= excess);
        let by_age = self
            .cutoff_ms
            .is_some_and(|cutoff| range.max_timestamp != NO_TIMESTAMP && range.max_timestamp < cutoff);
        if by_bytes || by_age {
            self.excess_bytes = self.excess_bytes.map(|e| e.saturating_sub(range.len));
        }
        by_bytes || by_age
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Node {
    /// Trims `stream` so that it starts at `offset` (at most its high watermark);
    /// returns the start offset after the trim. Offsets not yet committed are uploaded
    /// first.
    pub async fn trim(&self, stream: &str, offset: u64) -> Result<u64, StreamdError> {
        let handle = self.stream(stream)?;
        let start = handle.inner.lock().await.start_offset;
        let end = handle.durable_end();
        if offset > end {
            return Err(StreamdError::OffsetOutOfRange { offset, start, end });
        }
        if offset <= start {
            return Ok(start);
        }
        let mut committed = handle.committed.subscribe();
        if *committed.borrow() < offset {
            self.upload_now.notify_one();
            let waited = tokio::time::timeout(COMMIT_WAIT, committed.wait_for(|c| *c >= offset)).await;
            if !matches!(waited, Ok(Ok(_))) {
                return Err(StreamdError::Unavailable(format!(
                    "offsets below {offset} of stream '{stream}' are not committed yet; trim again"
                )));
            }
        }
        self.propose_trim(&handle, offset, "request").await
    }

    /// Proposes the trim and applies its result to the served stream.
    async fn propose_trim(&self, handle: &StreamHandle, start: u64, reason: &str) -> Result<u64, StreamdError> {
        let command = Command::TrimStream {
            stream: handle.id,
            start: Offset(start),
        };
        match self.metad.propose(&self.proposer(), command).await {
            Ok((index, Ok(Applied::Trimmed { start: now }))) => {
                let expired = self.apply_start(handle, now.0).await;
                tracing::info!(stream = %handle.name, start_offset = now.0, log_index = index, reason, expired_producers = expired, "trimmed stream");
                crate::metrics::metrics().trims.with_label_values(&[reason]).inc();
                Ok(now.0)
            }
            Ok((_, Ok(other))) => Err(StreamdError::Internal(format!(
                "unexpected answer to TrimStream: {other:?}"
            ))),
            Ok((_, Err(r))) => Err(match r.code {
                RejectCode::Fenced | RejectCode::Superseded => {
                    self.fence(&r.message);
                    StreamdError::Fenced
                }
                RejectCode::NotFound => StreamdError::NotFound(handle.name.clone()),
                _ => StreamdError::InvalidArgument(r.message),
            }),
            Err(ClientError::Unavailable(e)) => Err(StreamdError::Unavailable(format!("metadata log: {e}"))),
            Err(e) => Err(StreamdError::Unavailable(format!("metadata log: {e}"))),
        }
    }

    /// Moves a served stream's start offset up to `start` (never back): reads below it
    /// are refused, its cached ranges go, and producers whose data is gone expire.
    /// Returns how many producers expired.
    pub(super) async fn apply_start(&self, handle: &StreamHandle, start: u64) -> usize {
        if start <= handle.start.load(std::sync::atomic::Ordering::Acquire) {
            return 0;
        }
        let mut inner = handle.inner.lock().await;
        if start <= inner.start_offset {
            return 0;
        }
        inner.start_offset = start;
        handle.start.store(start, std::sync::atomic::Ordering::Release);
        self.ranges.forget_below(handle.id, start);
        inner.txns.forget_below(start);
        inner.producers.expire_below(start)
    }

    /// One retention pass over the served streams whose config asks for one.
    pub async fn enforce_retention(&self) {
        for handle in self.all_streams() {
            let row = self.view.with(|s| s.streams.get(&handle.id).cloned());
            let Some(row) = row.filter(|r| r.epoch == handle.epoch) else {
                continue;
            };
            let Some(mut retention) = Retention::new(&row.config, row.bytes, now_ms()) else {
                continue;
            };
            let from = handle.inner.lock().await.start_offset;
            match self.retention_point(&handle, from, &mut retention).await {
                Ok(Some(start)) => {
                    if let Err(e) = self.propose_trim(&handle, start, "retention").await {
                        tracing::warn!(stream = %handle.name, error = %e, "retention trim refused; will retry");
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(stream = %handle.name, error = %e, "cannot read the stream's ranges for retention; will retry")
                }
            }
        }
    }

    /// The start offset retention allows, walking the committed ranges from `from`.
    async fn retention_point(
        &self,
        handle: &Arc<StreamHandle>,
        from: u64,
        retention: &mut Retention,
    ) -> Result<Option<u64>, StreamdError> {
        let (mut at, mut point) = (from, None);
        loop {
            let page = self.index_page(handle.id, at).await?;
            for range in &page.ranges {
                if !retention.lets_go(range) {
                    return Ok(point);
                }
                point = Some(range.end.0);
                at = range.end.0;
            }
            if !page.more || page.ranges.is_empty() {
                return Ok(point);
            }
        }
    }
}

/// Runs a retention pass every `every` until `cancel`.
pub async fn retention_loop(node: Arc<Node>, every: Duration, cancel: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = node.fenced.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if node.is_admitted() {
            node.enforce_retention().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_shared::ids::ObjectKey;

    fn range(start: u64, len: u64, max_timestamp: i64) -> ObjectRange {
        ObjectRange {
            key: ObjectKey(format!("data/{start}")),
            start: Offset(start),
            end: Offset(start + 1),
            pos: 0,
            len,
            crc: 0,
            max_timestamp,
            txns: Default::default(),
        }
    }

    fn walk(retention: &mut Retention, ranges: &[ObjectRange]) -> usize {
        ranges.iter().take_while(|r| retention.lets_go(r)).count()
    }

    #[test]
    fn retention_bytes_drops_the_oldest_ranges_while_the_rest_still_meet_the_limit() {
        let config = StreamConfig {
            retention_bytes: Some(250),
            ..Default::default()
        };
        let ranges = [range(0, 100, 1), range(1, 100, 1), range(2, 100, 1), range(3, 100, 1)];
        // 400 retained, 250 kept: 150 may go, so only the first range (the second would
        // leave 200 < 250).
        let mut r = Retention::new(&config, 400, 10).expect("configured");
        assert_eq!(walk(&mut r, &ranges), 1);
        let mut r = Retention::new(&config, 250, 10).expect("configured");
        assert_eq!(walk(&mut r, &ranges), 0, "at the limit nothing goes");
        let mut r = Retention::new(&config, 100, 10).expect("configured");
        assert_eq!(walk(&mut r, &ranges), 0, "below the limit nothing goes");
    }

    #[test]
    fn retention_ms_drops_the_expired_prefix_and_keeps_ranges_of_unknown_age() {
        let config = StreamConfig {
            retention_ms: Some(1_000),
            ..Default::default()
        };
        let ranges = [
            range(0, 1, 100),
            range(1, 1, 8_999),
            range(2, 1, 9_500),
            range(3, 1, 50),
        ];
        let mut r = Retention::new(&config, 4, 10_000).expect("configured");
        assert_eq!(
            walk(&mut r, &ranges),
            2,
            "stops at the first range newer than the cutoff"
        );
        let unknown = [range(0, 1, NO_TIMESTAMP), range(1, 1, 100)];
        let mut r = Retention::new(&config, 2, 10_000).expect("configured");
        assert_eq!(walk(&mut r, &unknown), 0, "a range of unknown age stays");
    }

    #[test]
    fn either_limit_lets_a_range_go_and_no_config_asks_nothing() {
        let config = StreamConfig {
            retention_ms: Some(1_000),
            retention_bytes: Some(150),
            ..Default::default()
        };
        // The first goes by age; the bytes budget (300 - 150) covers it and the next.
        let ranges = [
            range(0, 100, 1),
            range(1, 50, 9_999),
            range(2, 100, 9_999),
            range(3, 50, 9_999),
        ];
        let mut r = Retention::new(&config, 300, 10_000).expect("configured");
        assert_eq!(walk(&mut r, &ranges), 2);
        assert_eq!(Retention::new(&StreamConfig::default(), 1 << 40, 0), None);
    }
}
