//! The HTTP API (`/v1`, JSON), health, admin and metrics endpoints of gatewayd.

pub mod append;
pub mod auth;
mod catching_up;
pub mod error;
pub mod get_records;
pub mod health;
mod in_flight;
pub mod live_reads;
pub mod nodes;
pub mod quotas;
pub mod read;
pub mod sse;
pub mod streams;
pub mod tokens;
pub mod trim;

use crate::route::Routes;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use error::ApiError;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use weir_meta::client::MetadClient;
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::{Grants, Resource};
use weir_meta::model::Proposer;
use weir_shared::error_code::ErrorCode;
use weir_shared::ids::Incarnation;

/// What every handler shares.
pub struct Gateway {
    pub routes: Routes,
    pub metad: Arc<MetadClient>,
    pub me: Incarnation,
    /// Require bearer tokens on the API.
    pub auth: bool,
    pub max_body_bytes: usize,
    /// Most bytes one stored batch's records are inflated to when read (issue 19).
    pub max_decompressed_bytes: usize,
    /// Slots for SSE subscriptions and long polls.
    pub live_reads: live_reads::LiveReads,
    /// Cancelled when this incarnation is fenced or replaced.
    pub fenced: CancellationToken,
    /// Cancelled when the gateway stops: live reads (long polls, SSE) end.
    pub stopping: CancellationToken,
    /// Set at a stop request: readiness fails (SD-CS-2).
    pub terminating: std::sync::atomic::AtomicBool,
    /// Work a request leaves running (an SSE subscription's pump), waited for with the
    /// requests in drain-support.
    pub tasks: tokio_util::task::TaskTracker,
    /// Client quotas metered on what this gateway serves (issue 59).
    pub quotas: crate::quotas::Quotas,
}

impl Gateway {
    pub fn is_terminating(&self) -> bool {
        self.terminating.load(std::sync::atomic::Ordering::Acquire) || self.stopping.is_cancelled()
    }

    /// Waits until the view has applied everything the log had committed when this was
    /// called (a quorum read), so what it shows is current as of the request: a delete
    /// names the incarnation the user meant from it.
    pub async fn catch_up(&self) -> Result<(), weir_meta::ClientError> {
        let index = self.metad.linearizable_read().await?;
        tokio::time::timeout(self.metad.timeout(), self.routes.view().wait_applied(index))
            .await
            .map_err(|_| {
                weir_meta::ClientError::Unavailable(format!(
                    "this gateway's metadata view did not reach log index {index} within {:?}",
                    self.metad.timeout()
                ))
            })
    }

    /// Waits (bounded) until the view has applied a change this gateway made, so the
    /// caller's next request sees it.
    pub async fn settle(&self, index: u64) {
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            self.routes.view().wait_applied(index),
        )
        .await;
    }
}

/// Who made a request (the token's name, or `anonymous` without auth) and what its
/// token's scopes grant; metadata changes are proposed in their name.
#[derive(Clone, Debug)]
pub struct Principal {
    pub name: String,
    pub grants: Grants,
}

impl Principal {
    pub fn anonymous() -> Self {
        Principal {
            name: weir_meta::model::names::ANONYMOUS.into(),
            grants: Grants::everything(),
        }
    }

    pub fn proposer(&self) -> Proposer {
        Proposer::Operator {
            principal: self.name.clone(),
        }
    }

    /// 403 unless the caller's scopes and the cluster's ACLs allow `op` on stream
    /// `name` (a stream is a topic to an ACL, as it is to a Kafka client).
    pub fn require(&self, op: Operation, name: &str) -> Result<(), ApiError> {
        if self.grants.allows(op, Resource::Topic(name)) {
            return Ok(());
        }
        Err(ApiError::new(
            weir_shared::error_code::ErrorCode::Forbidden,
            format!(
                "user '{}' may not {op} stream '{name}': no scope of its token or ACL allows it, or an ACL denies it",
                self.name
            ),
        ))
    }
}

/// The OpenAPI document of this API (kept in `docs/api/openapi.json`).
const OPENAPI: &str = include_str!("../../../docs/api/openapi.json");

pub fn router(gw: Arc<Gateway>) -> Router {
    let api = Router::new()
        .route("/v1/streams", get(streams::list).post(streams::create))
        .route("/v1/streams/{name}", get(streams::describe).delete(streams::delete))
        .route(
            "/v1/streams/{name}/records",
            get(get_records::read_or_subscribe).post(append::append),
        )
        .route("/v1/streams/{name}/records/tail", get(read::tail))
        .route("/v1/streams/{name}/trim", post(trim::trim))
        .route("/v1/admin/tokens", get(tokens::list).post(tokens::issue))
        .route("/v1/admin/tokens/{name}", delete(tokens::revoke))
        .route("/admin/nodes", get(health::nodes))
        .route("/admin/nodes/{node}/cordon", post(nodes::cordon))
        .route("/admin/nodes/{node}/uncordon", post(nodes::uncordon))
        .route("/admin/nodes/{node}/drain", post(nodes::drain))
        .route("/v1/admin/streams/{name}/transfer", post(nodes::transfer))
        // Inside authentication: quotas are metered on the token's user.
        .route_layer(middleware::from_fn_with_state(gw.clone(), quotas::enforce))
        .route_layer(middleware::from_fn_with_state(gw.clone(), auth::require_token))
        // Outermost: tokens are checked against the view too.
        .route_layer(middleware::from_fn_with_state(
            gw.clone(),
            catching_up::refuse_until_admitted,
        ));
    Router::new()
        .route("/livez", get(health::livez))
        .route("/readyz", get(health::readyz))
        .route("/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
        .route(
            "/v1/openapi.json",
            get(|| async { ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI) }),
        )
        .merge(api)
        .fallback(|| async {
            ApiError::not_found("no such endpoint; see /v1/openapi.json for the API").into_response()
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "method not allowed on this endpoint; see /v1/openapi.json",
            )
            .into_response()
        })
        .layer(DefaultBodyLimit::max(gw.max_body_bytes))
        .layer(middleware::from_fn_with_state(gw.clone(), count_requests))
        .with_state(gw)
}

/// OBS: requests by route, method and status, and their latency.
async fn count_requests(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().to_string();
    let started = std::time::Instant::now();
    let _in_flight = in_flight::InFlight::new();
    let response = next.run(in_flight::track_body(req, &gw.stopping)).await;
    let m = crate::metrics::metrics();
    m.http_requests
        .with_label_values(&[&route, &method, response.status().as_str()])
        .inc();
    m.http_latency
        .with_label_values(&[&route, &method])
        .observe(started.elapsed().as_secs_f64());
    response
}
