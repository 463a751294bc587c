//! Kafka error codes, and the one table from routing and metadata errors to them.

use super::conn::Session;
use crate::route::{error_code, RouteError};
use weir_metad::client::ClientError;
use weir_metad::model::{Proposer, RejectCode, Rejection};

pub const NONE: i16 = 0;
pub const UNKNOWN_SERVER_ERROR: i16 = -1;
pub const OFFSET_OUT_OF_RANGE: i16 = 1;
pub const CORRUPT_MESSAGE: i16 = 2;
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
pub const LEADER_NOT_AVAILABLE: i16 = 5;
pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
pub const REQUEST_TIMED_OUT: i16 = 7;
pub const MESSAGE_TOO_LARGE: i16 = 10;
pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
pub const NOT_COORDINATOR: i16 = 16;
pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
pub const INVALID_REQUIRED_ACKS: i16 = 21;
pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
pub const INVALID_PARTITIONS: i16 = 37;
pub const INVALID_REPLICATION_FACTOR: i16 = 38;
pub const INVALID_CONFIG: i16 = 40;
pub const INVALID_REQUEST: i16 = 42;
pub const TOPIC_ALREADY_EXISTS: i16 = 36;
pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
pub const INVALID_PRODUCER_EPOCH: i16 = 47;
pub const KAFKA_STORAGE_ERROR: i16 = 56;
pub const UNKNOWN_TOPIC_ID: i16 = 100;

/// A routed call's failure as a partition-level Kafka error. An owner that failed
/// mid-append (outcome unknown) is REQUEST_TIMED_OUT, as a Kafka broker's timeout is:
/// the client retries, and an idempotent producer's retry is deduplicated.
pub fn route(e: &RouteError) -> i16 {
    match e {
        RouteError::NotFound(_) => UNKNOWN_TOPIC_OR_PARTITION,
        RouteError::NoOwner { .. } | RouteError::CatchingUp => NOT_LEADER_OR_FOLLOWER,
        RouteError::Unknown(_) => REQUEST_TIMED_OUT,
        RouteError::Streamd(status) => match error_code(status) {
            Some("not_owner" | "fenced" | "unavailable") => NOT_LEADER_OR_FOLLOWER,
            Some("wal_full") => KAFKA_STORAGE_ERROR,
            Some("offset_out_of_range") => OFFSET_OUT_OF_RANGE,
            Some("invalid_producer_epoch") => INVALID_PRODUCER_EPOCH,
            Some("out_of_order_sequence") => OUT_OF_ORDER_SEQUENCE_NUMBER,
            Some("invalid_argument" | "corrupt") => CORRUPT_MESSAGE,
            Some("not_found") => UNKNOWN_TOPIC_OR_PARTITION,
            _ => UNKNOWN_SERVER_ERROR,
        },
    }
}

/// A topic admin command's failure. A metadata outage is NOT_LEADER_OR_FOLLOWER (D-9).
pub fn admin(e: &Result<Rejection, ClientError>) -> (i16, String) {
    match e {
        Err(ClientError::Unavailable(m)) => (NOT_LEADER_OR_FOLLOWER, format!("metadata log unavailable: {m}")),
        Err(other) => (UNKNOWN_SERVER_ERROR, other.to_string()),
        Ok(r) => (
            match r.code {
                RejectCode::AlreadyExists => TOPIC_ALREADY_EXISTS,
                RejectCode::NotFound => UNKNOWN_TOPIC_OR_PARTITION,
                RejectCode::InvalidArgument => INVALID_REQUEST,
                RejectCode::NotReady => NOT_LEADER_OR_FOLLOWER,
                RejectCode::Fenced | RejectCode::Superseded | RejectCode::UnknownNode => TOPIC_AUTHORIZATION_FAILED,
                RejectCode::Conflict | RejectCode::NotOwner => INVALID_REQUEST,
            },
            r.message.clone(),
        ),
    }
}

/// Metadata changes are proposed in the authenticated principal's name.
pub fn proposer(session: &Session) -> Proposer {
    Proposer::Operator {
        principal: session.principal.clone().unwrap_or_else(|| "anonymous".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: &str) -> RouteError {
        let mut s = tonic::Status::unavailable("x");
        s.metadata_mut().insert("x-weir-error", code.parse().expect("ascii"));
        RouteError::Streamd(s)
    }

    // FO-TKO-11, FO-TKO-12: a partition without a live owner is the retryable
    // NOT_LEADER_OR_FOLLOWER, never UNKNOWN_TOPIC_OR_PARTITION.
    #[test]
    fn a_partition_without_a_live_owner_is_not_leader_or_follower() {
        let no_owner = RouteError::NoOwner {
            stream: "t/0".into(),
            why: "moving".into(),
        };
        assert_eq!(route(&no_owner), NOT_LEADER_OR_FOLLOWER);
        assert_eq!(route(&RouteError::CatchingUp), NOT_LEADER_OR_FOLLOWER);
        for code in ["not_owner", "fenced", "unavailable"] {
            assert_eq!(route(&status(code)), NOT_LEADER_OR_FOLLOWER, "{code}");
        }
        assert_eq!(route(&RouteError::NotFound("t/0".into())), UNKNOWN_TOPIC_OR_PARTITION);
        assert_eq!(route(&RouteError::Unknown("reset".into())), REQUEST_TIMED_OUT);
        assert_eq!(route(&status("out_of_order_sequence")), OUT_OF_ORDER_SEQUENCE_NUMBER);
        assert_eq!(route(&status("invalid_producer_epoch")), INVALID_PRODUCER_EPOCH);
        assert_eq!(route(&status("offset_out_of_range")), OFFSET_OUT_OF_RANGE);
    }

    // D-9: topic admin during a metadata outage.
    #[test]
    fn topic_admin_during_an_outage_is_not_leader_or_follower() {
        let (code, _) = admin(&Err(ClientError::Unavailable("no quorum".into())));
        assert_eq!(code, NOT_LEADER_OR_FOLLOWER);
        let (code, _) = admin(&Ok(Rejection::new(RejectCode::AlreadyExists, "exists")));
        assert_eq!(code, TOPIC_ALREADY_EXISTS);
    }
}
