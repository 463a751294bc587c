//! Committed ranges' bytes for readers: from the block cache, or one ranged GET per
//! range however many want it at once, checked against the range's CRC and cached.
//! A sequential reader's next range is fetched ahead while it reads this one, so a
//! consumer never waits for a whole range at each range boundary (issue 17).

use super::cache::BlockCache;
use crate::error::StreamdError;
use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use object_store::{GetOptions, GetRange, ObjectStore};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use weir_meta::model::ObjectRange;
use weir_shared::task_kinds::KindTasks;

/// Ranges fetched ahead at once, node-wide: read-ahead is a guess and must not take
/// the store's bandwidth (or the cache) from reads that are waiting.
pub const READ_AHEAD_CONCURRENCY: usize = 4;

/// Ranges larger than this are checked off the runtime's workers.
const BLOCKING_CHECK_BYTES: usize = 1 << 20;

/// Ranges smaller than this are copied out of the HTTP client's buffer before they are
/// cached. A small response's body is a slice of the connection's read buffer (8 KiB
/// and up), which would stay allocated, uncounted, as long as the cache kept the slice.
const DETACH_BELOW: usize = 512 << 10;

type Fetch = Shared<BoxFuture<'static, Result<Bytes, StreamdError>>>;
type Key = (String, u64);

/// The node's reads of committed ranges.
pub struct RangeReads {
    store: Arc<dyn ObjectStore>,
    cache: Arc<BlockCache>,
    /// GETs under way by (object key, position); an entry leaves once its bytes are
    /// cached, so a reader finds a range in one or the other.
    inflight: Arc<Mutex<HashMap<Key, Fetch>>>,
    ahead: Arc<tokio::sync::Semaphore>,
    /// The node's tasks: the GETs run there, so a teardown can name and end them.
    tasks: KindTasks,
}

impl RangeReads {
    pub fn new(store: Arc<dyn ObjectStore>, cache: Arc<BlockCache>, tasks: KindTasks) -> Self {
        Self {
            store,
            cache,
            tasks,
            inflight: Arc::default(),
            ahead: Arc::new(tokio::sync::Semaphore::new(READ_AHEAD_CONCURRENCY)),
        }
    }

    /// `range`'s bytes, from the cache or a GET (shared with any other reader of it).
    pub async fn get(&self, range: &ObjectRange) -> Result<Bytes, StreamdError> {
        if let Some(b) = self.cache.get(&range.key.0, range.pos) {
            return Ok(b);
        }
        self.fetch(range, "reader").await
    }

    /// Starts fetching `range` into the cache unless it is there, already coming, or
    /// too many read-aheads are under way. Returns at once.
    pub fn read_ahead(&self, range: &ObjectRange) {
        if self.cache.contains(&range.key.0, range.pos) {
            return;
        }
        let Ok(permit) = self.ahead.clone().try_acquire_owned() else {
            return;
        };
        let fetch = self.fetch(range, "read_ahead");
        self.tasks.spawn("read", "read ahead", None, async move {
            // Errors are the reader's to see when it gets there.
            let _ = fetch.await;
            drop(permit);
        });
    }

    /// The GET of `range` under way, or a new one. It runs in a task of its own, so a
    /// reader that goes away does not cancel it for the others.
    /// `by` names who asked first, for the metric.
    fn fetch(&self, range: &ObjectRange, by: &str) -> Fetch {
        let key = (range.key.0.clone(), range.pos);
        let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = inflight.get(&key) {
            return f.clone();
        }
        // Cached by a fetch that ended since the caller looked: it left the map after.
        if let Some(b) = self.cache.get(&key.0, key.1) {
            return futures::future::ready(Ok(b)).boxed().shared();
        }
        let (store, cache, map, range) = (
            self.store.clone(),
            self.cache.clone(),
            self.inflight.clone(),
            range.clone(),
        );
        crate::metrics::metrics().range_gets.with_label_values(&[by]).inc();
        let k = key.clone();
        let fetch = async move {
            let got = get_checked(store.as_ref(), &range).await.map(detach_small);
            if let Ok(b) = &got {
                cache.insert(&k.0, k.1, b.clone());
            }
            map.lock().unwrap_or_else(|p| p.into_inner()).remove(&k);
            got
        }
        .boxed()
        .shared();
        self.tasks
            .spawn("read", format!("get {}@{}", key.0, key.1), None, fetch.clone());
        inflight.insert(key, fetch.clone());
        fetch
    }
}

/// `bytes` in an allocation of its own when small (see `DETACH_BELOW`).
fn detach_small(bytes: Bytes) -> Bytes {
    if bytes.len() < DETACH_BELOW {
        Bytes::copy_from_slice(&bytes)
    } else {
        bytes
    }
}

/// One committed range's bytes by a ranged GET, checked against its CRC.
pub async fn get_checked(store: &dyn ObjectStore, range: &ObjectRange) -> Result<Bytes, StreamdError> {
    let bytes = get_span(store, &range.key.0, range.pos..range.pos + range.len).await?;
    // A compacted range is tens of MiB: checked on a blocking thread, so the runtime's
    // workers go on answering appends meanwhile.
    let crc = if bytes.len() > BLOCKING_CHECK_BYTES {
        let whole = bytes.clone();
        tokio::task::spawn_blocking(move || crc32c::crc32c(&whole))
            .await
            .map_err(|e| StreamdError::Internal(format!("checking object {}: {e}", range.key)))?
    } else {
        crc32c::crc32c(&bytes)
    };
    if crc != range.crc {
        return Err(StreamdError::Corrupt(format!(
            "object {} range {}..{} fails its checksum; it is not served",
            range.key, range.start, range.end
        )));
    }
    Ok(bytes)
}

