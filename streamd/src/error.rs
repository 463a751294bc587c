//! streamd's error enum, by how a caller reacts, and its one mapping to gRPC.

use tonic::metadata::MetadataValue;

/// Why a data-plane call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StreamdError {
    /// This node does not own the stream (or not at that epoch); retry at `owner`.
    #[error("this node does not own stream '{stream}'{}", owner.as_ref().map(|o| format!("; its owner is {o}")).unwrap_or_default())]
    NotOwner { stream: String, owner: Option<String> },
    /// This node's incarnation is fenced; it stops.
    #[error("this node is fenced")]
    Fenced,
    /// The WAL is over `--wal-max-bytes` until uploads catch up; retry later (FO-MDO-7).
    #[error("write-ahead log is full ({0} bytes); retry later")]
    WalFull(u64),
    #[error("offset {offset} is outside the stream's range {start}..{end}")]
    OffsetOutOfRange { offset: u64, start: u64, end: u64 },
    #[error("stream '{0}' does not exist")]
    NotFound(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// `match_next_offset` did not match.
    #[error("stream's next offset is {actual}, not {expected}")]
    OffsetMismatch { expected: u64, actual: u64 },
    /// An idempotent producer's epoch is older than the stream has seen.
    #[error("{0}")]
    InvalidProducerEpoch(String),
    /// An idempotent producer's sequence has a gap or goes backwards.
    #[error("{0}")]
    OutOfOrderSequence(String),
    /// Transient: retry.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Stored data failed a check (corrupt object or WAL).
    #[error("corrupt data: {0}")]
    Corrupt(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl StreamdError {
    /// The stable code carried in `x-weir-error`.
    pub fn code(&self) -> &'static str {
        match self {
            StreamdError::NotOwner { .. } => "not_owner",
            StreamdError::Fenced => "fenced",
            StreamdError::WalFull(_) => "wal_full",
            StreamdError::OffsetOutOfRange { .. } => "offset_out_of_range",
            StreamdError::NotFound(_) => "not_found",
            StreamdError::InvalidArgument(_) => "invalid_argument",
            StreamdError::OffsetMismatch { .. } => "offset_mismatch",
            StreamdError::InvalidProducerEpoch(_) => "invalid_producer_epoch",
            StreamdError::OutOfOrderSequence(_) => "out_of_order_sequence",
            StreamdError::Unavailable(_) => "unavailable",
            StreamdError::Corrupt(_) => "corrupt",
            StreamdError::Internal(_) => "internal",
        }
    }
}

impl From<StreamdError> for tonic::Status {
    fn from(e: StreamdError) -> Self {
        let code = match &e {
            StreamdError::NotOwner { .. } | StreamdError::Fenced | StreamdError::Unavailable(_) => {
                tonic::Code::Unavailable
            }
            StreamdError::WalFull(_) => tonic::Code::ResourceExhausted,
            StreamdError::OffsetOutOfRange { .. } => tonic::Code::OutOfRange,
            StreamdError::NotFound(_) => tonic::Code::NotFound,
            StreamdError::InvalidArgument(_) => tonic::Code::InvalidArgument,
            StreamdError::OffsetMismatch { .. }
            | StreamdError::InvalidProducerEpoch(_)
            | StreamdError::OutOfOrderSequence(_) => tonic::Code::FailedPrecondition,
            StreamdError::Corrupt(_) => tonic::Code::DataLoss,
            StreamdError::Internal(_) => tonic::Code::Internal,
        };
        let mut status = tonic::Status::new(code, e.to_string());
        status
            .metadata_mut()
            .insert("x-weir-error", MetadataValue::from_static(e.code()));
        if let StreamdError::NotOwner { owner: Some(owner), .. } = &e {
            if let Ok(v) = MetadataValue::try_from(owner.as_str()) {
                status.metadata_mut().insert("x-weir-owner", v);
            }
        }
        status
    }
}

/// Reads the stable code back from a status (gatewayd, tests).
pub fn error_code(status: &tonic::Status) -> Option<&str> {
    status.metadata().get("x-weir-error").and_then(|v| v.to_str().ok())
}
