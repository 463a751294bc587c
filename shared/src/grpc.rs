//! gRPC channels between Weir's services, built one way everywhere: lazy connection,
//! bounded connect time, TCP_NODELAY and HTTP/2 keep-alives that notice a dead peer.

use std::time::Duration;
use tonic::transport::{ClientTlsConfig, Endpoint};

/// The channel every client of Weir's services uses: its calls are counted for the
/// transport drain at teardown ([`crate::outgoing_calls`]).
pub use crate::outgoing_calls::Channel;

/// Builds a lazily connecting channel to `addr` (`host:port`), with this process's
/// cluster mTLS when installed ([`crate::cluster_tls`]).
pub fn channel(addr: &str) -> Result<Channel, tonic::transport::Error> {
    channel_with(addr, crate::cluster_tls::installed().map(|t| t.client()))
}

/// As [`channel`], with `tls` (`https`, the server checked against the cluster's CA by
/// the host of `addr`, and the client's certificate if it has one) or plaintext without.
/// A service this process serves at `addr` is called in process ([`crate::in_process`]).
pub fn channel_with(addr: &str, tls: Option<ClientTlsConfig>) -> Result<Channel, tonic::transport::Error> {
    if let Some(local) = crate::in_process::lookup(addr) {
        return Ok(local.into());
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        // Calls are cancelled by design (a long poll ends when another partition has
        // data). HTTP/2 remembers only 10 reset streams by default, and a late frame of
        // a forgotten one counts toward the 1,024 errors after which the connection is
        // closed with GOAWAY(ENHANCE_YOUR_CALM), failing every call on it. Remember as
        // many as may be open at once, and do not count the rest against a peer of our
        // own cluster.
        .http2_max_concurrent_reset_streams(MAX_CONCURRENT_STREAMS as usize)
        .http2_max_local_error_reset_streams(None);
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls)?;
    }
    Ok(Channel::network(endpoint.connect_lazy(), addr))
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
/// [`grpc_incoming`](crate::listener::grpc_incoming) for the connection limits. With
/// cluster mTLS installed, every connection's handshake asks for a client certificate
/// the cluster's CA signed.
pub fn server(limits: &crate::listener::Limits) -> Result<tonic::transport::Server, tonic::transport::Error> {
    server_with(limits, false)
}

/// As [`server`]; with `certless_callers`, a TLS caller may come without a certificate
/// and every service must authenticate its calls another way ([`crate::peer::caller`]
/// refuses such a caller unless an interceptor named it).
pub fn server_with(
    limits: &crate::listener::Limits,
    certless_callers: bool,
) -> Result<tonic::transport::Server, tonic::transport::Error> {
    let builder = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(
            (limits.idle_timeout / 2).clamp(Duration::from_secs(1), Duration::from_secs(60)),
        ))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS));
    match crate::cluster_tls::installed() {
        Some(tls) => builder.tls_config(tls.server(limits.header_read_timeout, certless_callers)),
        None => Ok(builder),
    }
}
