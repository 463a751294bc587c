//! Pacing of background IO, like Kafka's `log.cleaner.io.max.bytes.per.second`: a
//! [`Pace`] hands out bytes at a rate, and a caller waits for its share before reading
//! or writing them.
//!
//! A PUT whose `PutOptions::extensions` hold a `Pace` is paced by the store: the local
//! store ([`super::local`]) before each synced step of 1 MiB, so a paced object reaches
//! the disk a step at a time between the WAL's syncs, and any other store, wrapped in
//! [`PacedStore`], before the PUT as a whole.
//!
//! A stopped pace waits no more: a node's teardown stops compaction's, so a paced pass
//! (and a paced write on a blocking thread, which an abort cannot end) finishes its
//! current step at once rather than holding the stop for the rest of its schedule.

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, RenameOptions, Result,
};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Longest sleep of a blocking wait between looks at the stop.
const BLOCKING_SLICE: Duration = Duration::from_millis(10);

/// Bytes at a rate (0: no limit). Clones share the rate and the schedule.
#[derive(Clone)]
pub struct Pace {
    inner: Arc<Inner>,
}

struct Inner {
    rate: AtomicU64,
    /// When the bytes handed out so far have been used up at the rate.
    free_at: Mutex<Instant>,
    /// Seconds callers waited, for the operator.
    waited: prometheus::Counter,
    stopped: CancellationToken,
}

impl fmt::Debug for Pace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pace({} B/s)", self.rate())
    }
}

impl Pace {
    pub fn new(bytes_per_sec: u64, waited: prometheus::Counter) -> Self {
        Pace {
            inner: Arc::new(Inner {
                rate: AtomicU64::new(bytes_per_sec),
                free_at: Mutex::new(Instant::now()),
                waited,
                stopped: CancellationToken::new(),
            }),
        }
    }

    pub fn rate(&self) -> u64 {
        self.inner.rate.load(Ordering::Relaxed)
    }

    pub fn set_rate(&self, bytes_per_sec: u64) {
        self.inner.rate.store(bytes_per_sec, Ordering::Relaxed);
    }

    /// Ends every wait, now and later.
    pub fn stop(&self) {
        self.inner.stopped.cancel();
    }

    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.is_cancelled()
    }

    /// Hands out `n` bytes; how long the caller waits before using them. A caller
    /// after an idle spell goes at once, and each one after it waits until the bytes
    /// before it are used up at the rate: no burst beyond one caller's bytes.
    pub fn reserve(&self, n: u64) -> Duration {
        let rate = self.rate();
        if rate == 0 || n == 0 || self.is_stopped() {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let mut free_at = self.inner.free_at.lock().expect("pace lock");
        let start = (*free_at).max(now);
        *free_at = start + Duration::from_secs_f64(n as f64 / rate as f64);
        let wait = start - now;
        self.inner.waited.inc_by(wait.as_secs_f64());
        wait
    }

    /// Waits for `n` bytes on the runtime.
    pub async fn take(&self, n: u64) {
        let wait = self.reserve(n);
        if !wait.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.inner.stopped.cancelled() => {}
            }
        }
    }

    /// Waits for `n` bytes on a blocking thread.
    pub fn take_blocking(&self, n: u64) {
        let until = Instant::now() + self.reserve(n);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || self.is_stopped() {
                return;
            }
            std::thread::sleep(left.min(BLOCKING_SLICE));
        }
    }
}

/// Options for a PUT paced by `pace`.
pub fn paced(pace: &Pace) -> PutOptions {
    let mut opts = PutOptions::default();
    opts.extensions.insert(pace.clone());
    opts
}

/// A store that paces a PUT carrying a [`Pace`] as a whole, before sending it.
#[derive(Debug)]
pub struct PacedStore<S> {
    inner: S,
}

impl<S> PacedStore<S> {
    pub fn new(inner: S) -> Self {
        PacedStore { inner }
    }
}

impl<S: fmt::Display> fmt::Display for PacedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Paced({})", self.inner)
    }
}

#[async_trait]
impl<S: ObjectStore> ObjectStore for PacedStore<S> {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        if let Some(pace) = opts.extensions.get::<Pace>() {
            pace.take(payload.content_length() as u64).await;
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[std::ops::Range<u64>]) -> Result<Vec<bytes::Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(&self, prefix: Option<&Path>, offset: &Path) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(rate: u64) -> Pace {
        Pace::new(rate, prometheus::Counter::new("waited", "test").unwrap())
    }

    #[test]
    fn each_caller_waits_until_the_bytes_before_it_are_used_up() {
        let pace = pace(1 << 20);
        assert_eq!(pace.reserve(1 << 20), Duration::ZERO, "the first goes at once");
        let second = pace.reserve(512 << 10);
        assert!(
            second > Duration::from_millis(950) && second <= Duration::from_secs(1),
            "{second:?}"
        );
        let third = pace.reserve(1);
        assert!(
            third > Duration::from_millis(1450) && third <= Duration::from_millis(1500),
            "{third:?}"
        );
        assert!(pace.inner.waited.get() > 2.4, "the waits are counted");
    }

    #[test]
    fn no_rate_is_no_limit() {
        let pace = pace(0);
        for _ in 0..3 {
            assert_eq!(pace.reserve(1 << 30), Duration::ZERO);
        }
    }

    #[test]
    fn a_stop_ends_the_waits() {
        let pace = pace(1);
        pace.reserve(1 << 20);
        let waiting = std::thread::spawn({
            let pace = pace.clone();
            move || pace.take_blocking(1)
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiting.is_finished(), "a wait of 12 days goes on");
        pace.stop();
        waiting.join().unwrap();
        assert_eq!(pace.reserve(1 << 20), Duration::ZERO, "none after the stop");
    }

    #[tokio::test]
    async fn a_paced_store_waits_before_each_paced_put() {
        let dir = tempfile::tempdir().unwrap();
        let store = PacedStore::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let pace = pace(256 << 10);
        let body = || PutPayload::from(vec![7u8; 128 << 10]);
        let started = Instant::now();
        for i in 0..3 {
            store
                .put_opts(&Path::from(format!("paced-{i}")), body(), paced(&pace))
                .await
                .unwrap();
        }
        // The second waits 0.5 s for the first's bytes, the third 1 s.
        assert!(
            started.elapsed() >= Duration::from_millis(990),
            "{:?}",
            started.elapsed()
        );
    }
}