/// Bytes `span` of object `key` by one ranged GET; an answer of another length is an
/// error (the object is not what the index says).
pub async fn get_span(store: &dyn ObjectStore, key: &str, span: std::ops::Range<u64>) -> Result<Bytes, StreamdError> {
    let path = object_store::path::Path::from(key);
    let opts = GetOptions {
        range: Some(GetRange::Bounded(span.clone())),
        ..Default::default()
    };
    let unavailable = |e: object_store::Error| StreamdError::Unavailable(format!("reading object {key}: {e}"));
    let bytes = store
        .get_opts(&path, opts)
        .await
        .map_err(|e| match e {
            object_store::Error::NotFound { .. } => StreamdError::ObjectGone(key.to_string()),
            e => unavailable(e),
        })?
        .bytes()
        .await
        .map_err(unavailable)?;
    if bytes.len() as u64 != span.end - span.start {
        return Err(StreamdError::Corrupt(format!(
            "object {key} returned {} bytes for {}..{}; it is not served",
            bytes.len(),
            span.start,
            span.end
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::ObjectStoreExt;
    use object_store::PutPayload;
    use weir_shared::ids::{ObjectKey, Offset};

    async fn store_with(key: &str, data: &'static [u8]) -> Arc<dyn ObjectStore> {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        store
            .put(&Path::from(key), PutPayload::from_static(data))
            .await
            .unwrap();
        store
    }

    fn range(key: &str, pos: u64, data: &[u8]) -> ObjectRange {
        ObjectRange {
            key: ObjectKey(key.into()),
            start: Offset(0),
            end: Offset(1),
            pos,
            len: data.len() as u64,
            crc: crc32c::crc32c(data),
            max_timestamp: 0,
            txns: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_range_is_checked_cached_and_read_again_from_the_cache() {
        let store = store_with("o", b"xxhello").await;
        let reads = RangeReads::new(store.clone(), Arc::new(BlockCache::new(1 << 20)), KindTasks::new());
        let r = range("o", 2, b"hello");
        assert_eq!(&reads.get(&r).await.unwrap()[..], b"hello");
        // Gone from the store, still served: the cache holds it.
        store.delete(&Path::from("o")).await.unwrap();
        assert_eq!(&reads.get(&r).await.unwrap()[..], b"hello");
        assert!(reads.inflight.lock().unwrap().is_empty());
        let bad = ObjectRange { crc: 1, pos: 0, ..r };
        assert!(matches!(reads.get(&bad).await, Err(StreamdError::ObjectGone(_))));
    }

    /// Found by the transactions soak (issue 23): a cached small range must not keep
    /// the buffer it was read into (here the stored object itself; over HTTP, the
    /// connection's read buffer) allocated behind it.
    #[tokio::test]
    async fn a_small_range_is_cached_in_an_allocation_of_its_own() {
        static OBJECT: [u8; 64 << 10] = [7; 64 << 10];
        let store = store_with("o", &OBJECT).await;
        let whole = store.get(&Path::from("o")).await.unwrap().bytes().await.unwrap();
        let r = range("o", 100, &OBJECT[100..200]);
        let within = |b: &Bytes| whole.as_ptr_range().contains(&b.as_ptr());
        let raw = get_checked(store.as_ref(), &r).await.unwrap();
        assert!(within(&raw), "the store answers with slices");
        let reads = RangeReads::new(store, Arc::new(BlockCache::new(1 << 20)), KindTasks::new());
        let got = reads.get(&r).await.unwrap();
        assert!(!within(&got), "the cached range is a slice of the object read");
        assert_eq!(got.len(), 100);
    }

    #[tokio::test]
    async fn readers_of_one_range_share_one_get() {
        let store = store_with("o", b"hello").await;
        let reads = RangeReads::new(store, Arc::new(BlockCache::new(1 << 20)), KindTasks::new());
        let r = range("o", 0, b"hello");
        let (a, b) = (reads.fetch(&r, "reader"), reads.fetch(&r, "reader"));
        assert!(a.ptr_eq(&b), "the second reader waits on the first one's GET");
        assert_eq!(reads.inflight.lock().unwrap().len(), 1);
        assert_eq!(&a.await.unwrap()[..], b"hello");
        assert_eq!(&b.await.unwrap()[..], b"hello");
        assert!(reads.inflight.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_range_failing_its_checksum_is_not_served_or_cached() {
        let store = store_with("o", b"hello").await;
        let cache = Arc::new(BlockCache::new(1 << 20));
        let reads = RangeReads::new(store, cache.clone(), KindTasks::new());
        let r = ObjectRange {
            crc: 7,
            ..range("o", 0, b"hello")
        };
        assert!(matches!(reads.get(&r).await, Err(StreamdError::Corrupt(_))));
        assert!(!cache.contains("o", 0));
    }

    #[tokio::test]
    async fn a_read_ahead_fills_the_cache_without_a_reader() {
        let store = store_with("o", b"hello").await;
        let cache = Arc::new(BlockCache::new(1 << 20));
        let reads = RangeReads::new(store, cache.clone(), KindTasks::new());
        reads.read_ahead(&range("o", 0, b"hello"));
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while !cache.contains("o", 0) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("read ahead");
    }
}
