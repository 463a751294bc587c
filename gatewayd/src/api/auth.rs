//! Bearer-token authentication: with `--auth`, every API request carries a token issued
//! through the metadata log; only its SHA-256 is stored and compared.

use super::error::ApiError;
use super::{Gateway, Principal};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use weir_meta::model::grants::Grants;
use weir_shared::error_code::ErrorCode;

/// Hex SHA-256 of a token secret, as stored in the token row; and the clock token
/// expiry is judged against at every request (every second on a Kafka connection).
pub use weir_meta::model::rows::{now_ms, secret_sha256 as secret_hash};

fn unauthorized(message: impl Into<String>) -> Response {
    ApiError::new(ErrorCode::Unauthorized, message).into_response()
}

pub async fn require_token(State(gw): State<Arc<Gateway>>, mut req: Request, next: Next) -> Response {
    if !gw.auth {
        req.extensions_mut().insert(Principal::anonymous());
        return next.run(req).await;
    }
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return unauthorized("this gateway requires 'Authorization: Bearer <token>'");
    };
    let Some(secret) = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
    else {
        return unauthorized("the Authorization header must be 'Bearer <token>'");
    };
    let token = gw.routes.view().with(|s| s.token_by_secret(secret).cloned());
    let Some(token) = token else {
        return unauthorized("unknown token");
    };
    if let Some(why) = token.refusal(now_ms()) {
        return unauthorized(why);
    }
    // Judged against the ACLs as they are at this request, from the caller's address.
    let acls = gw.routes.view().with(|s| s.acls.clone());
    let mut grants = Grants::for_token(&token, acls);
    if let Some(ConnectInfo(peer)) = req.extensions().get::<ConnectInfo<std::net::SocketAddr>>() {
        grants = grants.at(peer.ip());
    }
    let path = req.uri().path();
    if (path.starts_with("/v1/admin/") || path.starts_with("/admin/")) && !grants.is_super() {
        return ApiError::new(
            ErrorCode::Forbidden,
            format!("token '{}' lacks the 'admin' scope this endpoint needs", token.name),
        )
        .into_response();
    }
    req.extensions_mut().insert(Principal {
        name: token.name,
        grants,
    });
    next.run(req).await
}
