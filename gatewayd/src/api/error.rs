//! The HTTP API's one error type, always as JSON. Its status and JSON code come from the
//! system's error-code table (`weir_shared::error_code`), so they cannot disagree; every
//! source of errors (routing, streamd's `x-weir-error` codes, metad's refusals, request
//! parsing) maps to a code here.

use crate::route::RouteError;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use weir_meta::client::ClientError;
use weir_meta::model::Rejection;
use weir_shared::error_code::ErrorCode;

/// An HTTP API error: a code of the system's one table (which fixes the status and
/// the JSON `code`), a message a person can act on, and optional extra JSON fields.
#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// Extra JSON fields (for example the stream's `tail` on a read past it).
    pub details: Option<serde_json::Value>,
    /// A shutdown refusal (this gateway, or the stream's owner, is stopping): no retry
    /// delay (SD-INT-8), since the retry belongs elsewhere at once, not here later.
    pub stopping: bool,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: None,
            stopping: false,
        }
    }

    /// SD-INT-8: what a request still open when the gateway stops is answered.
    pub fn stopping(message: impl Into<String>) -> Self {
        Self {
            stopping: true,
            ..Self::new(ErrorCode::Unavailable, message)
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unavailable, message)
    }

    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut body = json!({ "error": { "code": self.code.api_code(), "message": self.message } });
        if let (Some(serde_json::Value::Object(extra)), Some(err)) = (self.details, body["error"].as_object_mut()) {
            err.extend(extra);
        }
        let mut response = (status, Json(body)).into_response();
        if self.code.is_retryable() && !self.stopping {
            // Every retryable error is transient: the stream moves, recovers or the quorum returns.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Routing failures and streamd's refusals; an owner's shutdown refusal is passed on
/// with no retry delay (SD-INT-8).
impl From<RouteError> for ApiError {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::Draining { .. } => ApiError::stopping(e.to_string()),
            e => ApiError::new(e.code(), e.to_string()),
        }
    }
}

/// metad's refusals of a proposal.
impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        ApiError::new(r.code.into(), r.message)
    }
}

/// FO-MDO-5: a metadata change during an outage is a retryable 503.
impl From<ClientError> for ApiError {
    fn from(e: ClientError) -> Self {
        let code = e.code();
        match e {
            ClientError::Unavailable(m) => ApiError::unavailable(format!(
                "the metadata quorum is unavailable ({m}); metadata changes are refused until it returns"
            )),
            ClientError::Invalid(m)
            | ClientError::NotFound(m)
            | ClientError::Conflict(m)
            | ClientError::Malformed(m)
            | ClientError::Denied(m)
            | ClientError::StorageFull(m) => ApiError::new(code, m),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let status = r.status();
        let text = r.body_text();
        match r {
            _ if text.contains(super::in_flight::BODY_CUT_AT_STOP) => ApiError::stopping(text),
            _ if status == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                ErrorCode::TooLarge,
                "request body is over the gateway's --max-body-bytes limit",
            ),
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "send the body as JSON with 'Content-Type: application/json'",
            ),
            JsonRejection::JsonSyntaxError(_) => ApiError::invalid(format!("malformed JSON: {text}")),
            _ => ApiError::invalid(text),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::invalid(format!("bad query parameters: {}", r.body_text()))
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::invalid(r.body_text())
    }
}
