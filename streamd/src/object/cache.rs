//! A bounded cache of data-object ranges, so tail readers and repeated reads do not
//! hit object storage. Evicts in insertion order once over its byte budget.

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

type Key = (String, u64);

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
        if data.len() as u64 > self.budget {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let k = (key.to_string(), pos);
        if let Some(old) = inner.entries.insert(k.clone(), data.clone()) {
            inner.bytes -= old.len() as u64;
        } else {
            inner.order.push_back(k);
        }
        inner.bytes += data.len() as u64;
        while inner.bytes > self.budget {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(old) = inner.entries.remove(&oldest) {
                inner.bytes -= old.len() as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_stays_within_its_budget() {
        let cache = BlockCache::new(10);
        cache.insert("a", 0, Bytes::from_static(b"12345"));
        cache.insert("b", 0, Bytes::from_static(b"12345"));
        cache.insert("c", 0, Bytes::from_static(b"12345"));
        assert!(cache.get("a", 0).is_none());
        assert_eq!(cache.get("c", 0).as_deref(), Some(&b"12345"[..]));
    }
}
