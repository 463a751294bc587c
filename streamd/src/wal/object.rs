//! The `object` WAL backend: each group commit is one object at the next sequential key
//! under `wal/<node>/<epoch>/`, written with put-if-absent, several at once
//! (`object_writer`). A takeover puts a fence marker at the first key not written, so
//! the old writer's conditional put there fails, and since the writer acknowledges its
//! objects in key order it acknowledges nothing at or above the fence (INV-7). Survives
//! the loss of the machine.
//!
//! **The floor.** Every object carries the writer's floor: keys below it may be deleted
//! (reclaimed: every record in them is committed in data objects), and the writer deletes
//! a key only once an acknowledged object carries a floor above it. So any key at or above
//! the highest floor a takeover reads was never deleted before its listing, and a missing
//! key there is a PUT that failed or has not landed: the end of the log, never a hole to
//! skip. Deletes in any order, and in bulk, cannot be mistaken for the end (design 0007).

use super::record::{decode_past_damage, decode_segment, segment_header, SegmentEnd};
use super::{Replay, SegmentId, WalDamage, WalError};
use bytes::Bytes;
#[cfg(test)]
use bytes::BytesMut;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::sync::Arc;
use std::time::Duration;
use weir_shared::ids::{Epoch, NodeId};

/// Marks a fence object; stable.
const FENCE_MAGIC: &[u8] = b"WEIRFENCE";
/// Starts an object with a floor: this magic, then the floor (u64, big-endian), then a
/// WAL segment. Objects written before floors start with the segment itself (floor 0).
const OBJECT_MAGIC: &[u8; 8] = b"WEIRWOB1";
const OBJECT_HEADER_LEN: usize = OBJECT_MAGIC.len() + 8;

/// How soon a failed WAL PUT is tried again, at first and at most.
const PUT_RETRY_FIRST: Duration = Duration::from_millis(100);
const PUT_RETRY_MAX: Duration = Duration::from_secs(2);

/// The key prefix of one incarnation's WAL.
pub fn incarnation_prefix(node: &NodeId, epoch: Epoch) -> ObjectPath {
    ObjectPath::from(format!("wal/{}/{:020}", node.as_str(), epoch.0))
}

fn key(prefix: &ObjectPath, seq: SegmentId) -> ObjectPath {
    prefix.clone().join(format!("{seq:020}"))
}

/// How the object WAL batches and pipelines its PUTs (`--wal-max-inflight-puts`,
/// `--wal-object-max-bytes`, `--wal-object-linger-ms`).
#[derive(Clone, Copy, Debug)]
pub struct Pipelining {
    /// WAL objects being written at once.
    pub max_inflight: usize,
    /// Most bytes of records one object holds.
    pub max_bytes: usize,
    /// While another object is in flight, how long a group may wait for more appends
    /// before it is sent; with none in flight it is sent at once.
    pub linger: Duration,
    /// How long a WAL PUT that failed is tried again on the same key, past the object
    /// store client's own retries, before the log fails (`--wal-put-retry-sec`).
    pub put_retry: Duration,
}

impl Default for Pipelining {
    fn default() -> Self {
        Pipelining {
            max_inflight: 8,
            max_bytes: 8 << 20,
            linger: Duration::from_millis(5),
            put_retry: Duration::from_secs(120),
        }
    }
}

/// The writer side of an object WAL: hands out keys in order and writes objects.
pub struct ObjectSink {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    next_seq: SegmentId,
    pub pipelining: Pipelining,
}

impl ObjectSink {
    /// A WAL for a new incarnation, starting at sequence 1.
    pub fn create(store: Arc<dyn ObjectStore>, node: &NodeId, epoch: Epoch, pipelining: Pipelining) -> Self {
        Self {
            store,
            prefix: incarnation_prefix(node, epoch),
            next_seq: 1,
            pipelining,
        }
    }

