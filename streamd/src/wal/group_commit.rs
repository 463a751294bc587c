//! What the WAL's writer gathers and keeps: the requests waiting for it, the group of
//! appends one write makes durable, and its account of the log (what each segment
//! holds, whether the log failed), which answers appends and finds segments to reclaim.
//! Both backends' writers (`file_writer`, `object_writer`) share it.

use super::record::{Framed, WalRecord};
use super::stall::Stall;
use super::{SegmentId, WalError};
use bytes::{BufMut, Bytes, BytesMut};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use weir_shared::ids::StreamId;

/// Most bytes one group commit writes.
const MAX_GROUP_BYTES: usize = 8 * 1024 * 1024;

pub(super) enum Request {
    /// Framed by the writer into the buffer it writes from, so the batches are copied once.
    Append {
        record: WalRecord,
        done: Answer,
        on_durable: Option<OnDurable>,
    },
    /// Delete segments whose every stream's records end at or below these committed ends.
    /// New committed ends are waiting in `WalWriter::committed`.
    Reclaim,
    /// The stop was requested: wakes a writer thread waiting for appends.
    Wake,
}

/// Run by the writer once a record is durable, before its submitter is told: what
/// must follow durability whether or not the submitter still waits (a caller that
/// went away, such as a cancelled request, must not leave a stream's durable end
/// behind a record that is in the log).
pub type OnDurable = Box<dyn FnOnce() + Send>;

/// Where an append's submitter is told how its write went.
type Answer = oneshot::Sender<Result<(), WalError>>;

/// What a segment holds, for reclaiming it.
#[derive(Default)]
struct SegmentInfo {
    bytes: u64,
    /// Per stream, the end offset of its last record in the segment.
    stream_ends: HashMap<StreamId, u64>,
}

/// The writer's account of its log: what each segment holds, and whether it failed.
pub(super) struct Log {
    segments: BTreeMap<SegmentId, SegmentInfo>,
    /// Set by the first failure: nothing after it is acknowledged.
    failed: Option<WalError>,
    bytes: Arc<AtomicU64>,
    fenced: Arc<AtomicBool>,
    stalled: Stall,
    /// Where the handle leaves reported committed ends (`WalWriter::reclaim`).
    reported: Arc<Mutex<HashMap<StreamId, u64>>>,
    /// The committed end of every stream with records in a live segment, as reported;
    /// a stream not in it has nothing committed yet.
    committed: HashMap<StreamId, u64>,
}

/// Appends gathered for one write.
#[derive(Default)]
pub(super) struct Group {
    /// Kept as they came until the write frames them: framing into a buffer of its
    /// own would copy every byte once more, and grow that buffer a doubling at a time.
    records: Vec<WalRecord>,
    /// Bytes the records take framed.
    bytes: usize,
    pub(super) waiters: Vec<(Answer, Option<OnDurable>)>,
    ends: Vec<(StreamId, u64)>,
    /// Committed ends were reported.
    pub(super) reclaim: bool,
}

impl Group {
    /// `first`, and every request already waiting behind it, up to a group's bytes.
    pub(super) fn gather(first: Request, rx: &mut mpsc::Receiver<Request>) -> Self {
        let mut group = Group::default();
        group.take(first);
        while !group.is_full() {
            match rx.try_recv() {
                Ok(req) => group.take(req),
                Err(_) => break,
            }
        }
        group
    }

    pub(super) fn take(&mut self, req: Request) {
        match req {
            Request::Append {
                record,
                done,
                on_durable,
            } => {
                self.bytes += record.encoded_len();
                self.ends.push((record.stream, record.end_offset()));
                self.records.push(record);
                self.waiters.push((done, on_durable));
            }
            Request::Reclaim => self.reclaim = true,
            Request::Wake => {}
        }
    }

    pub(super) fn is_full(&self) -> bool {
        self.bytes >= MAX_GROUP_BYTES
    }

    /// The records framed into one buffer of exactly their size, let go of here (an
    /// object WAL's group waits for its PUT holding these bytes only).
    pub(super) fn take_framed(&mut self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.bytes);
        self.frame_into(&mut out);
        self.records = Vec::new();
        out.freeze()
    }
}

