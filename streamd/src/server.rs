//! Wires one streamd incarnation together and runs it until stopped or fenced.

use crate::config::{StreamdArgs, WalBackend};
use crate::node::{reconcile_loop, upload_loop, Node, Tunables, WalSource};
use crate::service::DataPlane;
use crate::wal::{file::FileSink, object::ObjectSink, Sink, WalWriter};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_meta::model::{NodeAddrs, NodeKind};
use weir_meta::registration::{self, Registered};
use weir_proto::streamd::streamd_server::StreamdServer;
use weir_shared::ids::NodeId;
use weir_shared::listener::{grpc_incoming, Listener};
use weir_shared::service::Exit;
use weir_shared::shutdown::{watch_listener, PhaseOutcome, Shutdown, StopSteps, TeardownStep};
use weir_shared::task_kinds::{KindTasks, TASK_GRACE};

/// Largest gRPC message: an append of `--max-append-bytes` plus framing.
fn max_message(args: &StreamdArgs) -> usize {
    args.max_append_bytes + 64 * 1024
}

pub async fn run(args: StreamdArgs, shutdown: Arc<Shutdown>) -> anyhow::Result<Exit> {
    args.cluster_tls.install()?;
    let store = crate::object::store::open(&args.object_store)?;
    let grpc_listener = weir_shared::service::bind("--listen", args.listen).await?;
    let http_listener = weir_shared::service::bind("--http-listen", args.http_listen).await?;
    let grpc_addr = args
        .advertise
        .clone()
        .unwrap_or(grpc_listener.local_addr()?.to_string());
    let addrs = NodeAddrs {
        grpc: grpc_addr,
        http: http_listener.local_addr()?.to_string(),
    };
    let node_id = NodeId::new(args.node.id.clone());
    let limits = args.listeners.limits()?;
    let joining = weir_shared::listener::close_connections_while(
        &grpc_listener,
        Registered::join(&args.node, NodeKind::Streamd, addrs.clone()),
    );
    let stopping = shutdown.token();
    let joined =
        weir_shared::http_server::answer_probes_while(&http_listener, limits, None, &args.node.id, &stopping, joining);
    let registered = Arc::new(joined.await??);
    let me = registered.me.clone();

    let tasks = TaskTracker::new();
    let sink = match args.wal_backend {
        WalBackend::File => Sink::File(FileSink::create(
            &args.wal_root(),
            &node_id,
            me.epoch,
            args.wal_segment_bytes,
        )?),
        WalBackend::Object => Sink::Object(ObjectSink::create(
            store.clone(),
            &node_id,
            me.epoch,
            args.object_wal_pipelining(),
        )),
    };
    // Background work stops only after the hand-off, which needs the uploader, the
    // heartbeat and the view; so no token below is a child of `shutdown`. Each stops in
    // its own step of terminal teardown (SD-TD-2): `background_stop` the loops and the
    // heartbeat, `stop` the view, registration and HTTP, `storage_stop` the WAL.
    let stop = CancellationToken::new();
    let background_stop = CancellationToken::new();
    // SD-INT-7: compaction, retention and GC write and delete objects on their own
    // account, so they stop at the stop request; the uploader goes on, since the
    // hand-off's closes need it.
    let object_work_stop = background_stop.child_token();
    let storage = TaskTracker::new();
    let storage_stop = CancellationToken::new();
    let wal = WalWriter::start(sink, args.wal_max_bytes, &storage, storage_stop.clone())?;
    let disk = weir_shared::disk_space::DiskWatch::new(args.watched_volumes(), args.disk_space.clone());
    tasks.spawn(disk.watch(stop.clone()));
    let tunables = Tunables {
        upload_interval: Duration::from_millis(args.upload_interval_ms),
        upload_bytes: args.upload_bytes,
        reupload_after: Duration::from_secs(args.gc_delay_sec / 2),
        max_append_bytes: args.max_append_bytes,
        max_decompressed_bytes: args.max_decompressed_bytes,
        max_group_members: args.max_group_members,
        group_initial_rebalance_delay: Duration::from_millis(args.group_initial_rebalance_delay_ms),
        consumer_heartbeat_interval: Duration::from_millis(args.consumer_heartbeat_interval_ms),
        consumer_session_timeout: Duration::from_millis(args.consumer_session_timeout_ms),
        producer_state_bytes: args.producer_state_bytes,
        cache_bytes: args.cache_bytes,
        compaction_target_bytes: args.compaction_target_bytes,
        compaction_interval: Duration::from_millis(args.compaction_interval_ms),
        compaction_max_bytes_per_sec: args.compaction_max_bytes_per_sec,
    };
    let node = Arc::new(Node::new(
        &registered,
        wal,
        disk,
        store,
        tunables,
        match args.wal_backend {
            WalBackend::File => WalSource::File(args.wal_root()),
            WalBackend::Object => WalSource::Object,
        },
    ));

    registered.follow(&tasks, &stop);
    // The node's loops and heartbeat, each given the same short grace at teardown
    // (SD-TD-2/3/4).
    let loops = KindTasks::new();
    loops.spawn(
        "heartbeat",
        "heartbeat",
        None,
        registered.heartbeat(args.node.heartbeat, &background_stop),
    );
    loops.spawn(
        "reconcile",
        "reconcile",
        None,
        reconcile_loop(node.clone(), background_stop.clone()),
    );
    loops.spawn(
        "takeover",
        "takeover",
        None,
        crate::node::takeover_loop(node.clone(), background_stop.clone()),
    );
    loops.spawn(
        "uploader",
        "uploader",
        None,
        upload_loop(node.clone(), background_stop.clone()),
    );
    loops.spawn(
        "compaction",
        "compaction",
        None,
        crate::node::compaction_loop(node.clone(), object_work_stop.clone()),
    );
    loops.spawn(
        "retention",
        "retention",
        None,
        crate::node::retention_loop(
            node.clone(),
            Duration::from_millis(args.retention_check_interval_ms),
            object_work_stop.clone(),
        ),
    );
    let txns = crate::coordinators::txn::coordinator::Txns::new(
        crate::node::core_api::CoreApi::new(node.clone()),
        crate::coordinators::txn::coordinator::TxnLimits {
            max_timeout_ms: args.transaction_max_timeout_ms,
            id_expiration_ms: args.transactional_id_expiration_ms,
        },
    );
    let verifier: std::sync::Weak<crate::coordinators::txn::coordinator::Txns> = Arc::downgrade(&txns);
    node.coordination.register_txns(verifier);
    loops.spawn(
        "txn",
        "transaction coordinators",
        None,
        txns.clone().run(background_stop.clone()),
    );
    let gc_delay = Duration::from_secs(args.gc_delay_sec);
    let gc_grace = Duration::from_secs(args.gc_grace_sec);
    loops.spawn(
        "gc",
        "object gc",
        None,
        crate::object::gc::gc_loop(
            node.store.clone(),
            crate::object::gc::MetadIndex {
                metad: node.metad.clone(),
                me: node.me.clone(),
            },
            node.view.clone(),
            crate::object::gc::Limits {
                delay: gc_delay,
                grace: gc_grace,
            },
            (gc_delay.min(gc_grace.max(Duration::from_secs(1))) / 4)
                .clamp(Duration::from_secs(1), Duration::from_secs(300)),
            object_work_stop.clone(),
        ),
    );

    // Listeners and the calls they carry, tracked apart from background work so the
    // teardown can give in-flight calls their own bound (SD-CS-5).
    let servers = TaskTracker::new();
    let grpc_stop = CancellationToken::new();
    let data_plane = StreamdServer::new(DataPlane::new(node.clone(), txns.clone()))
        .max_decoding_message_size(max_message(&args))
        .max_encoding_message_size(max_message(&args));
    // In `weir dev` the gateway beside this node calls it in process (issue 62).
    weir_shared::in_process::serve(&addrs.grpc, data_plane.clone(), grpc_stop.clone(), servers.clone());
    let grpc = weir_shared::grpc::server(&limits)?
        .add_service(data_plane)
        .serve_with_incoming_shutdown(
            grpc_incoming(Listener::new(grpc_listener, "grpc", limits)),
            grpc_stop.clone().cancelled_owned(),
        );
    servers.spawn(watch_listener("grpc", grpc, shutdown.clone(), grpc_stop.clone()));
    let http_stop = CancellationToken::new();
    let http = weir_shared::http_server::serve(
        Listener::new(http_listener, "http", limits),
        crate::http::router(node.clone()),
        None,
        http_stop.clone().cancelled_owned(),
    );
    tasks.spawn(watch_listener("http", http, shutdown.clone(), http_stop.clone()));
    tracing::info!(node_id = %me.node, epoch = %me.epoch, grpc = %addrs.grpc, http = %addrs.http, "streamd listening");

    let stop_requested = shutdown.token();
    if registered.catch_up(&stop_requested).await {
        node.admit();
        node.upload_now.notify_one();
    }
    let mut teardown = Teardown {
        node: node.clone(),
        shutdown: shutdown.clone(),
        servers,
        grpc_stop,
        http_stop,
        background_stop,
        object_work_stop,
        loops,
        stop,
        tasks,
        storage_stop,
        storage,
    };
    let exit = registered.until_stopped(&stop_requested).await;
    match exit {
        Exit::Clean => shutdown.run_phases(&mut StreamdStop { node, teardown }).await,
        Exit::Fenced => {
            node.fence("fenced while running");
            teardown.run().await;
        }
    }
    Ok(exit)
}

