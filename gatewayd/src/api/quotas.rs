//! Client quotas on HTTP (issue 59): the same quotas as Kafka, metered on the token's
//! user and the `X-Client-Id` header (empty without). Appends are metered by their
//! body's bytes, record reads by their answer's; other requests by the time they take.
//! A request that arrives while its user or client owes time is answered `429` with
//! `Retry-After` (whole seconds) and does nothing.

use super::error::ApiError;
use super::{Gateway, Principal};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use std::sync::Arc;
use std::time::Instant;
use weir_meta::model::quotas::QuotaKey;
use weir_shared::error_code::ErrorCode;

/// The header naming an HTTP client for its quotas, as Kafka's client id does.
pub const CLIENT_ID: &str = "x-client-id";

pub async fn enforce(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let Some(who) = req.extensions().get::<Principal>().map(|p| p.name.clone()) else {
        return next.run(req).await;
    };
    let client_id = req
        .headers()
        .get(CLIENT_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let records = req.uri().path().ends_with("/records") || req.uri().path().ends_with("/records/tail");
    let (append, read) = (
        records && req.method() == Method::POST,
        records && req.method() == Method::GET,
    );
    let metered_by = match (append, read) {
        (true, _) => QuotaKey::ProducerByteRate,
        (_, true) => QuotaKey::ConsumerByteRate,
        _ => QuotaKey::RequestPercentage,
    };
    let owed = gw.quotas.owed(&[metered_by], &who, &client_id);
    if !owed.is_zero() {
        crate::metrics::metrics()
            .quota_throttle_ms
            .with_label_values(&["http"])
            .inc_by(owed.as_millis() as u64);
        let secs = owed.as_secs() + u64::from(owed.subsec_nanos() > 0);
        let mut response = ApiError::new(
            ErrorCode::TooManyRequests,
            format!(
                "user '{who}' (client id '{client_id}') is over its {} quota; retry in {} ms",
                metered_by.name(),
                owed.as_millis()
            ),
        )
        .into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        return response;
    }
    let sent = req.body().size_hint().exact().unwrap_or_else(|| content_length(&req));
    let started = Instant::now();
    let response = next.run(req).await;
    let used = match metered_by {
        QuotaKey::ProducerByteRate => sent as f64,
        // A subscription (SSE) has no size: it is metered on nothing.
        QuotaKey::ConsumerByteRate => response.body().size_hint().exact().unwrap_or(0) as f64,
        QuotaKey::RequestPercentage => started.elapsed().as_micros() as f64,
    };
    gw.quotas.charge(metered_by, &who, &client_id, used);
    response
}

fn content_length(req: &Request) -> u64 {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
