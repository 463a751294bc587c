//! Where a stream's committed offsets are stored (design 0002): a bounded cache of
//! committed ranges, filled by this node's own commits and, on a miss, by a page of
//! metad's object index read at the view's applied index. A committed range changes
//! only when this node's compactor replaces it, which updates the cache; a compaction
//! whose outcome is unknown, or a range whose object is gone, makes the stream's next
//! index read linearizable instead. The cache forgets a stream it stops serving.

use super::Node;
use crate::error::StreamdError;
use std::collections::{BTreeMap, HashMap, VecDeque};
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
    /// Bumped by every forget, across all streams, so a generation is never reused.
    forgets: u64,
    /// The generation of every stream without a mark: at least that of any mark
    /// dropped, so a read begun before a dropped mark's forget never matches again.
    floor: u64,
    /// The streams forgotten lately. Past the cache's capacity the settled ones are
    /// dropped (raising `floor`), so the marks stay bounded however many streams the
    /// node serves over time, while a forget still leaves other streams' reads alone.
    marks: HashMap<StreamId, Mark>,
}

/// A stream's last forget, and whether it is unsettled: its next index read must be
/// linearizable, because the view may not show yet what replaced the ranges forgotten.
#[derive(Clone, Copy)]
struct Mark {
    generation: u64,
    unsettled: bool,
}

