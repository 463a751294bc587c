//! HTTP requests in flight, and those whose bodies are still arriving: a stop that
//! gives up on in-flight requests drops the latter unadmitted (SD-INT-12).

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use std::pin::Pin;
use std::task::{Context, Poll};

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

/// Counts `req` in `weir_gatewayd_http_requests_receiving` until its body has arrived
/// whole (or is dropped); a request without a body is never counted.
pub fn track_body(req: Request) -> Request {
    if req.body().is_end_stream() {
        return req;
    }
    crate::metrics::metrics().http_receiving.inc();
    req.map(|body| Body::new(Receiving { body, counted: true }))
}

/// A request body that leaves the receiving gauge when its last frame arrives.
struct Receiving {
    body: Body,
    counted: bool,
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
