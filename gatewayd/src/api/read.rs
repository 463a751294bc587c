//! Reading a page of records: from `seq_num`, at most `count` records and about
//! `bytes` bytes, waiting up to `wait` seconds for new ones at the tail (long poll).
//! Both the GET route (`get_records`) and a subscription (`sse`) read through it.
//! `GET .../records/tail` gives the next sequence number.

use super::append::{request_format, FormatQuery};
use super::error::ApiError;
use super::Gateway;
use crate::records::{decode_batches, Format, ReadRecord};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use weir_meta::model::acls::Operation;
use weir_proto::streamd::{ReadRequest, StatusRequest};
use weir_shared::error_code::ErrorCode;
use weir_shared::inflate::InflateError;

pub const MAX_COUNT: usize = 1000;
pub const MAX_BYTES: usize = 8 << 20;
pub const MAX_WAIT_SEC: u64 = 60;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    #[serde(default)]
    pub seq_num: Option<u64>,
    #[serde(default)]
    pub count: Option<usize>,
    #[serde(default)]
    pub bytes: Option<usize>,
    #[serde(default)]
    pub wait: Option<u64>,
    #[serde(default)]
    pub format: Option<String>,
}

/// A read's validated limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub count: usize,
    pub bytes: usize,
    pub wait_ms: u32,
    pub format: Format,
}

impl ReadQuery {
    pub fn limits(&self, headers: &HeaderMap) -> Result<Limits, ApiError> {
        let count = self.count.unwrap_or(MAX_COUNT);
        if !(1..=MAX_COUNT).contains(&count) {
            return Err(ApiError::invalid(format!(
                "count must be 1 to {MAX_COUNT}, got {count}"
            )));
        }
        let bytes = self.bytes.unwrap_or(1 << 20);
        if !(1..=MAX_BYTES).contains(&bytes) {
            return Err(ApiError::invalid(format!(
                "bytes must be 1 to {MAX_BYTES}, got {bytes}"
            )));
        }
        let wait = self.wait.unwrap_or(0);
        if wait > MAX_WAIT_SEC {
            return Err(ApiError::invalid(format!(
                "wait must be 0 to {MAX_WAIT_SEC} seconds, got {wait}"
            )));
        }
        let format = request_format(
            &FormatQuery {
                format: self.format.clone(),
            },
            headers,
        )?;
        Ok(Limits {
            count,
            bytes,
            wait_ms: (wait * 1000) as u32,
            format,
        })
    }
}

/// One read's answer.
pub struct Page {
    pub records: Vec<ReadRecord>,
    pub next_seq_num: u64,
    pub tail: u64,
}

/// Reads from `from`; a start below the stream's first retained record reads from
/// that record, a start past the tail is `416` with the tail in the error.
pub async fn read_page(gw: &Gateway, name: &str, from: u64, limits: Limits) -> Result<Page, ApiError> {
    let mut from = from;
    for _ in 0..2 {
        let reply = gw
            .routes
            .read_waiting(name, Duration::from_millis(limits.wait_ms.into()), |mut c| {
                let request = ReadRequest {
                    stream: name.to_string(),
                    offset: from,
                    max_bytes: limits.bytes as u32,
                    wait_ms: limits.wait_ms,
                    exact_max_bytes: false,
                    read_committed: false,
                };
                async move { c.read(request).await }
            })
            .await;
        match reply {
            Ok(reply) => {
                let records = decode_batches(
                    reply.batches,
                    from,
                    limits.count,
                    limits.format,
                    gw.max_decompressed_bytes,
                )
                .map_err(|e| match e {
                    InflateError::TooLarge { .. } => ApiError::new(ErrorCode::TooLarge, e.to_string()),
                    InflateError::Invalid(_) => {
                        ApiError::new(ErrorCode::Internal, format!("cannot decode stored batches: {e}"))
                    }
                })?;
                let next_seq_num = match records.last() {
                    Some(last) if records.len() == limits.count => last.seq_num + 1,
                    _ => reply.next_offset.max(from),
                };
                return Ok(Page {
                    records,
                    next_seq_num,
                    tail: reply.end_offset,
                });
            }
            Err(e) if e.code() == ErrorCode::OffsetOutOfRange => {
                let (start, tail) = range(gw, name).await?;
                if from < start {
                    from = start;
                    continue;
                }
                return Err(ApiError::new(
                    ErrorCode::OffsetOutOfRange,
                    format!("seq_num {from} is past the stream's tail {tail}"),
                )
                .with_details(json!({ "tail": tail })));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::unavailable(
        "the stream's retained range moved during the read; retry",
    ))
}

/// The stream's first retained sequence number and its tail.
async fn range(gw: &Gateway, name: &str) -> Result<(u64, u64), ApiError> {
    let status = gw
        .routes
        .call(name, true, |mut c| {
            let stream = name.to_string();
            async move { c.status(StatusRequest { stream }).await }
        })
        .await?;
    Ok((status.start_offset, status.end_offset))
}

pub async fn tail(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<super::Principal>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    who.require(Operation::Read, &name)?;
    if gw.routes.stream(&name).is_none() {
        return Err(ApiError::not_found(format!("stream '{name}' does not exist")));
    }
    let (start, tail) = range(&gw, &name).await?;
    Ok(Json(json!({ "tail": tail, "start_seq_num": start })))
}