    /// The next key: each object takes one, in order, whether or not its PUT succeeds.
    pub fn next_key(&mut self) -> SegmentId {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Writes `group` (framed records) as the object at `seq`, carrying `floor`; runs
    /// beside the writes of other keys.
    ///
    /// A PUT that fails is tried again on the same key for `put_retry` (issue 60: an
    /// object store answering 503 SlowDown, 403 or 507 for a while), saying so in
    /// `stall`, so new appends are refused meanwhile. Retrying the same key is safe
    /// whatever the failed attempt did: put-if-absent finds an earlier attempt that
    /// landed, or a takeover's fence, and either ends this writer (`Fenced`).
    pub(super) fn put(
        &self,
        seq: SegmentId,
        floor: SegmentId,
        group: Bytes,
        stall: super::stall::Stall,
    ) -> impl std::future::Future<Output = Result<(SegmentId, u64), WalError>> + Send + 'static {
        let (store, path, retry_for) = (self.store.clone(), key(&self.prefix, seq), self.pipelining.put_retry);
        async move {
            let mut header = Vec::with_capacity(OBJECT_HEADER_LEN + 8);
            header.extend_from_slice(OBJECT_MAGIC);
            header.extend_from_slice(&floor.to_be_bytes());
            header.extend_from_slice(&segment_header());
            let len = group.len() as u64;
            // The records go as they are, beside the header: no copy of the group.
            let payload = PutPayload::from_iter([Bytes::from(header), group]);
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            let started = tokio::time::Instant::now();
            let mut backoff = weir_shared::backoff::Backoff::new(PUT_RETRY_FIRST, PUT_RETRY_MAX);
            loop {
                match store.put_opts(&path, payload.clone(), opts.clone()).await {
                    Ok(_) => {
                        if stall.clear() {
                            tracing::info!(key = seq, "the object store takes write-ahead log objects again");
                        }
                        return Ok((seq, len));
                    }
                    // Someone else wrote this key: the fence marker of a takeover.
                    Err(object_store::Error::AlreadyExists { .. }) => return Err(WalError::Fenced),
                    Err(e) if started.elapsed() < retry_for => {
                        if stall.set(format!("the object store refuses write-ahead log objects: {e}")) {
                            tracing::warn!(key = seq, error = %e, "WAL object PUT failed; refusing new appends and trying the same key again");
                        }
                        tokio::time::sleep(backoff.next_wait()).await;
                    }
                    Err(e) => return Err(WalError::Io(e.to_string())),
                }
            }
        }
    }