/// How a stream's ranges are read from the index, and whether the answer may be cached.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReadMark {
    generation: u64,
    pub linearizable: bool,
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
        self.insert_locked(&mut inner, stream, ranges);
    }

    fn insert_locked(&self, inner: &mut Inner, stream: StreamId, ranges: impl IntoIterator<Item = ObjectRange>) {
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

    /// Ranges from an index read begun at `mark`, cached unless the stream's ranges
    /// were forgotten meanwhile; a linearizable read settles the stream.
    pub fn insert_read(&self, stream: StreamId, mark: ReadMark, ranges: impl IntoIterator<Item = ObjectRange>) {
        let mut inner = self.lock();
        if Self::settle_locked(&mut inner, stream, mark) {
            self.insert_locked(&mut inner, stream, ranges);
        }
    }

    /// Records an index read begun at `mark` that caches nothing: a linearizable one
    /// settles the stream.
    pub fn settle(&self, stream: StreamId, mark: ReadMark) {
        Self::settle_locked(&mut self.lock(), stream, mark);
    }

    /// Whether nothing was forgotten since `mark`; settles the stream if so and the
    /// read was linearizable.
    fn settle_locked(inner: &mut Inner, stream: StreamId, mark: ReadMark) -> bool {
        if inner.generation(stream) != mark.generation {
            return false;
        }
        if mark.linearizable {
            if let Some(settled) = inner.marks.get_mut(&stream) {
                settled.unsettled = false;
            }
        }
        true
    }

    /// How the next index read of `stream` must be made.
    pub fn read_mark(&self, stream: StreamId) -> ReadMark {
        let inner = self.lock();
        ReadMark {
            generation: inner.generation(stream),
            linearizable: inner.marks.get(&stream).is_some_and(|m| m.unsettled),
        }
    }

    /// Drops what is cached of `stream`, whose ranges may have been replaced in a way
    /// the view does not show yet: its next index read is linearizable.
    pub fn forget_unsettled(&self, stream: StreamId) {
        let mut inner = self.lock();
        let generation = Self::forget_locked(&mut inner, stream);
        inner.marks.insert(
            stream,
            Mark {
                generation,
                unsettled: true,
            },
        );
        self.bound_marks(&mut inner);
    }

    /// Drops what is cached of `stream`.
    pub fn forget(&self, stream: StreamId) {
        let mut inner = self.lock();
        let generation = Self::forget_locked(&mut inner, stream);
        let mark = inner.marks.entry(stream).or_insert(Mark {
            generation,
            unsettled: false,
        });
        mark.generation = generation;
        self.bound_marks(&mut inner);
    }

    /// Past the capacity, drops every settled mark; their streams read `floor`, raised
    /// past them. Unsettled marks stay until a linearizable read settles them.
    fn bound_marks(&self, inner: &mut Inner) {
        if inner.marks.len() <= self.capacity {
            return;
        }
        let mut floor = inner.floor;
        inner.marks.retain(|_, m| {
            if !m.unsettled {
                floor = floor.max(m.generation);
            }
            m.unsettled
        });
        inner.floor = floor;
    }

    /// Drops the stream's cached ranges and returns the forget's new generation.
    fn forget_locked(inner: &mut Inner, stream: StreamId) -> u64 {
        inner.forgets += 1;
        let keys: Vec<_> = inner
            .ranges
            .range((stream, 0)..=(stream, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for key in &keys {
            inner.ranges.remove(key);
        }
        inner.order.retain(|k| k.0 != stream);
        inner.forgets
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

    /// Streams whose next index read must be linearizable.
    pub fn unsettled(&self) -> usize {
        self.lock().marks.values().filter(|m| m.unsettled).count()
    }

    /// Streams with a mark of their own.
    pub fn marks(&self) -> usize {
        self.lock().marks.len()
    }
}

impl Inner {
    fn generation(&self, stream: StreamId) -> u64 {
        self.marks.get(&stream).map_or(self.floor, |m| m.generation)
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
        let mark = self.ranges.read_mark(stream);
        let page = self.index_page_at(stream, offset, mark).await?;
        self.ranges.settle(stream, mark);
        Ok(page)
    }

    async fn index_page_at(&self, stream: StreamId, offset: u64, mark: ReadMark) -> Result<RangesPage, StreamdError> {
        self.metad
            .read_ranges(stream, Offset(offset), false, PAGE, self.consistency(mark))
            .await
            .map_err(index_unavailable)
    }

    fn consistency(&self, mark: ReadMark) -> Consistency {
        if mark.linearizable {
            Consistency::Linearizable
        } else {
            Consistency::AtLeast(self.view.applied_index())
        }
    }

    /// The committed range of `stream` holding `offset`: cached, or read from metad's
    /// object index at (or after) the view's applied index, with the page after it.
    pub async fn range_at(&self, stream: StreamId, offset: u64) -> Result<ObjectRange, StreamdError> {
        if let Some(r) = self.ranges.find(stream, offset) {
            return Ok(r);
        }
        let mark = self.ranges.read_mark(stream);
        let page = self.index_page_at(stream, offset, mark).await?;
        let found = page
            .ranges
            .iter()
            .find(|r| r.start.0 <= offset && offset < r.end.0)
            .cloned();
        self.ranges.insert_read(stream, mark, page.ranges);
        found.ok_or_else(|| {
            StreamdError::Internal(format!("no committed object holds offset {offset} of stream {stream}"))
        })
    }

    /// The newest committed ranges of `stream` below `end`, oldest first, until they
    /// cover `bytes` (an open's idempotent-producer rebuild needs only the tail).
    pub async fn tail_ranges(&self, stream: StreamId, end: u64, bytes: u64) -> Result<Vec<ObjectRange>, StreamdError> {
        let mark = self.ranges.read_mark(stream);
        let consistency = self.consistency(mark);
        let (mut tail, mut covered, mut at) = (Vec::new(), 0u64, end);
        while covered < bytes {
            let page = self
                .metad
                .read_ranges(stream, Offset(at), true, PAGE.min(100), consistency)
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
        self.ranges.insert_read(stream, mark, tail.iter().cloned());
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
            txns: Default::default(),
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

    /// A compaction replaced ranges the view may not show yet: an index read begun
    /// before the forget is not cached, the next one is linearizable, and one that
    /// completes settles the stream.
    #[test]
    fn an_index_read_begun_before_a_forget_is_not_cached_and_the_next_is_linearizable() {
        let cache = RangeCache::new(10);
        let (a, b) = (StreamId(1), StreamId(2));
        let before = cache.read_mark(a);
        assert!(!before.linearizable);
        cache.forget_unsettled(a);
        cache.insert_read(a, before, [range(0, 5)]);
        assert_eq!(cache.find(a, 0), None, "a read begun before the forget is dropped");
        let next = cache.read_mark(a);
        assert!(next.linearizable, "the next read is linearizable");
        assert!(!cache.read_mark(b).linearizable, "another stream is untouched");
        cache.insert_read(a, next, [range(0, 5)]);
        assert_eq!(cache.find(a, 3), Some(range(0, 5)));
        assert!(!cache.read_mark(a).linearizable, "a linearizable read settles it");
        let stale = cache.read_mark(a);
        cache.forget(a);
        cache.settle(a, stale);
        cache.insert_read(a, stale, [range(5, 9)]);
        assert_eq!(cache.find(a, 6), None);
    }

    /// Issue 21: the marks stay bounded by the capacity however many streams pass
    /// through the node, a sweep never drops an unsettled one, and dropping one never
    /// lets a stale read be cached.
    #[test]
    fn marks_stay_bounded_and_a_swept_mark_caches_no_stale_read() {
        let cache = RangeCache::new(10);
        let stuck = StreamId(1_000_000);
        cache.forget_unsettled(stuck);
        for id in 0..10_000 {
            let stream = StreamId(id);
            let mark = cache.read_mark(stream);
            cache.insert_read(stream, mark, [range(0, 5)]);
            cache.forget_unsettled(stream);
            let next = cache.read_mark(stream);
            assert!(next.linearizable);
            cache.settle(stream, next);
            cache.forget(stream);
            assert!(cache.marks() <= 11, "{} marks", cache.marks());
        }
        assert_eq!(cache.unsettled(), 1, "only the stream never settled");
        assert!(cache.read_mark(stuck).linearizable, "a sweep keeps an unsettled mark");

        let (a, b) = (StreamId(1), StreamId(2));
        let stale_a = cache.read_mark(a);
        cache.forget_unsettled(a);
        let settling = cache.read_mark(a);
        cache.settle(a, settling);
        let fresh_b = cache.read_mark(b);
        for id in 100_000..100_020 {
            cache.forget(StreamId(id));
        }
        cache.insert_read(a, stale_a, [range(0, 5)]);
        assert_eq!(cache.find(a, 0), None, "a read begun before its swept mark's forget");
        cache.insert_read(b, fresh_b, [range(0, 5)]);
        assert_eq!(cache.find(b, 0), None, "a sweep merely leaves reads in flight uncached");
        let fresh = cache.read_mark(b);
        cache.insert_read(b, fresh, [range(0, 5)]);
        assert_eq!(cache.find(b, 0), Some(range(0, 5)));

        // Below the bound, one stream's forget leaves another's read in flight alone.
        let cache = RangeCache::new(1_000);
        let before_forget = cache.read_mark(a);
        let other = cache.read_mark(b);
        cache.forget(a);
        cache.insert_read(a, before_forget, [range(0, 5)]);
        assert_eq!(cache.find(a, 0), None, "a release forgets");
        cache.insert_read(b, other, [range(5, 9)]);
        assert_eq!(cache.find(b, 6), Some(range(5, 9)));
    }
}
