//! A bounded cache of data-object ranges, so tail readers and repeated reads do not
//! hit object storage. Evicts in insertion order once over its byte budget, which
//! charges each entry its bookkeeping too: uploads of many small streams cache parts
//! of a few hundred bytes, where the keys and slots weigh as much as the data.
//!
//! An upload's write-through keeps a range as the batches the stream buffered, and
//! joins them into one buffer only when a read first asks for it (issue 62): most
//! uploaded ranges are never read from here (a tail reader reads the stream's buffer),
//! and joining every one was a copy of every produced byte, into buffers of 8 MiB and
//! more that the allocator maps fresh and unmaps on free.

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

type Key = (String, u64);

/// Bytes an entry costs beyond its data and its key's two copies: the map's slot
/// (key, value, hash control), the order queue's slot and the data's shared header.
const ENTRY_OVERHEAD: u64 = 160;

/// Mean size of the batches below which a write-through range is joined at once: the
/// `Bytes` of thousands of tiny batches would weigh more than their bytes, uncounted.
const KEEP_PIECES_OF: usize = 16 << 10;

/// A cached range: one buffer, or (written through by an upload) its batches in order.
#[derive(Clone)]
enum Entry {
    Joined(Bytes),
    Pieces(Arc<[Bytes]>),
}

impl Entry {
    fn len(&self) -> usize {
        match self {
            Entry::Joined(b) => b.len(),
            Entry::Pieces(p) => p.iter().map(Bytes::len).sum(),
        }
    }
}

/// `pieces` in one buffer.
fn join(pieces: &[Bytes]) -> Bytes {
    let mut joined = Vec::with_capacity(pieces.iter().map(Bytes::len).sum());
    for p in pieces {
        joined.extend_from_slice(p);
    }
    Bytes::from(joined)
}

/// What an entry is charged against the budget.
fn cost(key: &str, data: &Entry) -> u64 {
    data.len() as u64 + 2 * key.len() as u64 + ENTRY_OVERHEAD
}

/// Object ranges by (object key, position).
pub struct BlockCache {
    inner: Mutex<Inner>,
    budget: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    order: VecDeque<Key>,
    bytes: u64,
}

