//! The HTTP API's one error type: a status, a stable code and a message a person can act
//! on, always as JSON. Every source of errors (routing, streamd's `x-weir-error` codes,
//! metad's rejections, request parsing) maps to it here, in one table each.

use crate::route::{error_code, RouteError};
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use weir_metad::client::ClientError;
use weir_metad::model::{RejectCode, Rejection};

/// The stable codes of the HTTP API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Unavailable,
    NotFound,
    InvalidArgument,
    Conflict,
    Unauthorized,
    TooLarge,
    /// Only for faults of the gateway or its peers (5xx), never for a bad request.
    Internal,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Unavailable => "unavailable",
            Code::NotFound => "not_found",
            Code::InvalidArgument => "invalid_argument",
            Code::Conflict => "conflict",
            Code::Unauthorized => "unauthorized",
            Code::TooLarge => "too_large",
            Code::Internal => "internal",
        }
    }
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: Code,
    pub message: String,
    /// Extra JSON fields (for example the stream's `tail` on a read past it).
    pub details: Option<serde_json::Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: Code, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, Code::NotFound, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable, message)
    }

    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(details);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": { "code": self.code.as_str(), "message": self.message } });
        if let (Some(serde_json::Value::Object(extra)), Some(err)) = (self.details, body["error"].as_object_mut()) {
            err.extend(extra);
        }
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            // Every 503 here is transient: the stream moves, recovers or the quorum returns.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// streamd's `x-weir-error` codes, and routing failures.
impl From<RouteError> for ApiError {
    fn from(e: RouteError) -> Self {
        let message = e.to_string();
        match e {
            RouteError::NotFound(_) => ApiError::not_found(message),
            RouteError::NoOwner { .. } | RouteError::CatchingUp | RouteError::Unknown(_) => {
                ApiError::unavailable(message)
            }
            RouteError::Streamd(status) => match error_code(&status) {
                Some("not_owner" | "fenced" | "unavailable" | "wal_full") => ApiError::unavailable(message),
                Some("not_found") => ApiError::not_found(message),
                Some("invalid_argument") => ApiError::invalid(message),
                Some("offset_mismatch") => ApiError::new(StatusCode::CONFLICT, Code::Conflict, message),
                Some("invalid_producer_epoch" | "out_of_order_sequence") => {
                    ApiError::new(StatusCode::CONFLICT, Code::Conflict, message)
                }
                Some("offset_out_of_range") => {
                    ApiError::new(StatusCode::RANGE_NOT_SATISFIABLE, Code::InvalidArgument, message)
                }
                Some(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, Code::Internal, message),
                None => match status.code() {
                    tonic::Code::ResourceExhausted | tonic::Code::OutOfRange => {
                        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, Code::TooLarge, message)
                    }
                    _ => ApiError::unavailable(message),
                },
            },
        }
    }
}

/// metad's refusals of a proposal.
impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        match r.code {
            RejectCode::NotFound => ApiError::not_found(r.message),
            RejectCode::AlreadyExists | RejectCode::Conflict => {
                ApiError::new(StatusCode::CONFLICT, Code::Conflict, r.message)
            }
            RejectCode::InvalidArgument => ApiError::invalid(r.message),
            RejectCode::NotReady
            | RejectCode::Fenced
            | RejectCode::Superseded
            | RejectCode::UnknownNode
            | RejectCode::NotOwner => ApiError::unavailable(r.message),
        }
    }
}

/// FO-MDO-5: a metadata change during an outage is a retryable 503.
impl From<ClientError> for ApiError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Unavailable(m) => ApiError::unavailable(format!(
                "the metadata quorum is unavailable ({m}); metadata changes are refused until it returns"
            )),
            ClientError::Invalid(m) => ApiError::invalid(m),
            ClientError::NotFound(m) => ApiError::not_found(m),
            ClientError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, Code::Conflict, m),
            ClientError::Malformed(m) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, Code::Internal, m),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let status = r.status();
        let text = r.body_text();
        match r {
            _ if status == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                Code::TooLarge,
                "request body is over the gateway's --max-body-bytes limit",
            ),
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Code::InvalidArgument,
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
