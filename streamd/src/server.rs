//! Wires one streamd incarnation together and runs it until stopped or fenced.

use crate::config::{StreamdArgs, WalBackend};
use crate::node::{reconcile_loop, upload_loop, Node, Tunables, WalSource};
use crate::service::DataPlane;
use crate::wal::{file::FileSink, object::ObjectSink, Sink, WalWriter};
use std::future::IntoFuture;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_metad::client::MetadClient;
use weir_metad::model::{NodeAddrs, NodeKind};
use weir_metad::view::{catch_up, follow, View};
use weir_proto::streamd::streamd_server::StreamdServer;
use weir_shared::ids::NodeId;
use weir_shared::shutdown::{Outcome, Phase, Shutdown};

/// How a streamd run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Stopped on request, after handing off.
    Clean,
    /// Fenced or replaced: exit 75 so a supervisor restarts it (D-5).
    Fenced,
}

/// Largest gRPC message: an append of `--max-append-bytes` plus framing.
fn max_message(args: &StreamdArgs) -> usize {
    args.max_append_bytes + 64 * 1024
}

pub async fn run(args: StreamdArgs, shutdown: Arc<Shutdown>) -> anyhow::Result<Exit> {
    let store = crate::object::store::open(&args.object_store)?;
    let metad = Arc::new(MetadClient::new(&args.metad_addrs(), Duration::from_secs(5))?);
    let grpc_listener = TcpListener::bind(args.listen).await?;
    let http_listener = TcpListener::bind(args.http_listen).await?;
    let grpc_addr = args
        .advertise
        .clone()
        .unwrap_or(grpc_listener.local_addr()?.to_string());
    let addrs = NodeAddrs {
        grpc: grpc_addr,
        http: http_listener.local_addr()?.to_string(),
    };
    let node_id = NodeId::new(args.id.clone());
    let me = weir_metad::membership::register(
        &metad,
        &node_id,
        NodeKind::Streamd,
        addrs.clone(),
        args.heartbeat,
        // SD-TRG-7: a stop request during registration is held until startup is done.
        &CancellationToken::new(),
    )
    .await?;

    let tasks = TaskTracker::new();
    let sink = match args.wal_backend {
        WalBackend::File => Sink::File(FileSink::create(
            &args.wal_root(),
            &node_id,
            me.epoch,
            args.wal_segment_bytes,
        )?),
        WalBackend::Object => Sink::Object(ObjectSink::create(store.clone(), &node_id, me.epoch)),
    };
    // Background work stops only after the hand-off, which needs the uploader, the
    // heartbeat and the view; so `stop` is not a child of `shutdown`.
    let stop = CancellationToken::new();
    let wal = WalWriter::start(sink, args.wal_max_bytes, &tasks, stop.clone());
    let view = Arc::new(View::default());
    let tunables = Tunables {
        upload_interval: Duration::from_millis(args.upload_interval_ms),
        upload_bytes: args.upload_bytes,
        reupload_after: Duration::from_secs(args.gc_delay_sec / 2),
        max_append_bytes: args.max_append_bytes,
        producer_state_bytes: args.producer_state_bytes,
        cache_bytes: args.cache_bytes,
    };
    let node = Arc::new(Node::new(
        me.clone(),
        metad.clone(),
        view.clone(),
        wal,
        store,
        tunables,
        match args.wal_backend {
            WalBackend::File => WalSource::File(args.wal_root()),
            WalBackend::Object => WalSource::Object,
        },
    ));

    tasks.spawn(follow(view.clone(), metad.clone(), stop.clone()));
    let heartbeat_interval = Duration::from_secs(args.heartbeat.heartbeat_interval_sec);
    tasks.spawn({
        let (node, stop) = (node.clone(), stop.clone());
        async move {
            let cancel = stop.child_token();
            let stopped = tokio::select! {
                r = weir_metad::membership::heartbeat_loop(&node.metad, &node.me, heartbeat_interval, &cancel) => r,
                _ = node.fenced.cancelled() => None,
            };
            if let Some(why) = stopped {
                node.fence(&why);
            }
        }
    });
    tasks.spawn(reconcile_loop(node.clone(), stop.clone()));
    tasks.spawn(upload_loop(node.clone(), stop.clone()));
    let gc_delay = Duration::from_secs(args.gc_delay_sec);
    tasks.spawn(crate::object::gc::gc_loop(
        node.store.clone(),
        view.clone(),
        gc_delay,
        (gc_delay / 4).clamp(Duration::from_secs(1), Duration::from_secs(300)),
        stop.clone(),
    ));

    let servers_stop = CancellationToken::new();
    let grpc = tonic::transport::Server::builder()
        .add_service(
            StreamdServer::new(DataPlane::new(node.clone()))
                .max_decoding_message_size(max_message(&args))
                .max_encoding_message_size(max_message(&args)),
        )
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(grpc_listener),
            servers_stop.clone().cancelled_owned(),
        );
    let grpc = tokio::spawn(weir_shared::shutdown::watch_listener(
        "grpc",
        grpc,
        shutdown.clone(),
        servers_stop.clone(),
    ));
    let http_stop = CancellationToken::new();
    let http = axum::serve(http_listener, crate::http::router(node.clone()))
        .with_graceful_shutdown(http_stop.clone().cancelled_owned());
    tasks.spawn(weir_shared::shutdown::watch_listener(
        "http",
        http.into_future(),
        shutdown.clone(),
        http_stop.clone(),
    ));
    tracing::info!(node_id = %me.node, epoch = %me.epoch, grpc = %addrs.grpc, http = %addrs.http, "streamd listening");

    let stop_requested = shutdown.token();
    tokio::select! {
        admitted = catch_up(&view, &metad, &stop) => if admitted.is_some() {
            node.admit();
            node.upload_now.notify_one();
        },
        _ = node.fenced.cancelled() => {}
        _ = stop_requested.cancelled() => {}
    }

    let exit = tokio::select! {
        _ = stop_requested.cancelled() => Exit::Clean,
        _ = node.fenced.cancelled() => Exit::Fenced,
    };
    if exit == Exit::Clean {
        stop_requested_phase(&node, &shutdown).await;
        shutdown.begin(Phase::DrainSupport);
        let outcome = crate::shutdown_drain::drain(&node, &shutdown).await;
        shutdown.finish(Phase::DrainSupport, outcome);
        shutdown.begin(Phase::TerminalTeardown);
        // SD-TD-1: the self-fence first; failover places whatever did not close.
        weir_metad::membership::fence_self(&node.metad, &node.me).await;
        node.fence("clean shutdown");
    }
    // Listeners stop; in-flight calls get `--shutdown-timeout-sec` (SD-CS-5).
    servers_stop.cancel();
    let inflight = shutdown.inflight_timeout.min(shutdown.deadline_left());
    if tokio::time::timeout(inflight, grpc).await.is_err() {
        tracing::warn!(timeout = ?inflight, "in-flight requests did not finish; stopping anyway");
    }
    http_stop.cancel();
    stop.cancel();
    weir_shared::shutdown::stop_background(&tasks).await;
    if exit == Exit::Clean {
        shutdown.finish(Phase::TerminalTeardown, Outcome::Completed);
    }
    Ok(exit)
}

/// Stop-requested (F step 1): readiness fails and the incarnation is marked
/// terminating, so it gets no new streams (SD-CS-2, D-4).
async fn stop_requested_phase(node: &Arc<Node>, shutdown: &Shutdown) {
    shutdown.begin(Phase::StopRequested);
    node.terminating.store(true, Ordering::Release);
    weir_metad::membership::mark_terminating(&node.metad, &node.me, shutdown.step(Duration::from_secs(2))).await;
    shutdown.finish(Phase::StopRequested, Outcome::Completed);
}
