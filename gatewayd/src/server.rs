//! Wires one gatewayd incarnation together and runs it until stopped or fenced.

use crate::api::{router, Gateway};
use crate::config::GatewaydArgs;
use crate::kafka::brokers::{broker_id, Broker};
use crate::kafka::Kafka;
use crate::route::Routes;
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_metad::client::MetadClient;
use weir_metad::model::{NodeAddrs, NodeKind};
use weir_metad::view::{catch_up, follow, View};
use weir_shared::ids::NodeId;
use weir_shared::shutdown::{Outcome, Phase, Shutdown};

/// How a gatewayd run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Clean,
    /// Fenced or replaced: exit 75 so a supervisor restarts it (D-5).
    Fenced,
}

pub async fn run(args: GatewaydArgs, shutdown: Arc<Shutdown>) -> anyhow::Result<Exit> {
    let metad = Arc::new(MetadClient::new(&args.metad_addrs(), Duration::from_secs(5))?);
    let http_listener = TcpListener::bind(args.http_listen).await?;
    let http_addr = args
        .http_advertise
        .clone()
        .unwrap_or(http_listener.local_addr()?.to_string());
    let kafka_listener = TcpListener::bind(args.kafka_listen).await?;
    let kafka_addr = args
        .kafka_advertise
        .clone()
        .unwrap_or(kafka_listener.local_addr()?.to_string());
    // A gateway's `grpc` address is its Kafka listener: what Metadata advertises.
    let addrs = NodeAddrs {
        grpc: kafka_addr.clone(),
        http: http_addr.clone(),
    };
    let node_id = NodeId::new(args.id.clone());
    // SD-TRG-7: a stop request during registration is held until startup is done.
    let me = weir_metad::membership::register(
        &metad,
        &node_id,
        NodeKind::Gatewayd,
        addrs,
        args.heartbeat,
        &CancellationToken::new(),
    )
    .await?;

    let view = Arc::new(View::default());
    let gw = Arc::new(Gateway {
        routes: Routes::new(
            view.clone(),
            Duration::from_millis(args.route_retry_ms),
            args.max_body_bytes + 64 * 1024,
        ),
        metad: metad.clone(),
        me: me.clone(),
        auth: args.auth,
        max_body_bytes: args.max_body_bytes,
        fenced: CancellationToken::new(),
        stopping: CancellationToken::new(),
        terminating: Default::default(),
    });

    let tasks = TaskTracker::new();
    let stop = CancellationToken::new();
    tasks.spawn(follow(view.clone(), metad.clone(), stop.clone()));
    let heartbeat_interval = Duration::from_secs(args.heartbeat.heartbeat_interval_sec);
    tasks.spawn({
        let (gw, stop) = (gw.clone(), stop.clone());
        async move {
            if let Some(why) =
                weir_metad::membership::heartbeat_loop(&gw.metad, &gw.me, heartbeat_interval, &stop).await
            {
                fence(&gw, &why);
            }
        }
    });
    tasks.spawn(watch_own_row(gw.clone(), stop.clone()));

    // Listeners and the requests they carry, tracked apart from background tasks so
    // drain-support can wait for in-flight requests alone.
    let servers = TaskTracker::new();
    let servers_stop = CancellationToken::new();
    let http =
        axum::serve(http_listener, router(gw.clone())).with_graceful_shutdown(servers_stop.clone().cancelled_owned());
    servers.spawn(weir_shared::shutdown::watch_listener(
        "http",
        http.into_future(),
        shutdown.clone(),
        servers_stop.clone(),
    ));
    let (host, port) = crate::kafka::brokers::split_host_port(&kafka_addr)
        .ok_or_else(|| anyhow::anyhow!("--kafka-advertise '{kafka_addr}' is not HOST:PORT"))?;
    let kafka = Arc::new(Kafka {
        gw: gw.clone(),
        me: Broker {
            id: broker_id(me.node.as_str()),
            host,
            port,
        },
        max_frame_bytes: args.kafka_max_frame_bytes,
        max_message_bytes: args.kafka_max_message_bytes,
        auto_create_topics: args.kafka_auto_create_topics,
        default_partitions: args.kafka_default_partitions,
    });
    servers.spawn(weir_shared::shutdown::watch_listener(
        "kafka",
        crate::kafka::serve(kafka_listener, kafka, servers.clone(), servers_stop.clone()),
        shutdown.clone(),
        servers_stop.clone(),
    ));
    tracing::info!(node_id = %me.node, epoch = %me.epoch, http = %http_addr, kafka = %kafka_addr, "gatewayd listening");

    // RR-FEN-2: nothing is routed before the catch-up fence.
    let stop_requested = shutdown.token();
    tokio::select! {
        admitted = catch_up(&view, &metad, &stop) => if admitted.is_some() { gw.routes.admit() },
        _ = gw.fenced.cancelled() => {}
        _ = stop_requested.cancelled() => {}
    }
    let exit = tokio::select! {
        _ = stop_requested.cancelled() => Exit::Clean,
        _ = gw.fenced.cancelled() => Exit::Fenced,
    };
    if exit == Exit::Clean {
        // SD-CS-9: steps 1–4 of a clean stop; a gateway owns no streams and never fences.
        shutdown.begin(Phase::StopRequested);
        gw.terminating.store(true, std::sync::atomic::Ordering::Release);
        weir_metad::membership::mark_terminating(&metad, &me, shutdown.step(Duration::from_secs(2))).await;
        shutdown.finish(Phase::StopRequested, Outcome::Completed);

        shutdown.begin(Phase::DrainSupport);
        tokio::time::sleep(shutdown.step(shutdown.drain_window)).await;
        // Live reads end (long polls and SSE answer 503, Kafka fetches stop waiting),
        // then the listeners stop and in-flight requests get a bounded time.
        gw.stopping.cancel();
        servers_stop.cancel();
        servers.close();
        let inflight = shutdown.step(shutdown.inflight_timeout);
        let outcome = match tokio::time::timeout(inflight, servers.wait()).await {
            Ok(()) => Outcome::Completed,
            Err(_) => {
                tracing::warn!(timeout = ?inflight, "in-flight requests did not finish; stopping anyway");
                Outcome::Abandoned
            }
        };
        shutdown.finish(Phase::DrainSupport, outcome);
        shutdown.begin(Phase::TerminalTeardown);
    } else {
        gw.stopping.cancel();
        servers_stop.cancel();
        servers.close();
    }
    stop.cancel();
    weir_shared::shutdown::stop_background(&tasks).await;
    if exit == Exit::Clean {
        shutdown.finish(Phase::TerminalTeardown, Outcome::Completed);
    }
    Ok(exit)
}

fn fence(gw: &Gateway, why: &str) {
    if !gw.fenced.is_cancelled() {
        tracing::error!(node_id = %gw.me.node, epoch = %gw.me.epoch, reason = why, "this incarnation is fenced; stopping");
    }
    gw.fenced.cancel();
}

/// FO-FEN-8 for a gateway: its own row fenced or replaced means stop.
async fn watch_own_row(gw: Arc<Gateway>, stop: CancellationToken) {
    let mut applied = gw.routes.view().subscribe();
    loop {
        let row = gw
            .routes
            .view()
            .with(|s| s.nodes.get(&gw.me.node).map(|r| (r.epoch, r.fenced)));
        match row {
            Some((epoch, true)) if epoch == gw.me.epoch => return fence(&gw, "its node row is fenced"),
            Some((epoch, _)) if epoch != gw.me.epoch => {
                return fence(&gw, &format!("a newer registration (epoch {epoch}) replaced it"))
            }
            _ => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = applied.changed() => if changed.is_err() { return },
        }
    }
}