impl Framed for Group {
    fn framed_len(&self) -> usize {
        self.bytes
    }

    fn frame_into(&self, out: &mut impl BufMut) {
        for record in &self.records {
            record.encode_into(out);
        }
    }
}

impl Log {
    /// An empty log, sharing its counters and the committed ends reported with the handle.
    pub(super) fn new(
        bytes: Arc<AtomicU64>,
        fenced: Arc<AtomicBool>,
        stalled: Stall,
        reported: Arc<Mutex<HashMap<StreamId, u64>>>,
    ) -> Self {
        Self {
            segments: BTreeMap::new(),
            failed: None,
            bytes,
            fenced,
            stalled,
            reported,
            committed: HashMap::new(),
        }
    }

    /// Answers a group's appends with what its write did.
    pub(super) fn settle(&mut self, group: Group, result: Result<(SegmentId, u64), WalError>) {
        match result {
            Ok((segment, len)) => {
                let info = self.segments.entry(segment).or_default();
                info.bytes += len;
                for (stream, end) in group.ends {
                    let e = info.stream_ends.entry(stream).or_insert(0);
                    *e = (*e).max(end);
                }
                self.bytes.fetch_add(len, Ordering::Relaxed);
                for (w, on_durable) in group.waiters {
                    if let Some(f) = on_durable {
                        f();
                    }
                    let _ = w.send(Ok(()));
                }
            }
            Err(e) => {
                // Nothing after a failure is acknowledged: a taken-over or broken WAL stays failed.
                if e == WalError::Fenced {
                    self.fenced.store(true, Ordering::Release);
                }
                // Said once, when it first failed (objects in flight fail after it).
                if self.failed.is_none() {
                    if e == WalError::Fenced {
                        tracing::error!("write-ahead log was taken over; acknowledging nothing more");
                    } else {
                        tracing::error!(error = %e, "write-ahead log write failed; acknowledging nothing more");
                    }
                    self.failed = Some(e.clone());
                }
                for (w, _) in group.waiters {
                    let _ = w.send(Err(e.clone()));
                }
            }
        }
    }

    /// A write found the volume full: said once, and new appends refused until it is written.
    pub(super) fn out_of_space(&mut self, why: String) {
        if self.stalled.set(format!("write-ahead log volume is full: {why}")) {
            tracing::error!(error = %why, "write-ahead log volume is full; refusing new appends and retrying the write until space returns");
        }
    }

    /// The write went through (or failed otherwise): appends are taken again.
    pub(super) fn space_returned(&mut self) {
        if self.stalled.clear() {
            tracing::info!("write-ahead log volume has space again; taking appends");
        }
    }

    /// Where an object WAL's PUTs say they are retrying.
    pub(super) fn stall(&self) -> Stall {
        self.stalled.clone()
    }

    /// The failure that ended this log's acknowledgements, if any.
    pub(super) fn failure(&self) -> Option<&WalError> {
        self.failed.as_ref()
    }

    /// Whether `segment` holds any record (an object WAL's floor object holds none).
    pub(super) fn holds_records(&self, segment: SegmentId) -> bool {
        self.segments.get(&segment).is_some_and(|info| info.bytes > 0)
    }

