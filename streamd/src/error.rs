//! streamd's error enum, by how a caller reacts, and its one mapping to the system's
//! error codes (and through them to gRPC).

use tonic::metadata::MetadataValue;
use weir_shared::error_code::ErrorCode;

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
    /// A volume is under its refuse mark, or the WAL found its disk full (issue 60):
    /// appends are refused until space returns; reads go on.
    #[error("insufficient storage: {0}; retry once space is freed")]
    StorageFull(String),
    #[error("offset {offset} is outside the stream's range {start}..{end}")]
    OffsetOutOfRange { offset: u64, start: u64, end: u64 },
    #[error("stream '{0}' does not exist")]
    NotFound(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// A request or batch over a configured limit.
    #[error("{0}")]
    TooLarge(String),
    /// `match_next_offset` did not match.
    #[error("stream's next offset is {actual}, not {expected}")]
    OffsetMismatch { expected: u64, actual: u64 },
    /// An idempotent producer's epoch is older than the stream has seen.
    #[error("{0}")]
    InvalidProducerEpoch(String),
    /// An idempotent producer's sequence has a gap or goes backwards.
    #[error("{0}")]
    OutOfOrderSequence(String),
    /// A transactional write outside its producer's ongoing transaction (KIP-890).
    #[error("{0}")]
    InvalidTxnState(String),
    /// Transient: retry.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A committed range's object is no longer in object storage: the range was
    /// replaced (compacted) since it was looked up. Retryable; the next read rereads
    /// the index.
    #[error("unavailable: object {0} is no longer stored; read again")]
    ObjectGone(String),
    /// The node stopped taking appends: it is shutting down and its streams move
    /// (SD-INT-1). Retryable like [`StreamdError::Unavailable`]; counted apart (OBS-15).
    #[error("unavailable: the node is shutting down; its streams are moving")]
    Draining,
    /// Stored data failed a check (corrupt object or WAL).
    #[error("corrupt data: {0}")]
    Corrupt(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl StreamdError {
    /// The system's code for this error (`weir_shared::error_code`), carried in `x-weir-error`.
    pub fn code(&self) -> ErrorCode {
        match self {
            StreamdError::NotOwner { .. } => ErrorCode::NotOwner,
            StreamdError::Fenced => ErrorCode::Fenced,
            StreamdError::WalFull(_) => ErrorCode::WalFull,
            StreamdError::StorageFull(_) => ErrorCode::StorageFull,
            StreamdError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
            StreamdError::NotFound(_) => ErrorCode::NotFound,
            StreamdError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            StreamdError::TooLarge(_) => ErrorCode::TooLarge,
            StreamdError::OffsetMismatch { .. } => ErrorCode::OffsetMismatch,
            StreamdError::InvalidProducerEpoch(_) => ErrorCode::InvalidProducerEpoch,
            StreamdError::OutOfOrderSequence(_) => ErrorCode::OutOfOrderSequence,
            StreamdError::InvalidTxnState(_) => ErrorCode::InvalidTxnState,
            StreamdError::Unavailable(_) | StreamdError::ObjectGone(_) | StreamdError::Draining => {
                ErrorCode::Unavailable
            }
            StreamdError::Corrupt(_) => ErrorCode::Corrupt,
            StreamdError::Internal(_) => ErrorCode::Internal,
        }
    }
}

/// The owner's address travels in `x-weir-owner` next to the code; must be kept stable.
pub const OWNER_KEY: &str = "x-weir-owner";

impl From<StreamdError> for tonic::Status {
    fn from(e: StreamdError) -> Self {
        let mut status = e.code().status(e.to_string());
        if let StreamdError::Draining = &e {
            status.metadata_mut().insert(
                weir_shared::error_code::DRAINING_KEY,
                MetadataValue::from_static("true"),
            );
        }
        if let StreamdError::NotOwner { owner: Some(owner), .. } = &e {
            if let Ok(v) = MetadataValue::try_from(owner.as_str()) {
                status.metadata_mut().insert(OWNER_KEY, v);
            }
        }
        status
    }
}
