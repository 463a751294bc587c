//! The object index: each stream's committed ranges and the data objects that hold them
//! (design 0002). metad keeps it in its store, outside the watched view, and serves it
//! on demand; apply reads it through [`IndexRead`] and writes it as [`IndexChange`]s, so
//! apply stays a pure function of the state, the index and the proposal.

use super::rows::{ObjectRange, ObjectRow};
use std::collections::{BTreeMap, BTreeSet};
use weir_shared::ids::{ObjectKey, Offset, StreamId};

/// Reads the index as it stands before an entry applies.
pub trait IndexRead {
    /// The committed object `key`, if any.
    fn object(&self, key: &ObjectKey) -> Option<ObjectRow>;
    /// Up to `limit` of the stream's ranges whose start is at or after `from`, in order.
    fn ranges_from(&self, stream: StreamId, from: Offset, limit: usize) -> Vec<ObjectRange>;
    /// Up to `limit` of the stream's ranges whose start is before `before`, newest first.
    fn ranges_before(&self, stream: StreamId, before: Offset, limit: usize) -> Vec<ObjectRange>;
}

/// A page of the index as `ReadRanges` answers it: forward, the range holding `offset`
/// and those after it; reverse, the ranges ending at or before `offset`, newest first.
/// Whether more follow in that direction.
pub fn page(
    index: &dyn IndexRead,
    stream: StreamId,
    offset: Offset,
    reverse: bool,
    limit: usize,
) -> (Vec<ObjectRange>, bool) {
    let limit = limit.max(1);
    let mut ranges = if reverse {
        let mut back = index.ranges_before(stream, offset, limit + 2);
        // The range holding `offset` ends after it; reverse pages stop before it.
        back.retain(|r| r.end <= offset);
        back
    } else {
        let holding = index
            .ranges_before(stream, Offset(offset.0.saturating_add(1)), 1)
            .into_iter()
            .filter(|r| r.end > offset);
        let after = index.ranges_from(stream, Offset(offset.0.saturating_add(1)), limit + 1);
        holding.chain(after).collect()
    };
    let more = ranges.len() > limit;
    ranges.truncate(limit);
    (ranges, more)
}

/// One write to the index, made by an applied entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexChange {
    PutRange {
        stream: StreamId,
        range: ObjectRange,
    },
    DeleteRange {
        stream: StreamId,
        start: Offset,
    },
    PutObject(ObjectRow),
    DeleteObject(ObjectKey),
    /// An object left the index at log index `index`: GC deletes it from the bucket
    /// after its grace, reading these in order instead of listing the bucket (D-23).
    Released {
        index: u64,
        key: ObjectKey,
    },
    /// GC deleted the objects released at or below log index `through`.
    ForgetReleased {
        through: u64,
    },
}

/// The index in memory: the reference implementation (tests, the migration) and the
/// writes of an apply batch not yet stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemIndex {
    ranges: BTreeMap<(StreamId, Offset), ObjectRange>,
    objects: BTreeMap<ObjectKey, ObjectRow>,
    /// Objects released and not yet forgotten, by the log index that released them.
    released: BTreeSet<(u64, ObjectKey)>,
}

impl MemIndex {
    /// Applies `changes` in order.
    pub fn apply(&mut self, changes: &[IndexChange]) {
        for change in changes {
            match change {
                IndexChange::PutRange { stream, range } => {
                    self.ranges.insert((*stream, range.start), range.clone());
                }
                IndexChange::DeleteRange { stream, start } => {
                    self.ranges.remove(&(*stream, *start));
                }
                IndexChange::PutObject(row) => {
                    self.objects.insert(row.key.clone(), row.clone());
                }
                IndexChange::DeleteObject(key) => {
                    self.objects.remove(key);
                }
                IndexChange::Released { index, key } => {
                    self.released.insert((*index, key.clone()));
                }
                IndexChange::ForgetReleased { through } => {
                    self.released = self
                        .released
                        .split_off(&(through.saturating_add(1), ObjectKey(String::new())));
                }
            }
        }
    }

    /// Objects released and not forgotten, by releasing index, from `after` on (exclusive).
    pub fn released(&self, after: u64, limit: usize) -> Vec<(u64, ObjectKey)> {
        self.released
            .range((after.saturating_add(1), ObjectKey(String::new()))..)
            .take(limit)
            .cloned()
            .collect()
    }

    /// This index without its released-objects log (which format 1 did not have).
    pub fn without_released(&self) -> Self {
        Self {
            released: BTreeSet::new(),
            ..self.clone()
        }
    }

