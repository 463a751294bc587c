//! Limits every listener enforces (issue 19): connections per listener and per peer
//! address, an idle timeout, and a deadline for a request's head. A peer that opens
//! thousands of connections, or opens one and trickles bytes into it, costs a bounded
//! amount and never holds a slot forever. Refusals and timeouts are counted in
//! `weir_listener_connections_refused_total` and `weir_listener_connections_closed_total`.
//! Once its service stops, a listener may also end connections whose client reads
//! nothing (SD-INT-3), so a stop never waits on a full TCP window.

use prometheus::{IntCounterVec, IntGaugeVec, Opts};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// The connection limits of a service's listeners (each listener counts its own).
#[derive(clap::Args, Clone, Debug)]
pub struct ListenerArgs {
    /// Most open connections on each listener; one more is accepted and closed at once.
    #[arg(long, env = "WEIR_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,

    /// Most open connections from one peer address on each listener (Kafka's
    /// `max.connections.per.ip`), so one client cannot take every slot.
    #[arg(long, env = "WEIR_MAX_CONNECTIONS_PER_IP", default_value_t = 1_000)]
    pub max_connections_per_ip: usize,

    /// Close a connection that moved no byte either way for this long (Kafka's
    /// `connections.max.idle.ms`, 10 minutes).
    #[arg(long, env = "WEIR_IDLE_TIMEOUT_SEC", default_value_t = 600)]
    pub idle_timeout_sec: u64,

    /// A request's head (HTTP request headers, a whole Kafka request frame, the HTTP/2
    /// connection preface) must arrive within this many seconds of its first byte, or of
    /// the connection's opening; a slow sender is disconnected.
    #[arg(long, env = "WEIR_HEADER_READ_TIMEOUT_SEC", default_value_t = 30)]
    pub header_read_timeout_sec: u64,
}

impl Default for ListenerArgs {
    /// The flags' defaults.
    fn default() -> Self {
        let d = Limits::default();
        ListenerArgs {
            max_connections: d.max_connections,
            max_connections_per_ip: d.max_connections_per_ip,
            idle_timeout_sec: d.idle_timeout.as_secs(),
            header_read_timeout_sec: d.header_read_timeout.as_secs(),
        }
    }
}

impl ListenerArgs {
    /// The limits, checked; the error names the flag.
    pub fn limits(&self) -> Result<Limits, crate::config::ConfigError> {
        use crate::config::ConfigError;
        if self.max_connections == 0 {
            return Err(ConfigError::new("--max-connections must be at least 1"));
        }
        if self.max_connections_per_ip == 0 {
            return Err(ConfigError::new("--max-connections-per-ip must be at least 1"));
        }
        if self.idle_timeout_sec == 0 {
            return Err(ConfigError::new("--idle-timeout-sec must be at least 1"));
        }
        if self.header_read_timeout_sec == 0 {
            return Err(ConfigError::new("--header-read-timeout-sec must be at least 1"));
        }
        Ok(Limits {
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            idle_timeout: Duration::from_secs(self.idle_timeout_sec),
            header_read_timeout: Duration::from_secs(self.header_read_timeout_sec),
        })
    }
}

/// Checked [`ListenerArgs`].
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub idle_timeout: Duration,
    pub header_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            max_connections_per_ip: 1_000,
            idle_timeout: Duration::from_secs(600),
            header_read_timeout: Duration::from_secs(30),
        }
    }
}

struct Metrics {
    open: IntGaugeVec,
    refused: IntCounterVec,
    closed: IntCounterVec,
}

fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| Metrics {
        open: crate::metrics::register(
            IntGaugeVec::new(
                Opts::new("listener_connections_open", "Open connections per listener."),
                &["listener"],
            )
            .expect("static metric"),
        ),
        refused: crate::metrics::register(
            IntCounterVec::new(
                Opts::new(
                    "listener_connections_refused_total",
                    "Connections closed at accept: reason max_connections or max_connections_per_ip.",
                ),
                &["listener", "reason"],
            )
            .expect("static metric"),
        ),
        closed: crate::metrics::register(
            IntCounterVec::new(
                Opts::new(
                    "listener_connections_closed_total",
                    "Connections closed by a limit or a failed start: reason idle_timeout, header_read_timeout, stalled_at_stop or tls_handshake.",
                ),
                &["listener", "reason"],
            )
            .expect("static metric"),
        ),
    })
}

/// Connections open now on the listener named `listener`.
pub fn open_connections(listener: &str) -> i64 {
    metrics().open.with_label_values(&[listener]).get()
}

