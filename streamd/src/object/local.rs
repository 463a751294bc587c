//! The `file://` object store: object_store's `LocalFileSystem` (fsynced), except that a
//! large PUT is written and synced in steps of [`STEP`] bytes.
//!
//! A PUT carrying a [`Pace`] (compaction's) is also paced: each step waits for its share
//! of the rate before it is written, so a paced object reaches the disk a step at a time
//! between the WAL's syncs rather than at the disk's full speed.
//!
//! Why: the WAL shares the disk. `LocalFileSystem` writes a whole object into the page
//! cache and syncs it at the end, so a 64 MiB compaction output reaches the disk as one
//! burst (~70 ms at 900 MB/s), and every WAL fdatasync issued meanwhile waits behind it:
//! the produce p99 went from ~2 ms to 25–77 ms whenever compaction wrote (issue 17).
//! Synced in 1 MiB steps, a WAL sync waits behind at most one step.
//!
//! The object is published as `LocalFileSystem` publishes one: written under a staging
//! name beside it, synced, renamed into place, and its directory synced. The staging name
//! (`<name>.<random>.staging`) is listed like any object, so what a crash leaves under
//! `data/` is deleted by GC once older than its safety delay; the WAL's own listing
//! ignores it (its keys are numbers).

use super::pace::Pace;
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};
use std::fmt;
use std::io::Write;
use std::ops::Range;

/// Bytes written between syncs of a large object: about a millisecond of this disk.
pub const STEP: usize = 1 << 20;

/// See the module documentation.
#[derive(Debug)]
pub struct SteppedLocalStore {
    inner: LocalFileSystem,
}

impl SteppedLocalStore {
    /// `inner` must sync (`with_fsync(true)`): small objects and every other operation
    /// go to it as they are.
    pub fn new(inner: LocalFileSystem) -> Self {
        SteppedLocalStore { inner }
    }

    /// Whether `payload` is written in steps here rather than by `inner`: only a large,
    /// plain overwrite (a conditional PUT needs `inner`'s atomic create or update).
    fn stepped(payload: &PutPayload, opts: &PutOptions) -> bool {
        payload.content_length() > STEP
            && matches!(opts.mode, PutMode::Overwrite)
            && opts.attributes.is_empty()
            && opts.tags.encoded().is_empty()
    }
}

impl fmt::Display for SteppedLocalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stepped({})", self.inner)
    }
}

/// Writes `payload` to `dest`: to a staging file beside it, synced every [`STEP`] bytes,
/// then renamed into place with its directory synced, each step paced by `pace` if
/// given. The staging file is removed on failure.
fn write_in_steps(dest: &std::path::Path, payload: PutPayload, pace: Option<&Pace>) -> std::io::Result<()> {
    let dir = dest.parent().unwrap_or(std::path::Path::new("."));
    weir_shared::durable_dir::create_dir_all(dir)?;
    let mut staging = dest.as_os_str().to_owned();
    staging.push(format!(".{:016x}.staging", rand::random::<u64>()));
    let staging = std::path::PathBuf::from(staging);
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create_new(&staging)?;
        let mut unsynced = 0;
        for chunk in payload.iter() {
            for step in chunk.chunks(STEP) {
                if let Some(pace) = pace {
                    pace.take_blocking(step.len() as u64);
                }
                file.write_all(step)?;
                unsynced += step.len();
                if unsynced >= STEP {
                    file.sync_data()?;
                    unsynced = 0;
                }
            }
        }
        file.sync_all()?;
        std::fs::rename(&staging, dest)?;
        weir_shared::durable_dir::sync_dir(dir)
    };
    let written = write();
    if written.is_err() {
        // Best effort: what is left is listed, and GC deletes it under `data/`.
        std::fs::remove_file(&staging).ok();
    }
    written
}

fn generic(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> object_store::Error {
    object_store::Error::Generic {
        store: "LocalFileSystem",
        source: source.into(),
    }
}

#[async_trait]
impl ObjectStore for SteppedLocalStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        let pace = opts.extensions.get::<Pace>().cloned();
        if !Self::stepped(&payload, &opts) {
            if let Some(pace) = &pace {
                pace.take(payload.content_length() as u64).await;
            }
            return self.inner.put_opts(location, payload, opts).await;
        }
        let dest = self.inner.path_to_filesystem(location)?;
        tokio::task::spawn_blocking(move || write_in_steps(&dest, payload, pace.as_ref()))
            .await
            .map_err(generic)?
            .map_err(generic)?;
        let meta = self.inner.head(location).await?;
        Ok(PutResult {
            e_tag: meta.e_tag,
            version: meta.version,
            extensions: Default::default(),
        })
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
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

    fn store(dir: &std::path::Path) -> SteppedLocalStore {
        SteppedLocalStore::new(LocalFileSystem::new_with_prefix(dir).unwrap().with_fsync(true))
    }

    // Issue 17: compaction's objects reach the disk at its rate, a step at a time.
    #[tokio::test]
    async fn a_paced_object_is_written_a_step_at_a_time_at_the_rate() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let pace = Pace::new(8 * STEP as u64, prometheus::Counter::new("waited", "test").unwrap());
        let body: Vec<u8> = (0..STEP * 4).map(|i| (i % 253) as u8).collect();
        let started = std::time::Instant::now();
        store
            .put_opts(
                &Path::from("paced.wdo"),
                PutPayload::from(body.clone()),
                super::super::pace::paced(&pace),
            )
            .await
            .unwrap();
        // Four steps at eight a second: the last starts 3/8 s after the first.
        let took = started.elapsed();
        assert!(took >= std::time::Duration::from_millis(370), "{took:?}");
        let read = store
            .get(&Path::from("paced.wdo"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(read.as_ref(), &body[..]);
    }

    #[tokio::test]
    async fn a_large_object_is_written_whole_and_leaves_no_staging_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        // Three and a half steps, in two chunks that do not fall on step boundaries.
        let body: Vec<u8> = (0..STEP * 7 / 2).map(|i| (i % 251) as u8).collect();
        let payload = PutPayload::from_iter([
            Bytes::copy_from_slice(&body[..STEP + 17]),
            Bytes::copy_from_slice(&body[STEP + 17..]),
        ]);
        let at = Path::from("data/n1/compacted/big.wdo");
        let put = store.put(&at, payload).await.unwrap();
        assert!(put.e_tag.is_some());
        let got = store.get(&at).await.unwrap().bytes().await.unwrap();
        assert_eq!(got.as_ref(), body.as_slice());
        let listed: Vec<String> = futures::TryStreamExt::try_collect::<Vec<_>>(store.list(None))
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.location.to_string())
            .collect();
        assert_eq!(listed, vec![at.to_string()], "only the object itself is left");
    }

    #[tokio::test]
    async fn a_large_put_replaces_an_existing_object_and_a_conditional_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let at = Path::from("data/x.wdo");
        store.put(&at, PutPayload::from_static(b"old")).await.unwrap();
        let big = Bytes::from(vec![7u8; STEP * 2]);
        store.put(&at, big.clone().into()).await.unwrap();
        assert_eq!(store.get(&at).await.unwrap().bytes().await.unwrap(), big);
        // A create-only PUT still goes through LocalFileSystem's atomic create.
        let refused = store.put_opts(&at, big.into(), PutOptions::from(PutMode::Create)).await;
        assert!(
            matches!(refused, Err(object_store::Error::AlreadyExists { .. })),
            "{refused:?}"
        );
    }
}