impl BlockCache {
    pub fn new(budget: u64) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            budget,
        }
    }

    /// The range at `pos` of object `key`, in one buffer. A range written through as
    /// its batches is joined here, outside the lock, and kept joined.
    pub fn get(&self, key: &str, pos: u64) -> Option<Bytes> {
        let k = (key.to_string(), pos);
        let pieces = match self.inner.lock().unwrap_or_else(|p| p.into_inner()).entries.get(&k)? {
            Entry::Joined(b) => return Some(b.clone()),
            Entry::Pieces(p) => p.clone(),
        };
        let joined = join(&pieces);
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // Same length, so the same charge; unless it was replaced or evicted meanwhile.
        if let Some(entry) = inner.entries.get_mut(&k) {
            if matches!(entry, Entry::Pieces(p) if Arc::ptr_eq(p, &pieces)) {
                *entry = Entry::Joined(joined.clone());
            }
        }
        Some(joined)
    }

    pub fn contains(&self, key: &str, pos: u64) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.entries.contains_key(&(key.to_string(), pos))
    }

    pub fn insert(&self, key: &str, pos: u64, data: Bytes) {
        self.insert_entry(key, pos, Entry::Joined(data));
    }

    /// Caches an uploaded range as the batches it was made of, without copying them;
    /// many small batches are joined now instead (see [`KEEP_PIECES_OF`]).
    pub fn insert_batches(&self, key: &str, pos: u64, batches: Vec<Bytes>) {
        let len: usize = batches.iter().map(Bytes::len).sum();
        let entry = match batches.len() {
            1 => Entry::Joined(batches.into_iter().next().expect("one")),
            n if len / n.max(1) < KEEP_PIECES_OF => Entry::Joined(join(&batches)),
            _ => Entry::Pieces(batches.into()),
        };
        self.insert_entry(key, pos, entry);
    }

    fn insert_entry(&self, key: &str, pos: u64, data: Entry) {
        let charged = cost(key, &data);
        if charged > self.budget {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let k = (key.to_string(), pos);
        if let Some(old) = inner.entries.insert(k.clone(), data) {
            inner.bytes -= cost(key, &old);
        } else {
            inner.order.push_back(k);
        }
        inner.bytes += charged;
        while inner.bytes > self.budget {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(old) = inner.entries.remove(&oldest) {
                inner.bytes -= cost(&oldest.0, &old);
            }
        }
        crate::metrics::metrics().cache_bytes.set(inner.bytes as i64);
    }

    /// Bytes charged against the budget now.
    pub fn bytes(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_stays_within_its_budget() {
        let each = cost("a", &Entry::Joined(Bytes::from_static(b"12345")));
        let cache = BlockCache::new(2 * each);
        cache.insert("a", 0, Bytes::from_static(b"12345"));
        cache.insert("b", 0, Bytes::from_static(b"12345"));
        cache.insert("c", 0, Bytes::from_static(b"12345"));
        assert!(cache.get("a", 0).is_none());
        assert_eq!(cache.get("b", 0).as_deref(), Some(&b"12345"[..]));
        assert_eq!(cache.get("c", 0).as_deref(), Some(&b"12345"[..]));
        assert_eq!(cache.bytes(), 2 * each);
    }

    /// Found by the transactions soak (issue 23): parts of a few bytes each, counted
    /// by their data alone, let a 16 MiB budget hold many times that in keys and slots.
    #[test]
    fn tiny_entries_are_charged_their_bookkeeping() {
        let key = "objects/0000000000000042-streamd-1-7.weir";
        let cache = BlockCache::new(100_000);
        for pos in 0..10_000 {
            cache.insert(key, pos, Bytes::from_static(b"x"));
        }
        let held = cache.inner.lock().unwrap().entries.len() as u64;
        assert!(
            held * (1 + 2 * key.len() as u64 + ENTRY_OVERHEAD) <= 100_000,
            "{held} entries held"
        );
        assert!(cache.bytes() <= 100_000);
        assert!(cache.get(key, 9_999).is_some());
    }

    #[test]
    fn replacing_an_entry_charges_only_the_new_one() {
        let cache = BlockCache::new(10_000);
        cache.insert("a", 0, Bytes::from_static(b"12345"));
        cache.insert("a", 0, Bytes::from_static(b"123"));
        assert_eq!(cache.bytes(), cost("a", &Entry::Joined(Bytes::from_static(b"123"))));
    }

    /// Issue 62: an upload's write-through keeps large batches as they are, joins them
    /// on the first read only, and from then on serves the joined buffer; many small
    /// batches are joined at once. Each is charged its bytes.
    #[test]
    fn written_through_batches_are_joined_on_the_first_read_only() {
        let batches: Vec<Bytes> = (0..4u8).map(|i| Bytes::from(vec![i; KEEP_PIECES_OF])).collect();
        let whole: Vec<u8> = batches.iter().flat_map(|b| b.to_vec()).collect();
        let cache = BlockCache::new(1 << 30);
        cache.insert_batches("o", 0, batches.clone());
        let held = |cache: &BlockCache| match cache.inner.lock().unwrap().entries.get(&("o".into(), 0)) {
            Some(Entry::Pieces(p)) => Some(p.len()),
            Some(Entry::Joined(_)) => Some(1),
            None => None,
        };
        assert_eq!(held(&cache), Some(4), "kept as the batches, not copied");
        assert_eq!(cache.bytes(), whole.len() as u64 + 2 + ENTRY_OVERHEAD);
        let first = cache.get("o", 0).expect("cached");
        assert_eq!(&first[..], &whole[..]);
        assert_eq!(held(&cache), Some(1), "joined once read");
        let again = cache.get("o", 0).expect("cached");
        assert_eq!(again.as_ptr(), first.as_ptr(), "the joined buffer is served again");
        assert_eq!(cache.bytes(), whole.len() as u64 + 2 + ENTRY_OVERHEAD);

        let small: Vec<Bytes> = (0..100u8).map(|i| Bytes::from(vec![i; 100])).collect();
        cache.insert_batches("o", 1, small.clone());
        assert!(matches!(
            cache.inner.lock().unwrap().entries.get(&("o".into(), 1)),
            Some(Entry::Joined(_))
        ));
        assert_eq!(cache.get("o", 1).expect("cached").to_vec(), small.concat());
    }
}