/// Counts a connection refused by a limit its service applies after accepting it (a
/// Kafka principal's share).
pub fn count_refused(listener: &str, reason: &str) {
    metrics().refused.with_label_values(&[listener, reason]).inc();
}

/// Counts a connection closed by its service for `reason` (`tls_handshake`).
pub fn count_closed(listener: &str, reason: &str) {
    metrics().closed.with_label_values(&[listener, reason]).inc();
}

/// Counts a connection closed because its request head did not arrive in time.
pub fn count_header_timeout(listener: &str) {
    metrics()
        .closed
        .with_label_values(&[listener, "header_read_timeout"])
        .inc();
}

/// Open connections, in all and per peer address.
#[derive(Default)]
struct Counts {
    all: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// How long, once the service stops, a write may make no progress before the
/// connection fails (SD-INT-3). A client that reads, even over a slow link, frees
/// window within a round trip; one whose window stays full is not reading.
pub const STALLED_AT_STOP: Duration = Duration::from_millis(250);

/// A TCP listener that accepts only connections within its [`Limits`].
pub struct Listener {
    inner: TcpListener,
    name: &'static str,
    limits: Limits,
    counts: Arc<Mutex<Counts>>,
    stopping: Option<tokio_util::sync::CancellationToken>,
}

impl Listener {
    /// `name` labels the metrics (`kafka`, `http`, `grpc`).
    pub fn new(inner: TcpListener, name: &'static str, limits: Limits) -> Self {
        Listener {
            inner,
            name,
            limits,
            counts: Default::default(),
            stopping: None,
        }
    }

    /// SD-INT-3: once `stopping` is cancelled, a connection whose write makes no
    /// progress for [`STALLED_AT_STOP`] fails it, so the service's stop never waits for
    /// a client to read.
    pub fn ending_stalled_writes(mut self, stopping: tokio_util::sync::CancellationToken) -> Self {
        self.stopping = Some(stopping);
        self
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The next connection within the limits. One over a limit is closed at once and
    /// counted; accept errors (out of file descriptors) are logged and retried after a
    /// pause, as a listener must not spin or die on them.
    pub async fn accept(&self) -> (Guarded, SocketAddr) {
        loop {
            let (socket, peer) = match self.inner.accept().await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(listener = self.name, error = %e, "accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match self.admit(peer.ip()) {
                Ok(()) => {
                    let _ = socket.set_nodelay(true);
                    metrics().open.with_label_values(&[self.name]).inc();
                    return (
                        Guarded {
                            io: socket,
                            slot: Slot {
                                counts: self.counts.clone(),
                                ip: peer.ip(),
                                name: self.name,
                            },
                            idle: self.limits.idle_timeout,
                            last: Instant::now(),
                            timer: Box::pin(tokio::time::sleep(self.limits.idle_timeout)),
                            head: None,
                            stall: self.stopping.clone().map(StallAtStop::new),
                        },
                        peer,
                    );
                }
                Err(reason) => {
                    metrics().refused.with_label_values(&[self.name, reason]).inc();
                    tracing::debug!(listener = self.name, %peer, reason, "connection refused");
                    drop(socket);
                }
            }
        }
    }

    fn admit(&self, ip: IpAddr) -> Result<(), &'static str> {
        let mut c = self.counts.lock().expect("listener counts");
        if c.all >= self.limits.max_connections {
            return Err("max_connections");
        }
        let mine = c.per_ip.entry(ip).or_default();
        if *mine >= self.limits.max_connections_per_ip {
            return Err("max_connections_per_ip");
        }
        *mine += 1;
        c.all += 1;
        Ok(())
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }
}

/// A connection's place in its listener's counts, given back when it closes.
struct Slot {
    counts: Arc<Mutex<Counts>>,
    ip: IpAddr,
    name: &'static str,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().expect("listener counts");
        c.all -= 1;
        if let Some(n) = c.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.per_ip.remove(&self.ip);
            }
        }
        metrics().open.with_label_values(&[self.name]).dec();
    }
}

/// An accepted connection: fails with `TimedOut` once no byte moved either way for the
/// idle timeout, or, when [`Guarded::require_head`] was called, once the first bytes
/// did not arrive by their deadline.
pub struct Guarded {
    io: TcpStream,
    slot: Slot,
    idle: Duration,
    /// When a byte last moved; the timer is pushed back lazily when it fires.
    last: Instant,
    timer: Pin<Box<Sleep>>,
    /// Bytes still to arrive before the deadline (the HTTP/2 preface).
    head: Option<(usize, Instant)>,
    /// Set when the listener ends stalled writes at its service's stop.
    stall: Option<StallAtStop>,
}

