//! Wires one gatewayd incarnation together and runs it until stopped or fenced.

use crate::api::{router, Gateway};
use crate::config::GatewaydArgs;
use crate::kafka::brokers::{broker_id, Broker};
use crate::kafka::Kafka;
use crate::route::Routes;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_meta::model::{NodeAddrs, NodeKind};
use weir_meta::registration::{self, Registered};
use weir_shared::listener::{self, Listener};
use weir_shared::service::Exit;
use weir_shared::shutdown::{watch_listener, PhaseOutcome, Shutdown, StopSteps, TeardownStep};
use weir_shared::task_kinds::{KindTasks, TASK_GRACE};

pub async fn run(args: GatewaydArgs, shutdown: Arc<Shutdown>) -> anyhow::Result<Exit> {
    args.cluster_tls.install()?;
    let http_tls = args.tls.load(weir_shared::http_server::ALPN)?;
    let kafka_tls = args.tls.load(&[])?;
    if args.auth && kafka_tls.is_none() && !args.kafka_allow_plaintext_sasl {
        tracing::warn!(
            "Kafka clients cannot authenticate with PLAIN: SASL/PLAIN is refused on a plaintext listener \
             (SCRAM-SHA-256 and SCRAM-SHA-512 are offered); give --tls-cert and --tls-key, or --kafka-allow-plaintext-sasl"
        );
    }
    let http_listener = weir_shared::service::bind("--http-listen", args.http_listen).await?;
    let http_addr = args
        .http_advertise
        .clone()
        .unwrap_or(http_listener.local_addr()?.to_string());
    let kafka_listener = weir_shared::service::bind("--kafka-listen", args.kafka_listen).await?;
    let kafka_addr = args
        .kafka_advertise
        .clone()
        .unwrap_or(kafka_listener.local_addr()?.to_string());
    let (host, port) = crate::kafka::brokers::split_host_port(&kafka_addr)
        .ok_or_else(|| anyhow::anyhow!("--kafka-advertise '{kafka_addr}' is not HOST:PORT"))?;
    // A gateway's `grpc` address is its Kafka listener: what Metadata advertises.
    let addrs = NodeAddrs {
        grpc: kafka_addr.clone(),
        http: http_addr.clone(),
    };
    let limits = args.listeners.limits()?;
    let joining =
        listener::close_connections_while(&kafka_listener, Registered::join(&args.node, NodeKind::Gatewayd, addrs));
    let stopping = shutdown.token();
    let joined = weir_shared::http_server::answer_probes_while(
        &http_listener,
        limits,
        http_tls.clone(),
        &args.node.id,
        &stopping,
        joining,
    );
    let registered = Arc::new(joined.await??);
    let me = registered.me.clone();

    // Listeners, the requests they carry and the live reads they start (SSE), tracked
    // apart from background work so drain-support can wait for in-flight requests alone.
    let servers = TaskTracker::new();
    let gw = Arc::new(Gateway {
        routes: Routes::new(
            registered.view.clone(),
            Duration::from_millis(args.route_retry_ms),
            args.max_body_bytes + 64 * 1024,
        ),
        metad: registered.metad.clone(),
        me: me.clone(),
        auth: args.auth,
        max_body_bytes: args.max_body_bytes,
        max_decompressed_bytes: args.max_decompressed_bytes,
        live_reads: crate::api::live_reads::LiveReads::new(args.max_sse_subscribers, args.max_long_polls),
        fenced: registered.fenced.clone(),
        stopping: CancellationToken::new(),
        terminating: Default::default(),
        tasks: servers.clone(),
        quotas: crate::quotas::Quotas::new(registered.view.clone()),
    });

    let tasks = TaskTracker::new();
    let stop = CancellationToken::new();
    registered.follow(&tasks, &stop);
    // The heartbeat is the gateway's one background task, stopped first (SD-TD-2).
    let background = KindTasks::new();
    let background_stop = CancellationToken::new();
    background.spawn(
        "heartbeat",
        "heartbeat",
        None,
        registered.heartbeat(args.node.heartbeat, &background_stop),
    );

    let servers_stop = CancellationToken::new();
    let http = weir_shared::http_server::serve(
        // SD-INT-3: once the listeners stop, a client that reads nothing holds nothing.
        Listener::new(http_listener, "http", limits).ending_stalled_writes(servers_stop.clone()),
        router(gw.clone()),
        http_tls.clone(),
        servers_stop.clone().cancelled_owned(),
    );
    servers.spawn(watch_listener("http", http, shutdown.clone(), servers_stop.clone()));
    let kafka = Arc::new(Kafka {
        gw: gw.clone(),
        me: Broker {
            id: broker_id(me.node.as_str()),
            host,
            port,
        },
        max_frame_bytes: args.kafka_max_frame_bytes,
        max_unauthenticated_frame_bytes: args
            .kafka_max_unauthenticated_frame_bytes
            .min(args.kafka_max_frame_bytes),
        max_message_bytes: args.kafka_max_message_bytes,
        fetch_max_bytes: args.kafka_fetch_max_bytes,
        fetch_sessions: crate::kafka::fetch_sessions::FetchSessions::new(
            args.kafka_fetch_sessions,
            std::time::Duration::from_millis(args.kafka_fetch_session_eviction_ms),
        ),
        auto_create_topics: args.kafka_auto_create_topics,
        header_read_timeout: limits.header_read_timeout,
        principals: crate::kafka::principals::Principals::new(args.kafka_max_connections_per_principal),
        default_partitions: args.kafka_default_partitions,
        tls: kafka_tls.clone(),
        allow_plaintext_sasl: args.kafka_allow_plaintext_sasl,
    });
    servers.spawn(watch_listener(
        "kafka",
        crate::kafka::serve(
            Listener::new(kafka_listener, "kafka", limits).ending_stalled_writes(servers_stop.clone()),
            kafka,
            servers.clone(),
            servers_stop.clone(),
        ),
        shutdown.clone(),
        servers_stop.clone(),
    ));
    tracing::info!(
        node_id = %me.node,
        epoch = %me.epoch,
        http = %http_addr,
        kafka = %kafka_addr,
        tls = kafka_tls.is_some(),
        auth = args.auth,
        "gatewayd listening"
    );

    // RR-FEN-2: nothing is routed before the catch-up fence.
    let stop_requested = shutdown.token();
    if registered.catch_up(&stop_requested).await {
        gw.routes.admit();
    }
    let mut steps = GatewaydStop {
        gw,
        shutdown: shutdown.clone(),
        servers,
        servers_stop,
        background_stop,
        background,
        stop,
        tasks,
    };
    let exit = registered.until_stopped(&stop_requested).await;
    match exit {
        Exit::Clean => shutdown.run_phases(&mut steps).await,
        Exit::Fenced => {
            steps.stop_serving();
            steps.teardown().await;
        }
    }
    Ok(exit)
}

