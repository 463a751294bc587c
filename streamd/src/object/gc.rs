//! Garbage collection of data objects: those no stream references any more (a
//! destroyed stream, a trim, retention, a compaction), and those uploaded but never
//! committed (a crash between PUT and CommitObjects, or a refused commit). An object is
//! deleted only once the object index, read linearizably, does not hold it, and it has
//! stayed so for the grace period, so a read that looked a range up just before it was
//! released still finds its object (RR-WAL-4, RR-WAL-5, INV-17). The decision is made
//! from the index, not from this node's view of the log, so a node whose view lags
//! deletes nothing committed (design 0002).
//!
//! A pass costs what changed since the last one, not what the bucket holds (D-23):
//! - **released objects**: metad logs every object that leaves the index; a pass reads
//!   that log in release order, deletes what is past its grace, and tells metad to
//!   forget it (`ForgetReleased`);
//! - **never committed uploads**: no log names them, so once per safety delay (an hour
//!   by default) a sweep lists the bucket, a page at a time, and deletes what is older
//!   than the delay and not committed. The passes between sweeps list nothing.
//!
//! Deletes go in bounded batches (one bulk request each on S3) and stop between results
//! when cancelled; what a stop leaves is found again by the next pass, after a restart
//! too (RR-INT-7). One streamd runs GC: the live one with the least node id.

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStore;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use weir_meta::client::{ClientError, MetadClient, MAX_PAGE};
use weir_meta::model::{Command, NodeKind, Proposer};
use weir_meta::view::View;
use weir_shared::ids::{Incarnation, ObjectKey};

/// What GC reads and writes in the metadata log.
pub trait GcIndex {
    /// Up to a page of released objects after log index `after`, in release order;
    /// whether more follow.
    fn released(&self, after: u64) -> impl Future<Output = Result<(Vec<(u64, ObjectKey)>, bool), ClientError>> + Send;
    /// Which of `keys` the index holds, read linearizably.
    fn committed(&self, keys: &[ObjectKey]) -> impl Future<Output = Result<BTreeSet<ObjectKey>, ClientError>> + Send;
    /// The objects released at or below `through` are deleted.
    fn forget(&self, through: u64) -> impl Future<Output = Result<(), ClientError>> + Send;
}

/// The metadata log as a streamd incarnation reaches it.
pub struct MetadIndex {
    pub metad: Arc<MetadClient>,
    pub me: Incarnation,
}

impl GcIndex for MetadIndex {
    async fn released(&self, after: u64) -> Result<(Vec<(u64, ObjectKey)>, bool), ClientError> {
        count("released");
        self.metad.released_objects(after).await
    }

    async fn committed(&self, keys: &[ObjectKey]) -> Result<BTreeSet<ObjectKey>, ClientError> {
        count("committed");
        Ok(self.metad.objects_committed(keys).await?.0)
    }

    async fn forget(&self, through: u64) -> Result<(), ClientError> {
        count("forget");
        let (_, outcome) = self
            .metad
            .propose(&Proposer::Node(self.me.clone()), Command::ForgetReleased { through })
            .await?;
        outcome.map(|_| ()).map_err(|r| ClientError::Unavailable(r.message))
    }
}

/// Counts one request GC made, by kind (`weir_streamd_gc_requests_total`).
fn count(kind: &str) {
    crate::metrics::metrics().gc_requests.with_label_values(&[kind]).inc();
}

/// The collector's memory between passes. Kept in memory: a restart only delays deletes.
#[derive(Debug, Default)]
pub struct Gc {
    /// When this node first saw each released object: its grace runs from there.
    released_seen: HashMap<ObjectKey, Instant>,
    /// When a sweep first found each never committed object unreferenced.
    unreferenced: HashMap<Path, Instant>,
    /// When the last sweep of the bucket ended.
    swept: Option<Instant>,
}

/// Bounds of one pass.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A listed object younger than this may be an upload whose commit is under way.
    pub delay: Duration,
    /// How long an object stays unreferenced before it is deleted.
    pub grace: Duration,
}

impl Gc {
    /// One pass; how many objects it deleted.
    pub async fn pass(
        &mut self,
        store: &dyn ObjectStore,
        index: &impl GcIndex,
        limits: Limits,
        cancel: &CancellationToken,
    ) -> anyhow::Result<usize> {
        let released = self.collect_released(store, index, limits.grace, cancel).await?;
        let swept = self.sweep(store, index, limits, cancel).await?;
        Ok(released + swept)
    }

