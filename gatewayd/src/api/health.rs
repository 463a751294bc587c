//! `/livez`, `/readyz`, `/ready` (OBS-2 to OBS-4), `/metrics` and `/admin/nodes`.

use super::Gateway;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::Arc;

pub async fn livez() -> &'static str {
    "ok"
}

/// Ready once caught up with the metadata log and following it, not fenced and not stopping.
fn is_ready(gw: &Gateway) -> bool {
    gw.routes.is_admitted() && gw.routes.view().error().is_none() && !gw.fenced.is_cancelled() && !gw.is_terminating()
}

pub async fn readyz(State(gw): State<Arc<Gateway>>) -> StatusCode {
    if is_ready(&gw) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

pub async fn ready(State(gw): State<Arc<Gateway>>) -> Response {
    let ready = is_ready(&gw);
    let body = json!({
        "ready": ready,
        "node_id": gw.me.node,
        "epoch": gw.me.epoch,
        "fenced": gw.fenced.is_cancelled(),
        "terminating": gw.is_terminating(),
        "caught_up": gw.routes.is_admitted(),
        "applied_index": gw.routes.view().applied_index(),
        // Why the gateway cannot follow the metadata log, when it cannot (design 0002).
        "view_error": gw.routes.view().error(),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

pub async fn metrics(State(gw): State<Arc<Gateway>>) -> impl IntoResponse {
    crate::metrics::metrics()
        .applied_index
        .set(gw.routes.view().applied_index() as i64);
    weir_shared::metrics::metrics_handler().await
}

/// The nodes as this gateway's view has them.
pub async fn nodes(State(gw): State<Arc<Gateway>>) -> Json<serde_json::Value> {
    Json(gw.routes.view().with(weir_meta::listing::nodes_json))
}
