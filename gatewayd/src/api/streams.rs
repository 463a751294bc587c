//! Stream admin: create, list (prefix and paging), describe, delete. Changes go
//! through the metadata log; listings and descriptions come from the gateway's view.

use super::error::ApiError;
use super::{Gateway, Principal};
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::Resource;
use weir_meta::model::{Applied, Command, StreamConfig, StreamRow, StreamState};
use weir_proto::streamd::StatusRequest;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigBody {
    /// Records older than this are trimmed; absent keeps everything.
    #[serde(default)]
    retention_ms: Option<u64>,
    /// The oldest records are trimmed while the rest hold at least this many bytes.
    #[serde(default)]
    retention_bytes: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    stream: String,
    #[serde(default)]
    config: Option<ConfigBody>,
}

fn state_name(s: StreamState) -> &'static str {
    match s {
        StreamState::Closed => "closed",
        StreamState::Open => "open",
        StreamState::Deleted => "deleted",
    }
}

/// A stream as its row has it (`tail` added by `describe` when the owner answers).
pub fn stream_json(row: &StreamRow) -> Value {
    json!({
        "name": row.name,
        "id": row.id.0,
        "state": state_name(row.state),
        "owner": row.owner.as_ref().map(|o| json!({"node": o.node, "epoch": o.epoch.0})),
        "stream_epoch": row.epoch.0,
        "transfer_target": row.transfer_target,
        "start_seq_num": row.start_offset.0,
        "committed_seq_num": row.committed_end.0,
        "topic": row.topic,
        "partition": row.partition,
        "config": {"retention_ms": row.config.retention_ms, "retention_bytes": row.config.retention_bytes},
    })
}

pub async fn create(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Principal>,
    body: Result<Json<CreateBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    weir_meta::model::validate_name("stream", &body.stream).map_err(ApiError::from)?;
    who.require(Operation::Create, &body.stream)?;
    let config = body.config.map_or_else(StreamConfig::default, |c| StreamConfig {
        retention_ms: c.retention_ms,
        retention_bytes: c.retention_bytes,
        ..StreamConfig::default()
    });
    let (index, outcome) = gw
        .metad
        .propose(
            &who.proposer(),
            Command::CreateStream {
                name: body.stream.clone(),
                config,
            },
        )
        .await?;
    match outcome? {
        Applied::StreamCreated { .. } => {}
        other => {
            return Err(ApiError::unavailable(format!(
                "unexpected answer to CreateStream: {other:?}"
            )))
        }
    }
    gw.settle(index).await;
    let row = gw
        .routes
        .stream(&body.stream)
        .ok_or_else(|| ApiError::unavailable("stream created but already gone from the view; retry"))?;
    Ok((StatusCode::CREATED, Json(stream_json(&row))).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    prefix: String,
    /// Names strictly after this one (the last name of the previous page).
    #[serde(default)]
    start_after: String,
    #[serde(default)]
    limit: Option<usize>,
}

pub const MAX_LIST: usize = 1000;

pub async fn list(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Principal>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = query?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_LIST).contains(&limit) {
        return Err(ApiError::invalid(format!("limit must be 1 to {MAX_LIST}, got {limit}")));
    }
    let (page, has_more) = gw.routes.view().with(|s| {
        use std::ops::Bound;
        // From the later of the prefix and the previous page's last name, and no
        // further than the prefix reaches: a page visits the names it may show.
        let start = if q.start_after.is_empty() || q.start_after < q.prefix {
            Bound::Included(q.prefix.clone())
        } else {
            Bound::Excluded(q.start_after.clone())
        };
        let mut names = s
            .streams
            .names()
            .range((start, Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(&q.prefix))
            // A token sees the streams it may read.
            .filter(|(name, _)| who.grants.allows(Operation::Describe, Resource::Topic(name)))
            .filter_map(|(_, id)| s.streams.get(id));
        let page: Vec<Value> = names.by_ref().take(limit).map(stream_json).collect();
        (page, names.next().is_some())
    });
    Ok(Json(json!({ "streams": page, "has_more": has_more })))
}

pub async fn describe(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    who.require(Operation::Describe, &name)?;
    let row = gw
        .routes
        .stream(&name)
        .ok_or_else(|| ApiError::not_found(format!("stream '{name}' does not exist")))?;
    let mut out = stream_json(&row);
    if row.state == StreamState::Open {
        let status = gw
            .routes
            .call(&name, true, |mut c| {
                let stream = name.clone();
                async move { c.status(StatusRequest { stream }).await }
            })
            .await;
        if let Ok(status) = status {
            out["tail"] = json!(status.end_offset);
            out["start_seq_num"] = json!(status.start_offset);
        }
    }
    Ok(Json(out))
}

pub async fn delete(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    who.require(Operation::Delete, &name)?;
    // By id, so a proposal that lands after its caller gave up (delayed in a paused
    // replica or on a slow link) cannot delete a stream of that name created since.
    gw.catch_up().await?;
    let id = gw
        .routes
        .view()
        .with(|s| s.stream_by_name(&name).map(|row| row.id))
        .ok_or_else(|| ApiError::not_found(format!("stream '{name}' does not exist")))?;
    let command = Command::DeleteStream {
        name: name.clone(),
        id: Some(id),
    };
    let (index, outcome) = gw.metad.propose(&who.proposer(), command).await?;
    outcome?;
    gw.settle(index).await;
    Ok((StatusCode::ACCEPTED, Json(json!({"name": name, "state": "deleted"}))).into_response())
}
