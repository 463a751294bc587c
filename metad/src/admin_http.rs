//! Admin HTTP on each replica: `/livez`, `/readyz`, `/ready`, `/admin/nodes`,
//! `/admin/metadata/log`, `/admin/state/{section}`, `/metrics`.

use crate::admin::{index_json, log_json, status_json};
use crate::leader::current_leader;
use crate::raft_types::Raft;
use crate::store::StateMachineStore;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use weir_meta::listing::{nodes_json, section_json};
use weir_shared::shutdown::Shutdown;

#[derive(Clone)]
struct AdminState {
    raft: Raft,
    sm: StateMachineStore,
    node_id: u64,
    disk: weir_shared::disk_space::DiskWatch,
    stopping: Arc<Shutdown>,
}

/// The admin router for one replica.
pub fn router(
    raft: Raft,
    sm: StateMachineStore,
    node_id: u64,
    disk: weir_shared::disk_space::DiskWatch,
    stopping: Arc<Shutdown>,
) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/ready", get(ready))
        .route("/admin/nodes", get(nodes))
        .route("/admin/status", get(status))
        .route("/admin/metadata/log", get(log))
        .route("/admin/state/{section}", get(section))
        .route("/admin/index", get(index))
        .route("/metrics", get(weir_shared::metrics::metrics_handler))
        .with_state(AdminState {
            raft,
            sm,
            node_id,
            disk,
            stopping,
        })
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": code, "message": message.into() }))).into_response()
}

/// A replica is ready once it knows a leader (D-2: for metad, readiness means that),
/// until it is stopping (SD-CS-2).
fn is_ready(s: &AdminState) -> bool {
    current_leader(&s.raft).is_some() && !s.stopping.is_requested()
}

/// This replica's incarnation as the log holds it (`metad-ID`, registered by its
/// failover loop): the epoch, and whether a peer fenced it for going silent (it then
/// registers again; it stays a Raft voter meanwhile, FO-LIV-11).
fn own_row(s: &AdminState) -> (Option<u64>, bool) {
    let id = weir_shared::ids::NodeId::new(format!("metad-{}", s.node_id));
    s.sm.hub()
        .with_state(|st| st.nodes.get(&id).map(|r| (Some(r.epoch.0), r.fenced)))
        .unwrap_or((None, false))
}

async fn readyz(State(s): State<AdminState>) -> StatusCode {
    if is_ready(&s) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn ready(State(s): State<AdminState>) -> Response {
    let ready = is_ready(&s);
    let (epoch, fenced) = own_row(&s);
    let body = json!({
        "ready": ready,
        "node_id": format!("metad-{}", s.node_id),
        "epoch": epoch,
        "leader": current_leader(&s.raft).map(|(id, _)| id),
        "applied_index": s.sm.hub().applied_index(),
        "fenced": fenced,
        "terminating": s.stopping.is_requested(),
        "caught_up": current_leader(&s.raft).is_some(),
        // Issue 60: the data directory's volume against its marks, and why new
        // topics, streams and tokens are refused, when they are.
        "disk": s.disk.states(),
        "proposals_refused": s.disk.refusal(),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn nodes(State(s): State<AdminState>) -> Response {
    Json(s.sm.hub().with_state(nodes_json)).into_response()
}

async fn status(State(s): State<AdminState>) -> Response {
    Json(status_json(&s.raft)).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogParams {
    from: Option<u64>,
    limit: Option<u64>,
}

async fn log(
    State(s): State<AdminState>,
    params: Result<Query<LogParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(params) = match params {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_argument", e.body_text()),
    };
    match log_json(&s.sm, params.from.unwrap_or(0), params.limit.unwrap_or(1000)) {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
    }
}

/// The object index's size (design 0002).
async fn index(State(s): State<AdminState>) -> Response {
    Json(index_json(&s.sm)).into_response()
}

/// `from` and `limit` page the streams of `streams`, `damaged` and `state`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PageParams {
    from: Option<u64>,
    limit: Option<usize>,
}

async fn section(
    State(s): State<AdminState>,
    Path(what): Path<String>,
    params: Result<Query<PageParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(params) = match params {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_argument", e.body_text()),
    };
    let (from, limit) = (params.from.unwrap_or(0), params.limit.unwrap_or(0));
    match s.sm.hub().with_state(|st| section_json(st, &what, from, limit)) {
        Some(v) => Json(v).into_response(),
        None => error(StatusCode::NOT_FOUND, "not_found", format!("no state section '{what}'")),
    }
}
