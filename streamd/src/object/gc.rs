//! Garbage collection of data objects that were uploaded but never committed (a crash
//! between PUT and CommitObjects, or a refused commit), or that no stream references
//! any more (a destroyed stream, a trim, retention, a compaction): deleted once older
//! than the safety delay, absent from the object index, and found absent for a grace
//! period, so a read that looked a range up just before it was released still finds
//! its object (RR-WAL-4, RR-WAL-5, INV-17).
//!
//! The decision is made from the index, not from this node's view of the log: right
//! before deleting, a linearizable read (through the metad leader) shows which of the
//! candidates are committed, so a node whose view lags — or that follows a lagging
//! replica — deletes nothing committed (design 0002). Deletes in bounded batches of
//! [`MAX_PAGE`] keys, one bulk request each on S3, and stops between results when
//! cancelled; what a stop leaves is listed again by the next pass, after a restart too
//! (RR-INT-7).

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStore;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use weir_meta::client::{MetadClient, MAX_PAGE};
use weir_shared::ids::ObjectKey;

/// When this node first found each object unreferenced; an object is deleted only once
/// it has stayed so for the grace period. Kept in memory: a restart only delays deletes.
#[derive(Debug, Default)]
pub struct Unreferenced {
    since: HashMap<Path, Instant>,
}

impl Unreferenced {
    /// Whether `path`, found unreferenced now, has been so for at least `grace`.
    fn grace_passed(&mut self, path: &Path, grace: Duration) -> bool {
        let first = *self.since.entry(path.clone()).or_insert_with(Instant::now);
        first.elapsed() >= grace
    }
}

/// One pass: deletes `data/` objects older than `delay` that the index does not hold
/// and has not held for `grace`. Returns how many.
pub async fn collect(
    store: &dyn ObjectStore,
    metad: &MetadClient,
    delay: Duration,
    grace: Duration,
    unreferenced: &mut Unreferenced,
    cancel: &CancellationToken,
) -> anyhow::Result<usize> {
    let cutoff = std::time::SystemTime::now() - delay;
    let listed: Vec<_> = store.list(Some(&Path::from("data"))).try_collect().await?;
    let candidates: Vec<Path> = listed
        .into_iter()
        .filter(|m| std::time::SystemTime::from(m.last_modified) < cutoff)
        .map(|m| m.location)
        .collect();
    // What is gone from the bucket (or committed again, below) is forgotten.
    let listed: std::collections::HashSet<&Path> = candidates.iter().collect();
    unreferenced.since.retain(|p, _| listed.contains(p));
    let mut deleted = 0;
    for batch in candidates.chunks(MAX_PAGE as usize) {
        if cancel.is_cancelled() {
            break;
        }
        let keys: Vec<ObjectKey> = batch.iter().map(|p| ObjectKey(p.to_string())).collect();
        // Asked right before deleting: a commit that landed since the listing counts.
        let (committed, read_index) = metad.objects_committed(&keys).await?;
        let mut doomed = Vec::new();
        for (path, key) in batch.iter().zip(&keys) {
            if committed.contains(key) {
                unreferenced.since.remove(path);
            } else if unreferenced.grace_passed(path, grace) {
                doomed.push(path.clone());
            }
        }
        // One bulk request per batch where the store has one (S3's DeleteObjects takes
        // up to 1,000 keys), not a request per object; a stop ends it between results.
        let asked = doomed.len();
        let before = deleted;
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
            deleted += 1;
            crate::metrics::metrics().gc_deleted.inc();
            unreferenced.since.remove(&path);
            tracing::info!(object_key = %path, log_index = read_index, "deleted unreferenced data object");
        }
        if asked > 0 {
            tracing::info!(
                deleted = deleted - before,
                asked,
                log_index = read_index,
                "deleted a batch of unreferenced data objects"
            );
        }
    }
    Ok(deleted)
}

/// Runs [`collect`] every `every` until `cancel`.
pub async fn gc_loop(
    store: Arc<dyn ObjectStore>,
    metad: Arc<MetadClient>,
    delay: Duration,
    grace: Duration,
    every: Duration,
    cancel: CancellationToken,
) {
    let mut unreferenced = Unreferenced::default();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        // A stop ends a pass wherever it waits (a listing of a large bucket takes a
        // while): every step is safe to drop, and the next start lists again.
        let pass = tokio::select! {
            pass = collect(store.as_ref(), &metad, delay, grace, &mut unreferenced, &cancel) => pass,
            _ = cancel.cancelled() => return,
        };
        match pass {
            Ok(_) => crate::metrics::metrics().gc_passes.inc(),
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "object garbage collection failed; will retry"),
        }
    }
}