/// What ends a streamd, clean or fenced, in SD-TD-2's steps: its loops and heartbeat
/// (2 s), calls in flight (`--shutdown-timeout-sec`, SD-CS-5), the tasks it started for
/// single streams, the view and its links to peers (the transport drain, SD-DL-8), and
/// last the WAL, which in-flight appends needed to the end.
struct Teardown {
    node: Arc<Node>,
    shutdown: Arc<Shutdown>,
    servers: TaskTracker,
    grpc_stop: CancellationToken,
    http_stop: CancellationToken,
    background_stop: CancellationToken,
    /// Compaction, retention and GC (SD-INT-7); a child of `background_stop`.
    object_work_stop: CancellationToken,
    loops: KindTasks,
    stop: CancellationToken,
    tasks: TaskTracker,
    storage_stop: CancellationToken,
    storage: TaskTracker,
}

impl Teardown {
    async fn run(&mut self) -> PhaseOutcome {
        TeardownStep::BackgroundTasks.begin();
        self.background_stop.cancel();
        self.loops.stop(TASK_GRACE).await;

        TeardownStep::WorkInFlight.begin();
        // OBS-16: the peers (gateways, metad) still attached when the listener stops.
        let attached = weir_shared::listener::open_connections("grpc");
        self.grpc_stop.cancel();
        self.servers.close();
        // Append streams end with their calls; never aborted, since an aborted one would
        // end its call as if every append were answered.
        self.node.calls.close();
        let inflight = self.shutdown.inflight_timeout.min(self.shutdown.deadline_left());
        let calls_end = async {
            self.servers.wait().await;
            self.node.calls.wait().await;
        };
        if tokio::time::timeout(inflight, calls_end).await.is_err() {
            tracing::warn!(timeout = ?inflight, "in-flight requests did not finish; stopping anyway");
        }
        if attached > 0 {
            tracing::info!(
                listener = "grpc",
                count = attached,
                reason = "shutting down",
                "ended the clients of a listener"
            );
        }

        TeardownStep::RuntimeAndLinks.begin();
        self.http_stop.cancel();
        self.stop.cancel();
        // The tasks the node started for single streams (closes, takeovers, group ticks)
        // get one shared grace (SD-TD-3/4); the view and registration the background
        // grace to close their links.
        tokio::join!(
            self.node.tasks.stop(TASK_GRACE),
            weir_shared::shutdown::stop_background(&self.tasks),
        );
        let links = self.shutdown.transport_drain(self.shutdown.transport_drain_end()).await;

        TeardownStep::Storage.begin();
        self.storage_stop.cancel();
        weir_shared::shutdown::stop_background(&self.storage).await;
        links
    }
}

