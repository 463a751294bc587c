//! A coordinator's table kept in an internal stream this node owns (the offsets
//! stream of a group coordinator, the transaction-state stream of a transaction
//! coordinator). Changes are appended before they are applied, so what a client was
//! told is what a new owner replays; a load replays the stream from its start; and
//! once enough changes pile up the whole table is appended and the stream trimmed to
//! it, so a load replays the table and a short tail, not every change ever made.

use crate::error::StreamdError;
use crate::node::core_api::CoreApi;
use bytes::Bytes;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use weir_shared::ids::StreamEpoch;

/// A snapshot is due once this many changes, and at least twice the table's size,
/// have been stored since the last one: load work stays within a few table sizes.
const SNAPSHOT_MIN_CHANGES: u64 = 1_000;
/// Changes per batch of a snapshot.
const SNAPSHOT_BATCH: usize = 5_000;

/// A coordinator of one internal stream, at the stream epoch it was loaded at.
pub trait Loaded {
    fn epoch(&self) -> StreamEpoch;
}

/// The coordinators of the internal streams this node owns: one per stream, at the
/// stream's current epoch, each loaded once. Loads of different streams, and requests
/// to loaded coordinators, do not wait for each other.
pub struct Registry<C> {
    loaded: tokio::sync::Mutex<HashMap<String, Arc<C>>>,
    loading: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl<C> Default for Registry<C> {
    fn default() -> Self {
        Self {
            loaded: Default::default(),
            loading: Default::default(),
        }
    }
}

impl<C: Loaded> Registry<C> {
    /// The coordinator of `stream` at `epoch` if loaded.
    pub async fn get(&self, stream: &str, epoch: StreamEpoch) -> Option<Arc<C>> {
        self.loaded
            .lock()
            .await
            .get(stream)
            .filter(|c| c.epoch() == epoch)
            .cloned()
    }

    /// The coordinator of `stream` at `epoch`, loaded by `load` when the stream was
    /// (re)opened since the last load; `loaded` runs once for each new one (its tasks).
    /// A coordinator it replaces is handed to `replaced`.
    pub async fn get_or_load<F, Fut>(
        &self,
        stream: &str,
        epoch: StreamEpoch,
        load: F,
        replaced: impl FnOnce(Arc<C>),
    ) -> Result<(Arc<C>, bool), StreamdError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, StreamdError>>,
    {
        if let Some(c) = self.get(stream, epoch).await {
            return Ok((c, false));
        }
        let gate = self
            .loading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(stream.to_string())
            .or_default()
            .clone();
        let _loading = gate.lock().await;
        if let Some(c) = self.get(stream, epoch).await {
            return Ok((c, false));
        }
        let c = Arc::new(load().await?);
        if let Some(old) = self.loaded.lock().await.insert(stream.to_string(), c.clone()) {
            replaced(old);
        }
        Ok((c, true))
    }

