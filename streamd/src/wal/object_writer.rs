//! The object WAL's writer task: group commit with several objects in flight.
//!
//! Everything waiting, across every stream of the node, goes into the next object. An
//! object is sent as soon as a PUT slot is free and either no other object is in flight
//! (nothing to wait for), the group is full (`max_bytes`), or it has waited `linger`.
//! Objects are answered in key order, whatever order their PUTs finish in: an append is
//! acknowledged only once its object and every object before it are durable, so no
//! record is acknowledged before one it follows (RR-WAL-1). The first PUT that fails
//! fails every object after it, in flight or not, and the log acknowledges nothing more.
//!
//! Reclaim never waits on the writes: the writer raises its floor over the objects whose
//! records are all committed, and deletes them (in bulk) once an acknowledged object
//! carries that floor (see `object`). The next object carries it; when nothing is being
//! written, one object with no records does, so a node that goes idle reclaims its WAL
//! with one PUT and then makes none.

use super::group_commit::{Group, Log, Request};
use super::object::ObjectSink;
use super::record::Framed;
use super::{SegmentId, WalError};
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A PUT in flight: its group, the floor it carries, and how it went.
type Put = BoxFuture<'static, (Group, SegmentId, Result<(SegmentId, u64), WalError>)>;
/// A bulk delete in flight: each key's outcome.
type Deletes = BoxFuture<'static, Vec<(SegmentId, Result<(), WalError>)>>;

/// What the writer holds between events.
struct Writer {
    sink: ObjectSink,
    log: Log,
    inflight: FuturesOrdered<Put>,
    /// Appends gathered for the next object, and when the first of them arrived.
    pending: Group,
    pending_since: Option<Instant>,
    deleting: Option<Deletes>,
    /// Keys below this may be deleted; carried by the next object.
    floor: SegmentId,
    /// The highest floor an acknowledged object carries: only keys below it are deleted.
    durable_floor: SegmentId,
    /// Reclaim has something to look at: ends were reported, or the durable floor rose.
    reclaim_due: bool,
}

/// Runs the writer until the queue closes and everything in flight is answered.
pub(super) async fn run(sink: ObjectSink, mut rx: mpsc::Receiver<Request>, log: Log) {
    let mut w = Writer {
        sink,
        log,
        inflight: FuturesOrdered::new(),
        pending: Group::default(),
        pending_since: None,
        deleting: None,
        floor: 1,
        durable_floor: 1,
        reclaim_due: false,
    };
    let tuning = w.sink.pipelining;
    let mut open = true;
    loop {
        w.send_ready(open).await;
        w.start_reclaim();
        if !open && w.inflight.is_empty() && w.pending.waiters.is_empty() && w.deleting.is_none() {
            return;
        }
        let room = w.pending.framed_len() < tuning.max_bytes;
        let linger_at = w
            .pending_since
            .filter(|_| w.inflight.len() < tuning.max_inflight)
            .map(|t| t + tuning.linger);
        tokio::select! {
            req = rx.recv(), if open && room => match req {
                Some(req) => {
                    w.take(req);
                    // And whatever else is already waiting, up to an object's bytes.
                    while w.pending.framed_len() < tuning.max_bytes {
                        match rx.try_recv() {
                            Ok(req) => w.take(req),
                            Err(_) => break,
                        }
                    }
                }
                None => open = false,
            },
            Some((group, floor, result)) = w.inflight.next(), if !w.inflight.is_empty() => {
                w.settled(group, floor, result);
            }
            _ = tokio::time::sleep_until(linger_at.unwrap_or_else(Instant::now)), if linger_at.is_some() => {}
            Some(done) = futures::future::OptionFuture::from(w.deleting.as_mut()), if w.deleting.is_some() => {
                w.deleting = None;
                for (segment, result) in done {
                    w.log.deleted(segment, result);
                }
                w.log.forget_reclaimed();
            }
        }
    }
}

impl Writer {
    fn take(&mut self, req: Request) {
        self.pending.take(req);
        if self.log.has_reported() {
            self.reclaim_due = true;
        }
        if self.pending_since.is_none() && !self.pending.waiters.is_empty() {
            self.pending_since = Some(Instant::now());
        }
    }

    /// Sends the pending group if a slot is free and it should not wait for more.
    async fn send_ready(&mut self, open: bool) {
        let tuning = self.sink.pipelining;
        if self.pending.reclaim {
            self.pending.reclaim = false;
            self.reclaim_due = true;
        }
        while !self.pending.waiters.is_empty() && self.inflight.len() < tuning.max_inflight {
            let lingered = self.pending_since.is_some_and(|t| t.elapsed() >= tuning.linger);
            let full = self.pending.framed_len() >= tuning.max_bytes;
            if !(self.inflight.is_empty() || full || lingered || !open) {
                return;
            }
            // Tests: a slow store, so appends that arrive meanwhile pile up for the next object.
            weir_shared::failpoint::pause("wal_persist").await;
            let group = std::mem::take(&mut self.pending);
            self.pending_since = None;
            if let Some(e) = self.log.failure() {
                let e = e.clone();
                self.log.settle(group, Err(e));
                continue;
            }
            self.send(group);
        }
    }

    /// Puts `group` at the next key, carrying the current floor.
    fn send(&mut self, mut group: Group) {
        let (seq, floor) = (self.sink.next_key(), self.floor);
        let put = self.sink.put(seq, floor, group.take_framed(), self.log.stall());
        let inflight = &crate::metrics::metrics().wal_puts_inflight;
        inflight.inc();
        self.inflight.push_back(
            async move {
                let result = put.await;
                inflight.dec();
                (group, floor, result)
            }
            .boxed(),
        );
    }

    /// Answers the oldest object in flight: as its PUT went, unless one before it failed.
    fn settled(&mut self, group: Group, floor: SegmentId, result: Result<(SegmentId, u64), WalError>) {
        let result = match self.log.failure() {
            Some(e) => Err(e.clone()),
            None => result,
        };
        if result.is_ok() && floor > self.durable_floor {
            self.durable_floor = floor;
            self.reclaim_due = true;
        }
        self.log.settle(group, result);
    }

    /// Raises the floor over the segments whose records are all committed, and deletes
    /// those an acknowledged object's floor already covers; one bulk delete at a time.
    fn start_reclaim(&mut self) {
        if !self.reclaim_due || self.deleting.is_some() {
            return;
        }
        self.reclaim_due = false;
        self.log.take_reported();
        // No boundary kept: the object carrying the highest durable floor is at or above
        // it, so it is never among the keys deleted.
        let reclaimable = self.log.reclaimable(None);
        if let Some(last) = reclaimable.last() {
            self.floor = self.floor.max(last + 1);
        }
        let (now, later): (Vec<SegmentId>, Vec<SegmentId>) =
            reclaimable.into_iter().partition(|s| *s < self.durable_floor);
        if !now.is_empty() {
            self.deleting = Some(self.sink.delete(now).boxed());
        }
        // Records wait on a floor no object is about to carry: one object without
        // records carries it.
        let idle = self.inflight.is_empty() && self.pending.waiters.is_empty();
        if idle && self.log.failure().is_none() && later.iter().any(|s| self.log.holds_records(*s)) {
            self.send(Group::default());
        }
    }
}