    /// The range of `stream` holding `offset`.
    pub fn find(&self, stream: StreamId, offset: Offset) -> Option<&ObjectRange> {
        self.ranges
            .range(..=(stream, offset))
            .next_back()
            .filter(|((s, _), r)| *s == stream && offset < r.end)
            .map(|(_, r)| r)
    }

    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    pub fn objects(&self) -> impl Iterator<Item = &ObjectRow> {
        self.objects.values()
    }

    /// Every range, by stream then start.
    pub fn all_ranges(&self) -> impl Iterator<Item = (StreamId, &ObjectRange)> {
        self.ranges.iter().map(|((s, _), r)| (*s, r))
    }
}

impl IndexRead for MemIndex {
    fn object(&self, key: &ObjectKey) -> Option<ObjectRow> {
        self.objects.get(key).cloned()
    }

    fn ranges_before(&self, stream: StreamId, before: Offset, limit: usize) -> Vec<ObjectRange> {
        self.ranges
            .range((stream, Offset(0))..(stream, before))
            .rev()
            .take(limit)
            .map(|(_, r)| r.clone())
            .collect()
    }

    fn ranges_from(&self, stream: StreamId, from: Offset, limit: usize) -> Vec<ObjectRange> {
        self.ranges
            .range((stream, from)..=(stream, Offset(u64::MAX)))
            .take(limit)
            .map(|(_, r)| r.clone())
            .collect()
    }
}

/// `base` with the writes of entries applied after it but not yet stored on top.
pub struct Overlay<'a> {
    base: &'a dyn IndexRead,
    puts: MemIndex,
    deleted_ranges: BTreeSet<(StreamId, Offset)>,
    deleted_objects: BTreeSet<ObjectKey>,
}

impl<'a> Overlay<'a> {
    pub fn new(base: &'a dyn IndexRead) -> Self {
        Self {
            base,
            puts: MemIndex::default(),
            deleted_ranges: BTreeSet::new(),
            deleted_objects: BTreeSet::new(),
        }
    }

    /// Records `changes` on top of what is read through it.
    pub fn apply(&mut self, changes: &[IndexChange]) {
        for change in changes {
            match change {
                IndexChange::PutRange { stream, range } => {
                    self.deleted_ranges.remove(&(*stream, range.start));
                }
                IndexChange::DeleteRange { stream, start } => {
                    self.deleted_ranges.insert((*stream, *start));
                }
                IndexChange::PutObject(row) => {
                    self.deleted_objects.remove(&row.key);
                }
                IndexChange::DeleteObject(key) => {
                    self.deleted_objects.insert(key.clone());
                }
                // Never read by apply.
                IndexChange::Released { .. } | IndexChange::ForgetReleased { .. } => {}
            }
        }
        self.puts.apply(changes);
    }
}

impl IndexRead for Overlay<'_> {
    fn object(&self, key: &ObjectKey) -> Option<ObjectRow> {
        if self.deleted_objects.contains(key) {
            return None;
        }
        self.puts.object(key).or_else(|| self.base.object(key))
    }

    fn ranges_from(&self, stream: StreamId, from: Offset, limit: usize) -> Vec<ObjectRange> {
        // Ranges deleted here may hide stored ones, so read past them.
        let hidden = self.deleted_ranges.iter().filter(|(s, _)| *s == stream).count();
        let mut merged: BTreeMap<Offset, ObjectRange> = self
            .base
            .ranges_from(stream, from, limit.saturating_add(hidden))
            .into_iter()
            .map(|r| (r.start, r))
            .collect();
        for r in self.puts.ranges_from(stream, from, usize::MAX) {
            merged.insert(r.start, r);
        }
        merged
            .into_values()
            .filter(|r| !self.deleted_ranges.contains(&(stream, r.start)))
            .take(limit)
            .collect()
    }

    fn ranges_before(&self, stream: StreamId, before: Offset, limit: usize) -> Vec<ObjectRange> {
        let hidden = self.deleted_ranges.iter().filter(|(s, _)| *s == stream).count();
        let mut merged: BTreeMap<Offset, ObjectRange> = self
            .base
            .ranges_before(stream, before, limit.saturating_add(hidden))
            .into_iter()
            .map(|r| (r.start, r))
            .collect();
        for r in self.puts.ranges_before(stream, before, usize::MAX) {
            merged.insert(r.start, r);
        }
        merged
            .into_values()
            .rev()
            .filter(|r| !self.deleted_ranges.contains(&(stream, r.start)))
            .take(limit)
            .collect()
    }
}
