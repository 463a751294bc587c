//! API tokens: issued and revoked through the metadata log by an admin; the secret is
//! shown once, only its SHA-256 is stored.

use super::auth::secret_hash;
use super::error::ApiError;
use super::{Gateway, Principal};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use rand::RngCore;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use weir_meta::model::Command;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssueBody {
    name: String,
    #[serde(default)]
    scopes: Vec<String>,
    /// Seconds until the token stops authenticating; it never does without.
    #[serde(default)]
    ttl_sec: Option<u64>,
}

/// Most a token's `ttl_sec` may be: ten years.
pub const MAX_TTL_SEC: u64 = 10 * 365 * 24 * 3600;

/// When a token issued now with `ttl_sec` expires (Unix ms); `None` without one.
pub fn expiry(ttl_sec: Option<u64>) -> Result<Option<u64>, String> {
    match ttl_sec {
        None => Ok(None),
        Some(0) => Err("ttl_sec must be at least 1".into()),
        Some(t) if t > MAX_TTL_SEC => Err(format!("ttl_sec must be at most {MAX_TTL_SEC} (ten years)")),
        Some(t) => Ok(Some(super::auth::now_ms() + t * 1000)),
    }
}

/// A fresh secret: 32 random bytes, hex, with a prefix that makes it recognisable.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("weir_{}", hex::encode(bytes))
}

pub async fn issue(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Principal>,
    body: Result<Json<IssueBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    weir_meta::model::scopes::Scopes::parse(&body.scopes).map_err(ApiError::invalid)?;
    let expires_at_ms = expiry(body.ttl_sec).map_err(ApiError::invalid)?;
    let secret = new_secret();
    let (index, outcome) = gw
        .metad
        .propose(
            &who.proposer(),
            Command::IssueToken {
                name: body.name.clone(),
                secret_sha256: secret_hash(&secret),
                scram: Some(weir_meta::scram::credentials(&secret)),
                scopes: body.scopes.clone(),
                expires_at_ms,
            },
        )
        .await?;
    outcome?;
    gw.settle(index).await;
    Ok((
        StatusCode::CREATED,
        Json(json!({"name": body.name, "token": secret, "scopes": body.scopes, "expires_at_ms": expires_at_ms})),
    )
        .into_response())
}

pub async fn list(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let tokens: Vec<Value> = gw.routes.view().with(|s| {
        s.tokens
            .values()
            .map(|t| {
                json!({
                    "name": t.name,
                    "scopes": t.scopes,
                    "revoked": t.revoked,
                    "issued_index": t.issued_index,
                    "expires_at_ms": t.expires_at_ms,
                })
            })
            .collect()
    });
    Json(json!({ "tokens": tokens }))
}

/// Revokes a token; answered once this gateway refuses it.
pub async fn revoke(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (index, outcome) = gw
        .metad
        .propose(&who.proposer(), Command::RevokeToken { name: name.clone() })
        .await?;
    outcome?;
    gw.settle(index).await;
    Ok(Json(json!({"name": name, "revoked": true})))
}
