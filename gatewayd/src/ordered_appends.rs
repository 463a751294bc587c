//! Ordered appends for one caller (a Kafka connection), D-22. Each owner gets one
//! `AppendStream` (a lane): appends sent on it are admitted by the owner in the order
//! they were sent, without waiting for the one before to be durable. So a pipelined
//! producer's batches to a partition are stored in the order it sent them, and many
//! share one fdatasync.
//!
//! An append the lane could not deliver (no owner yet, the owner moved, the lane
//! broke) goes the unary way, through [`Routes::call`], which follows the stream to its
//! owner. It goes only after this caller's previous append to the stream has finished,
//! and a later append to that stream follows it there instead of overtaking it on a
//! lane: retries keep the order too.

use crate::route::{retry_or_fail, RouteError, Routes};
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::task::TaskTracker;
use weir_proto::streamd::append_stream_reply::Result as Outcome;
use weir_proto::streamd::{AppendReply, AppendRequest, AppendStreamReply, AppendStreamRequest};
use weir_shared::error_code::ErrorCode;
use weir_shared::ids::Incarnation;

type Reply = Result<AppendReply, tonic::Status>;

/// A lane with nothing sent or awaited for this long ends (a new one opens on demand).
const LANE_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// One caller's lanes, and its latest append to each stream. Shared by the caller
/// and its appends in flight (a retried append goes back onto a lane).
#[derive(Clone)]
pub struct OrderedAppends(Arc<Mutex<Lanes>>);

struct Lanes {
    tasks: TaskTracker,
    lanes: HashMap<Incarnation, Lane>,
    latest: HashMap<String, Tail>,
}

/// The sending side of one `AppendStream`.
struct Lane {
    tx: mpsc::UnboundedSender<AppendStreamRequest>,
    queue: Arc<Mutex<Waiting>>,
    next_seq: u64,
}

/// Appends sent on a lane and not yet answered, oldest first (replies come in order).
#[derive(Default)]
struct Waiting {
    /// Set, with the reason, once the lane ended: later appends fail at once.
    ended: Option<tonic::Status>,
    replies: VecDeque<(u64, oneshot::Sender<Reply>)>,
}

/// Where an append is: queued on a lane, or outside the lanes (waiting to be sent again).
#[derive(Clone)]
enum Place {
    Lane(Incarnation, Arc<Mutex<Waiting>>),
    Detoured,
}

/// How a caller's append to a stream is getting on, for the one after it.
#[derive(Clone)]
struct Tail {
    /// Closed once the append has finished (its sender is dropped).
    finished: watch::Receiver<()>,
    place: Arc<Mutex<Place>>,
}

impl Tail {
    fn is_finished(&self) -> bool {
        self.finished.has_changed().is_err()
    }

    /// Whether an append to the same stream sent now on `owner`'s lane could overtake
    /// this one: it is outside the lanes, on another owner's, or on a lane that ended.
    fn could_be_overtaken(&self, owner: &Incarnation) -> bool {
        match &*lock(&self.place) {
            Place::Detoured => true,
            Place::Lane(o, queue) => o != owner || lock(queue).ended.is_some(),
        }
    }