    /// Deletes the released objects past their grace, in release order, and has metad
    /// forget them; stops at the first one still within it (those after it are newer).
    /// Every released object is read, so each one's grace runs from the first pass
    /// that saw it: what a pass reads is what was released and is not deleted yet.
    async fn collect_released(
        &mut self,
        store: &dyn ObjectStore,
        index: &impl GcIndex,
        grace: Duration,
        cancel: &CancellationToken,
    ) -> anyhow::Result<usize> {
        let now = Instant::now();
        let mut pending = Vec::new();
        let mut after = 0;
        loop {
            let (page, more) = index.released(after).await?;
            let Some(last) = page.last() else { break };
            after = last.0;
            pending.extend(page);
            if !more {
                break;
            }
        }
        for (_, key) in &pending {
            self.released_seen.entry(key.clone()).or_insert(now);
        }
        let due: Vec<(u64, ObjectKey)> = pending
            .into_iter()
            .take_while(|(_, key)| {
                self.released_seen
                    .get(key)
                    .is_some_and(|seen| now.saturating_duration_since(*seen) >= grace)
            })
            .collect();
        let (mut deleted, mut done_through) = (0, None);
        for chunk in due.chunks(MAX_PAGE as usize) {
            let keys: Vec<ObjectKey> = chunk.iter().map(|(_, k)| k.clone()).collect();
            // Asked right before deleting: an object is committed under one key once.
            let committed = index.committed(&keys).await?;
            let doomed: Vec<Path> = keys
                .iter()
                .filter(|k| !committed.contains(k))
                .map(|k| Path::from(k.0.as_str()))
                .collect();
            let asked = doomed.len();
            let gone = delete(store, doomed, cancel).await;
            deleted += gone.len();
            if gone.len() < asked || cancel.is_cancelled() {
                // A delete failed or a stop came: forget only what is surely gone.
                break;
            }
            for (i, key) in chunk {
                self.released_seen.remove(key);
                done_through = Some(*i);
            }
        }
        if let Some(through) = done_through {
            index.forget(through).await?;
        }
        Ok(deleted)
    }

    /// Every `delay` (the youngest a never committed upload may be deleted at),
    /// lists the bucket and deletes the objects older than the delay that the index
    /// does not hold and has not held for the grace period. Between sweeps, a pass
    /// lists nothing.
    async fn sweep(
        &mut self,
        store: &dyn ObjectStore,
        index: &impl GcIndex,
        limits: Limits,
        cancel: &CancellationToken,
    ) -> anyhow::Result<usize> {
        if self.swept.is_some_and(|at| at.elapsed() < limits.delay) {
            return Ok(0);
        }
        count("list");
        let cutoff = std::time::SystemTime::now() - limits.delay;
        // Fused: a page that ends the listing is followed by one more look at it.
        let mut listing = store.list(Some(&Path::from("data"))).fuse();
        let mut seen = std::collections::HashSet::new();
        let mut deleted = 0;
        loop {
            // A page of candidates at a time: the listing is not held in memory.
            let mut candidates = Vec::with_capacity(MAX_PAGE as usize);
            while candidates.len() < MAX_PAGE as usize {
                let Some(meta) = listing.try_next().await? else { break };
                if std::time::SystemTime::from(meta.last_modified) < cutoff {
                    candidates.push(meta.location);
                }
            }
            if candidates.is_empty() {
                break;
            }
            let keys: Vec<ObjectKey> = candidates.iter().map(|p| ObjectKey(p.to_string())).collect();
            // Asked right before deleting: a commit that landed since the listing counts.
            let committed = index.committed(&keys).await?;
            let now = Instant::now();
            let mut doomed = Vec::new();
            for (path, key) in candidates.iter().zip(&keys) {
                if committed.contains(key) {
                    continue;
                }
                seen.insert(path.clone());
                let first = *self.unreferenced.entry(path.clone()).or_insert(now);
                if now.saturating_duration_since(first) >= limits.grace {
                    doomed.push(path.clone());
                }
            }
            let gone = delete(store, doomed, cancel).await;
            deleted += gone.len();
            for path in &gone {
                self.unreferenced.remove(path);
            }
            if cancel.is_cancelled() {
                return Ok(deleted);
            }
        }
        // What this sweep did not find unreferenced is forgotten.
        self.unreferenced.retain(|p, _| seen.contains(p));
        self.swept = Some(Instant::now());
        Ok(deleted)
    }
}

