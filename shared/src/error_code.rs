//! The one error-code table of Weir. Every error a caller can react to has one stable
//! code, and the code alone decides its HTTP status and JSON code, its gRPC code, whether
//! a retry can succeed, and its Kafka error code per API family (D-9). Services carry
//! the code between them in the `x-weir-error` gRPC metadata key and read it back with
//! [`ErrorCode::of_status`], never by matching strings.

use kafka_protocol::ResponseError as Kafka;
use tonic::metadata::MetadataValue;

/// gRPC metadata key carrying an [`ErrorCode`] between services; must be kept stable.
pub const ERROR_CODE_KEY: &str = "x-weir-error";
/// Set (to `true`) on an `unavailable` refusal because the node is shutting down, which
/// a client-facing service passes on with no retry delay (SD-INT-8); must be kept stable.
pub const DRAINING_KEY: &str = "x-weir-draining";

/// Whether `status` is a refusal because its sender is shutting down.
pub fn is_draining(status: &tonic::Status) -> bool {
    status.metadata().get(DRAINING_KEY).is_some()
}

/// The Kafka API family an error is answered in: the same fault is a different code
/// for a producer, a group member and an admin client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KafkaApi {
    /// Produce, Fetch and ListOffsets.
    Data,
    /// The group APIs (JoinGroup, SyncGroup, Heartbeat, OffsetCommit, ...).
    Group,
    /// Topic admin (CreateTopics, DeleteTopics, CreatePartitions).
    Admin,
}

/// Every error code of the system. The snake_case names are stable wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The node does not own the stream (or not at that epoch); ownership is moving.
    NotOwner,
    /// The node's incarnation is fenced; the stream is being recovered elsewhere.
    Fenced,
    /// Transient: no quorum, no live owner, catching up, stopping.
    Unavailable,
    /// The WAL is over its limit until uploads catch up (FO-MDO-7).
    WalFull,
    /// A volume is under its refuse mark, or full (issue 60): client writes are refused
    /// until space returns; reads go on.
    StorageFull,
    /// The call may or may not have been applied (the owner failed or stopped
    /// mid-request): HTTP 504 `interrupted`, never retried blindly.
    OutcomeUnknown,
    /// An offset outside the stream's retained range.
    OffsetOutOfRange,
    NotFound,
    AlreadyExists,
    InvalidArgument,
    /// A compare-and-set or state check found something else.
    Conflict,
    /// An append's `match_seq_num` did not match the stream's next offset.
    OffsetMismatch,
    /// An idempotent producer's epoch is older than the stream has seen.
    InvalidProducerEpoch,
    /// An idempotent producer's sequence has a gap or goes backwards.
    OutOfOrderSequence,
    /// A transactional write outside its producer's ongoing transaction (KIP-890).
    InvalidTxnState,
    /// No valid credentials.
    Unauthorized,
    /// Valid credentials without the scope the request needs.
    Forbidden,
    /// A request or record over a configured limit.
    TooLarge,
    /// A cap on concurrent work was reached (live reads, watch streams, group members).
    TooManyRequests,
    /// The endpoint does not take this HTTP method.
    MethodNotAllowed,
    /// The body is not in the media type the endpoint takes.
    UnsupportedMediaType,
    /// Stored data failed a checksum; it is not served.
    Corrupt,
    /// A fault of the service or its peers, never of the request.
    Internal,
}

/// Every code, for tables and tests.
pub const ALL: [ErrorCode; 23] = [
    ErrorCode::NotOwner,
    ErrorCode::Fenced,
    ErrorCode::Unavailable,
    ErrorCode::WalFull,
    ErrorCode::StorageFull,
    ErrorCode::OutcomeUnknown,
    ErrorCode::OffsetOutOfRange,
    ErrorCode::NotFound,
    ErrorCode::AlreadyExists,
    ErrorCode::InvalidArgument,
    ErrorCode::Conflict,
    ErrorCode::OffsetMismatch,
    ErrorCode::InvalidProducerEpoch,
    ErrorCode::OutOfOrderSequence,
    ErrorCode::InvalidTxnState,
    ErrorCode::Unauthorized,
    ErrorCode::Forbidden,
    ErrorCode::TooLarge,
    ErrorCode::TooManyRequests,
    ErrorCode::MethodNotAllowed,
    ErrorCode::UnsupportedMediaType,
    ErrorCode::Corrupt,
    ErrorCode::Internal,
];

/// One row of the table.
struct Row {
    name: &'static str,
    http: u16,
    /// The HTTP API's documented JSON code: a coarser family of the name.
    api: &'static str,
    grpc: tonic::Code,
    retryable: bool,
    data: Kafka,
    group: Kafka,
    admin: Kafka,
}