    /// Deletes `segments` (in one bulk request per 1,000 on S3); each key's outcome.
    pub fn delete(
        &self,
        segments: Vec<SegmentId>,
    ) -> impl std::future::Future<Output = Vec<(SegmentId, Result<(), WalError>)>> + Send + 'static {
        let (store, prefix) = (self.store.clone(), self.prefix.clone());
        async move {
            let paths: Vec<object_store::Result<ObjectPath>> = segments.iter().map(|s| Ok(key(&prefix, *s))).collect();
            let results: Vec<_> = store
                .delete_stream(futures::stream::iter(paths).boxed())
                .collect()
                .await;
            // Results come in request order; a missing key is already deleted.
            segments
                .into_iter()
                .zip(results.into_iter().chain(std::iter::repeat_with(|| {
                    Err(object_store::Error::Generic {
                        store: "wal",
                        source: "no result for this delete".into(),
                    })
                })))
                .map(|(seq, r)| {
                    let r = match r {
                        Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                        Err(e) => Err(WalError::Io(e.to_string())),
                    };
                    (seq, r)
                })
                .collect()
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

/// What one WAL object holds.
enum Object {
    Fence,
    /// The writer's floor when it sent the object, and its segment.
    Records {
        floor: SegmentId,
        segment: Bytes,
    },
}

fn parse(seq: SegmentId, data: Bytes) -> Result<Object, WalError> {
    if data.starts_with(FENCE_MAGIC) {
        return Ok(Object::Fence);
    }
    if data.starts_with(OBJECT_MAGIC) {
        if data.len() < OBJECT_HEADER_LEN {
            return Err(WalError::Corrupt(format!("WAL object {seq}: header cut short")));
        }
        let floor = u64::from_be_bytes(data[OBJECT_MAGIC.len()..OBJECT_HEADER_LEN].try_into().expect("8 bytes"));
        return Ok(Object::Records {
            floor,
            segment: data.slice(OBJECT_HEADER_LEN..),
        });
    }
    // Written before floors: a bare segment.
    Ok(Object::Records {
        floor: 0,
        segment: data,
    })
}

/// Takes over the object WAL of `(node, epoch)` as `agent`. It reads every listed
/// object; from the highest floor among them, the log runs over consecutive keys up to
/// the first fence (an earlier takeover's, reused) or the first key missing, where it
/// puts its fence. A key taken meanwhile by the writer is read and the fence tried at
/// the next. Records below the floor are committed and not replayed.
///
/// Keys above the fence (the writer's PUTs that were in flight) are never read: the
/// writer acknowledged none of them, since it acknowledges in key order and its PUT at
/// the fence failed. Nor is anything after a missing key, for the same reason.
pub async fn take_over(
    store: Arc<dyn ObjectStore>,
    node: &NodeId,
    epoch: Epoch,
    agent: &str,
) -> Result<Replay, WalError> {
    let prefix = incarnation_prefix(node, epoch);
    let listed = list_seqs(store.as_ref(), &prefix).await?;
    let mut objects = std::collections::BTreeMap::new();
    let mut fetched = futures::stream::iter(listed)
        .map(|seq| {
            let (store, path) = (store.clone(), key(&prefix, seq));
            async move { get(store.as_ref(), &path).await.map(|data| (seq, data)) }
        })
        .buffered(REPLAY_CONCURRENCY);
    while let Some(object) = fetched.next().await {
        let (seq, data) = object?;
        // Gone since the listing: reclaimed, so its records are committed.
        if let Some(data) = data {
            objects.insert(seq, parse(seq, data)?);
        }
    }
    drop(fetched);
    let floor = objects
        .values()
        .filter_map(|o| match o {
            Object::Records { floor, .. } => Some(*floor),
            Object::Fence => None,
        })
        .max()
        .unwrap_or(0);
    // Floors start at 1. An incarnation written before floors (all 0) deleted its keys
    // in order, one at a time, with one PUT in flight: its log starts at its lowest key.
    let mut next = match floor {
        0 => objects.keys().next().copied().unwrap_or(1),
        floor => floor,
    };
    let mut replay = Replay::default();
    loop {
        let object = match objects.remove(&next) {
            Some(object) => object,
            None => {
                let mut marker = FENCE_MAGIC.to_vec();
                marker.extend_from_slice(agent.as_bytes());
                let opts = PutOptions {
                    mode: PutMode::Create,
                    ..Default::default()
                };
                match store
                    .put_opts(&key(&prefix, next), PutPayload::from(marker), opts)
                    .await
                {
                    Ok(_) => return Ok(replay),
                    // The writer (or a racing agent) got there first: read what it put.
                    Err(object_store::Error::AlreadyExists { .. }) => {
                        match get(store.as_ref(), &key(&prefix, next)).await? {
                            Some(data) => parse(next, data)?,
                            None => {
                                next += 1;
                                continue;
                            }
                        }
                    }
                    Err(e) => return Err(WalError::Io(e.to_string())),
                }
            }
        };
        match object {
            Object::Fence => return Ok(replay),
            Object::Records { segment, .. } => replay_segment(&mut replay, &prefix, next, &segment)?,
        }
        next += 1;
    }
}

fn replay_segment(replay: &mut Replay, prefix: &ObjectPath, seq: SegmentId, data: &[u8]) -> Result<(), WalError> {
    let (mut recs, end) = decode_segment(data).map_err(|e| WalError::Corrupt(format!("WAL object {seq}: {e}")))?;
    replay.records.append(&mut recs);
    // Objects are written whole, so a bad record is damage, not a torn write.
    if let SegmentEnd::Invalid { at, reason } = end {
        let (mut after, damage) = decode_past_damage(data, at, reason);
        for d in damage {
            let d = WalDamage {
                place: format!("WAL object {}", key(prefix, seq)),
                damage: d,
            };
            tracing::error!(damage = %d, "damaged WAL object; the records after it are replayed");
            replay.damage.push(d);
        }
        replay.records.append(&mut after);
    }
    Ok(())
}

/// The object at `path`, or `None` if there is none.
async fn get(store: &dyn ObjectStore, path: &ObjectPath) -> Result<Option<Bytes>, WalError> {
    let got = match store.get(path).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(WalError::Io(e.to_string())),
    };
    got.bytes().await.map(Some).map_err(|e| WalError::Io(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::test_store::ScriptedStore;
    use crate::wal::{Sink, WalRecord, WalWriter};
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;
    use weir_shared::ids::{StreamEpoch, StreamId};

    const NODE: &str = "streamd-9";

    fn record(i: u64) -> WalRecord {
        WalRecord {
            stream: StreamId(1),
            stream_epoch: StreamEpoch(1),
            base_offset: i,
            offset_count: 1,
            batches: Bytes::from(format!("r-{i}")),
        }
    }

    /// The WAL writer of incarnation `streamd-9`/1 on `store`.
    fn writer(store: Arc<ScriptedStore>) -> (WalWriter, TaskTracker, CancellationToken) {
        writer_retrying(store, Duration::ZERO)
    }

    /// A writer whose failed PUTs are tried again for `put_retry`.
    fn writer_retrying(store: Arc<ScriptedStore>, put_retry: Duration) -> (WalWriter, TaskTracker, CancellationToken) {
        let pipelining = Pipelining {
            put_retry,
            ..Pipelining::default()
        };
        writer_with(store, pipelining)
    }

    /// A writer pipelining as `pipelining` says.
    fn writer_with(store: Arc<ScriptedStore>, pipelining: Pipelining) -> (WalWriter, TaskTracker, CancellationToken) {
        let (tasks, stop) = (TaskTracker::new(), CancellationToken::new());
        let sink = ObjectSink::create(store, &NodeId::new(NODE), Epoch(1), pipelining);
        let wal = WalWriter::start(Sink::Object(sink), u64::MAX, &tasks, stop.clone()).expect("writer");
        (wal, tasks, stop)
    }

    async fn stopped(tasks: TaskTracker, stop: CancellationToken) {
        stop.cancel();
        tasks.close();
        tasks.wait().await;
    }

    /// Writes `n` records, one WAL object each, as incarnation `streamd-9`/1.
    async fn written(store: Arc<ScriptedStore>, n: u64) -> (NodeId, Epoch) {
        let (wal, tasks, stop) = writer(store);
        for i in 0..n {
            wal.append(&record(i)).await.expect("append");
        }
        stopped(tasks, stop).await;
        (NodeId::new(NODE), Epoch(1))
    }

    async fn keys(store: &ScriptedStore) -> Vec<SegmentId> {
        list_seqs(store, &incarnation_prefix(&NodeId::new(NODE), Epoch(1)))
            .await
            .expect("list")
    }

    async fn take_over_as(store: &Arc<ScriptedStore>, agent: &str) -> Vec<u64> {
        let replay = take_over(store.clone(), &NodeId::new(NODE), Epoch(1), agent)
            .await
            .expect("takeover");
        assert!(replay.damage.is_empty(), "{:?}", replay.damage);
        replay.records.iter().map(|r| r.base_offset).collect()
    }

    /// Waits until the store has seen the PUT of key `seq` start.
    async fn put_started(store: &ScriptedStore, seq: SegmentId) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !store.puts_started.lock().expect("lock").contains(&seq) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the PUT of WAL key {seq} never started"));
    }

    /// Waits until WAL key `seq` exists in the store.
    async fn landed(store: &ScriptedStore, seq: SegmentId) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !keys(store).await.contains(&seq) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("WAL key {seq} never landed"));
    }