/// Deletes `doomed` in one bulk request where the store has one (S3's DeleteObjects
/// takes up to 1,000 keys), not a request per object; a stop ends it between results.
/// The paths deleted (or found gone already).
async fn delete(store: &dyn ObjectStore, doomed: Vec<Path>, cancel: &CancellationToken) -> Vec<Path> {
    if doomed.is_empty() {
        return Vec::new();
    }
    count("delete");
    let asked = doomed.len();
    let mut gone = Vec::new();
    let mut results = store.delete_stream(futures::stream::iter(doomed.into_iter().map(Ok)).boxed());
    loop {
        let result = tokio::select! {
            r = results.next() => r,
            _ = cancel.cancelled() => None,
        };
        let path = match result {
            None => break,
            Some(Ok(path)) => path,
            // Gone already: deleted by an earlier pass whose answer was lost.
            Some(Err(object_store::Error::NotFound { path, .. })) => Path::from(path),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot delete unreferenced data object");
                continue;
            }
        };
        crate::metrics::metrics().gc_deleted.inc();
        tracing::info!(object_key = %path, "deleted unreferenced data object");
        gone.push(path);
    }
    tracing::info!(
        deleted = gone.len(),
        asked,
        "deleted a batch of unreferenced data objects"
    );
    gone
}

/// Whether `me` runs GC: the live streamd with the least node id does, so the cluster
/// deletes each object once (two at a time, while the view says so, is harmless).
fn runs_gc(view: &View, me: &Incarnation) -> bool {
    view.with(|s| {
        s.nodes
            .values()
            .filter(|n| n.kind == NodeKind::Streamd && n.is_live())
            .map(|n| &n.id)
            .min()
            == Some(&me.node)
    })
}

