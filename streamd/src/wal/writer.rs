//! Group commit: one task drains every waiting append, makes them durable with one
//! write and one sync, and only then answers them all. It also reclaims segments whose
//! records are all committed in data objects, and bounds the WAL by `--wal-max-bytes`.

use super::record::WalRecord;
use super::{SegmentId, Sink, WalError};
use bytes::{Bytes, BytesMut};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use weir_shared::ids::StreamId;

/// Most bytes one group commit writes.
const MAX_GROUP_BYTES: usize = 8 * 1024 * 1024;
/// Bounded queue of appends waiting for the writer.
const QUEUE: usize = 4096;

enum Request {
    Append {
        stream: StreamId,
        end_offset: u64,
        record: Bytes,
        done: oneshot::Sender<Result<(), WalError>>,
    },
    /// Delete segments whose every stream's records end at or below these committed ends.
    Reclaim { committed: HashMap<StreamId, u64> },
}

/// What a segment holds, for reclaiming it.
#[derive(Default)]
struct SegmentInfo {
    bytes: u64,
    /// Per stream, the end offset of its last record in the segment.
    stream_ends: HashMap<StreamId, u64>,
}

/// The handle appends go through.
#[derive(Clone)]
pub struct WalWriter {
    tx: mpsc::Sender<Request>,
    bytes: Arc<AtomicU64>,
    max_bytes: u64,
    fenced: Arc<AtomicBool>,
}

impl WalWriter {
    /// Starts the group-commit task on `sink`.
    pub fn start(
        sink: Sink,
        max_bytes: u64,
        tasks: &tokio_util::task::TaskTracker,
        stop: tokio_util::sync::CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer = Self {
            tx,
            bytes: Arc::new(AtomicU64::new(0)),
            max_bytes,
            fenced: Arc::new(AtomicBool::new(false)),
        };
        let (writer_bytes, writer_fenced) = (writer.bytes.clone(), writer.fenced.clone());
        tasks.spawn(async move {
            let mut sink = sink;
            tokio::select! {
                _ = run(&mut sink, rx, writer_bytes, writer_fenced) => {}
                _ = stop.cancelled() => {}
            }
            sink.close().await;
        });
        writer
    }

    /// Appends `record`; returns once it is durable and the WAL was not taken over.
    pub async fn append(&self, record: &WalRecord) -> Result<(), WalError> {
        self.check()?;
        self.submit(record).await?.await
    }

    /// Refuses new appends once fenced or over `--wal-max-bytes` (FO-MDO-7).
    pub fn check(&self) -> Result<(), WalError> {
        if self.fenced.load(Ordering::Acquire) {
            return Err(WalError::Fenced);
        }
        let held = self.bytes.load(Ordering::Relaxed);
        if held >= self.max_bytes {
            return Err(WalError::Full(held));
        }
        Ok(())
    }

    /// Queues `record` behind every earlier one; the returned future resolves once it is
    /// durable. Queue order is write order, so callers holding a stream's lock while
    /// submitting keep its records in offset order.
    pub async fn submit(
        &self,
        record: &WalRecord,
    ) -> Result<impl std::future::Future<Output = Result<(), WalError>>, WalError> {
        let (done, rx) = oneshot::channel();
        let req = Request::Append {
            stream: record.stream,
            end_offset: record.end_offset(),
            record: record.encode(),
            done,
        };
        self.tx
            .send(req)
            .await
            .map_err(|_| WalError::Io("the WAL writer has stopped".into()))?;
        Ok(async move {
            rx.await
                .map_err(|_| WalError::Io("the WAL writer has stopped".into()))?
        })
    }

    /// Reclaims segments fully covered by `committed` ends.
    pub fn reclaim(&self, committed: HashMap<StreamId, u64>) {
        let _ = self.tx.try_send(Request::Reclaim { committed });
    }

    /// Bytes held in live segments.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }
}

async fn run(sink: &mut Sink, mut rx: mpsc::Receiver<Request>, bytes: Arc<AtomicU64>, fenced: Arc<AtomicBool>) {
    let mut segments: BTreeMap<SegmentId, SegmentInfo> = BTreeMap::new();
    let mut failed: Option<WalError> = None;
    while let Some(first) = rx.recv().await {
        let mut group = BytesMut::new();
        let mut waiters = Vec::new();
        let mut ends = Vec::new();
        let mut next = Some(first);
        while let Some(req) = next.take() {
            match req {
                Request::Append {
                    stream,
                    end_offset,
                    record,
                    done,
                } => {
                    group.extend_from_slice(&record);
                    waiters.push(done);
                    ends.push((stream, end_offset));
                }
                Request::Reclaim { committed } => {
                    reclaim(sink, &mut segments, &committed, &bytes).await;
                }
            }
            if group.len() < MAX_GROUP_BYTES {
                next = rx.try_recv().ok();
            }
        }
        if waiters.is_empty() {
            continue;
        }
        // Tests: a slow disk, so appends that arrive meanwhile pile up for the next group.
        weir_shared::failpoint::pause("wal_persist").await;
        let result = match &failed {
            Some(e) => Err(e.clone()),
            None => sink.persist(group.freeze()).await,
        };
        match result {
            Ok((segment, len)) => {
                let info = segments.entry(segment).or_default();
                info.bytes += len;
                for (stream, end) in ends {
                    let e = info.stream_ends.entry(stream).or_insert(0);
                    *e = (*e).max(end);
                }
                bytes.fetch_add(len, Ordering::Relaxed);
                for w in waiters {
                    let _ = w.send(Ok(()));
                }
            }
            Err(e) => {
                // Nothing after a failure is acknowledged: a taken-over or broken WAL stays failed.
                if e == WalError::Fenced {
                    tracing::error!("write-ahead log was taken over; acknowledging nothing more");
                    fenced.store(true, Ordering::Release);
                } else {
                    tracing::error!(error = %e, "write-ahead log write failed; acknowledging nothing more");
                }
                failed = Some(e.clone());
                for w in waiters {
                    let _ = w.send(Err(e.clone()));
                }
            }
        }
    }
}

async fn reclaim(
    sink: &mut Sink,
    segments: &mut BTreeMap<SegmentId, SegmentInfo>,
    committed: &HashMap<StreamId, u64>,
    bytes: &AtomicU64,
) {
    let boundary = sink.boundary_segment();
    tracing::debug!(
        segments = segments.len(),
        ?boundary,
        ?committed,
        "reclaiming WAL segments"
    );
    let reclaimable: Vec<SegmentId> = segments
        .iter()
        .take_while(|(id, info)| {
            Some(**id) != boundary
                && info
                    .stream_ends
                    .iter()
                    .all(|(s, end)| committed.get(s).is_none_or(|c| c >= end))
        })
        .map(|(id, _)| *id)
        .collect();
    for id in reclaimable {
        match sink.delete(id).await {
            Ok(()) => {
                if let Some(info) = segments.remove(&id) {
                    bytes.fetch_sub(info.bytes, Ordering::Relaxed);
                }
                tracing::debug!(segment = id, "reclaimed WAL segment");
            }
            Err(e) => {
                tracing::warn!(segment = id, error = %e, "cannot reclaim WAL segment; will retry");
                return;
            }
        }
    }
}
