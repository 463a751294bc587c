//! Server-sent events: one `record` event per record, its `id` the record's sequence
//! number, so a client that reconnects with `Last-Event-ID` resumes right after the
//! last record it saw. The subscription follows the stream across owner moves and
//! ends with an `error` event when the stream is deleted or the gateway stops.

use super::error::ApiError;
use super::read::{read_page, Limits, ReadQuery};
use super::Gateway;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;
use weir_shared::error_code::ErrorCode;

/// Long-poll time of each read behind a subscription.
const POLL_MS: u32 = 25_000;

pub fn subscribe(
    gw: Arc<Gateway>,
    name: String,
    query: ReadQuery,
    limits: Limits,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    if gw.routes.stream(&name).is_none() {
        return Err(ApiError::not_found(format!("stream '{name}' does not exist")));
    }
    let resume = headers
        .get("last-event-id")
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                // The next sequence number must exist too (issue 19).
                .filter(|id| *id < u64::MAX)
                .ok_or_else(|| ApiError::invalid("Last-Event-ID must be a sequence number below 2^64 - 1"))
        })
        .transpose()?;
    let slot = gw.live_reads.subscription()?;
    let start = resume.map(|id| id + 1).or(query.seq_num).unwrap_or(0);
    // `count` bounds the whole subscription when given.
    let total = query.count;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(64);
    gw.tasks.clone().spawn(async move {
        pump(gw, name, start, total, limits, tx).await;
        drop(slot);
    });
    Ok(Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

async fn pump(
    gw: Arc<Gateway>,
    name: String,
    mut next: u64,
    total: Option<usize>,
    limits: Limits,
    tx: tokio::sync::mpsc::Sender<Result<Event, Infallible>>,
) {
    let mut sent = 0usize;
    let limits = Limits {
        wait_ms: POLL_MS,
        ..limits
    };
    loop {
        let page = tokio::select! {
            _ = tx.closed() => return,
            _ = gw.stopping.cancelled() => {
                let _ = tx.send(Ok(error_event(ErrorCode::Unavailable, "the gateway is stopping; reconnect with Last-Event-ID"))).await;
                return;
            }
            p = read_page(&gw, &name, next, limits) => p,
        };
        match page {
            Ok(page) => {
                for record in page.records {
                    let id = record.seq_num;
                    let event = Event::default()
                        .event("record")
                        .id(id.to_string())
                        .json_data(&record)
                        .unwrap_or_else(|_| Event::default().event("record").id(id.to_string()));
                    if tx.send(Ok(event)).await.is_err() {
                        return;
                    }
                    sent += 1;
                    if total.is_some_and(|t| sent >= t) {
                        return;
                    }
                }
                next = page.next_seq_num;
            }
            // Damaged data is terminal: retrying would read the same damage forever.
            Err(e) if e.code == ErrorCode::Corrupt => {
                let _ = tx.send(Ok(error_event(e.code, &e.message))).await;
                return;
            }
            Err(e) if e.status().is_server_error() => {
                // No owner for now (moving, recovering): keep the subscription and retry.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                let _ = tx.send(Ok(error_event(e.code, &e.message))).await;
                return;
            }
        }
    }
}

fn error_event(code: ErrorCode, message: &str) -> Event {
    Event::default()
        .event("error")
        .data(json!({"error": {"code": code.api_code(), "message": message}}).to_string())
}
