//! The gRPC calls this process has open to its peers, counted from request to the end
//! of the response body, so terminal teardown can give them their own transport drain
//! before the process ends and its connections close (SD-DL-8, SD-TD-7): a call a
//! phase budget stopped waiting for still gets its answer, bounded by 10 s and the
//! deadline, instead of being cut off with the runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Notify;
use tonic::body::Body;

/// SD-DL-8: how long calls still open to peers get at the end of terminal teardown.
pub const TRANSPORT_DRAIN: Duration = Duration::from_secs(10);

static OPEN: AtomicUsize = AtomicUsize::new(0);
static ENDED: Notify = Notify::const_new();

/// Calls open to peers now.
pub fn open() -> usize {
    OPEN.load(Ordering::Acquire)
}

/// Returns once no call is open to a peer.
pub async fn all_ended() {
    loop {
        // Registered before the check, so an end between the two is not missed.
        let ended = ENDED.notified();
        if open() == 0 {
            return;
        }
        ended.await;
    }
}

/// One open call; it ends when dropped.
#[derive(Debug)]
pub struct Call;

impl Call {
    fn start() -> Self {
        OPEN.fetch_add(1, Ordering::AcqRel);
        Call
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if OPEN.fetch_sub(1, Ordering::AcqRel) == 1 {
            ENDED.notify_waiters();
        }
    }
}

/// A tonic channel whose calls are counted; every client of Weir's services uses it.
/// It reaches its peer over the network, or calls a service of this process directly
/// ([`crate::in_process`]).
#[derive(Clone, Debug)]
pub struct Channel {
    inner: Route,
}

#[derive(Clone, Debug)]
enum Route {
    /// With the address, when the peer may yet turn out to be served in this process
    /// (it registers after it is known: a gateway may route to it before then).
    Network(tonic::transport::Channel, Option<std::sync::Arc<str>>),
    InProcess(crate::in_process::Local),
}

impl From<tonic::transport::Channel> for Channel {
    fn from(inner: tonic::transport::Channel) -> Self {
        Self {
            inner: Route::Network(inner, None),
        }
    }
}

impl From<crate::in_process::Local> for Channel {
    fn from(local: crate::in_process::Local) -> Self {
        Self {
            inner: Route::InProcess(local),
        }
    }
}

impl Channel {
    /// A channel over the network to `addr` that moves in process once a service of
    /// this process serves `addr`.
    pub(crate) fn network(channel: tonic::transport::Channel, addr: &str) -> Self {
        let addr = crate::in_process::is_enabled().then(|| addr.into());
        Self {
            inner: Route::Network(channel, addr),
        }
    }

    /// Whether calls on this channel stay in this process.
    pub fn is_in_process(&self) -> bool {
        matches!(self.inner, Route::InProcess(_))
    }
}

impl tower_service::Service<http::Request<Body>> for Channel {
    type Response = http::Response<CountedBody>;
    type Error = tonic::transport::Error;
    type Future = CountedCall;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let Route::Network(_, Some(addr)) = &self.inner {
            if let Some(local) = crate::in_process::lookup(addr) {
                self.inner = Route::InProcess(local);
            }
        }
        match &mut self.inner {
            Route::Network(channel, _) => tower_service::Service::poll_ready(channel, cx),
            Route::InProcess(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let call = Call::start();
        let inner = match &mut self.inner {
            Route::Network(channel, _) => Head::Network(tower_service::Service::call(channel, request)),
            Route::InProcess(local) => Head::InProcess(local.call(request)),
        };
        CountedCall {
            inner,
            call: Some(call),
        }
    }
}

/// A call waiting for its response head; the count passes on to the body.
pub struct CountedCall {
    inner: Head,
    call: Option<Call>,
}

enum Head {
    Network(tonic::transport::channel::ResponseFuture),
    InProcess(futures::future::BoxFuture<'static, http::Response<Body>>),
}

impl Future for CountedCall {
    type Output = Result<http::Response<CountedBody>, tonic::transport::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let head = match &mut self.inner {
            Head::Network(f) => std::task::ready!(Pin::new(f).poll(cx)),
            Head::InProcess(f) => Ok(std::task::ready!(f.as_mut().poll(cx))),
        };
        let call = self.call.take();
        Poll::Ready(head.map(|response| response.map(|inner| crate::held_body::HeldBody::new(inner, call))))
    }
}

/// A response body that holds its call open until it is read to its end or dropped.
pub type CountedBody = crate::held_body::HeldBody<Option<Call>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// SD-DL-8: the wait ends once the last open call ends, not before.
    #[tokio::test]
    async fn the_wait_ends_with_the_last_open_call() {
        let call = Call::start();
        assert_eq!(open(), 1);
        let early = tokio::time::timeout(Duration::from_millis(50), all_ended()).await;
        // SD-DL-8: the transport drain does not end while a call to a peer is still open.
        assert!(early.is_err(), "still open");
        let started = std::time::Instant::now();
        let ends = async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(call);
        };
        tokio::join!(all_ended(), ends);
        assert_eq!(open(), 0);
        // SD-DL-8: it runs until that call has its answer, and ends then.
        assert!(started.elapsed() >= Duration::from_millis(100), "ended by the call");
    }
}
