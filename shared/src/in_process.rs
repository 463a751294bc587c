//! gRPC calls between services that share one process (`weir dev`, issue 62): a server
//! registers its service under the address it advertises, and a channel to that address
//! calls the service directly. The request and its reply are the same tonic messages,
//! checked by the same service code (authorization, size limits, D-22's ordering on an
//! append stream), but never framed as HTTP/2, copied through a loopback socket or woken
//! up by its reads: the hop that costs the most CPU per produced byte on one machine.
//!
//! What the network gave a call is kept:
//! - cancellation: a caller that drops its call drops the handler's future, as a reset
//!   HTTP/2 stream does;
//! - the listener's end: once the server's stop token is cancelled, new calls are
//!   refused with `UNAVAILABLE`, as a closed listener would refuse them, and the calls
//!   already open are counted on the server's tracker until their replies end, so the
//!   teardown's in-flight bound (SD-CS-5) covers them;
//! - no identity: a call carries no certificate, as on a plaintext cluster. This is why
//!   it is off unless [`enable`]d, which only `weir dev` does (it has no cluster TLS).

use crate::held_body::HeldBody;
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::body::Body;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Services served in this process, by the address each advertises.
static SERVED: LazyLock<Mutex<HashMap<String, Local>>> = LazyLock::new(Mutex::default);

/// Lets this process's services call each other in process from now on. Call it
/// before the services start; it cannot be undone.
pub fn enable() {
    ENABLED.store(true, Ordering::Release);
}

/// Whether services of this process call each other in process.
pub fn is_enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

fn served() -> std::sync::MutexGuard<'static, HashMap<String, Local>> {
    SERVED.lock().unwrap_or_else(|p| p.into_inner())
}

type Call = Arc<dyn Fn(http::Request<Body>) -> BoxFuture<'static, http::Response<Body>> + Send + Sync>;

/// A service served in this process, as a channel holds it.
#[derive(Clone)]
pub struct Local {
    addr: Arc<str>,
    call: Call,
    stop: CancellationToken,
    calls: TaskTracker,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Registers `service` as what `addr` serves in this process, until `stop` is
/// cancelled; each call is counted on `calls` until its reply ends. Does nothing
/// unless [`enable`]d.
pub fn serve<S>(addr: &str, service: S, stop: CancellationToken, calls: TaskTracker)
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    if !ENABLED.load(Ordering::Acquire) {
        return;
    }
    let call: Call = Arc::new(move |request| {
        let mut service = service.clone();
        Box::pin(async move {
            match tower_service::Service::call(&mut service, request).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        })
    });
    let local = Local {
        addr: addr.into(),
        call,
        stop,
        calls,
    };
    served().insert(addr.to_string(), local);
}

/// The service `addr` names in this process, if one serves it and has not stopped.
pub fn lookup(addr: &str) -> Option<Local> {
    if !ENABLED.load(Ordering::Acquire) {
        return None;
    }
    let mut served = served();
    match served.get(addr) {
        Some(local) if local.stop.is_cancelled() => {
            served.remove(addr);
            None
        }
        found => found.cloned(),
    }
}

impl Local {
    /// Calls the service; refused with `UNAVAILABLE` once it stopped.
    pub fn call(&self, request: http::Request<Body>) -> BoxFuture<'static, http::Response<Body>> {
        calls_total().inc();
        if self.stop.is_cancelled() {
            let refused = tonic::Status::unavailable(format!("the service at {} has stopped", self.addr));
            return Box::pin(std::future::ready(refused.into_http()));
        }
        let open = self.calls.token();
        let reply = (self.call)(request);
        // The reply body keeps the call counted on the server's tracker until it ends.
        Box::pin(async move { reply.await.map(|body| Body::new(HeldBody::new(body, open))) })
    }
}