/// When a connection's writes last moved, and whether its service has stopped. Polled
/// only by writes, with a timer of its own, so a pending read cannot take its wake-up.
struct StallAtStop {
    stopping: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    last_written: Instant,
    /// Set once the stop is seen: the stall's deadline. Most connections never get one.
    timer: Option<Pin<Box<Sleep>>>,
}

impl StallAtStop {
    fn new(stopping: tokio_util::sync::CancellationToken) -> Self {
        StallAtStop {
            stopping: Box::pin(stopping.cancelled_owned()),
            last_written: Instant::now(),
            timer: None,
        }
    }

    /// Ready with the error once a write stalled for [`STALLED_AT_STOP`] after the
    /// stop; pending otherwise, woken by the stop or the stall's end.
    fn poll_stalled(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let timer = match &mut self.timer {
            Some(timer) => timer,
            None => {
                ready!(self.stopping.as_mut().poll(cx));
                let stopped_at = Instant::now();
                self.last_written = self.last_written.max(stopped_at);
                self.timer
                    .insert(Box::pin(tokio::time::sleep_until(stopped_at + STALLED_AT_STOP)))
            }
        };
        let deadline = self.last_written + STALLED_AT_STOP;
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        timer.as_mut().poll(cx)
    }
}

impl Guarded {
    /// The first `bytes` must arrive within `within` of now.
    pub fn require_head(&mut self, bytes: usize, within: Duration) {
        self.head = Some((bytes, Instant::now() + within));
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io.peer_addr()
    }

