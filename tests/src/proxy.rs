//! A fault-injecting TCP proxy for one link: it forwards connections to a target and
//! can cut the link (drop every connection and refuse new ones), blackhole it (accept
//! and forward nothing), delay it (every chunk, or each request once: an object store's
//! latency), answer every HTTP request itself with S3's `503 SlowDown`, or heal it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Pass = 0,
    /// Existing connections are closed; new ones are closed at once.
    Cut = 1,
    /// Connections stay open but nothing is forwarded either way.
    Blackhole = 2,
    /// Requests reach the target, and its replies are dropped: a request that landed
    /// whose answer was lost.
    DropReplies = 3,
    /// Existing connections are closed; every HTTP request on a new one is answered
    /// by the proxy with S3's `503 SlowDown`, reaching nothing (issue 60).
    SlowDown = 4,
}

struct Shared {
    mode: AtomicU8,
    delay_ms: AtomicU64,
    /// Each request's delay, drawn between these (inclusive, ms; 0 and 0 for none).
    request_delay_ms: (AtomicU64, AtomicU64),
    /// Connections accepted so far.
    accepted: AtomicU64,
    /// Requests answered `503 SlowDown`.
    slowed_down: AtomicU64,
    /// Bumped on every cut, so live connections notice and close.
    generation: watch::Sender<u64>,
}

/// A proxy listening on `addr`, forwarding to `target`.
pub struct Proxy {
    pub addr: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", crate::free_port()))
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr").to_string();
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Mode::Pass as u8),
            delay_ms: AtomicU64::new(0),
            request_delay_ms: (AtomicU64::new(0), AtomicU64::new(0)),
            accepted: AtomicU64::new(0),
            slowed_down: AtomicU64::new(0),
            generation: watch::channel(0).0,
        });
        let target = target.to_string();
        let task = tokio::spawn({
            let shared = shared.clone();
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        return;
                    };
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    let (shared, target) = (shared.clone(), target.clone());
                    tokio::spawn(async move { serve(client, &target, shared).await });
                }
            }
        });
        Proxy { addr, shared, task }
    }

    pub fn set(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
        if matches!(mode, Mode::Cut | Mode::SlowDown) {
            self.shared.generation.send_modify(|g| *g += 1);
        }
    }

    /// Adds `delay` to every forwarded chunk.
    pub fn delay(&self, delay: Duration) {
        self.shared.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Delays each request (the first bytes a client sends after a reply, or on a new
    /// connection) by a time drawn between `min` and `max`, once: an object store's
    /// latency, which a per-chunk delay would multiply over a large body.
    pub fn delay_requests(&self, min: Duration, max: Duration) {
        assert!(min <= max, "delay_requests: {min:?} > {max:?}");
        self.shared
            .request_delay_ms
            .0
            .store(min.as_millis() as u64, Ordering::SeqCst);
        self.shared
            .request_delay_ms
            .1
            .store(max.as_millis() as u64, Ordering::SeqCst);
    }

    /// Requests the proxy answered `503 SlowDown` so far.
    pub fn slowed_down(&self) -> u64 {
        self.shared.slowed_down.load(Ordering::SeqCst)
    }

    /// Connections accepted so far: a client whose request timed out retries on a new one.
    pub fn connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    fn mode(shared: &Shared) -> u8 {
        shared.mode.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(client: TcpStream, target: &str, shared: Arc<Shared>) {
    if Proxy::mode(&shared) == Mode::Cut as u8 {
        return;
    }
    if Proxy::mode(&shared) == Mode::SlowDown as u8 {
        return slow_down(client, &shared).await;
    }
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut cut = shared.generation.subscribe();
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // A request starts with the first bytes the client sends after a reply.
    let new_request = Arc::new(AtomicBool::new(true));
    tokio::select! {
        _ = pipe(cr, sw, shared.clone(), false, new_request.clone()) => {}
        _ = pipe(sr, cw, shared.clone(), true, new_request) => {}
        _ = cut.changed() => {}
    }
}

/// Forwards `from` to `to`; `replies` is the direction from the target back.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: Arc<Shared>,
    replies: bool,
    new_request: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            match Proxy::mode(&shared) {
                m if m == Mode::Cut as u8 => return,
                // Hold the bytes until the link heals (or is cut).
                m if m == Mode::Blackhole as u8 => tokio::time::sleep(Duration::from_millis(20)).await,
                _ => break,
            }
        }
        if replies && Proxy::mode(&shared) == Mode::DropReplies as u8 {
            continue;
        }
        let delay = shared.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if replies {
            new_request.store(true, Ordering::SeqCst);
        } else if new_request.swap(false, Ordering::SeqCst) {
            let (min, max) = (
                shared.request_delay_ms.0.load(Ordering::SeqCst),
                shared.request_delay_ms.1.load(Ordering::SeqCst),
            );
            if max > 0 {
                tokio::time::sleep(Duration::from_millis(rand::random_range(min..=max))).await;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Answers the HTTP request on `client` with S3's `503 SlowDown`, read whole first
/// (head and `Content-Length` body) so the client reads the answer, and closes it.
async fn slow_down(mut client: TcpStream, shared: &Shared) {
    const BODY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    let head_end = loop {
        if let Some(i) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&pending[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while pending.len() < head_end + length {
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
    shared.slowed_down.fetch_add(1, Ordering::SeqCst);
    // The answer closes its connection: the mode is chosen when a connection is
    // accepted, so a kept-alive connection would answer SlowDown after the store
    // healed, for as long as the client's pool reused it.
    let answer = format!(
        "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = client.write_all(answer.as_bytes()).await;
    let _ = client.shutdown().await;
}
