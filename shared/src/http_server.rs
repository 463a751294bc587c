//! Serves an axum router on a limited [`Listener`](crate::listener::Listener), with
//! hyper's header-read timeout on (axum's own `serve` sets no timer, so a client could
//! trickle request headers forever). HTTP/1.1 and HTTP/2 (prior knowledge, or ALPN
//! under TLS) both work; with a certificate every connection is HTTPS.

use crate::listener::Listener;
use crate::tls::ServerTls;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::net::SocketAddr;
use std::task::{Context, Poll};

/// Most concurrent requests on one HTTP/2 connection.
const MAX_CONCURRENT_STREAMS: u32 = 256;

/// ALPN names an HTTPS listener offers, HTTP/2 first.
pub const ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// Serves `router` until `stop` completes, then lets open requests finish (a graceful
/// shutdown of every connection) and returns. With `tls`, each connection's handshake
/// runs on its own task, bounded by the header-read timeout.
pub async fn serve(
    listener: Listener,
    router: Router,
    tls: Option<ServerTls>,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let limits = listener.limits();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // hyper also applies it while a keep-alive connection waits for its next request.
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .keep_alive_interval(limits.idle_timeout / 2);
    let graceful = GracefulShutdown::new();
    let connections = tokio_util::task::TaskTracker::new();
    tokio::pin!(stop);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut stop => break,
        };
        let (service, builder, tls, watcher) = (
            TowerToHyperService::new(WithPeer {
                router: router.clone(),
                peer,
            }),
            builder.clone(),
            tls.clone(),
            graceful.watcher(),
        );
        connections.spawn(async move {
            let io = match crate::tls::start(tls.as_ref(), io, limits.header_read_timeout, "http").await {
                Ok(io) => io,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "https connection closed before its handshake finished");
                    return;
                }
            };
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(io), service)
                .into_owned();
            if let Err(e) = watcher.watch(conn).await {
                log_closed(e);
            }
        });
    }
    // SD-CS-5: the socket closes now, so a new connection is refused rather than left
    // in the kernel's backlog until the open requests finish.
    drop(listener);
    graceful.shutdown().await;
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Answers probes on `listener` until `until` completes, then lets the answered
/// requests finish and returns `until`'s output. A node registering with metad (which
/// waits as long as metad is unreachable) is alive but not ready, and says so:
/// `/livez` 200, `/readyz` and everything else 503 with a JSON body. Without it a
/// probe would wait in the accept queue until registration ended (RR-FEN-3). It
/// serves a duplicate of the socket, so the listener stays open throughout and the
/// full server takes over its queue without refusing a connection. Requests already
/// answered get [`PROBE_HANDOVER`] to finish; a slow client cannot hold up the start.
pub async fn answer_probes_while<T>(
    listener: &tokio::net::TcpListener,
    limits: crate::listener::Limits,
    tls: Option<ServerTls>,
    node_id: &str,
    stopping: &tokio_util::sync::CancellationToken,
    until: impl Future<Output = T>,
) -> std::io::Result<T> {
    use std::os::fd::AsFd;
    let dup = std::net::TcpListener::from(listener.as_fd().try_clone_to_owned()?);
    let dup = tokio::net::TcpListener::from_std(dup)?;
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = serve(
        Listener::new(dup, "http", limits),
        registering_router(node_id, stopping.clone()),
        tls,
        stop.clone().cancelled_owned(),
    );
    let serving = async {
        tokio::pin!(serving);
        tokio::select! {
            served = &mut serving => served,
            // The connections left run on by themselves, told to close.
            _ = async {
                stop.cancelled().await;
                tokio::time::sleep(PROBE_HANDOVER).await;
            } => Ok(()),
        }
    };
    let until = async {
        let out = until.await;
        stop.cancel();
        out
    };
    let (served, out) = tokio::join!(serving, until);
    served.map(|()| out)
}

/// How long requests answered while registering may take to finish once it is done.
const PROBE_HANDOVER: std::time::Duration = std::time::Duration::from_secs(1);

/// What a registering node answers.
fn registering_router(node_id: &str, stopping: tokio_util::sync::CancellationToken) -> Router {
    use axum::http::StatusCode;
    use axum::routing::get;
    use axum::Json;
    let message = format!("node '{node_id}' is registering with metad and serves nothing yet");
    let error = serde_json::json!({"error": {"code": "unavailable", "message": message}});
    let node_id = node_id.to_string();
    // OBS-4's fields; a stop requested now is held until registration ends (SD-TRG-7).
    let ready = move || {
        serde_json::json!({
            "ready": false,
            "node_id": node_id,
            "epoch": null,
            "fenced": false,
            "terminating": stopping.is_cancelled(),
            "registering": true,
        })
    };
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/ready",
            get(move || async move { (StatusCode::SERVICE_UNAVAILABLE, Json(ready())) }),
        )
        .fallback(move || async move { (StatusCode::SERVICE_UNAVAILABLE, Json(error)) })
}

fn log_closed(e: Box<dyn std::error::Error + Send + Sync>) {
    let header_timeout = e.downcast_ref::<hyper::Error>().is_some_and(|h| h.is_timeout());
    if header_timeout {
        crate::listener::count_header_timeout("http");
    }
    tracing::debug!(error = %e, "http connection closed");
}

/// The router, with each request carrying its connection's peer address as axum's
/// `ConnectInfo` (ACLs name hosts, issue 59).
#[derive(Clone)]
struct WithPeer {
    router: Router,
    peer: SocketAddr,
}

impl<B> tower_service::Service<axum::http::Request<B>> for WithPeer
where
    Router: tower_service::Service<axum::http::Request<B>>,
{
    type Response = <Router as tower_service::Service<axum::http::Request<B>>>::Response;
    type Error = <Router as tower_service::Service<axum::http::Request<B>>>::Error;
    type Future = <Router as tower_service::Service<axum::http::Request<B>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower_service::Service::<axum::http::Request<B>>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, mut req: axum::http::Request<B>) -> Self::Future {
        req.extensions_mut().insert(axum::extract::ConnectInfo(self.peer));
        self.router.call(req)
    }
}