    /// Forgets `c` if it is still the coordinator of `stream` (the stream moved away).
    pub async fn remove(&self, stream: &str, c: &Arc<C>) {
        let mut map = self.loaded.lock().await;
        if map.get(stream).is_some_and(|m| Arc::ptr_eq(m, c)) {
            map.remove(stream);
        }
    }
}

/// Replays every stored batch of `stream`, from its start to the durable end it had
/// when the load began, into `replay`.
pub async fn load(
    core: &CoreApi,
    stream: &str,
    mut replay: impl FnMut(Bytes) -> Result<(), String>,
) -> Result<(), StreamdError> {
    let mut offset = 0;
    let mut end = None;
    loop {
        let read = core.read(stream, offset, 1 << 20).await;
        let r = match read {
            Ok(r) => r,
            Err(StreamdError::OffsetOutOfRange { start, end, .. }) if offset < start && start <= end => {
                offset = start;
                continue;
            }
            Err(e) => return Err(e),
        };
        let end = *end.get_or_insert(r.end_offset);
        replay(r.batches.clone()).map_err(StreamdError::Corrupt)?;
        if r.next_offset <= offset || r.next_offset >= end {
            return Ok(());
        }
        offset = r.next_offset;
    }
}

/// Whether a table of `entries` with `changes` stored since its last snapshot is due
/// for another.
pub fn snapshot_due(changes: u64, entries: u64) -> bool {
    changes >= SNAPSHOT_MIN_CHANGES.max(2 * entries)
}

/// The append side of one coordinator's state stream.
#[derive(Default)]
pub struct StateLog {
    /// Held shared by each append-and-apply of changes, and exclusively while a
    /// snapshot is taken and appended: the snapshot then holds every change stored
    /// before it, so trimming to it loses none.
    lock: tokio::sync::RwLock<()>,
    snapshotting: AtomicBool,
}

impl StateLog {
    /// Appends `batch` (the encoded changes) to `stream`, then runs `apply`, once the
    /// batch is durable.
    pub async fn store<T>(
        &self,
        core: &CoreApi,
        stream: &str,
        batch: Result<Bytes, String>,
        apply: impl FnOnce() -> T,
    ) -> Result<T, StreamdError> {
        let _shared = self.lock.read().await;
        let batch = batch.map_err(StreamdError::Internal)?;
        core.append(stream, &batch, None).await?;
        Ok(apply())
    }

    /// [`StateLog::store`] for a transactional batch of `transactional_id`'s producer
    /// (checked by the stream against the transaction's coordinator); `apply` gets the
    /// batch's first offset.
    pub async fn store_as<T>(
        &self,
        core: &CoreApi,
        stream: &str,
        batch: Result<Bytes, String>,
        transactional_id: Option<&str>,
        apply: impl FnOnce(u64) -> T,
    ) -> Result<T, StreamdError> {
        let _shared = self.lock.read().await;
        let batch = batch.map_err(StreamdError::Internal)?;
        let appended = core.append(stream, &batch, transactional_id).await?;
        Ok(apply(appended.base_offset))
    }

    /// Claims the snapshot: false when one is already under way.
    pub fn begin_snapshot(&self) -> bool {
        !self.snapshotting.swap(true, Ordering::AcqRel)
    }

    pub fn end_snapshot(&self) {
        self.snapshotting.store(false, Ordering::Release);
    }

    /// Appends the whole table (`take` returns it as changes, with how many changes it
    /// replaces, and the first offset the stream must keep even so: records the table
    /// does not hold yet, such as pending transactional offsets), calls `taken` once it
    /// is stored, and trims the stream to where it starts, or to that offset when it is
    /// earlier; the offset trimmed to.
    pub async fn snapshot<C>(
        &self,
        core: &CoreApi,
        stream: &str,
        take: impl FnOnce() -> (Vec<C>, u64, Option<u64>),
        encode: impl Fn(&[C]) -> Result<Bytes, String>,
        taken: impl FnOnce(),
        what: &str,
    ) -> Result<u64, StreamdError> {
        let start = {
            let _exclusive = self.lock.write().await;
            // Under the exclusive lock: nothing pending is missing from the stream.
            let (changes, replaced, keep_from) = take();
            // An empty table is a snapshot too: everything before now can go.
            let mut start = core.durable_end(stream)?;
            for (i, chunk) in changes.chunks(SNAPSHOT_BATCH).enumerate() {
                let batch = encode(chunk).map_err(StreamdError::Internal)?;
                let appended = core.append(stream, &batch, None).await?;
                if i == 0 {
                    start = appended.base_offset;
                }
            }
            taken();
            let start = keep_from.map_or(start, |keep| keep.min(start));
            tracing::info!(
                stream,
                entries = changes.len(),
                replaced_changes = replaced,
                offset = start,
                "stored a snapshot of the {what}"
            );
            start
        };
        core.trim(stream, start).await?;
        Ok(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_due_after_many_changes_and_twice_the_table() {
        assert!(!snapshot_due(999, 0));
        assert!(snapshot_due(1_000, 10));
        assert!(!snapshot_due(1_999, 1_000), "fewer than twice the table");
        assert!(snapshot_due(2_000, 1_000));
    }
}