/// What terminal teardown keeps of the deadline for its own steps after the
/// self-fence: the loops' grace and the single-stream tasks' grace.
const TEARDOWN_RESERVE: Duration = Duration::from_secs(2 * TASK_GRACE.as_secs());

/// A clean stop's steps (F steps 1–7, D-3).
struct StreamdStop {
    node: Arc<Node>,
    teardown: Teardown,
}

impl StopSteps for StreamdStop {
    /// Readiness fails and the incarnation is marked terminating, so it gets no new
    /// streams (SD-CS-2, D-4).
    async fn stop_requested(&mut self) {
        self.node.terminating.store(true, Ordering::Release);
        self.teardown.object_work_stop.cancel();
        let within = self.teardown.shutdown.step(Duration::from_secs(2));
        registration::mark_terminating(&self.node.metad, &self.node.me, within).await;
    }

    async fn drain_support(&mut self) -> PhaseOutcome {
        crate::shutdown_drain::drain(&self.node, &self.teardown.shutdown).await
    }

    /// SD-TD-1: the self-fence first; failover places whatever did not close. The
    /// streams keep answering (not-owner) until it lands, so a gateway whose view lags
    /// a drain's transfer reroutes rather than seeing its owner fenced mid-request.
    async fn terminal_teardown(&mut self) -> PhaseOutcome {
        self.node.fencing_self();
        // FO-MDO-6: with the metadata log out of reach the fence cannot land; it may not
        // take the time teardown's own graces need, or the deadline would force the stop.
        let within = self.teardown.shutdown.deadline_left().saturating_sub(TEARDOWN_RESERVE);
        registration::fence_self(&self.node.metad, &self.node.me, within).await;
        self.node.fence("it fenced itself for the shutdown");
        self.teardown.run().await
    }
}
