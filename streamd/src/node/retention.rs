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
use weir_meta::view::ChangedStreams;
use weir_shared::ids::{Offset, StreamId};

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

    /// Enforces retention on one served stream; when it should be looked at again
    /// (`None`: only once its row changes).
    async fn enforce_retention(&self, handle: &Arc<StreamHandle>, every: Duration) -> Option<Duration> {
        let row = self.view.with(|s| {
            s.streams
                .get(&handle.id)
                .filter(|r| r.epoch == handle.epoch)
                .map(|r| (r.config.clone(), r.bytes))
        });
        let (config, bytes) = row?;
        let now = now_ms();
        let mut retention = Retention::new(&config, bytes, now)?;
        let from = handle.inner.lock().await.start_offset;
        match self.retention_point(handle, from, &mut retention).await {
            Ok((point, stays)) => {
                if let Some(start) = point {
                    if let Err(e) = self.propose_trim(handle, start, "retention").await {
                        tracing::warn!(stream = %handle.name, error = %e, "retention trim refused; will retry");
                        return Some(every);
                    }
                }
                // The oldest range that stays expires at its newest record's age limit.
                let expires = stays.filter(|t| *t != NO_TIMESTAMP).zip(config.retention_ms)?;
                let at = expires.0.saturating_add(i64::try_from(expires.1).unwrap_or(i64::MAX));
                let wait = Duration::from_millis(u64::try_from(at.saturating_sub(now)).unwrap_or(0));
                Some(wait.clamp(every, MAX_RETENTION_WAIT))
            }
            Err(e) => {
                tracing::warn!(stream = %handle.name, error = %e, "cannot read the stream's ranges for retention; will retry");
                Some(every)
            }
        }
    }

    /// The start offset retention allows, walking the committed ranges from `from`,
    /// and the newest-record timestamp of the first range that stays, if one does.
    async fn retention_point(
        &self,
        handle: &Arc<StreamHandle>,
        from: u64,
        retention: &mut Retention,
    ) -> Result<(Option<u64>, Option<i64>), StreamdError> {
        let (mut at, mut point) = (from, None);
        loop {
            let page = self.index_page(handle.id, at).await?;
            for range in &page.ranges {
                if !retention.lets_go(range) {
                    return Ok((point, Some(range.max_timestamp)));
                }
                point = Some(range.end.0);
                at = range.end.0;
            }
            if !page.more || page.ranges.is_empty() {
                return Ok((point, None));
            }
        }
    }
}

/// The longest retention waits before looking at a stream again, whatever its oldest
/// range's age says (a clock that jumped).
const MAX_RETENTION_WAIT: Duration = Duration::from_secs(3600);

/// Which served streams retention looks at, and when (D-23): only streams whose config
/// asks for retention; each again when its oldest range that stayed may have expired,
/// or once its row changed (a commit adds bytes, a trim or config change moves the
/// limits), never every stream on every pass.
#[derive(Default)]
struct Schedule {
    due: std::collections::BTreeSet<(tokio::time::Instant, StreamId)>,
    at: std::collections::HashMap<StreamId, tokio::time::Instant>,
}

impl Schedule {
    fn set(&mut self, id: StreamId, when: Option<tokio::time::Instant>) {
        if let Some(old) = self.at.remove(&id) {
            self.due.remove(&(old, id));
        }
        if let Some(when) = when {
            self.at.insert(id, when);
            self.due.insert((when, id));
        }
    }

    /// Takes the streams due by `now`.
    fn take_due(&mut self, now: tokio::time::Instant) -> Vec<StreamId> {
        let mut out = Vec::new();
        while let Some(&(when, id)) = self.due.first() {
            if when > now {
                break;
            }
            self.set(id, None);
            out.push(id);
        }
        out
    }
}

/// Enforces retention every `every` on the streams due, until `cancel`.
pub async fn retention_loop(node: Arc<Node>, every: Duration, cancel: tokio_util::sync::CancellationToken) {
    let changed = node.view.track();
    let mut schedule = Schedule::default();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = node.fenced.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if !node.is_admitted() {
            continue;
        }
        let now = tokio::time::Instant::now();
        let ids: Vec<StreamId> = match changed.take() {
            ChangedStreams::All => node.served_or_open(),
            ChangedStreams::Some(ids) => ids.into_iter().collect(),
        };
        for id in ids {
            schedule.set(id, node.asks_retention(id).then_some(now));
        }
        for id in schedule.take_due(now) {
            let again = match node.handle(id) {
                Some(handle) => node.enforce_retention(&handle, every).await,
                // Opened in the view, and not served yet: looked at on the next pass.
                None => node.asks_retention(id).then_some(every),
            };
            schedule.set(id, again.map(|wait| tokio::time::Instant::now() + wait));
        }
    }
}

impl Node {
    /// Whether stream `id` is open on this incarnation with a config that asks for
    /// retention.
    fn asks_retention(&self, id: StreamId) -> bool {
        self.view.with(|s| {
            s.streams.get(&id).is_some_and(|r| {
                r.owner.as_ref() == Some(&self.me)
                    && r.state == weir_meta::model::StreamState::Open
                    && (r.config.retention_ms.is_some() || r.config.retention_bytes.is_some())
            })
        })
    }
}

#[cfg(test)]
mod schedule_tests {
    use super::*;

    /// D-23: of 100,000 streams with retention, a pass takes the one due, not all.
    #[test]
    fn a_pass_takes_only_the_streams_due() {
        let now = tokio::time::Instant::now();
        let later = now + Duration::from_secs(3600);
        let mut schedule = Schedule::default();
        for id in 0..100_000 {
            schedule.set(StreamId(id), Some(later));
        }
        schedule.set(StreamId(5), Some(now));
        assert_eq!(schedule.take_due(now), vec![StreamId(5)]);
        assert!(schedule.take_due(now).is_empty());
        schedule.set(StreamId(6), None);
        assert_eq!(schedule.take_due(later).len(), 99_998, "the others once due");
    }
}