    /// Whether `answer` is still unanswered after a while.
    async fn still_waiting<F: std::future::Future + Unpin>(answer: &mut F) -> bool {
        tokio::time::timeout(Duration::from_millis(200), answer).await.is_err()
    }

    // Issue 21 (a nemesis run's object-WAL takeover took over a minute): a takeover reads
    // each segment once; it used to read every segment twice, one at a time. A retried
    // takeover reuses its fence.
    #[tokio::test]
    async fn a_takeover_reads_each_segment_once_and_a_retry_reuses_its_fence() {
        let store = Arc::new(ScriptedStore::default());
        written(store.clone(), 20).await;
        assert_eq!(keys(&store).await.len(), 20);
        store.gets.store(0, Ordering::SeqCst);
        assert_eq!(take_over_as(&store, "agent-a").await, (0..20).collect::<Vec<_>>());
        let gets = store.gets.load(Ordering::SeqCst);
        assert!(gets <= 20, "{gets} GETs to take over 20 segments");
        assert_eq!(take_over_as(&store, "agent-b").await.len(), 20, "retried takeover");
        assert_eq!(keys(&store).await.len(), 21, "one fence, reused");
    }

    // Issue 58: a group goes out at once while no object is in flight; with one in
    // flight it waits up to the linger for more appends, unless it is full.
    #[tokio::test]
    async fn a_group_lingers_only_while_another_object_is_in_flight_and_not_full() {
        let store = Arc::new(ScriptedStore::default());
        let first = store.hold(1);
        let linger = Duration::from_secs(1);
        let pipelining = Pipelining {
            max_inflight: 4,
            max_bytes: 64,
            linger,
            put_retry: Duration::ZERO,
        };
        let (wal, tasks, stop) = writer_with(store.clone(), pipelining);
        let wal = Arc::new(wal);
        let appends = TaskTracker::new();
        let append = |i: u64, batches: Bytes| {
            let wal = wal.clone();
            appends.spawn(async move {
                let mut r = record(i);
                r.batches = batches;
                wal.append(&r).await
            })
        };
        let started = std::time::Instant::now();
        let a = append(0, Bytes::from_static(b"a"));
        put_started(&store, 1).await;
        // Object 1 is in flight (held): a small group lingers.
        let b = append(1, Bytes::from_static(b"b"));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(
            !store.puts_started.lock().expect("lock").contains(&2),
            "a small group was sent before its linger while an object was in flight"
        );
        put_started(&store, 2).await;
        assert!(started.elapsed() >= linger, "sent after {:?}", started.elapsed());
        // A full group does not linger, even with objects in flight.
        let full = std::time::Instant::now();
        let c = append(2, Bytes::from(vec![b'c'; 200]));
        put_started(&store, 3).await;
        assert!(full.elapsed() < linger, "a full group lingered {:?}", full.elapsed());
        first.release();
        for done in [a, b, c] {
            done.await.expect("task").expect("durable");
        }
        assert_eq!(keys(&store).await, vec![1, 2, 3]);
        drop(wal);
        stopped(tasks, stop).await;
    }