/// Client connections attached to each listener when it stopped.
struct Attached {
    kafka: i64,
    http: i64,
}

impl Attached {
    /// OBS-16: one record per listener whose clients the stop ended, with the requests it
    /// dropped unadmitted (SD-INT-12); the connection gauges fall as they close.
    fn log_ended(&self) {
        let dropped = &crate::metrics::metrics().requests_dropped;
        for (name, count) in [("kafka", self.kafka), ("http", self.http)] {
            if count > 0 {
                tracing::info!(
                    listener = name,
                    count,
                    dropped_requests = dropped.with_label_values(&[name]).get(),
                    reason = "shutting down",
                    "ended the clients of a listener"
                );
            }
        }
    }
}

/// A gateway's stop (SD-CS-9: steps 1–4 of a clean stop; it owns no streams and never
/// fences itself).
struct GatewaydStop {
    gw: Arc<Gateway>,
    shutdown: Arc<Shutdown>,
    servers: TaskTracker,
    servers_stop: CancellationToken,
    background_stop: CancellationToken,
    background: KindTasks,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl GatewaydStop {
    /// Live reads end (long polls and SSE answer 503, Kafka fetches stop waiting), then
    /// the listeners stop. Returns the client connections still attached then.
    fn stop_serving(&self) -> Attached {
        let attached = Attached {
            kafka: listener::open_connections("kafka"),
            http: listener::open_connections("http"),
        };
        self.gw.stopping.cancel();
        self.servers_stop.cancel();
        self.servers.close();
        attached
    }

    /// Terminal teardown in SD-TD-2's steps. Requests in flight had their bound in
    /// drain-support; those still running past it, with their calls to owners, get the
    /// transport drain (SD-DL-8) while the view still follows the log, so a request
    /// retrying towards a stream's new owner can still find it and its client may yet
    /// get the answer. Only then do the view and registration stop. A gateway keeps no
    /// storage.
    async fn teardown(&self) -> PhaseOutcome {
        TeardownStep::BackgroundTasks.begin();
        self.background_stop.cancel();
        self.background.stop(TASK_GRACE).await;
        TeardownStep::WorkInFlight.begin();
        let end = self.shutdown.transport_drain_end();
        let requests_ended = tokio::time::timeout_at(end, self.servers.wait()).await.is_ok();
        TeardownStep::RuntimeAndLinks.begin();
        // The view's own watch is a call to a peer too: it ends here, before the drain
        // waits for the rest.
        self.stop.cancel();
        weir_shared::shutdown::stop_background(&self.tasks).await;
        let calls = self.shutdown.transport_drain(end).await;
        if !requests_ended {
            tracing::warn!("requests in flight did not end in the transport drain; closing them");
            return PhaseOutcome::Abandoned;
        }
        calls
    }
}

impl StopSteps for GatewaydStop {
    async fn stop_requested(&mut self) {
        self.gw.terminating.store(true, std::sync::atomic::Ordering::Release);
        let within = self.shutdown.step(Duration::from_secs(2));
        registration::mark_terminating(&self.gw.metad, &self.gw.me, within).await;
    }

    /// Keeps serving for the readiness drain, then in-flight requests get a bounded time.
    async fn drain_support(&mut self) -> PhaseOutcome {
        tokio::time::sleep(self.shutdown.step(self.shutdown.drain_window)).await;
        let attached = self.stop_serving();
        let inflight = self.shutdown.step(self.shutdown.inflight_timeout);
        let outcome = match tokio::time::timeout(inflight, self.servers.wait()).await {
            Ok(()) => PhaseOutcome::Completed,
            Err(_) => {
                tracing::warn!(timeout = ?inflight, "in-flight requests did not finish; stopping anyway");
                // HTTP requests whose bodies are still arriving end with the process,
                // never admitted (SD-INT-12); others may have been, so are not counted.
                let open = crate::metrics::metrics().http_receiving.get().max(0) as u64;
                crate::metrics::metrics()
                    .requests_dropped
                    .with_label_values(&["http"])
                    .inc_by(open);
                PhaseOutcome::Abandoned
            }
        };
        attached.log_ended();
        outcome
    }

    async fn terminal_teardown(&mut self) -> PhaseOutcome {
        self.teardown().await
    }
}
