//! Routing by ownership: every request goes to the streamd incarnation the view says
//! owns its stream, never to a fenced one (FO-FEN-6), and nothing is routed before the
//! gateway has passed the catch-up fence (RR-FEN-2). While a stream has no live owner
//! (placed but not open, moving, recovering) a call waits for the view to change, for
//! a bounded time, and then reports the stream as unavailable (FO-TKO-11, FO-TKO-12).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir_meta::model::{StreamRow, StreamState, TakeoverState};
use weir_meta::view::View;
use weir_proto::streamd::streamd_client::StreamdClient;
use weir_shared::error_code::ErrorCode;
use weir_shared::grpc::Channel;
use weir_shared::ids::Incarnation;

/// Added to the node timeout to bound one call to an owner.
const CALL_MARGIN: Duration = Duration::from_secs(2);

/// Why a request could not be routed or was refused by the owner.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("stream '{0}' does not exist")]
    NotFound(String),
    /// No live owner right now; retry shortly.
    #[error("stream '{stream}' has no live owner right now ({why}); retry shortly")]
    NoOwner { stream: String, why: String },
    /// Its owner is shutting down and no other took the stream within the route retry
    /// time: a shutdown refusal, passed on with no retry delay (SD-INT-8).
    #[error("stream '{stream}' is being moved off its owner, which is shutting down ({why}); retry now")]
    Draining { stream: String, why: String },
    #[error("the gateway is catching up with the metadata log; retry shortly")]
    CatchingUp,
    /// The owner answered with an error (carrying `x-weir-error`).
    #[error("{}", .0.message())]
    Streamd(tonic::Status),
    /// The request may or may not have been applied (the owner failed mid-request).
    #[error("outcome unknown: {0}; retry with an idempotency key to be safe")]
    Unknown(String),
    /// The stream lost acknowledged records to damage and stays closed until an
    /// operator acts (issue 20); retrying does not help.
    #[error("{0}")]
    Damaged(String),
}

/// Whether a failed call may be sent again.
enum Retry {
    /// Refused before anything was applied.
    Yes,
    /// May have been applied: retried only when that is harmless (reads, keyed appends).
    IfSafe,
    No,
}

impl RouteError {
    /// The system's code for this failure; HTTP and Kafka answers follow from it.
    pub fn code(&self) -> ErrorCode {
        match self {
            RouteError::NotFound(_) => ErrorCode::NotFound,
            RouteError::NoOwner { .. } | RouteError::Draining { .. } | RouteError::CatchingUp => ErrorCode::Unavailable,
            RouteError::Unknown(_) => ErrorCode::OutcomeUnknown,
            RouteError::Damaged(_) => ErrorCode::Corrupt,
            RouteError::Streamd(status) => ErrorCode::of_status(status).unwrap_or(match status.code() {
                // tonic refused a message over its size limit.
                tonic::Code::OutOfRange => ErrorCode::TooLarge,
                // Anything else untagged is the transport failing, such as HTTP/2's
                // GOAWAY(ENHANCE_YOUR_CALM), which tonic reports as ResourceExhausted:
                // transient, never a client's message being too large.
                _ => ErrorCode::Unavailable,
            }),
        }
    }
}

/// What to do with a call the owner refused: `Ok` with the error to retry past when it
/// may be sent again (`safe_to_retry`: sending it twice is harmless), else the error
/// to report.
pub fn retry_or_fail(status: tonic::Status, safe_to_retry: bool) -> Result<RouteError, RouteError> {
    match classify(&status) {
        Retry::Yes => Ok(RouteError::Streamd(status)),
        Retry::IfSafe if safe_to_retry => Ok(RouteError::Streamd(status)),
        Retry::IfSafe => Err(RouteError::Unknown(status.message().to_string())),
        Retry::No => Err(RouteError::Streamd(status)),
    }
}

fn classify(status: &tonic::Status) -> Retry {
    match ErrorCode::of_status(status) {
        Some(ErrorCode::NotOwner | ErrorCode::Unavailable) => Retry::Yes,
        Some(ErrorCode::Fenced) => Retry::IfSafe,
        Some(_) => Retry::No,
        // No code: the transport failed (connection refused, reset, timed out).
        None => match status.code() {
            tonic::Code::Unavailable
            | tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
            | tonic::Code::ResourceExhausted
            | tonic::Code::Unknown => Retry::IfSafe,
            _ => Retry::No,
        },
    }
}