    // Issue 58: at most `max_inflight` WAL objects are in flight; the next waits for a
    // slot (--wal-max-inflight-puts).
    #[tokio::test]
    async fn no_more_objects_are_in_flight_than_the_bound() {
        let store = Arc::new(ScriptedStore::default());
        let (first, second) = (store.hold(1), store.hold(2));
        let pipelining = Pipelining {
            max_inflight: 2,
            max_bytes: 1,
            linger: Duration::ZERO,
            put_retry: Duration::ZERO,
        };
        let (wal, tasks, stop) = writer_with(store.clone(), pipelining);
        let wal = Arc::new(wal);
        let appends = TaskTracker::new();
        let waits: Vec<_> = (0..3)
            .map(|i| {
                let wal = wal.clone();
                appends.spawn(async move { wal.append(&record(i)).await })
            })
            .collect();
        put_started(&store, 2).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !store.puts_started.lock().expect("lock").contains(&3),
            "a third object went out with two in flight"
        );
        first.release();
        put_started(&store, 3).await;
        second.release();
        for done in waits {
            done.await.expect("task").expect("durable");
        }
        drop(wal);
        stopped(tasks, stop).await;
    }

    // The key layout is stable storage: a takeover by another version, and GC's sweep of
    // `data/` only, read it. Each incarnation writes under a prefix of its own, so a new
    // incarnation never writes a key the one before it may still be writing.
    #[tokio::test]
    async fn wal_objects_are_keyed_by_incarnation_then_sequence() {
        use futures::TryStreamExt;
        let store = Arc::new(ScriptedStore::default());
        written(store.clone(), 2).await;
        let mut listed: Vec<String> = store
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .expect("list");
        listed.sort();
        assert_eq!(
            listed,
            [
                "wal/streamd-9/00000000000000000001/00000000000000000001",
                "wal/streamd-9/00000000000000000001/00000000000000000002",
            ]
        );
        assert_eq!(
            incarnation_prefix(&NodeId::new(NODE), Epoch(2)).to_string(),
            "wal/streamd-9/00000000000000000002"
        );
    }

    // The fence is put only where no object is (put-if-absent): a writer's object that
    // lands at the fence's key after the listing is read and replayed, never overwritten.
    #[tokio::test]
    async fn a_writers_object_landing_at_the_fence_key_is_replayed_not_overwritten() {
        let prefix = incarnation_prefix(&NodeId::new(NODE), Epoch(1));
        let other = Arc::new(ScriptedStore::default());
        written(other.clone(), 3).await;
        let third = other
            .get(&key(&prefix, 3))
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        let store = Arc::new(ScriptedStore::default());
        written(store.clone(), 2).await;
        store.lands_before_fence(3, PutPayload::from(third));
        assert_eq!(take_over_as(&store, "agent-a").await, vec![0, 1, 2]);
        assert_eq!(keys(&store).await, vec![1, 2, 3, 4], "the fence went to the next key");
    }

    // A fence key found taken by an object reclaimed before it could be read: its records
    // were committed, and the fence goes to the next key.
    #[tokio::test]
    async fn a_fence_key_taken_and_reclaimed_moves_the_fence_to_the_next_key() {
        let store = Arc::new(ScriptedStore::default());
        written(store.clone(), 2).await;
        store.vanishes_before_fence(3);
        assert_eq!(take_over_as(&store, "agent-a").await, vec![0, 1]);
        assert_eq!(keys(&store).await, vec![1, 2, 4]);
    }

    // A WAL object cut inside its header is damage, reported, not a panic.
    #[test]
    fn an_object_cut_inside_its_header_is_corrupt() {
        let cut = Bytes::from([OBJECT_MAGIC.as_slice(), &[0, 0, 1]].concat());
        assert!(matches!(parse(7, cut), Err(WalError::Corrupt(_))));
        let whole = Bytes::from([OBJECT_MAGIC.as_slice(), &5u64.to_be_bytes(), b"seg"].concat());
        let Ok(Object::Records { floor, segment }) = parse(7, whole) else {
            panic!("a whole header parses")
        };
        assert_eq!((floor, &segment[..]), (5, &b"seg"[..]));
    }

    // Two agents that raced each put a fence; the log ends at the lower one.
    #[tokio::test]
    async fn a_racing_agents_fence_ends_the_log() {
        let store = Arc::new(ScriptedStore::default());
        written(store.clone(), 3).await;
        let prefix = incarnation_prefix(&NodeId::new(NODE), Epoch(1));
        for (seq, agent) in [(4, "agent-a"), (5, "agent-b")] {
            let marker = [FENCE_MAGIC, agent.as_bytes()].concat();
            store
                .put(&key(&prefix, seq), PutPayload::from(marker))
                .await
                .expect("fence");
        }
        assert_eq!(take_over_as(&store, "agent-c").await, vec![0, 1, 2]);
        assert_eq!(keys(&store).await.len(), 5, "agent-a's fence reused");
    }

    // Issue 58 (RR-WAL-1): objects are answered in key order. The object after a held
    // one lands first, and its append still waits until the held one is durable.
    #[tokio::test]
    async fn a_later_object_that_lands_first_waits_for_the_earlier_one() {
        let store = Arc::new(ScriptedStore::default());
        let first = store.hold(1);
        let (wal, tasks, stop) = writer(store.clone());
        let mut a = Box::pin(wal.submit(&record(0), None).await.expect("queued"));
        put_started(&store, 1).await;
        let mut b = Box::pin(wal.submit(&record(1), None).await.expect("queued"));
        landed(&store, 2).await;
        assert!(
            still_waiting(&mut b).await,
            "key 2 was answered before key 1 was durable"
        );
        assert!(still_waiting(&mut a).await);
        first.release();
        a.await.expect("key 1 durable");
        b.await.expect("key 2 durable");
        stopped(tasks, stop).await;
    }

    // Issue 58: a PUT that fails in the middle fails every object after it, though they
    // landed; nothing acknowledged is lost, and a takeover ends the log at the gap, so
    // the landed object after it is never read as acknowledged.
    #[tokio::test]
    async fn a_failed_put_in_the_middle_acknowledges_nothing_after_it() {
        let store = Arc::new(ScriptedStore::default());
        let first = store.hold(1);
        store.fail(2);
        let (wal, tasks, stop) = writer(store.clone());
        let a = wal.submit(&record(0), None).await.expect("queued");
        put_started(&store, 1).await;
        let b = wal.submit(&record(1), None).await.expect("queued");
        put_started(&store, 2).await;
        let c = wal.submit(&record(2), None).await.expect("queued");
        landed(&store, 3).await;
        first.release();
        a.await.expect("key 1 durable");
        assert!(matches!(b.await, Err(WalError::Io(_))), "the failed PUT");
        assert!(c.await.is_err(), "key 3 landed, but after the failed key 2");
        assert!(
            wal.append(&record(3)).await.is_err(),
            "the log acknowledges nothing more"
        );
        stopped(tasks, stop).await;
        assert_eq!(take_over_as(&store, "agent").await, vec![0], "the log ends at the gap");
        assert_eq!(keys(&store).await, vec![1, 2, 3], "the fence fills the gap");
    }

    // Issue 60: an object store that refuses a WAL PUT for a while (503 SlowDown, 403,
    // 507) does not end the log: the same key is tried again, new appends are refused
    // with a reason meanwhile, the waiting append is acknowledged once the PUT goes
    // through, and appends are taken again. Without the retry the append fails.
    #[tokio::test]
    async fn a_put_refused_for_a_while_is_retried_on_the_same_key_and_acknowledged() {
        let store = Arc::new(ScriptedStore::default());
        store.fail_times(1, 3);
        let (wal, tasks, stop) = writer_retrying(store.clone(), Duration::from_secs(30));
        let a = wal.submit(&record(0), None).await.expect("queued");
        let refused = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Err(e) = wal.check() {
                    return e;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("appends refused while the PUT is retried");
        assert!(
            matches!(&refused, WalError::Stalled(why) if why.contains("refuses write-ahead log objects")),
            "{refused:?}"
        );
        a.await.expect("acknowledged once the PUT went through");
        assert_eq!(wal.check(), Ok(()), "appends are taken again");
        wal.append(&record(1)).await.expect("the log goes on");
        assert_eq!(
            store
                .puts_started
                .lock()
                .expect("lock")
                .iter()
                .filter(|s| **s == 1)
                .count(),
            4,
            "key 1 tried four times"
        );
        stopped(tasks, stop).await;
        assert_eq!(take_over_as(&store, "agent").await, vec![0, 1]);

        let store = Arc::new(ScriptedStore::default());
        store.fail_times(1, 1);
        let (wal, tasks, stop) = writer(store.clone());
        assert!(
            matches!(wal.append(&record(0)).await, Err(WalError::Io(_))),
            "without retries the refused PUT fails the log"
        );
        stopped(tasks, stop).await;
    }

    // Issue 58 (INV-7): a takeover fences the first key not written while the writer
    // still has PUTs in flight. The writer's PUT at the fence fails, the object it put
    // above the fence is never read, and it acknowledges nothing after the fence; a
    // retried takeover reads the same.
    #[tokio::test]
    async fn a_fenced_writers_object_in_flight_is_never_used() {
        let store = Arc::new(ScriptedStore::default());
        let second = store.hold(2);
        let (wal, tasks, stop) = writer(store.clone());
        wal.append(&record(0)).await.expect("key 1 durable");
        let b = wal.submit(&record(1), None).await.expect("queued");
        put_started(&store, 2).await;
        let c = wal.submit(&record(2), None).await.expect("queued");
        landed(&store, 3).await;
        assert_eq!(take_over_as(&store, "agent-a").await, vec![0]);
        second.release();
        // INV-7: the taken-over WAL rejects its writer: its PUT at the fence fails as fenced,
        // nothing above the fence is acknowledged, and the writer stays fenced.
        assert_eq!(b.await, Err(WalError::Fenced));
        assert!(c.await.is_err(), "key 3 is above the fence");
        assert!(wal.is_fenced());
        stopped(tasks, stop).await;
        assert_eq!(take_over_as(&store, "agent-b").await, vec![0], "retried");
        assert_eq!(keys(&store).await, vec![1, 2, 3]);
    }

    // Issue 58: reclaim deletes a key only once an acknowledged object carries a floor
    // above it (an idle writer puts one without records), and a takeover starts at the
    // highest floor it reads, so bulk deletes in any order never look like the end of
    // the log, and a listed key below the floor is not replayed.
    #[tokio::test]
    async fn reclaimed_keys_are_deleted_once_a_durable_floor_covers_them() {
        let store = Arc::new(ScriptedStore::default());
        let (wal, tasks, stop) = writer(store.clone());
        for i in 0..10 {
            wal.append(&record(i)).await.expect("durable");
        }
        let floor_object = store.hold(11);
        // Records 0..6 (keys 1..=6) are committed.
        wal.reclaim([(StreamId(1), 6)]);
        put_started(&store, 11).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(keys(&store).await.len(), 10, "deleted before the floor was durable");
        floor_object.release();
        tokio::time::timeout(Duration::from_secs(10), async {
            while keys(&store).await != vec![7, 8, 9, 10, 11] {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("keys 1..=6 deleted");
        assert_eq!(
            wal.bytes() as usize,
            (6..10).map(|i| record(i).encoded_len()).sum::<usize>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(keys(&store).await.len(), 5, "an idle writer puts nothing more");
        stopped(tasks, stop).await;
        let mut stale = BytesMut::new();
        record(99).encode_into(&mut stale);
        let sink = ObjectSink::create(store.clone(), &NodeId::new(NODE), Epoch(1), Pipelining::default());
        sink.put(3, 1, stale.freeze(), Default::default())
            .await
            .expect("a key below the floor");
        assert_eq!(take_over_as(&store, "agent").await, vec![6, 7, 8, 9]);
    }
}