impl ErrorCode {
    #[rustfmt::skip]
    fn row(self) -> Row {
        use ErrorCode::*;
        use tonic::Code as G;
        let r = |name, http, api, grpc, retryable, data, group, admin| Row { name, http, api, grpc, retryable, data, group, admin };
        // D-9: data APIs answer NOT_LEADER_OR_FOLLOWER for anything that moves or
        // recovers; group APIs answer NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE, which
        // group clients retry; topic admin answers NOT_LEADER_OR_FOLLOWER in an outage.
        match self {
            NotOwner =>             r("not_owner", 503, "unavailable", G::Unavailable, true, Kafka::NotLeaderOrFollower, Kafka::NotCoordinator, Kafka::NotLeaderOrFollower),
            Fenced =>               r("fenced", 503, "unavailable", G::Unavailable, true, Kafka::NotLeaderOrFollower, Kafka::NotCoordinator, Kafka::NotLeaderOrFollower),
            Unavailable =>          r("unavailable", 503, "unavailable", G::Unavailable, true, Kafka::NotLeaderOrFollower, Kafka::CoordinatorNotAvailable, Kafka::NotLeaderOrFollower),
            WalFull =>              r("wal_full", 503, "unavailable", G::ResourceExhausted, true, Kafka::KafkaStorageError, Kafka::CoordinatorNotAvailable, Kafka::NotLeaderOrFollower),
            // Issue 60: HTTP's Insufficient Storage; Kafka's retryable storage error.
            StorageFull =>          r("storage_full", 507, "insufficient_storage", G::ResourceExhausted, true, Kafka::KafkaStorageError, Kafka::CoordinatorNotAvailable, Kafka::KafkaStorageError),
            // D-7, SD-INT-9: not 503, which says the request had no effect.
            OutcomeUnknown =>       r("outcome_unknown", 504, "interrupted", G::Unknown, false, Kafka::RequestTimedOut, Kafka::CoordinatorNotAvailable, Kafka::RequestTimedOut),
            OffsetOutOfRange =>     r("offset_out_of_range", 416, "invalid_argument", G::OutOfRange, false, Kafka::OffsetOutOfRange, Kafka::InvalidRequest, Kafka::InvalidRequest),
            NotFound =>             r("not_found", 404, "not_found", G::NotFound, false, Kafka::UnknownTopicOrPartition, Kafka::CoordinatorNotAvailable, Kafka::UnknownTopicOrPartition),
            AlreadyExists =>        r("already_exists", 409, "conflict", G::AlreadyExists, false, Kafka::InvalidRequest, Kafka::InvalidRequest, Kafka::TopicAlreadyExists),
            InvalidArgument =>      r("invalid_argument", 400, "invalid_argument", G::InvalidArgument, false, Kafka::CorruptMessage, Kafka::InvalidRequest, Kafka::InvalidRequest),
            Conflict =>             r("conflict", 409, "conflict", G::FailedPrecondition, false, Kafka::InvalidRequest, Kafka::InvalidRequest, Kafka::InvalidRequest),
            OffsetMismatch =>       r("offset_mismatch", 409, "conflict", G::FailedPrecondition, false, Kafka::InvalidRequest, Kafka::InvalidRequest, Kafka::InvalidRequest),
            InvalidProducerEpoch => r("invalid_producer_epoch", 409, "conflict", G::FailedPrecondition, false, Kafka::InvalidProducerEpoch, Kafka::InvalidProducerEpoch, Kafka::InvalidRequest),
            OutOfOrderSequence =>   r("out_of_order_sequence", 409, "conflict", G::FailedPrecondition, false, Kafka::OutOfOrderSequenceNumber, Kafka::InvalidRequest, Kafka::InvalidRequest),
            InvalidTxnState =>      r("invalid_txn_state", 409, "conflict", G::FailedPrecondition, false, Kafka::InvalidTxnState, Kafka::InvalidTxnState, Kafka::InvalidRequest),
            Unauthorized =>         r("unauthorized", 401, "unauthorized", G::Unauthenticated, false, Kafka::TopicAuthorizationFailed, Kafka::GroupAuthorizationFailed, Kafka::TopicAuthorizationFailed),
            Forbidden =>            r("forbidden", 403, "unauthorized", G::PermissionDenied, false, Kafka::TopicAuthorizationFailed, Kafka::GroupAuthorizationFailed, Kafka::TopicAuthorizationFailed),
            TooLarge =>             r("too_large", 413, "too_large", G::ResourceExhausted, false, Kafka::MessageTooLarge, Kafka::InvalidRequest, Kafka::InvalidRequest),
            TooManyRequests =>      r("too_many_requests", 429, "too_many_requests", G::ResourceExhausted, false, Kafka::ThrottlingQuotaExceeded, Kafka::GroupMaxSizeReached, Kafka::ThrottlingQuotaExceeded),
            MethodNotAllowed =>     r("method_not_allowed", 405, "invalid_argument", G::Unimplemented, false, Kafka::InvalidRequest, Kafka::InvalidRequest, Kafka::InvalidRequest),
            UnsupportedMediaType => r("unsupported_media_type", 415, "invalid_argument", G::InvalidArgument, false, Kafka::InvalidRequest, Kafka::InvalidRequest, Kafka::InvalidRequest),
            Corrupt =>              r("corrupt", 500, "internal", G::DataLoss, false, Kafka::CorruptMessage, Kafka::UnknownServerError, Kafka::UnknownServerError),
            Internal =>             r("internal", 500, "internal", G::Internal, false, Kafka::UnknownServerError, Kafka::UnknownServerError, Kafka::UnknownServerError),
        }
    }