/// Where a call goes: the stream's live owner or, for a read while its failed owner's
/// WAL is taken over, the takeover's agent, which serves what is committed (issue 60).
#[derive(Clone, Debug, PartialEq)]
enum Target {
    Owner(Incarnation),
    Recovering { agent: Incarnation, dead: Incarnation },
}

impl Target {
    fn incarnation(&self) -> &Incarnation {
        match self {
            Target::Owner(i) | Target::Recovering { agent: i, .. } => i,
        }
    }
}

/// The gateway's routing table: the view, and one client per owner incarnation.
pub struct Routes {
    view: Arc<View>,
    /// Passed the catch-up fence (RR-FEN-2): a watch, so requests can wait for it.
    admitted: tokio::sync::watch::Sender<bool>,
    clients: Mutex<HashMap<Incarnation, StreamdClient<Channel>>>,
    retry_for: Duration,
    max_message: usize,
}

impl Routes {
    pub fn new(view: Arc<View>, retry_for: Duration, max_message: usize) -> Self {
        Self {
            view,
            admitted: tokio::sync::watch::channel(false).0,
            clients: Mutex::new(HashMap::new()),
            retry_for,
            max_message,
        }
    }

    pub fn view(&self) -> &Arc<View> {
        &self.view
    }

    /// RR-FEN-2: routes, and answers from the view, only after this.
    pub fn admit(&self) {
        self.admitted.send_replace(true);
    }

    pub fn is_admitted(&self) -> bool {
        *self.admitted.borrow()
    }

    /// Waits until `deadline` for admission; whether it came.
    pub async fn wait_admitted(&self, deadline: tokio::time::Instant) -> bool {
        let mut rx = self.admitted.subscribe();
        let admitted = tokio::time::timeout_at(deadline, rx.wait_for(|a| *a)).await;
        matches!(admitted, Ok(Ok(_)))
    }

    /// The stream's row, if it exists and is not deleted.
    pub fn stream(&self, name: &str) -> Option<StreamRow> {
        self.view.with(|s| s.stream_by_name(name).cloned())
    }

    /// Whether the stream is open on a live owner right now (no routing wait).
    pub fn has_live_owner(&self, name: &str) -> bool {
        self.view.with(|s| {
            s.stream_by_name(name).is_some_and(|row| {
                row.state == StreamState::Open
                    && row
                        .owner
                        .as_ref()
                        .is_some_and(|o| s.nodes.get(&o.node).is_some_and(|n| n.epoch == o.epoch && !n.fenced))
            })
        })
    }

    /// OBS-15, SD-TD-7: a call to `owner` that its shutdown refused or reset is counted
    /// with `reason="shutdown"`; another transport failure with `reason="transport"`.
    pub(crate) fn count_failure(&self, owner: &Incarnation, status: &tonic::Status) {
        let reason = if weir_shared::error_code::is_draining(status) {
            "shutdown"
        } else if ErrorCode::of_status(status).is_some() {
            return;
        } else if self.view.with(|s| {
            s.nodes
                .get(&owner.node)
                .is_some_and(|n| n.epoch == owner.epoch && n.terminating)
        }) {
            "shutdown"
        } else {
            "transport"
        };
        crate::metrics::metrics()
            .peer_call_failures
            .with_label_values(&[reason])
            .inc();
    }

    /// The stream's live owner incarnation, and a client of it.
    pub fn owner_client(&self, name: &str) -> Result<(Incarnation, StreamdClient<Channel>), RouteError> {
        let (target, client) = self.target_client(name, false)?;
        Ok((target.incarnation().clone(), client))
    }