    /// Whether committed ends were reported and not yet taken (a full queue may have
    /// dropped the request that announced them).
    pub(super) fn has_reported(&self) -> bool {
        !self.reported.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Takes the committed ends reported since the last look.
    pub(super) fn take_reported(&mut self) {
        let reported = std::mem::take(&mut *self.reported.lock().unwrap_or_else(|p| p.into_inner()));
        for (stream, end) in reported {
            let e = self.committed.entry(stream).or_insert(end);
            *e = (*e).max(end);
        }
    }

    /// Segments, oldest first, whose every record is covered by the committed ends;
    /// never the `boundary` one, which the writer still needs.
    pub(super) fn reclaimable(&self, boundary: Option<SegmentId>) -> Vec<SegmentId> {
        tracing::debug!(segments = self.segments.len(), ?boundary, "reclaiming WAL segments");
        self.segments
            .iter()
            .take_while(|(id, info)| {
                Some(**id) != boundary
                    && info
                        .stream_ends
                        .iter()
                        .all(|(s, end)| self.committed.get(s).is_some_and(|c| c >= end))
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Forgets the committed ends of streams no live segment holds a record of, so
    /// the map follows what is in the log, not every stream ever served.
    pub(super) fn forget_reclaimed(&mut self) {
        let live: std::collections::HashSet<StreamId> = self
            .segments
            .values()
            .flat_map(|info| info.stream_ends.keys().copied())
            .collect();
        self.committed.retain(|s, _| live.contains(s));
    }

    /// Records that deleting `segment` went as it did; false stops this reclaim.
    pub(super) fn deleted(&mut self, segment: SegmentId, result: Result<(), WalError>) -> bool {
        match result {
            Ok(()) => {
                if let Some(info) = self.segments.remove(&segment) {
                    self.bytes.fetch_sub(info.bytes, Ordering::Relaxed);
                }
                tracing::debug!(segment, "reclaimed WAL segment");
                true
            }
            Err(e) => {
                tracing::warn!(segment, error = %e, "cannot reclaim WAL segment; will retry");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// D-23: only changed committed ends are reported. A segment is reclaimed once every
    /// stream in it is reported committed past its records; a stream not reported yet
    /// keeps its segments, and the ends of streams no live segment holds are forgotten.
    #[test]
    fn segments_are_reclaimed_from_reported_ends_and_unreported_streams_keep_theirs() {
        let mut log = Log {
            segments: BTreeMap::new(),
            failed: None,
            bytes: Arc::default(),
            fenced: Arc::default(),
            stalled: Stall::default(),
            reported: Arc::default(),
            committed: HashMap::new(),
        };
        let segment = |ends: &[(u64, u64)]| SegmentInfo {
            bytes: 1,
            stream_ends: ends.iter().map(|&(s, e)| (StreamId(s), e)).collect(),
        };
        log.segments.insert(1, segment(&[(1, 10), (2, 5)]));
        log.segments.insert(2, segment(&[(1, 20)]));
        log.segments.insert(3, segment(&[(3, 1)]));
        let report = |log: &Log, ends: &[(u64, u64)]| {
            log.reported
                .lock()
                .expect("lock")
                .extend(ends.iter().map(|&(s, e)| (StreamId(s), e)));
        };
        report(&log, &[(1, 20)]);
        log.take_reported();
        assert!(log.reclaimable(None).is_empty(), "stream 2 was never reported");
        report(&log, &[(2, 5)]);
        log.take_reported();
        assert_eq!(log.reclaimable(Some(3)), vec![1, 2], "never the boundary segment");
        for s in [1, 2] {
            assert!(log.deleted(s, Ok(())));
        }
        log.forget_reclaimed();
        assert!(log.committed.is_empty(), "no live segment holds streams 1 and 2");
    }

    /// Issue 62: a group keeps its records until the write frames them; framed, they
    /// are byte for byte each record framed alone, one after another, in a buffer of
    /// exactly the group's length.
    #[test]
    fn a_group_frames_its_records_as_each_frames_alone() {
        use weir_shared::ids::StreamEpoch;
        let records: Vec<WalRecord> = (0..5u64)
            .map(|i| WalRecord {
                stream: StreamId(i % 2),
                stream_epoch: StreamEpoch(1),
                base_offset: i * 10,
                offset_count: 10,
                batches: bytes::Bytes::from(vec![i as u8; 1000 * i as usize + 1]),
            })
            .collect();
        let mut group = Group::default();
        for record in &records {
            let (done, _answer) = oneshot::channel();
            group.take(Request::Append {
                record: record.clone(),
                done,
                on_durable: None,
            });
        }
        let alone: Vec<u8> = records.iter().flat_map(|r| r.encode()).collect();
        assert_eq!(group.framed_len(), alone.len());
        let mut framed = Vec::new();
        group.frame_into(&mut framed);
        assert_eq!(framed, alone);
        let taken = group.take_framed();
        assert_eq!(&taken[..], &alone[..]);
        assert!(group.records.is_empty(), "the records are let go once framed");
        assert_eq!(group.waiters.len(), 5, "the waiters stay to be answered");
    }
}
