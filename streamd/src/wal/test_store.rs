//! An in-memory object store whose WAL PUTs a test scripts: held until released, or
//! failed, by key sequence number; it counts GETs. The object WAL's failpoints.

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, Result,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use tokio::sync::watch;

/// What a scripted PUT does.
enum Script {
    /// Waits until released, then writes.
    Hold(watch::Receiver<bool>),
    /// Fails with an I/O error, writing nothing.
    Fail,
}

#[derive(Debug, Default)]
pub struct ScriptedStore {
    pub inner: InMemory,
    pub gets: AtomicUsize,
    scripts: Mutex<HashMap<u64, ScriptEntry>>,
    /// PUTs that reached the store (scripted or not), by key sequence.
    pub puts_started: Mutex<Vec<u64>>,
    /// What a takeover's fence PUT meets at a key, once.
    fence_races: Mutex<HashMap<u64, FenceRace>>,
}

/// A writer's PUT racing a takeover's fence at the same key.
#[derive(Debug)]
enum FenceRace {
    /// The writer's object lands at the key just before the fence PUT.
    Lands(PutPayload),
    /// The fence PUT finds the key taken, and the object is gone (reclaimed) by the
    /// time it is read.
    Vanished,
}

#[derive(Debug)]
struct ScriptEntry(ScriptKind);

#[derive(Debug)]
enum ScriptKind {
    Hold(watch::Receiver<bool>),
    Fail,
    /// Fails this many more times, then writes.
    FailTimes(usize),
}

/// Releases a held PUT.
pub struct Release(watch::Sender<bool>);

impl Release {
    pub fn release(&self) {
        let _ = self.0.send(true);
    }
}

/// The sequence number a WAL key ends in.
fn seq(location: &Path) -> Option<u64> {
    location.filename()?.parse().ok()
}

impl ScriptedStore {
    /// The WAL PUT of key `seq` waits until the returned handle releases it.
    pub fn hold(&self, seq: u64) -> Release {
        let (tx, rx) = watch::channel(false);
        self.scripts
            .lock()
            .expect("lock")
            .insert(seq, ScriptEntry(ScriptKind::Hold(rx)));
        Release(tx)
    }

    /// The WAL PUT of key `seq` fails.
    pub fn fail(&self, seq: u64) {
        self.scripts
            .lock()
            .expect("lock")
            .insert(seq, ScriptEntry(ScriptKind::Fail));
    }

    /// The WAL PUT of key `seq` fails `times` times, then writes.
    pub fn fail_times(&self, seq: u64, times: usize) {
        self.scripts
            .lock()
            .expect("lock")
            .insert(seq, ScriptEntry(ScriptKind::FailTimes(times)));
    }

    /// The writer's object `payload` lands at key `seq` just before a fence PUT there.
    pub fn lands_before_fence(&self, seq: u64, payload: PutPayload) {
        let mut races = self.fence_races.lock().expect("lock");
        races.insert(seq, FenceRace::Lands(payload));
    }

    /// A fence PUT at key `seq` finds it taken by an object that is gone when read.
    pub fn vanishes_before_fence(&self, seq: u64) {
        self.fence_races.lock().expect("lock").insert(seq, FenceRace::Vanished);
    }

    fn script(&self, location: &Path) -> Option<Script> {
        let seq = seq(location)?;
        let mut scripts = self.scripts.lock().expect("lock");
        match &mut scripts.get_mut(&seq)?.0 {
            ScriptKind::Hold(rx) => Some(Script::Hold(rx.clone())),
            ScriptKind::Fail => Some(Script::Fail),
            ScriptKind::FailTimes(0) => None,
            ScriptKind::FailTimes(left) => {
                *left -= 1;
                Some(Script::Fail)
            }
        }
    }
}

impl std::fmt::Display for ScriptedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScriptedStore")
    }
}

#[async_trait]
impl ObjectStore for ScriptedStore {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        // Fence markers are the takeover's, never scripted.
        let is_fence = payload.iter().next().is_some_and(|b| b.starts_with(b"WEIRFENCE"));
        if is_fence {
            let race = seq(location).and_then(|s| self.fence_races.lock().expect("lock").remove(&s));
            match race {
                Some(FenceRace::Lands(object)) => {
                    self.inner.put_opts(location, object, PutOptions::default()).await?;
                }
                Some(FenceRace::Vanished) => {
                    return Err(object_store::Error::AlreadyExists {
                        path: location.to_string(),
                        source: "scripted: taken, then reclaimed".into(),
                    })
                }
                None => {}
            }
        } else {
            if let Some(s) = seq(location) {
                self.puts_started.lock().expect("lock").push(s);
            }
            match self.script(location) {
                Some(Script::Hold(mut rx)) => {
                    let _ = rx.wait_for(|released| *released).await;
                }
                Some(Script::Fail) => {
                    return Err(object_store::Error::Generic {
                        store: "scripted",
                        source: "scripted PUT failure".into(),
                    })
                }
                None => {}
            }
        }
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