    /// Where a call on stream `name` goes, and a client of it: its live owner or, with
    /// `reads`, the agent recovering its failed owner.
    fn target_client(&self, name: &str, reads: bool) -> Result<(Target, StreamdClient<Channel>), RouteError> {
        if !self.is_admitted() {
            return Err(RouteError::CatchingUp);
        }
        let no_owner = |why: &str| RouteError::NoOwner {
            stream: name.to_string(),
            why: why.to_string(),
        };
        let (target, addr) = self.view.with(|s| {
            let row = s
                .stream_by_name(name)
                .ok_or_else(|| RouteError::NotFound(name.to_string()))?;
            if row.state != StreamState::Open {
                if let Some(d) = row.damage.as_ref().filter(|d| d.until > row.committed_end) {
                    return Err(RouteError::Damaged(format!(
                        "stream '{name}' lost acknowledged records {}..{} to damage ({}); it stays closed until an operator trims past it (weir streams repair --trim-past)",
                        d.from, d.until, d.what
                    )));
                }
                return Err(no_owner("it is being placed, moved or recovered"));
            }
            let owner = row.owner.clone().ok_or_else(|| no_owner("it is not placed"))?;
            let live = |inc: &Incarnation| {
                s.nodes
                    .get(&inc.node)
                    .filter(|n| n.epoch == inc.epoch && !n.fenced)
                    .map(|n| n.addrs.grpc.clone())
            };
            if let Some(addr) = live(&owner) {
                return Ok((Target::Owner(owner), addr));
            }
            // A dead owner's pending takeover: its live agent serves committed reads.
            let agent = s
                .takeovers
                .get(&(owner.node.clone(), owner.epoch))
                .filter(|t| reads && t.state == TakeoverState::Pending)
                .and_then(|t| t.agent.clone())
                .and_then(|agent| live(&agent).map(|addr| (agent, addr)));
            match agent {
                Some((agent, addr)) => Ok((Target::Recovering { agent, dead: owner }, addr)),
                None => Err(no_owner("its owner is fenced; failover is recovering it")),
            }
        })?;
        let inc = target.incarnation().clone();
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(&inc) {
            return Ok((target, c.clone()));
        }
        let channel = weir_shared::grpc::channel(&addr).map_err(|e| no_owner(&format!("owner address {addr}: {e}")))?;
        let client = StreamdClient::new(channel)
            .max_decoding_message_size(self.max_message)
            .max_encoding_message_size(self.max_message);
        // Incarnations that no longer own anything are dropped as new ones appear.
        clients.retain(|inc, _| {
            self.view
                .with(|s| s.nodes.get(&inc.node).is_some_and(|n| n.epoch == inc.epoch))
        });
        clients.insert(inc, client.clone());
        Ok((target, client))
    }

    /// Whether the view still names `owner` the stream's live owner; with
    /// `stream_moves` false, only whether that incarnation is still live (not fenced,
    /// not replaced by a newer epoch), wherever the stream went.
    fn still_serving(&self, name: &str, owner: &Incarnation, stream_moves: bool) -> bool {
        self.view.with(|s| {
            let live = s
                .nodes
                .get(&owner.node)
                .is_some_and(|n| n.epoch == owner.epoch && !n.fenced);
            live && (!stream_moves
                || s.stream_by_name(name)
                    .is_some_and(|row| row.state == StreamState::Open && row.owner.as_ref() == Some(owner)))
        })
    }

    /// Whether `agent` is live and still the agent of the pending takeover of `dead`.
    fn still_recovering(&self, agent: &Incarnation, dead: &Incarnation) -> bool {
        self.view.with(|s| {
            let live = s
                .nodes
                .get(&agent.node)
                .is_some_and(|n| n.epoch == agent.epoch && !n.fenced);
            live && s
                .takeovers
                .get(&(dead.node.clone(), dead.epoch))
                .is_some_and(|t| t.state == TakeoverState::Pending && t.agent.as_ref() == Some(agent))
        })
    }

    /// Resolves once a call in flight to `owner` should stop waiting for its answer.
    ///
    /// A call that is safe to send again (`safe_to_retry`) stops as soon as the view
    /// moves the stream away from `owner`, so it is retried on the new owner at once.
    /// Any other call stops only when `owner` itself is gone (fenced or replaced): a
    /// planned move leaves the old owner alive, and it answers what it admitted before
    /// letting the stream go, so cutting such a call short would turn a known outcome
    /// into an unknown one.
    pub async fn owner_left(&self, name: &str, owner: &Incarnation, safe_to_retry: bool) {
        self.target_left(name, &Target::Owner(owner.clone()), safe_to_retry)
            .await
    }

