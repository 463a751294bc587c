//! Garbage collection of data objects that were uploaded but never committed (a crash
//! between PUT and CommitObjects, or a refused commit): deleted once older than the
//! safety delay and still absent from the metadata log (RR-WAL-4, RR-WAL-5, INV-17).
//! Deletes in bounded batches and checks for cancellation between them.

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use weir_meta::view::View;
use weir_shared::ids::ObjectKey;

/// Objects deleted per batch.
const BATCH: usize = 100;

/// One pass: deletes uncommitted `data/` objects older than `delay`. Returns how many.
pub async fn collect(
    store: &dyn ObjectStore,
    view: &View,
    delay: Duration,
    cancel: &CancellationToken,
) -> object_store::Result<usize> {
    let cutoff = std::time::SystemTime::now() - delay;
    let listed: Vec<_> = store.list(Some(&Path::from("data"))).try_collect().await?;
    let orphans: Vec<Path> = listed
        .into_iter()
        .filter(|m| std::time::SystemTime::from(m.last_modified) < cutoff)
        .filter(|m| !view.with(|s| s.objects.contains_key(&ObjectKey(m.location.to_string()))))
        .map(|m| m.location)
        .collect();
    let mut deleted = 0;
    for batch in orphans.chunks(BATCH) {
        if cancel.is_cancelled() {
            break;
        }
        for path in batch {
            // Re-check right before deleting: a commit may have landed since the listing.
            if view.with(|s| s.objects.contains_key(&ObjectKey(path.to_string()))) {
                continue;
            }
            match store.delete(path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    deleted += 1;
                    crate::metrics::metrics().gc_deleted.inc();
                    tracing::info!(object_key = %path, "deleted uncommitted data object");
                }
                Err(e) => tracing::warn!(object_key = %path, error = %e, "cannot delete uncommitted data object"),
            }
        }
    }
    Ok(deleted)
}

/// Runs [`collect`] every `every` until `cancel`.
pub async fn gc_loop(
    store: Arc<dyn ObjectStore>,
    view: Arc<View>,
    delay: Duration,
    every: Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        // Only a view that has caught up knows every committed object.
        if view.applied_index() == 0 {
            continue;
        }
        match collect(store.as_ref(), &view, delay, &cancel).await {
            Ok(_) => crate::metrics::metrics().gc_passes.inc(),
            Err(e) => tracing::warn!(error = %e, "object garbage collection failed; will retry"),
        }
    }
}