/// `weir_in_process_calls_total`: gRPC calls this process made to a service of its own
/// without the network.
fn calls_total() -> &'static prometheus::IntCounter {
    static CALLS: std::sync::OnceLock<prometheus::IntCounter> = std::sync::OnceLock::new();
    CALLS.get_or_init(|| {
        crate::metrics::register(
            prometheus::IntCounter::new(
                "in_process_calls_total",
                "gRPC calls made to a service of this process without the network (weir dev)",
            )
            .expect("valid metric"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::channel;
    use std::task::{Context, Poll};
    use std::time::Duration;
    use tower_service::Service;

    /// Answers every call with its path; holds the answer of `/hold` until dropped,
    /// telling `dropped` when it is.
    #[derive(Clone)]
    struct Echo {
        dropped: Arc<tokio::sync::Notify>,
    }

    struct DropSignal(Arc<tokio::sync::Notify>);

    impl Drop for DropSignal {
        fn drop(&mut self) {
            self.0.notify_one();
        }
    }

    impl tower_service::Service<http::Request<Body>> for Echo {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<Body>) -> Self::Future {
            let path = request.uri().path().to_string();
            let signal = DropSignal(self.dropped.clone());
            Box::pin(async move {
                let _signal = signal;
                if path == "/hold" {
                    std::future::pending::<()>().await;
                }
                Ok(http::Response::new(Body::new(path)))
            })
        }
    }

    fn request(path: &str) -> http::Request<Body> {
        http::Request::builder().uri(path).body(Body::empty()).unwrap()
    }

    async fn body_text(response: http::Response<crate::outgoing_calls::CountedBody>) -> String {
        let mut body = std::pin::pin!(response.into_body());
        let mut text = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| http_body::Body::poll_frame(body.as_mut(), cx)).await {
            if let Ok(data) = frame.expect("frame").into_data() {
                text.extend_from_slice(&data);
            }
        }
        String::from_utf8(text).unwrap()
    }

    fn serve_echo(addr: &str) -> (CancellationToken, TaskTracker, Arc<tokio::sync::Notify>) {
        enable();
        let (stop, calls, dropped) = (CancellationToken::new(), TaskTracker::new(), Arc::default());
        let echo = Echo {
            dropped: Arc::clone(&dropped),
        };
        serve(addr, echo, stop.clone(), calls.clone());
        (stop, calls, dropped)
    }

    /// Issue 62: a channel to an address this process serves calls the service
    /// directly. Nothing listens at the address, so over the network the call would
    /// fail to connect.
    #[tokio::test]
    async fn a_channel_to_an_address_served_here_calls_the_service_without_the_network() {
        let addr = "127.0.0.1:9"; // discard: nothing listens there
        let (_stop, _calls, _) = serve_echo(addr);
        let mut ch = channel(addr).expect("channel");
        assert!(ch.is_in_process());
        let before = calls_total().get();
        std::future::poll_fn(|cx| ch.poll_ready(cx)).await.expect("ready");
        let reply = ch.call(request("/weir.Test/Echo")).await.expect("answered in process");
        assert_eq!(body_text(reply).await, "/weir.Test/Echo");
        assert!(calls_total().get() > before, "counted in weir_in_process_calls_total");
    }

    /// A channel made before the address was served moves in process once it is.
    #[tokio::test]
    async fn a_channel_made_before_the_service_registered_moves_in_process() {
        enable();
        let addr = "127.0.0.1:7";
        let mut ch = channel(addr).expect("channel");
        assert!(!ch.is_in_process(), "nothing serves it yet");
        let (_stop, _calls, _) = serve_echo(addr);
        std::future::poll_fn(|cx| ch.poll_ready(cx)).await.expect("ready");
        assert!(ch.is_in_process());
        let reply = ch.call(request("/late")).await.expect("answered in process");
        assert_eq!(body_text(reply).await, "/late");
    }

    /// Once the server stops, as a closed listener would, a new call is refused with
    /// UNAVAILABLE, and a new channel to the address goes over the network.
    #[tokio::test]
    async fn a_stopped_service_refuses_new_calls_as_unavailable() {
        let addr = "127.0.0.1:13";
        let (stop, _calls, _) = serve_echo(addr);
        let mut ch = channel(addr).expect("channel");
        stop.cancel();
        let reply = ch.call(request("/after-stop")).await.expect("a response head");
        let status = tonic::Status::from_header_map(reply.headers()).expect("a grpc-status");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(lookup(addr).is_none());
        assert!(!channel(addr).expect("channel").is_in_process());
    }

    /// A caller that drops its call drops the handler's future (a reset HTTP/2 stream),
    /// and an open call holds the server's tracker until its reply is done (SD-CS-5).
    #[tokio::test]
    async fn a_dropped_call_cancels_its_handler_and_open_calls_hold_the_tracker() {
        let addr = "127.0.0.1:17";
        let (_stop, calls, dropped) = serve_echo(addr);
        let mut ch = channel(addr).expect("channel");
        let held = ch.call(request("/hold"));
        let mut held = Box::pin(held);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut held)
                .await
                .is_err(),
            "the handler holds its answer"
        );
        calls.close();
        assert!(!calls.is_empty(), "the open call is counted");
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), dropped.notified())
            .await
            .expect("the handler was dropped with its call");
        tokio::time::timeout(Duration::from_secs(5), calls.wait())
            .await
            .expect("no call counted once it was dropped");
    }
}
