//! The `object` WAL backend: each group commit is one object at the next sequential key
//! under `wal/<node>/<epoch>/`, written with put-if-absent. A takeover puts a fence
//! marker at the next free key, so the old writer's next conditional put fails and it
//! acknowledges nothing more. Survives the loss of the machine.
//!
//! Reclaim never deletes the newest object (the boundary, as SlateDB keeps its boundary
//! WAL): with every object deleted, a takeover would list nothing, fence key 1, and the
//! old writer's next put, far above it, would succeed and be acknowledged unreplayed.

use super::record::{decode_past_damage, decode_segment, segment_header, SegmentEnd};
use super::{Replay, SegmentId, WalDamage, WalError};
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::sync::Arc;
use weir_shared::ids::{Epoch, NodeId};

/// Marks a fence object; stable.
const FENCE_MAGIC: &[u8] = b"WEIRFENCE";

/// The key prefix of one incarnation's WAL.
pub fn incarnation_prefix(node: &NodeId, epoch: Epoch) -> ObjectPath {
    ObjectPath::from(format!("wal/{}/{:020}", node.as_str(), epoch.0))
}

fn key(prefix: &ObjectPath, seq: SegmentId) -> ObjectPath {
    prefix.clone().join(format!("{seq:020}"))
}

/// The writer side of an object WAL.
pub struct ObjectSink {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    next_seq: SegmentId,
}

impl ObjectSink {
    /// A WAL for a new incarnation, starting at sequence 1.
    pub fn create(store: Arc<dyn ObjectStore>, node: &NodeId, epoch: Epoch) -> Self {
        Self {
            store,
            prefix: incarnation_prefix(node, epoch),
            next_seq: 1,
        }
    }

    pub async fn persist(&mut self, group: Bytes) -> Result<(SegmentId, u64), WalError> {
        let mut body = BytesMut::with_capacity(group.len() + 8);
        body.extend_from_slice(&segment_header());
        body.extend_from_slice(&group);
        let seq = self.next_seq;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&key(&self.prefix, seq), PutPayload::from_bytes(body.freeze()), opts)
            .await
        {
            Ok(_) => {
                self.next_seq += 1;
                Ok((seq, group.len() as u64))
            }
            // Someone else wrote our next key: the fence marker of a takeover.
            Err(object_store::Error::AlreadyExists { .. }) => Err(WalError::Fenced),
            Err(e) => Err(WalError::Io(e.to_string())),
        }
    }

    /// The newest object written, which reclaim keeps.
    pub fn newest_segment(&self) -> Option<SegmentId> {
        self.next_seq.checked_sub(1).filter(|s| *s > 0)
    }

    pub async fn delete(&mut self, segment: SegmentId) -> Result<(), WalError> {
        match self.store.delete(&key(&self.prefix, segment)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(WalError::Io(e.to_string())),
        }
    }
}

