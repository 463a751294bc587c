//! `POST /v1/streams/{name}/records`: a batch of records, acknowledged with its offsets
//! once durable in the owner's WAL. `match_seq_num` makes it conditional; an
//! idempotency key (body field or `Idempotency-Key` header) makes a retry apply once.

use super::error::ApiError;
use super::Gateway;
use crate::records::{encode_batch, AppendRecord, Format, ProducerStamp};
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use weir_proto::streamd::AppendRequest;
use weir_shared::error_code::ErrorCode;

/// Most records one append may carry.
pub const MAX_RECORDS: usize = 10_000;
/// Longest idempotency key.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppendBody {
    records: Vec<AppendRecord>,
    /// Apply only if the stream's next sequence number is this.
    #[serde(default)]
    match_seq_num: Option<u64>,
    #[serde(default)]
    idempotency_key: Option<String>,
}

impl AppendBody {
    pub fn records(&self) -> &[AppendRecord] {
        &self.records
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatQuery {
    #[serde(default)]
    pub format: Option<String>,
}

/// The record format from `?format=` or the `weir-format` header (query wins).
pub fn request_format(query: &FormatQuery, headers: &HeaderMap) -> Result<Format, ApiError> {
    let from_header = headers
        .get("weir-format")
        .map(|v| v.to_str().unwrap_or("?").to_string());
    match query.format.clone().or(from_header) {
        None => Ok(Format::Raw),
        Some(f) => Format::parse(&f).map_err(ApiError::invalid),
    }
}

fn idempotency_key(body: Option<String>, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let header = headers
        .get("idempotency-key")
        .map(|v| {
            v.to_str()
                .map(str::to_string)
                .map_err(|_| ApiError::invalid("Idempotency-Key must be visible ASCII"))
        })
        .transpose()?;
    let key = match (body, header) {
        (Some(b), Some(h)) if b != h => {
            return Err(ApiError::invalid(
                "idempotency_key in the body and the Idempotency-Key header differ",
            ))
        }
        (b, h) => b.or(h),
    };
    if let Some(k) = &key {
        if k.is_empty() || k.len() > MAX_IDEMPOTENCY_KEY {
            return Err(ApiError::invalid(format!(
                "idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY} bytes"
            )));
        }
    }
    Ok(key)
}

pub async fn append(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<super::Principal>,
    Path(name): Path<String>,
    query: Result<Query<FormatQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Json<AppendBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    who.require(weir_meta::model::acls::Operation::Write, &name)?;
    let Query(query) = query?;
    let format = request_format(&query, &headers)?;
    let Json(body) = body?;
    if crate::kafka::brokers::is_internal_stream(&name) {
        return Err(ApiError::invalid(format!(
            "stream '{name}' is internal (consumer-group offsets); it is written only by group commits"
        )));
    }
    if body.records.is_empty() {
        return Err(ApiError::invalid("records must hold at least one record"));
    }
    if body.records.len() > MAX_RECORDS {
        return Err(ApiError::invalid(format!(
            "an append holds at most {MAX_RECORDS} records, got {}",
            body.records.len()
        )));
    }
    let key = idempotency_key(body.idempotency_key, &headers)?;
    // A keyed append is an idempotent batch: a retry is answered with the original offsets.
    let stamp = key.as_deref().map(|k| ProducerStamp {
        producer_id: weir_shared::batch::idempotency_producer_id(k),
        producer_epoch: 0,
        base_sequence: 0,
    });
    let batches = encode_batch(&body.records, format, stamp).map_err(ApiError::invalid)?;
    if batches.len() > gw.max_body_bytes {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!(
                "the records encode to {} bytes, over the {} byte limit",
                batches.len(),
                gw.max_body_bytes
            ),
        ));
    }
    let started = std::time::Instant::now();
    let reply = gw
        .routes
        .call(&name, key.is_some(), |mut c| {
            let request = AppendRequest {
                stream: name.clone(),
                batches: batches.clone(),
                match_next_offset: body.match_seq_num,
                transactional_id: None,
            };
            async move { c.append(request).await }
        })
        .await;
    let m = crate::metrics::metrics();
    m.append_latency.observe(started.elapsed().as_secs_f64());
    let reply = reply.inspect_err(|_| m.appends.with_label_values(&["error"]).inc())?;
    m.appends.with_label_values(&["ok"]).inc();
    m.appended_records.inc_by(body.records.len() as u64);
    Ok(Json(json!({
        "start_seq_num": reply.base_offset,
        "end_seq_num": reply.end_offset,
        "stream_epoch": reply.stream_epoch,
    })))
}
