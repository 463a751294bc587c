//! Where a stream's committed offsets are stored (design 0002): a bounded cache of
//! committed ranges, filled by this node's own commits and, on a miss, by a page of
//! metad's object index read at the view's applied index. A committed range never
//! changes, so a cached one stays right; the cache forgets a stream it stops serving.

use super::Node;
use crate::error::StreamdError;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use weir_meta::client::{Consistency, RangesPage};
use weir_meta::model::ObjectRange;
use weir_shared::ids::{Offset, StreamId};

/// Most ranges kept (about 200 bytes each).
pub const CAPACITY: usize = 100_000;
/// Ranges one index read asks for.
const PAGE: u32 = 1_000;

/// Committed ranges by (stream, start offset), evicted oldest first.
pub struct RangeCache {
    inner: Mutex<Inner>,
    capacity: usize,
}

#[derive(Default)]
struct Inner {
    ranges: BTreeMap<(StreamId, u64), ObjectRange>,
    order: VecDeque<(StreamId, u64)>,
}

impl RangeCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, stream: StreamId, ranges: impl IntoIterator<Item = ObjectRange>) {
        let mut inner = self.lock();
        for range in ranges {
            let key = (stream, range.start.0);
            if inner.ranges.insert(key, range).is_none() {
                inner.order.push_back(key);
            }
        }
        while inner.ranges.len() > self.capacity {
            let Some(oldest) = inner.order.pop_front() else { break };
            inner.ranges.remove(&oldest);
        }
    }

    /// The cached range of `stream` holding `offset`.
    pub fn find(&self, stream: StreamId, offset: u64) -> Option<ObjectRange> {
        let inner = self.lock();
        inner
            .ranges
            .range(..=(stream, offset))
            .next_back()
            .filter(|((s, _), r)| *s == stream && offset < r.end.0)
            .map(|(_, r)| r.clone())
    }

    /// Drops what is cached of `stream`.
    pub fn forget(&self, stream: StreamId) {
        let mut inner = self.lock();
        let keys: Vec<_> = inner
            .ranges
            .range((stream, 0)..=(stream, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for key in &keys {
            inner.ranges.remove(key);
        }
        inner.order.retain(|k| k.0 != stream);
    }

    /// Drops the cached ranges of `stream` that end at or below `start` (trimmed).
    pub fn forget_below(&self, stream: StreamId, start: u64) {
        let mut inner = self.lock();
        let keys: Vec<_> = inner
            .ranges
            .range((stream, 0)..(stream, start))
            .filter(|(_, r)| r.end.0 <= start)
            .map(|(k, _)| *k)
            .collect();
        for key in &keys {
            inner.ranges.remove(key);
        }
        if !keys.is_empty() {
            inner.order.retain(|k| !(k.0 == stream && keys.contains(k)));
        }
    }

    pub fn len(&self) -> usize {
        self.lock().ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn index_unavailable(e: weir_meta::ClientError) -> StreamdError {
    StreamdError::Unavailable(format!("reading the object index: {e}"))
}

impl Node {
    /// One forward page of `stream`'s committed ranges from the one holding `offset`,
    /// read at this node's view or later (cache misses, compaction and retention walk
    /// the index with it).
    pub async fn index_page(&self, stream: StreamId, offset: u64) -> Result<RangesPage, StreamdError> {
        self.metad
            .read_ranges(
                stream,
                Offset(offset),
                false,
                PAGE,
                Consistency::AtLeast(self.view.applied_index()),
            )
            .await
            .map_err(index_unavailable)
    }

    /// The committed range of `stream` holding `offset`: cached, or read from metad's
    /// object index at (or after) the view's applied index, with the page after it.
    pub async fn range_at(&self, stream: StreamId, offset: u64) -> Result<ObjectRange, StreamdError> {
        if let Some(r) = self.ranges.find(stream, offset) {
            return Ok(r);
        }
        let page = self.index_page(stream, offset).await?;
        let found = page
            .ranges
            .iter()
            .find(|r| r.start.0 <= offset && offset < r.end.0)
            .cloned();
        self.ranges.insert(stream, page.ranges);
        found.ok_or_else(|| {
            StreamdError::Internal(format!("no committed object holds offset {offset} of stream {stream}"))
        })
    }

    /// The newest committed ranges of `stream` below `end`, oldest first, until they
    /// cover `bytes` (an open's idempotent-producer rebuild needs only the tail).
    pub async fn tail_ranges(&self, stream: StreamId, end: u64, bytes: u64) -> Result<Vec<ObjectRange>, StreamdError> {
        let at_least = Consistency::AtLeast(self.view.applied_index());
        let (mut tail, mut covered, mut at) = (Vec::new(), 0u64, end);
        while covered < bytes {
            let page = self
                .metad
                .read_ranges(stream, Offset(at), true, PAGE.min(100), at_least)
                .await
                .map_err(index_unavailable)?;
            for range in page.ranges {
                covered += range.len;
                at = range.start.0;
                tail.push(range);
                if covered >= bytes {
                    break;
                }
            }
            if !page.more {
                break;
            }
        }
        tail.reverse();
        self.ranges.insert(stream, tail.iter().cloned());
        Ok(tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_shared::ids::ObjectKey;

    fn range(start: u64, end: u64) -> ObjectRange {
        ObjectRange {
            key: ObjectKey(format!("data/{start}")),
            start: Offset(start),
            end: Offset(end),
            pos: 0,
            len: end - start,
            crc: 0,
            max_timestamp: weir_meta::model::NO_TIMESTAMP,
        }
    }

    #[test]
    fn finds_the_range_holding_an_offset_and_stays_within_capacity() {
        let cache = RangeCache::new(3);
        cache.insert(StreamId(1), [range(0, 5), range(5, 9)]);
        cache.insert(StreamId(2), [range(0, 4)]);
        assert_eq!(cache.find(StreamId(1), 7), Some(range(5, 9)));
        assert_eq!(cache.find(StreamId(1), 9), None, "past the last range");
        assert_eq!(cache.find(StreamId(2), 4), None);
        assert_eq!(cache.find(StreamId(3), 0), None);
        cache.insert(StreamId(1), [range(9, 12)]);
        assert_eq!(cache.len(), 3, "the oldest entry went");
        assert_eq!(cache.find(StreamId(1), 0), None);
        cache.forget(StreamId(1));
        assert_eq!(cache.len(), 1);

        let cache = RangeCache::new(10);
        cache.insert(StreamId(1), [range(0, 5), range(5, 9), range(9, 12)]);
        cache.insert(StreamId(2), [range(0, 4)]);
        cache.forget_below(StreamId(1), 10);
        assert_eq!(cache.find(StreamId(1), 4), None, "trimmed");
        assert_eq!(
            cache.find(StreamId(1), 10),
            Some(range(9, 12)),
            "the range holding the start stays"
        );
        assert_eq!(
            cache.find(StreamId(2), 0),
            Some(range(0, 4)),
            "another stream is untouched"
        );
        assert_eq!(cache.len(), 2);
    }
}
