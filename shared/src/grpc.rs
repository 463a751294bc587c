//! gRPC channels between Weir's services, built one way everywhere: lazy connection,
//! bounded connect time, TCP_NODELAY and HTTP/2 keep-alives that notice a dead peer.

use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Builds a lazily connecting channel to `addr` (`host:port`).
pub fn channel(addr: &str) -> Result<Channel, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_lazy())
}

/// Largest message of metad's client and admin APIs, both ways, set explicitly on every
/// stub and service. Nothing sent grows with the cluster's age: a watch frame is one
/// applied entry's delta or a snapshot chunk of at most 1 MiB, an index page at most
/// 1,000 ranges and an admin reply at most 4 MiB; the headroom is for one proposal that
/// commits a range of every stream a busy node owns.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// Most calls one gRPC connection carries at once (watch streams included).
pub const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// A gRPC server builder with the listener limits (issue 19): HTTP/2 pings at half the
/// idle timeout keep a live peer's connection from counting as idle, a peer that does
/// not answer them within 20 s is dropped, and one connection carries at most
/// [`MAX_CONCURRENT_STREAMS`] calls at once. Serve it with
/// [`grpc_incoming`](crate::listener::grpc_incoming) for the connection limits.
pub fn server(limits: &crate::listener::Limits) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(
            (limits.idle_timeout / 2).clamp(Duration::from_secs(1), Duration::from_secs(60)),
        ))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
}
