//! HTTP requests in flight, and those whose bodies are still arriving: stop admission
//! cancels the latter, unadmitted (SD-INT-4), and counts them (SD-INT-12).

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// One HTTP request in `weir_gatewayd_http_requests_in_flight`, however it ends:
/// answered, or dropped with its connection at a stop.
pub struct InFlight;

impl InFlight {
    pub fn new() -> Self {
        crate::metrics::metrics().http_in_flight.inc();
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        crate::metrics::metrics().http_in_flight.dec();
    }
}

/// Why a body still arriving at stop admission failed; a rejection carrying it is
/// answered as a shutdown refusal (503), not a bad request.
pub const BODY_CUT_AT_STOP: &str = "the gateway is stopping; the request body was not received whole";

/// Counts `req` in `weir_gatewayd_http_requests_receiving` until its body has arrived
/// whole (or is dropped); a request without a body is never counted. Once `stopping`
/// (stop admission) its body fails if it is still arriving, so the request ends there,
/// never admitted, rather than holding the stop while its client trickles.
pub fn track_body(req: Request, stopping: &CancellationToken) -> Request {
    if req.body().is_end_stream() {
        return req;
    }
    crate::metrics::metrics().http_receiving.inc();
    let stop = Box::pin(stopping.clone().cancelled_owned());
    req.map(|body| {
        Body::new(Receiving {
            body,
            counted: true,
            stop,
        })
    })
}

/// A request body that leaves the receiving gauge when its last frame arrives.
struct Receiving {
    body: Body,
    counted: bool,
    stop: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Receiving {
    fn done(&mut self) {
        if std::mem::take(&mut self.counted) {
            crate::metrics::metrics().http_receiving.dec();
        }
    }
}

impl HttpBody for Receiving {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.counted && self.stop.as_mut().poll(cx).is_ready() {
            // SD-INT-4: cancelled at stop admission, whatever its progress; counted as
            // dropped (SD-INT-12), and the request fails before any handler runs.
            self.done();
            crate::metrics::metrics()
                .requests_dropped
                .with_label_values(&["http"])
                .inc();
            return Poll::Ready(Some(Err(axum::Error::new(BODY_CUT_AT_STOP))));
        }
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) || self.body.is_end_stream() {
            self.done();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.done();
    }
}
