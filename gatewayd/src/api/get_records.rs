//! `GET /v1/streams/{name}/records`: a page of records (`read`), or, with
//! `Accept: text/event-stream`, a subscription (`sse`). The one place that knows both.

use super::error::ApiError;
use super::read::{read_page, ReadQuery};
use super::Gateway;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde_json::json;
use std::sync::Arc;
use weir_meta::model::acls::Operation;

fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

pub async fn read_or_subscribe(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<super::Principal>,
    Path(name): Path<String>,
    query: Result<Query<ReadQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    who.require(Operation::Read, &name)?;
    let Query(query) = query?;
    let limits = query.limits(&headers)?;
    if wants_events(&headers) {
        return super::sse::subscribe(gw, name, query, limits, &headers);
    }
    if gw.routes.stream(&name).is_none() {
        return Err(ApiError::not_found(format!("stream '{name}' does not exist")));
    }
    let from = query.seq_num.unwrap_or(0);
    let page = if limits.wait_ms > 0 {
        let _slot = gw.live_reads.long_poll()?;
        // SD-CS-4: a long poll never holds a stop; it ends with the drain window.
        tokio::select! {
            page = read_page(&gw, &name, from, limits) => page?,
            _ = gw.stopping.cancelled() => {
                return Err(ApiError::stopping("the gateway is stopping; poll again through another gateway"))
            }
        }
    } else {
        read_page(&gw, &name, from, limits).await?
    };
    Ok(Json(json!({
        "records": page.records,
        "next_seq_num": page.next_seq_num,
        "tail": page.tail,
    }))
    .into_response())
}