/// Runs a pass every `every` until `cancel`, on the node that runs GC.
pub async fn gc_loop(
    store: Arc<dyn ObjectStore>,
    index: MetadIndex,
    view: Arc<View>,
    limits: Limits,
    every: Duration,
    cancel: CancellationToken,
) {
    let mut gc = Gc::default();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if !runs_gc(&view, &index.me) {
            continue;
        }
        // A stop ends a pass wherever it waits: every step is safe to drop, and the next
        // start finds what is left.
        let pass = tokio::select! {
            pass = gc.pass(store.as_ref(), &index, limits, &cancel) => pass,
            _ = cancel.cancelled() => return,
        };
        match pass {
            Ok(_) => crate::metrics::metrics().gc_passes.inc(),
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "object garbage collection failed; will retry"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use futures::stream::BoxStream;
    use object_store::memory::InMemory;
    use object_store::{
        CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStoreExt,
        PutMultipartOptions, PutOptions, PutPayload, PutResult,
    };
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    /// An in-memory store that counts the requests GC makes of it.
    #[derive(Debug, Default)]
    struct Counting {
        inner: InMemory,
        lists: AtomicU64,
        deletes: AtomicU64,
    }

    impl std::fmt::Display for Counting {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Counting")
        }
    }

    #[async_trait]
    impl ObjectStore for Counting {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            self.inner.put_opts(location, payload, opts).await
        }

        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.inner.put_multipart_opts(location, opts).await
        }

        async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
            self.inner.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            self.deletes.fetch_add(1, Ordering::Relaxed);
            self.inner.delete_stream(locations)
        }

        fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.lists.fetch_add(1, Ordering::Relaxed);
            self.inner.list(prefix)
        }

        async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
            self.lists.fetch_add(1, Ordering::Relaxed);
            self.inner.list_with_delimiter(prefix).await
        }

        async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    /// The metadata log as GC sees it, counting its requests.
    #[derive(Default)]
    struct FakeIndex {
        committed: Mutex<BTreeSet<ObjectKey>>,
        released: Mutex<Vec<(u64, ObjectKey)>>,
        requests: AtomicU64,
    }

    impl FakeIndex {
        /// Object `key` leaves the index at log index `at`.
        fn release(&self, at: u64, key: &ObjectKey) {
            self.committed.lock().expect("lock").remove(key);
            self.released.lock().expect("lock").push((at, key.clone()));
        }
    }

    impl GcIndex for FakeIndex {
        async fn released(&self, after: u64) -> Result<(Vec<(u64, ObjectKey)>, bool), ClientError> {
            self.requests.fetch_add(1, Ordering::Relaxed);
            let all: Vec<_> = self
                .released
                .lock()
                .expect("lock")
                .iter()
                .filter(|(i, _)| *i > after)
                .cloned()
                .collect();
            let more = all.len() > MAX_PAGE as usize;
            Ok((all.into_iter().take(MAX_PAGE as usize).collect(), more))
        }

        async fn committed(&self, keys: &[ObjectKey]) -> Result<BTreeSet<ObjectKey>, ClientError> {
            self.requests.fetch_add(1, Ordering::Relaxed);
            let committed = self.committed.lock().expect("lock");
            Ok(keys.iter().filter(|k| committed.contains(k)).cloned().collect())
        }

        async fn forget(&self, through: u64) -> Result<(), ClientError> {
            self.requests.fetch_add(1, Ordering::Relaxed);
            self.released.lock().expect("lock").retain(|(i, _)| *i > through);
            Ok(())
        }
    }

    /// D-23, RR-WAL-5: with 5,000 objects kept and none released, a pass asks a constant
    /// number of requests, the bucket's size notwithstanding; once K objects are
    /// released, the pass after their grace deletes exactly them with requests in
    /// proportion to K, and the log forgets them.
    #[tokio::test]
    async fn a_pass_costs_what_was_released_not_what_the_bucket_holds() {
        let store = Counting::default();
        let index = FakeIndex::default();
        let keys: Vec<ObjectKey> = (0..5_000).map(|i| ObjectKey(format!("data/n/1/{i:05}.wdo"))).collect();
        for key in &keys {
            store
                .put(&Path::from(key.0.as_str()), PutPayload::from_static(b"x"))
                .await
                .expect("put");
            index.committed.lock().expect("lock").insert(key.clone());
        }
        // A delay of an hour: no sweep falls in this test after the first.
        let limits = Limits {
            delay: Duration::from_secs(3600),
            grace: Duration::from_millis(50),
        };
        let (mut gc, cancel) = (Gc::default(), CancellationToken::new());
        gc.pass(&store, &index, limits, &cancel)
            .await
            .expect("first pass sweeps");
        let requests = |store: &Counting, index: &FakeIndex| {
            store.lists.load(Ordering::Relaxed)
                + store.deletes.load(Ordering::Relaxed)
                + index.requests.load(Ordering::Relaxed)
        };
        for _ in 0..3 {
            let before = requests(&store, &index);
            assert_eq!(gc.pass(&store, &index, limits, &cancel).await.expect("pass"), 0);
            assert!(
                requests(&store, &index) - before <= 1,
                "an idle pass asked {} requests",
                requests(&store, &index) - before
            );
        }
        for (i, key) in keys.iter().take(2_500).enumerate() {
            index.release(10 + i as u64, key);
        }
        assert_eq!(
            gc.pass(&store, &index, limits, &cancel).await.expect("pass"),
            0,
            "within grace"
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
        let before = requests(&store, &index);
        assert_eq!(gc.pass(&store, &index, limits, &cancel).await.expect("pass"), 2_500);
        // 3 pages of released objects, 3 checks, 3 bulk deletes and one forget.
        let asked = requests(&store, &index) - before;
        assert!(
            (4..=12).contains(&asked),
            "deleting 2,500 objects asked {asked} requests"
        );
        assert!(index.released.lock().expect("lock").is_empty(), "forgotten");
        let left: Vec<_> = store.inner.list(None).try_collect().await.expect("list");
        assert_eq!(left.len(), 2_500, "the kept objects stay");
    }

    /// RR-WAL-4, INV-17: a never committed upload is deleted by a sweep once older than
    /// the delay and unreferenced for the grace; a committed one never is.
    #[tokio::test]
    async fn a_sweep_deletes_only_never_committed_uploads_after_their_grace() {
        let store = Counting::default();
        let index = FakeIndex::default();
        let (kept, orphan) = (
            ObjectKey("data/n/1/kept.wdo".into()),
            ObjectKey("data/n/1/orphan.wdo".into()),
        );
        for key in [&kept, &orphan] {
            store
                .put(&Path::from(key.0.as_str()), PutPayload::from_static(b"x"))
                .await
                .expect("put");
        }
        index.committed.lock().expect("lock").insert(kept.clone());
        let limits = Limits {
            delay: Duration::ZERO,
            grace: Duration::from_millis(50),
        };
        let (mut gc, cancel) = (Gc::default(), CancellationToken::new());
        // RR-WAL-4: an uncommitted object is not collected before its safety grace is over.
        assert_eq!(
            gc.pass(&store, &index, limits, &cancel).await.expect("pass"),
            0,
            "first seen"
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
        // RR-WAL-4: after it, the orphan is collected and the committed object is kept.
        assert_eq!(gc.pass(&store, &index, limits, &cancel).await.expect("pass"), 1);
        let left: Vec<String> = store
            .inner
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .expect("list");
        assert_eq!(left, [kept.0]);
    }
}
