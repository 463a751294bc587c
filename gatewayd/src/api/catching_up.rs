//! RR-FEN-2, RR-FEN-3: until this gateway has caught up with the metadata log, no API
//! request is answered from its view, which may be stale or empty: each gets a
//! retryable 503 (`unavailable`, with `Retry-After`) rather than a 404, an empty list
//! or a refused token. Health and metrics stay served.

use super::error::ApiError;
use super::Gateway;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

pub async fn refuse_until_admitted(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    if !gw.routes.is_admitted() {
        return ApiError::unavailable("this gateway is catching up with the metadata log; retry").into_response();
    }
    next.run(req).await
}
