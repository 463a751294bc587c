//! A bounded cache of data-object ranges, so tail readers and repeated reads do not
//! hit object storage. Evicts in insertion order once over its byte budget, which
//! charges each entry its bookkeeping too: uploads of many small streams cache parts
//! of a few hundred bytes, where the keys and slots weigh as much as the data.

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

type Key = (String, u64);

/// Bytes an entry costs beyond its data and its key's two copies: the map's slot
/// (key, value, hash control), the order queue's slot and the data's shared header.
const ENTRY_OVERHEAD: u64 = 160;

/// What an entry is charged against the budget.
fn cost(key: &str, data: &Bytes) -> u64 {
    data.len() as u64 + 2 * key.len() as u64 + ENTRY_OVERHEAD
}

/// Object ranges by (object key, position).
pub struct BlockCache {
    inner: Mutex<Inner>,
    budget: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Bytes>,
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

    pub fn get(&self, key: &str, pos: u64) -> Option<Bytes> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.entries.get(&(key.to_string(), pos)).cloned()
    }

    pub fn contains(&self, key: &str, pos: u64) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.entries.contains_key(&(key.to_string(), pos))
    }

    pub fn insert(&self, key: &str, pos: u64, data: Bytes) {
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
        let each = cost("a", &Bytes::from_static(b"12345"));
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
        assert_eq!(cache.bytes(), cost("a", &Bytes::from_static(b"123")));
    }
}
