//! A gRPC response body that holds a guard (a count of what is open) until it is read
//! to its end or dropped: the calls a process has open to its peers, and the calls
//! made to a service in process, end with their bodies.

use bytes::Bytes;
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::body::Body;

/// A response body that holds `G` (a count of what is open) until it is read to its end
/// or dropped.
pub struct HeldBody<G> {
    inner: Body,
    _held: G,
}

impl<G> HeldBody<G> {
    pub(crate) fn new(inner: Body, held: G) -> Self {
        Self { inner, _held: held }
    }
}

impl<G: Unpin> http_body::Body for HeldBody<G> {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