    /// The stable name carried in `x-weir-error`.
    pub fn as_str(self) -> &'static str {
        self.row().name
    }

    /// The code named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// The HTTP status of this code.
    pub fn http_status(self) -> u16 {
        self.row().http
    }

    /// The JSON `code` the HTTP API documents for this code.
    pub fn api_code(self) -> &'static str {
        self.row().api
    }

    /// The gRPC code of a status carrying this code.
    pub fn grpc_code(self) -> tonic::Code {
        self.row().grpc
    }

    /// Whether the same request can succeed later, unchanged.
    pub fn is_retryable(self) -> bool {
        self.row().retryable
    }

    /// The Kafka error this code is answered with in `api`.
    pub fn kafka(self, api: KafkaApi) -> Kafka {
        let row = self.row();
        match api {
            KafkaApi::Data => row.data,
            KafkaApi::Group => row.group,
            KafkaApi::Admin => row.admin,
        }
    }

    /// A gRPC status with this code and `message`, the code in `x-weir-error`.
    pub fn status(self, message: impl Into<String>) -> tonic::Status {
        let mut status = tonic::Status::new(self.grpc_code(), message);
        status
            .metadata_mut()
            .insert(ERROR_CODE_KEY, MetadataValue::from_static(self.as_str()));
        status
    }

    /// The code a status carries in `x-weir-error`; `None` for a status without one
    /// (a transport failure) or with a name this build does not know.
    pub fn of_status(status: &tonic::Status) -> Option<Self> {
        let name = status.metadata().get(ERROR_CODE_KEY)?.to_str().ok()?;
        Self::parse(name)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_its_name_and_a_status() {
        let mut names = std::collections::BTreeSet::new();
        for code in ALL {
            assert!(names.insert(code.as_str()), "{code:?} shares its name");
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            let status = code.status("m");
            assert_eq!(ErrorCode::of_status(&status), Some(code));
            assert_eq!(status.code(), code.grpc_code());
        }
        assert_eq!(ErrorCode::parse("no_such_code"), None);
        assert_eq!(ErrorCode::of_status(&tonic::Status::unavailable("reset")), None);
    }

    /// The name travels as the code's Display too (log fields and JSON bodies use it),
    /// and only a status marked draining reads as a stopping sender's refusal (SD-INT-8).
    #[test]
    fn display_is_the_stable_name_and_only_a_marked_status_is_draining() {
        for code in ALL {
            assert_eq!(code.to_string(), code.as_str());
        }
        let mut status = ErrorCode::Unavailable.status("stopping");
        assert!(!is_draining(&status));
        status
            .metadata_mut()
            .insert(DRAINING_KEY, MetadataValue::from_static("true"));
        assert!(is_draining(&status));
    }

    /// Retryable codes are exactly the 503s and 507s: a client told to retry gets `Retry-After`.
    #[test]
    fn an_unknown_outcome_is_504_interrupted_and_not_a_retryable_refusal() {
        // D-7, SD-INT-9: 503 would tell the client that nothing was applied.
        assert_eq!(ErrorCode::OutcomeUnknown.http_status(), 504);
        assert_eq!(ErrorCode::OutcomeUnknown.api_code(), "interrupted");
        assert!(!ErrorCode::OutcomeUnknown.is_retryable());
        assert_eq!(ErrorCode::OutcomeUnknown.kafka(KafkaApi::Data), Kafka::RequestTimedOut);
    }

    #[test]
    fn retryable_codes_are_the_service_unavailable_ones() {
        for code in ALL {
            assert_eq!(code.is_retryable(), matches!(code.http_status(), 503 | 507), "{code:?}");
        }
    }

    /// D-9: one fault, one Kafka code per API family.
    #[test]
    fn kafka_codes_differ_by_api_family_as_d9_says() {
        use KafkaApi::*;
        assert_eq!(ErrorCode::NotOwner.kafka(Data), Kafka::NotLeaderOrFollower);
        assert_eq!(ErrorCode::NotOwner.kafka(Group), Kafka::NotCoordinator);
        assert_eq!(ErrorCode::Unavailable.kafka(Group), Kafka::CoordinatorNotAvailable);
        assert_eq!(ErrorCode::Unavailable.kafka(Admin), Kafka::NotLeaderOrFollower);
        assert_eq!(ErrorCode::InvalidArgument.kafka(Data), Kafka::CorruptMessage);
        assert_eq!(ErrorCode::InvalidArgument.kafka(Admin), Kafka::InvalidRequest);
        assert_eq!(ErrorCode::AlreadyExists.kafka(Admin), Kafka::TopicAlreadyExists);
        // Whatever clients retry in one family they retry in every family.
        for code in ALL.into_iter().filter(|c| c.is_retryable()) {
            for api in [Data, Group, Admin] {
                assert!(code.kafka(api).is_retriable(), "{code:?} in {api:?}");
            }
        }
    }
}