    /// [`Routes::owner_left`] for any target: a recovering agent is left once the
    /// takeover it serves reads for is no longer pending with it, or it is gone itself.
    async fn target_left(&self, name: &str, target: &Target, safe_to_retry: bool) {
        let mut changed = self.view.subscribe();
        while match target {
            Target::Owner(owner) => self.still_serving(name, owner, safe_to_retry),
            Target::Recovering { agent, dead } => self.still_recovering(agent, dead),
        } {
            if changed.changed().await.is_err() {
                // The view stopped: nothing will move; the call's own deadline ends it.
                std::future::pending::<()>().await;
            }
        }
    }

    /// How long one call may wait on an owner: the node timeout, after which metad
    /// would have fenced an owner that stopped answering, plus a margin.
    pub fn call_deadline(&self) -> Duration {
        let node_timeout = self.view.with(|s| s.settings.map(|c| c.node_timeout_sec)).unwrap_or(30);
        Duration::from_secs(node_timeout) + CALL_MARGIN
    }

    /// Calls the stream's owner with `f`, following ownership changes for up to the
    /// route retry time. `safe_to_retry` says whether a call that may have been applied
    /// can be sent again (reads, appends with an idempotency key).
    pub async fn call<T, F, Fut>(&self, stream: &str, safe_to_retry: bool, f: F) -> Result<T, RouteError>
    where
        F: FnMut(StreamdClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_waiting(stream, safe_to_retry, Duration::ZERO, f).await
    }

    /// [`Routes::call`] for a call that may wait up to `wait` on the owner by design (a
    /// long poll). A call ends early when the owner it went to is fenced or replaced (or,
    /// if it is safe to retry, when the stream moves away from that owner), or when it
    /// outlasts `wait` plus the node timeout; it is then retried on the new owner if that
    /// is safe, or answered "outcome unknown" (issue 20).
    pub async fn call_waiting<T, F, Fut>(
        &self,
        stream: &str,
        safe_to_retry: bool,
        wait: Duration,
        f: F,
    ) -> Result<T, RouteError>
    where
        F: FnMut(StreamdClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_routed(stream, safe_to_retry, false, wait, f).await
    }

    /// [`Routes::call_waiting`] for a read (`Read`, which is safe to retry): while the
    /// stream's owner is dead and its WAL being taken over, it goes to the takeover's
    /// agent, which serves what is committed (issue 60).
    pub async fn read_waiting<T, F, Fut>(&self, stream: &str, wait: Duration, f: F) -> Result<T, RouteError>
    where
        F: FnMut(StreamdClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_routed(stream, true, true, wait, f).await
    }

    async fn call_routed<T, F, Fut>(
        &self,
        stream: &str,
        safe_to_retry: bool,
        reads: bool,
        wait: Duration,
        mut f: F,
    ) -> Result<T, RouteError>
    where
        F: FnMut(StreamdClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut deadline = tokio::time::Instant::now() + self.retry_for;
        let mut changed = self.view.subscribe();
        loop {
            let err = match self.target_client(stream, reads) {
                Ok((target, client)) => {
                    let owner = target.incarnation().clone();
                    let outcome = tokio::select! {
                        r = tokio::time::timeout(wait + self.call_deadline(), f(client)) => r.unwrap_or_else(|_| {
                            Err(tonic::Status::deadline_exceeded(format!("owner {owner} did not answer within the node timeout")))
                        }),
                        _ = self.target_left(stream, &target, safe_to_retry) => {
                            // The route retry time counts again from the move.
                            deadline = deadline.max(tokio::time::Instant::now() + self.retry_for);
                            Err(tonic::Status::cancelled(format!("owner {owner} was replaced while the request was in flight")))
                        }
                    };
                    match outcome {
                        Ok(reply) => return Ok(reply.into_inner()),
                        Err(status) => {
                            self.count_failure(&owner, &status);
                            retry_or_fail(status, safe_to_retry)?
                        }
                    }
                }
                Err(e @ (RouteError::NoOwner { .. } | RouteError::CatchingUp)) => e,
                Err(e) => return Err(e),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(match err {
                    RouteError::Streamd(s) if weir_shared::error_code::is_draining(&s) => RouteError::Draining {
                        stream: stream.to_string(),
                        why: s.message().to_string(),
                    },
                    RouteError::Streamd(s) => RouteError::NoOwner {
                        stream: stream.to_string(),
                        why: s.message().to_string(),
                    },
                    e => e,
                });
            }
            // Ownership changes arrive through the view; a short pause covers an owner
            // that refuses before our view has caught up with the move.
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
