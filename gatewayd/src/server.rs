//! Wires one gatewayd incarnation together and runs it until stopped or fenced.

use crate::api::{router, Gateway};
use crate::config::GatewaydArgs;
use crate::route::Routes;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_metad::client::MetadClient;
use weir_metad::model::{NodeAddrs, NodeKind};
use weir_metad::view::{catch_up, follow, View};
use weir_shared::ids::NodeId;

/// How a gatewayd run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Clean,
    /// Fenced or replaced: exit 75 so a supervisor restarts it (D-5).
    Fenced,
}

pub async fn run(args: GatewaydArgs, shutdown: CancellationToken) -> anyhow::Result<Exit> {
    let metad = Arc::new(MetadClient::new(&args.metad_addrs(), Duration::from_secs(5))?);
    let http_listener = TcpListener::bind(args.http_listen).await?;
    let http_addr = args
        .http_advertise
        .clone()
        .unwrap_or(http_listener.local_addr()?.to_string());
    let addrs = NodeAddrs {
        grpc: String::new(),
        http: http_addr.clone(),
    };
    let node_id = NodeId::new(args.id.clone());
    let me = weir_metad::membership::register(&metad, &node_id, NodeKind::Gatewayd, addrs, args.heartbeat, &shutdown)
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

    let servers_stop = CancellationToken::new();
    let http =
        axum::serve(http_listener, router(gw.clone())).with_graceful_shutdown(servers_stop.clone().cancelled_owned());
    tasks.spawn(async move { http.await });
    tracing::info!(node_id = %me.node, epoch = %me.epoch, http = %http_addr, "gatewayd listening");

    // RR-FEN-2: nothing is routed before the catch-up fence.
    tokio::select! {
        admitted = catch_up(&view, &metad, &stop) => if admitted.is_some() { gw.routes.admit() },
        _ = gw.fenced.cancelled() => {}
        _ = shutdown.cancelled() => {}
    }
    let exit = tokio::select! {
        _ = shutdown.cancelled() => Exit::Clean,
        _ = gw.fenced.cancelled() => Exit::Fenced,
    };
    // Live reads end first, so graceful HTTP shutdown does not wait on long polls.
    gw.stopping.cancel();
    if exit == Exit::Clean {
        weir_metad::membership::fence_self(&metad, &me).await;
    }
    servers_stop.cancel();
    stop.cancel();
    tasks.close();
    // In-flight requests get a bounded time to finish.
    if tokio::time::timeout(Duration::from_secs(10), tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish in 10 s; stopping anyway");
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
