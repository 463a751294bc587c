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
