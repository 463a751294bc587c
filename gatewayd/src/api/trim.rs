//! `POST /v1/streams/{name}/trim`: advances the stream's first sequence number, as
//! Kafka's DeleteRecords does. Records below it are no longer served, and their data
//! objects leave the bucket once nothing references them. A trim never moves the start
//! back, so a retried or stale trim is harmless.

use super::error::ApiError;
use super::Gateway;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use weir_proto::streamd::TrimRequest;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrimBody {
    /// The new first sequence number; at most the stream's tail.
    seq_num: u64,
}

pub async fn trim(
    State(gw): State<Arc<Gateway>>,
    axum::Extension(who): axum::Extension<super::Principal>,
    Path(name): Path<String>,
    body: Result<Json<TrimBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    who.require(weir_meta::model::acls::Operation::Delete, &name)?;
    let Json(body) = body?;
    if gw.routes.stream(&name).is_none() {
        return Err(ApiError::not_found(format!("stream '{name}' does not exist")));
    }
    // Safe to send again: a trim applies at most once and never goes back.
    let reply = gw
        .routes
        .call(&name, true, |mut c| {
            let request = TrimRequest {
                stream: name.clone(),
                offset: body.seq_num,
            };
            async move { c.trim(request).await }
        })
        .await?;
    Ok(Json(json!({ "name": name, "start_seq_num": reply.start_offset })))
}
