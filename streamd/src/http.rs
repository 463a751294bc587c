//! Health and metrics over HTTP: `/livez`, `/readyz`, `/ready`, `/metrics`.

use crate::node::Node;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;

pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(node)
}

/// Refreshes the gauges, then renders the registry.
async fn metrics(State(node): State<Arc<Node>>) -> impl IntoResponse {
    let m = crate::metrics::metrics();
    m.wal_bytes.set(node.wal.bytes() as i64);
    m.streams_served.set(node.served_count() as i64);
    m.damaged_streams.set(node.damaged_streams().len() as i64);
    weir_shared::metrics::metrics_handler().await
}

/// D-2: ready once caught up, following the log, and neither fenced nor terminating.
fn is_ready(node: &Node) -> bool {
    node.is_admitted()
        && node.view.error().is_none()
        && !node.fenced.is_cancelled()
        && !node.terminating.load(std::sync::atomic::Ordering::Acquire)
}

async fn readyz(State(node): State<Arc<Node>>) -> StatusCode {
    if is_ready(&node) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn ready(State(node): State<Arc<Node>>) -> Response {
    let ready = is_ready(&node);
    let body = json!({
        "ready": ready,
        "node_id": node.me.node,
        "epoch": node.me.epoch,
        "fenced": node.fenced.is_cancelled(),
        "terminating": node.terminating.load(std::sync::atomic::Ordering::Acquire),
        "caught_up": node.is_admitted(),
        // Why the node cannot follow the metadata log, when it cannot (design 0002).
        "view_error": node.view.error(),
        "streams": node.served_count(),
        "wal_bytes": node.wal.bytes(),
        // Served streams whose damaged data waits for an operator (`weir streams damaged`).
        "damaged_streams": node.damaged_streams(),
        // Issue 60: still ready under a mark (reads go on); `disk` says why writes are
        // refused, and `appends_refused` whether they are.
        "disk": node.disk.states(),
        "appends_refused": node.disk.refusal().or_else(|| node.wal.check().err().map(|e| e.to_string())),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}