    /// Ready with the error once a limit has passed; pending (timer armed) otherwise.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            let (deadline, reason) = match self.head {
                Some((_, head)) if head < self.last + self.idle => (head, "header_read_timeout"),
                _ => (self.last + self.idle, "idle_timeout"),
            };
            if self.timer.deadline() != deadline {
                self.timer.as_mut().reset(deadline);
            }
            ready!(self.timer.as_mut().poll(cx));
            if Instant::now() >= deadline {
                metrics().closed.with_label_values(&[self.slot.name, reason]).inc();
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connection closed: {reason} passed"),
                ));
            }
        }
    }

    /// A pending write: fails once stalled at the stop, else as [`Self::poll_expired`].
    fn poll_write_expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if let Some(stall) = self.stall.as_mut() {
            if stall.poll_stalled(cx).is_ready() {
                metrics()
                    .closed
                    .with_label_values(&[self.slot.name, "stalled_at_stop"])
                    .inc();
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection closed: the service is stopping and the client reads nothing",
                ));
            }
        }
        self.poll_expired(cx)
    }

    fn written(&mut self) {
        self.last = Instant::now();
        if let Some(stall) = self.stall.as_mut() {
            stall.last_written = self.last;
        }
    }

    fn moved(&mut self, read: usize) {
        self.last = Instant::now();
        if let Some((left, at)) = self.head {
            self.head = (read < left).then(|| (left - read, at));
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                if n > 0 {
                    this.moved(n);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_expired(cx).map(Err),
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                this.written();
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            // A peer that reads nothing we write is as idle as one that sends nothing.
            Poll::Pending => this.poll_write_expired(cx).map(Err),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(n)) => {
                this.written();
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_write_expired(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Guarded {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The accepted connections of `listener` as a stream, for tonic's
/// `serve_with_incoming`: each must deliver the HTTP/2 preface within the header-read
/// timeout.
pub fn grpc_incoming(listener: Listener) -> impl futures::Stream<Item = io::Result<Guarded>> {
    let head = listener.limits.header_read_timeout;
    futures::stream::unfold(listener, move |listener| async move {
        let (mut io, _) = listener.accept().await;
        // "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n": 24 bytes every HTTP/2 client sends first.
        io.require_head(24, head);
        Some((Ok(io), listener))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn listener(limits: Limits) -> (Listener, SocketAddr) {
        let inner = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = inner.local_addr().expect("addr");
        (Listener::new(inner, "test", limits), addr)
    }

    // Issue 19: a trickled head is cut at its deadline even though bytes keep coming.
    #[tokio::test]
    async fn a_trickled_head_is_cut_at_its_deadline() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(500),
            ..Limits::default()
        };
        let (l, addr) = listener(limits).await;
        let mut incoming = Box::pin(grpc_incoming(l));
        let client = tokio_util::task::TaskTracker::new().spawn(async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            for _ in 0..20 {
                if s.write_all(b"P").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut io = incoming.next().await.expect("a connection").expect("accepted");
        let started = Instant::now();
        let mut buf = [0u8; 64];
        let err = loop {
            match io.read(&mut buf).await {
                Ok(0) => panic!("closed by the client"),
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
        client.abort();
    }

    // SD-INT-3: a client that reads nothing holds a write pending; once the service
    // stops, that write fails within the stall bound instead of waiting on the client.
    #[tokio::test]
    async fn a_write_the_client_never_reads_fails_soon_after_the_stop() {
        let (l, addr) = listener(Limits::default()).await;
        let stopping = tokio_util::sync::CancellationToken::new();
        let l = l.ending_stalled_writes(stopping.clone());
        let client = TcpStream::connect(addr).await.expect("connect");
        let (mut io, _) = l.accept().await;
        // Fill the client's window and the socket buffers: the next write waits.
        let chunk = vec![7u8; 64 << 10];
        while let Ok(written) = tokio::time::timeout(Duration::from_millis(200), io.write_all(&chunk)).await {
            written.expect("a write before the stop");
        }
        // Before the stop a stalled write just waits.
        assert!(tokio::time::timeout(Duration::from_millis(600), io.write_all(&chunk))
            .await
            .is_err());
        stopping.cancel();
        let started = Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(5), io.write_all(&chunk))
            .await
            .expect("the write ended")
            .expect_err("nothing was read");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let took = started.elapsed();
        assert!(
            took >= STALLED_AT_STOP && took < STALLED_AT_STOP + Duration::from_millis(500),
            "{took:?}"
        );
        drop(client);
    }

    // Issue 19: the listener counts connections per peer address and gives slots back.
    #[tokio::test]
    async fn connections_past_a_limit_are_closed_at_accept() {
        let limits = Limits {
            max_connections_per_ip: 2,
            ..Limits::default()
        };
        let (l, addr) = listener(limits).await;
        let l = Arc::new(l);
        let accepted = {
            let l = l.clone();
            tokio_util::task::TaskTracker::new().spawn(async move {
                let mut kept = Vec::new();
                loop {
                    let (io, _) = l.accept().await;
                    kept.push(io);
                    if kept.len() == 2 {
                        return kept;
                    }
                }
            })
        };
        let a = TcpStream::connect(addr).await.expect("connect");
        let b = TcpStream::connect(addr).await.expect("connect");
        let kept = accepted.await.expect("accept");
        // A third is accepted by the kernel, then closed by the listener.
        let mut c = TcpStream::connect(addr).await.expect("connect");
        let l2 = l.clone();
        let next = tokio_util::task::TaskTracker::new().spawn(async move { l2.accept().await });
        let mut byte = [0u8; 1];
        assert_eq!(c.read(&mut byte).await.unwrap_or(0), 0, "a third connection was kept");
        drop(kept);
        drop((a, b));
        let _d = TcpStream::connect(addr).await.expect("connect");
        tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("a slot came back")
            .expect("accept");
    }
}

#[cfg(test)]
mod h2_tests {
    use super::*;
    use futures::StreamExt;
    use tokio::io::AsyncWriteExt;

    // Issue 19: hyper's HTTP/2 server (tonic's) over a guarded connection gives up on a
    // preface trickled past the header-read timeout.
    #[tokio::test]
    async fn an_h2_server_cuts_a_trickled_preface() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(500),
            ..Limits::default()
        };
        let inner = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = inner.local_addr().expect("addr");
        let mut incoming = Box::pin(grpc_incoming(Listener::new(inner, "h2test", limits)));
        let client = tokio_util::task::TaskTracker::new().spawn(async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(b"PRI ").await.expect("w");
            for b in b"* HTTP/2.0\r\n\r\nSM\r\n\r\n" {
                if s.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let io = incoming.next().await.expect("a connection").expect("accepted");
        let started = Instant::now();
        let svc = hyper::service::service_fn(|_req| async {
            Ok::<_, std::convert::Infallible>(hyper::Response::new(String::new()))
        });
        let mut b = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        b = b.http2_only();
        let r = b.serve_connection(hyper_util::rt::TokioIo::new(io), svc).await;
        assert!(r.is_err(), "{r:?}");
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
        client.abort();
    }
}

/// RR-FEN-3: connections made while a node registers with metad are closed at once, so
/// a client tries another server or retries, rather than waiting in the accept queue
/// for as long as metad is away. Returns `until`'s output.
pub async fn close_connections_while<T>(listener: &TcpListener, until: impl std::future::Future<Output = T>) -> T {
    tokio::pin!(until);
    loop {
        tokio::select! {
            out = &mut until => return out,
            accepted = listener.accept() => if accepted.is_err() {
                // Out of descriptors, say: the error repeats at once, so do not spin.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            },
        }
    }
}