/// Sorted sequence numbers of the objects under `prefix`.
async fn list_seqs(store: &dyn ObjectStore, prefix: &ObjectPath) -> Result<Vec<SegmentId>, WalError> {
    let metas: Vec<_> = store
        .list(Some(prefix))
        .try_collect()
        .await
        .map_err(|e| WalError::Io(e.to_string()))?;
    let mut seqs: Vec<SegmentId> = metas
        .iter()
        .filter_map(|m| m.location.filename()?.parse().ok())
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

/// Segments a takeover fetches at once while it replays (in order).
const REPLAY_CONCURRENCY: usize = 8;

/// Takes over the object WAL of `(node, epoch)` as `agent`: puts a fence marker at the
/// next free key (retrying past keys the writer wins), then replays every segment below
/// it. Idempotent: an existing fence marker is reused.
///
/// A fence is always the highest key: the old writer stops at the first of its keys it
/// finds taken, so nothing is written above a fence, and a second agent racing this one
/// fences the key after it. So only the last key is read to find one; the old scan read
/// every segment to find it, then every segment again to replay, one GET at a time, and
/// a busy node's WAL of thousands of objects took over a minute to take over on S3.
pub async fn take_over(
    store: Arc<dyn ObjectStore>,
    node: &NodeId,
    epoch: Epoch,
    agent: &str,
) -> Result<Replay, WalError> {
    let prefix = incarnation_prefix(node, epoch);
    let seqs = list_seqs(store.as_ref(), &prefix).await?;
    let fenced = match seqs.last() {
        Some(&last) => get(store.as_ref(), &key(&prefix, last))
            .await?
            .starts_with(FENCE_MAGIC)
            .then_some(last),
        None => None,
    };
    let fence = match fenced {
        Some(f) => f,
        None => {
            let mut candidate = seqs.last().copied().unwrap_or(0) + 1;
            loop {
                let mut marker = FENCE_MAGIC.to_vec();
                marker.extend_from_slice(agent.as_bytes());
                let opts = PutOptions {
                    mode: PutMode::Create,
                    ..Default::default()
                };
                match store
                    .put_opts(&key(&prefix, candidate), PutPayload::from(marker), opts)
                    .await
                {
                    Ok(_) => break candidate,
                    // The writer (or a racing agent) got there first; fence the key after it.
                    Err(object_store::Error::AlreadyExists { .. }) => candidate += 1,
                    Err(e) => return Err(WalError::Io(e.to_string())),
                }
            }
        }
    };
    let below: Vec<SegmentId> = list_seqs(store.as_ref(), &prefix)
        .await?
        .into_iter()
        .filter(|s| *s < fence)
        .collect();
    let mut segments = futures::stream::iter(below)
        .map(|seq| {
            let (store, path) = (store.clone(), key(&prefix, seq));
            async move { get(store.as_ref(), &path).await.map(|data| (seq, data)) }
        })
        .buffered(REPLAY_CONCURRENCY);
    let mut replay = Replay::default();
    while let Some(segment) = segments.next().await {
        let (seq, data) = segment?;
        // A racing agent's fence below this one holds no records.
        if data.starts_with(FENCE_MAGIC) {
            continue;
        }
        let (mut recs, end) = decode_segment(&data).map_err(|e| WalError::Corrupt(format!("WAL object {seq}: {e}")))?;
        replay.records.append(&mut recs);
        // Objects are written whole, so a bad record is damage, not a torn write.
        if let SegmentEnd::Invalid { at, reason } = end {
            let (mut after, damage) = decode_past_damage(&data, at, reason);
            for d in damage {
                let d = WalDamage {
                    place: format!("WAL object {}", key(&prefix, seq)),
                    damage: d,
                };
                tracing::error!(damage = %d, "damaged WAL object; the records after it are replayed");
                replay.damage.push(d);
            }
            replay.records.append(&mut after);
        }
    }
    Ok(replay)
}

async fn get(store: &dyn ObjectStore, path: &ObjectPath) -> Result<Bytes, WalError> {
    store
        .get(path)
        .await
        .map_err(|e| WalError::Io(e.to_string()))?
        .bytes()
        .await
        .map_err(|e| WalError::Io(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::{Sink, WalRecord, WalWriter};
    use async_trait::async_trait;
    use futures::stream::BoxStream;
    use object_store::memory::InMemory;
    use object_store::{
        CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, PutMultipartOptions, PutResult,
    };
    use std::sync::atomic::{AtomicUsize, Ordering};
    use weir_shared::ids::{StreamEpoch, StreamId};

    /// An in-memory store that counts its GETs.
    #[derive(Debug, Default)]
    struct CountingGets {
        inner: InMemory,
        gets: AtomicUsize,
    }

    impl std::fmt::Display for CountingGets {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "CountingGets")
        }
    }

    #[async_trait]
    impl ObjectStore for CountingGets {
        async fn put_opts(
            &self,
            location: &ObjectPath,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            self.inner.put_opts(location, payload, opts).await
        }
        async fn put_multipart_opts(
            &self,
            location: &ObjectPath,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.inner.put_multipart_opts(location, opts).await
        }
        async fn get_opts(&self, location: &ObjectPath, options: GetOptions) -> object_store::Result<GetResult> {
            self.gets.fetch_add(1, Ordering::SeqCst);
            self.inner.get_opts(location, options).await
        }
        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<ObjectPath>>,
        ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
            self.inner.delete_stream(locations)
        }
        fn list(&self, prefix: Option<&ObjectPath>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.inner.list(prefix)
        }
        async fn list_with_delimiter(&self, prefix: Option<&ObjectPath>) -> object_store::Result<ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }
        async fn copy_opts(
            &self,
            from: &ObjectPath,
            to: &ObjectPath,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    /// Writes `n` records, one WAL object each, as incarnation `streamd-9`/1.
    async fn written(store: Arc<CountingGets>, n: u64) -> (NodeId, Epoch) {
        let (node, epoch) = (NodeId::new("streamd-9"), Epoch(1));
        let (tasks, stop) = (
            tokio_util::task::TaskTracker::new(),
            tokio_util::sync::CancellationToken::new(),
        );
        let wal = WalWriter::start(
            Sink::Object(ObjectSink::create(store, &node, epoch)),
            u64::MAX,
            &tasks,
            stop.clone(),
        )
        .expect("writer");
        for i in 0..n {
            let record = WalRecord {
                stream: StreamId(1),
                stream_epoch: StreamEpoch(1),
                base_offset: i,
                offset_count: 1,
                batches: Bytes::from(format!("r-{i}")),
            };
            wal.append(&record).await.expect("append");
        }
        stop.cancel();
        tasks.close();
        tasks.wait().await;
        (node, epoch)
    }

    async fn keys(store: &CountingGets, node: &NodeId, epoch: Epoch) -> Vec<SegmentId> {
        list_seqs(store, &incarnation_prefix(node, epoch)).await.expect("list")
    }

    // Issue 21 (a nemesis run's object-WAL takeover took over a minute): a takeover reads
    // each segment once, and the last key alone to find an earlier fence; it used to read
    // every segment twice, one at a time. A retried takeover reuses its fence.
    #[tokio::test]
    async fn a_takeover_reads_each_segment_once_and_a_retry_reuses_its_fence() {
        let store = Arc::new(CountingGets::default());
        let (node, epoch) = written(store.clone(), 20).await;
        assert_eq!(keys(&store, &node, epoch).await.len(), 20);
        store.gets.store(0, Ordering::SeqCst);
        let replay = take_over(store.clone(), &node, epoch, "agent-a")
            .await
            .expect("takeover");
        assert_eq!(replay.records.len(), 20);
        let gets = store.gets.load(Ordering::SeqCst);
        assert!(gets <= 21, "{gets} GETs to take over 20 segments");
        let again = take_over(store.clone(), &node, epoch, "agent-b")
            .await
            .expect("retried takeover");
        assert_eq!(again.records.len(), 20);
        assert_eq!(keys(&store, &node, epoch).await.len(), 21, "one fence, reused");
    }

    // Two agents that raced each put a fence; the one below the highest holds no
    // records and is skipped, not replayed as a damaged segment.
    #[tokio::test]
    async fn a_racing_agents_fence_below_the_highest_is_skipped() {
        let store = Arc::new(CountingGets::default());
        let (node, epoch) = written(store.clone(), 3).await;
        let prefix = incarnation_prefix(&node, epoch);
        for (seq, agent) in [(4, "agent-a"), (5, "agent-b")] {
            let marker = [FENCE_MAGIC, agent.as_bytes()].concat();
            store
                .put(&key(&prefix, seq), PutPayload::from(marker))
                .await
                .expect("fence");
        }
        let replay = take_over(store.clone(), &node, epoch, "agent-c")
            .await
            .expect("takeover");
        assert_eq!(replay.records.len(), 3);
        assert!(replay.damage.is_empty(), "{:?}", replay.damage);
        assert_eq!(keys(&store, &node, epoch).await.len(), 5, "agent-b's fence reused");
    }
}