    async fn wait(mut self) {
        while self.finished.changed().await.is_ok() {}
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One append on its way; [`OrderedAppend::finish`] gives its outcome.
pub struct OrderedAppend {
    appends: OrderedAppends,
    stream: String,
    batches: Bytes,
    /// The producer's transactional id, for its owner's KIP-890 check.
    transactional_id: Option<String>,
    /// The lane's owner and its answer to come, or why it was not sent on one.
    sent: Result<(Incarnation, oneshot::Receiver<Reply>), RouteError>,
    previous: Option<Tail>,
    place: Arc<Mutex<Place>>,
    _finished: watch::Sender<()>,
}

impl OrderedAppends {
    /// Lanes run on `tasks`; each ends once every clone of this value is dropped and
    /// its owner has answered what it admitted.
    pub fn new(tasks: TaskTracker) -> Self {
        Self(Arc::new(Mutex::new(Lanes {
            tasks,
            lanes: HashMap::new(),
            latest: HashMap::new(),
        })))
    }

    /// Sends `batches` to `stream`'s owner behind every earlier append of this caller.
    /// Returns at once; nothing here waits for the owner.
    /// `transactional_id` names the producer's transaction for transactional batches.
    pub fn send(
        &self,
        routes: &Routes,
        stream: &str,
        batches: Bytes,
        transactional_id: Option<String>,
    ) -> OrderedAppend {
        let mut lanes = lock(&self.0);
        let previous = lanes.latest.get(stream).filter(|t| !t.is_finished()).cloned();
        let (finished_tx, finished_rx) = watch::channel(());
        let place = Arc::new(Mutex::new(Place::Detoured));
        let sent = lanes.send_on_lane(
            routes,
            stream,
            batches.clone(),
            transactional_id.clone(),
            previous.as_ref(),
            &place,
        );
        lanes.latest.insert(
            stream.to_string(),
            Tail {
                finished: finished_rx,
                place: place.clone(),
            },
        );
        // Streams whose last append finished need no entry.
        if lanes.latest.len() > 1024 {
            lanes.latest.retain(|_, t| !t.is_finished());
        }
        OrderedAppend {
            appends: self.clone(),
            stream: stream.to_string(),
            batches,
            transactional_id,
            sent,
            previous,
            place,
            _finished: finished_tx,
        }
    }
}

impl Lanes {
    /// Queues the append on its owner's lane unless that could overtake `previous`;
    /// records where it went in `place`.
    fn send_on_lane(
        &mut self,
        routes: &Routes,
        stream: &str,
        batches: Bytes,
        transactional_id: Option<String>,
        previous: Option<&Tail>,
        place: &Mutex<Place>,
    ) -> Result<(Incarnation, oneshot::Receiver<Reply>), RouteError> {
        let (owner, client) = routes.owner_client(stream)?;
        if previous.is_some_and(|p| p.could_be_overtaken(&owner)) {
            return Err(RouteError::NoOwner {
                stream: stream.to_string(),
                why: "an earlier append to it is being sent again".into(),
            });
        }
        let ended = |lane: &Lane| lock(&lane.queue).ended.is_some();
        if self.lanes.get(&owner).is_none_or(ended) {
            self.lanes.retain(|_, l| !ended(l));
            let lane = Lane::open(&self.tasks, client);
            self.lanes.insert(owner.clone(), lane);
        }
        let lane = self.lanes.get_mut(&owner).expect("inserted above");
        // A lane that ended since the check above sent nothing: the append is detoured.
        let reply = lane
            .send(AppendRequest {
                stream: stream.to_string(),
                batches,
                match_next_offset: None,
                transactional_id,
            })
            .map_err(|status| RouteError::NoOwner {
                stream: stream.to_string(),
                why: status.message().to_string(),
            })?;
        *lock(place) = Place::Lane(owner.clone(), lane.queue.clone());
        Ok((owner, reply))
    }
}

impl Lane {
    /// Opens an `AppendStream` to the owner behind `client`, read by a task on `tasks`.
    fn open(
        tasks: &TaskTracker,
        mut client: weir_proto::streamd::streamd_client::StreamdClient<weir_shared::grpc::Channel>,
    ) -> Lane {
        let (tx, rx) = mpsc::unbounded_channel();
        let queue = Arc::new(Mutex::new(Waiting::default()));
        let waiting = queue.clone();
        tasks.spawn(async move {
            let ended = match client.append_stream(UnboundedReceiverStream::new(rx)).await {
                Ok(replies) => {
                    let mut replies = replies.into_inner();
                    loop {
                        let message = tokio::select! {
                            m = replies.message() => m,
                            _ = tokio::time::sleep(LANE_IDLE) => {
                                // Nothing sent or awaited for a while: end the lane, so idle
                                // connections hold none of the owner's streams per
                                // connection. Under the lock, so no append slips in.
                                let mut w = lock(&waiting);
                                if w.replies.is_empty() {
                                    w.ended = Some(ErrorCode::Unavailable.status("the append lane was idle"));
                                    return;
                                }
                                continue;
                            }
                        };
                        match message {
                            Ok(Some(reply)) => deliver(&waiting, reply),
                            // Ended cleanly: the owner answered everything it admitted, so
                            // what is left was never applied and may go elsewhere.
                            Ok(None) => {
                                break ErrorCode::Unavailable
                                    .status("the owner stopped taking appends on this connection")
                            }
                            // The transport broke: what is left may or may not be applied.
                            Err(status) => break status,
                        }
                    }
                }
                Err(status) => status,
            };
            let mut w = lock(&waiting);
            for (_, reply) in w.replies.drain(..) {
                let _ = reply.send(Err(ended.clone()));
            }
            w.ended = Some(ended);
        });
        Lane { tx, queue, next_seq: 0 }
    }

    /// Queues one append on the lane; the receiver gets its reply.
    fn send(&mut self, append: AppendRequest) -> Result<oneshot::Receiver<Reply>, tonic::Status> {
        let mut w = lock(&self.queue);
        if let Some(ended) = &w.ended {
            return Err(ended.clone());
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let (reply_tx, reply_rx) = oneshot::channel();
        // Under the lock, so the reader cannot end the lane between the two.
        w.replies.push_back((seq, reply_tx));
        if self
            .tx
            .send(AppendStreamRequest {
                seq,
                append: Some(append),
            })
            .is_err()
        {
            w.replies.pop_back();
            return Err(ErrorCode::Unavailable.status("the append stream to the owner has ended"));
        }
        Ok(reply_rx)
    }
}

/// Hands one reply to the oldest waiting append (replies come in request order).
fn deliver(waiting: &Mutex<Waiting>, reply: AppendStreamReply) {
    let mut w = lock(waiting);
    let Some((seq, to)) = w.replies.pop_front() else {
        tracing::warn!(seq = reply.seq, "append stream reply with nothing waiting for it");
        return;
    };
    debug_assert_eq!(seq, reply.seq, "append stream replies come in request order");
    let result = match reply.result {
        Some(Outcome::Ok(ok)) => Ok(ok),
        Some(Outcome::Error(e)) => {
            let mut status = match ErrorCode::parse(&e.code) {
                Some(code) => code.status(e.message),
                None => tonic::Status::new(tonic::Code::from(e.grpc_code), e.message),
            };
            if e.draining {
                status.metadata_mut().insert(
                    weir_shared::error_code::DRAINING_KEY,
                    tonic::metadata::MetadataValue::from_static("true"),
                );
            }
            Err(status)
        }
        None => Err(tonic::Status::internal("append stream reply without a result")),
    };
    let _ = to.send(result);
}

impl OrderedAppend {
    /// The append's outcome. A refusal that allows it is sent again after this caller's
    /// previous append to the stream has finished: on a lane if the owner has one,
    /// else the unary way, which follows the stream to its next owner. `idempotent`:
    /// sending it twice is harmless (its owner deduplicates it).
    pub async fn finish(self, routes: &Routes, idempotent: bool) -> Result<AppendReply, RouteError> {
        let refused = match self.sent {
            Ok((owner, reply)) => match await_reply(routes, &self.stream, &owner, reply, idempotent).await {
                Ok(ok) => return Ok(ok),
                Err(status) => retry_or_fail(status, idempotent)?,
            },
            Err(e @ (RouteError::NoOwner { .. } | RouteError::CatchingUp)) => e,
            Err(e) => return Err(e),
        };
        *lock(&self.place) = Place::Detoured;
        tracing::debug!(stream = %self.stream, reason = %refused, "append sent again");
        if let Some(previous) = self.previous {
            previous.wait().await;
        }
        // Nothing of this caller to the stream is ahead of it now: a lane is safe again.
        let again = lock(&self.appends.0).send_on_lane(
            routes,
            &self.stream,
            self.batches.clone(),
            self.transactional_id.clone(),
            None,
            &self.place,
        );
        if let Ok((owner, reply)) = again {
            match await_reply(routes, &self.stream, &owner, reply, idempotent).await {
                Ok(ok) => return Ok(ok),
                Err(status) => {
                    retry_or_fail(status, idempotent)?;
                    *lock(&self.place) = Place::Detoured;
                }
            }
        }
        let (stream, batches, transactional_id) = (self.stream, self.batches, self.transactional_id);
        routes
            .call(&stream, idempotent, |mut c| {
                let req = AppendRequest {
                    stream: stream.clone(),
                    batches: batches.clone(),
                    match_next_offset: None,
                    transactional_id: transactional_id.clone(),
                };
                async move { c.append(req).await }
            })
            .await
    }
}

/// A lane's reply, as [`Routes::call`] waits for a unary one: it ends early when
/// [`Routes::owner_left`] says so, or when the owner outlasts the node timeout; the
/// append's outcome is then unknown unless it is `idempotent`.
async fn await_reply(
    routes: &Routes,
    stream: &str,
    owner: &Incarnation,
    reply: oneshot::Receiver<Reply>,
    idempotent: bool,
) -> Reply {
    let reply = tokio::select! {
        r = tokio::time::timeout(routes.call_deadline(), reply) => match r {
            Ok(r) => r.unwrap_or_else(|_| Err(tonic::Status::unavailable("the append stream was dropped"))),
            Err(_) => Err(tonic::Status::deadline_exceeded(format!("owner {owner} did not answer within the node timeout"))),
        },
        _ = routes.owner_left(stream, owner, idempotent) => {
            return Err(tonic::Status::cancelled(format!("owner {owner} was replaced while the append was in flight")))
        }
    };
    // OBS-15: a lane's refusals and failures count as a unary call's do (an owner that
    // left is counted when the unary retry that follows finds it gone).
    if let Err(status) = &reply {
        routes.count_failure(owner, status);
    }
    reply
}
