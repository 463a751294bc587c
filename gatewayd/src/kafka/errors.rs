//! The Kafka error codes gatewayd answers with: routing and metadata failures through
//! the system's one error-code table (`weir_shared::error_code`), and the codes of
//! request checks made here, all from `kafka_protocol`'s own table.

use crate::route::RouteError;
use kafka_protocol::ResponseError as KafkaError;
use weir_meta::client::ClientError;
use weir_meta::model::Rejection;
use weir_shared::error_code::{ErrorCode, KafkaApi};

pub const NONE: i16 = 0;
pub const UNKNOWN_SERVER_ERROR: i16 = KafkaError::UnknownServerError.code();
pub const OFFSET_OUT_OF_RANGE: i16 = KafkaError::OffsetOutOfRange.code();
pub const CORRUPT_MESSAGE: i16 = KafkaError::CorruptMessage.code();
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = KafkaError::UnknownTopicOrPartition.code();
pub const LEADER_NOT_AVAILABLE: i16 = KafkaError::LeaderNotAvailable.code();
pub const NOT_LEADER_OR_FOLLOWER: i16 = KafkaError::NotLeaderOrFollower.code();
pub const REQUEST_TIMED_OUT: i16 = KafkaError::RequestTimedOut.code();
pub const MESSAGE_TOO_LARGE: i16 = KafkaError::MessageTooLarge.code();
pub const COORDINATOR_NOT_AVAILABLE: i16 = KafkaError::CoordinatorNotAvailable.code();
pub const NOT_COORDINATOR: i16 = KafkaError::NotCoordinator.code();
pub const INVALID_TOPIC_EXCEPTION: i16 = KafkaError::InvalidTopicException.code();
pub const INVALID_REQUIRED_ACKS: i16 = KafkaError::InvalidRequiredAcks.code();
pub const TOPIC_AUTHORIZATION_FAILED: i16 = KafkaError::TopicAuthorizationFailed.code();
pub const GROUP_AUTHORIZATION_FAILED: i16 = KafkaError::GroupAuthorizationFailed.code();
pub const CLUSTER_AUTHORIZATION_FAILED: i16 = KafkaError::ClusterAuthorizationFailed.code();
pub const INVALID_PARTITIONS: i16 = KafkaError::InvalidPartitions.code();
pub const INVALID_REPLICATION_FACTOR: i16 = KafkaError::InvalidReplicationFactor.code();
pub const INVALID_CONFIG: i16 = KafkaError::InvalidConfig.code();
pub const INVALID_REQUEST: i16 = KafkaError::InvalidRequest.code();
pub const INVALID_REPLICA_ASSIGNMENT: i16 = KafkaError::InvalidReplicaAssignment.code();
pub const TOPIC_ALREADY_EXISTS: i16 = KafkaError::TopicAlreadyExists.code();
pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = KafkaError::OutOfOrderSequenceNumber.code();
pub const INVALID_PRODUCER_EPOCH: i16 = KafkaError::InvalidProducerEpoch.code();
pub const KAFKA_STORAGE_ERROR: i16 = KafkaError::KafkaStorageError.code();
pub const UNKNOWN_TOPIC_ID: i16 = KafkaError::UnknownTopicId.code();
pub const FENCED_LEADER_EPOCH: i16 = KafkaError::FencedLeaderEpoch.code();
pub const UNKNOWN_LEADER_EPOCH: i16 = KafkaError::UnknownLeaderEpoch.code();
pub const INVALID_RECORD: i16 = KafkaError::InvalidRecord.code();
pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = KafkaError::TransactionalIdAuthorizationFailed.code();

/// A routed call's failure as a partition-level Kafka error of a data API. An owner
/// that failed mid-append (outcome unknown) is REQUEST_TIMED_OUT, as a Kafka broker's
/// timeout is: the client retries, and an idempotent producer's retry is deduplicated.
pub fn route(e: &RouteError) -> i16 {
    e.code().kafka(KafkaApi::Data).code()
}

/// A topic admin command's failure. A metadata outage is NOT_LEADER_OR_FOLLOWER (D-9).
pub fn admin(e: &Result<Rejection, ClientError>) -> (i16, String) {
    let (code, message) = match e {
        Ok(r) => (ErrorCode::from(r.code), r.message.clone()),
        Err(e) => (e.code(), e.to_string()),
    };
    (code.kafka(KafkaApi::Admin).code(), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: &str) -> RouteError {
        RouteError::Streamd(ErrorCode::parse(code).expect("a known code").status("x"))
    }

    // FO-TKO-11, FO-TKO-12: a partition without a live owner is the retryable
    // NOT_LEADER_OR_FOLLOWER, never UNKNOWN_TOPIC_OR_PARTITION.
    #[test]
    fn a_partition_without_a_live_owner_is_not_leader_or_follower() {
        let no_owner = RouteError::NoOwner {
            stream: "t/0".into(),
            why: "moving".into(),
        };
        // FO-TKO-11, FO-TKO-12: no live owner (fenced and being recovered, or closed and not
        // yet placed) answers the retryable NOT_LEADER_OR_FOLLOWER, not UNKNOWN_TOPIC_OR_PARTITION.
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

    // Issue 22: a connection the transport closed with GOAWAY(ENHANCE_YOUR_CALM) (tonic's
    // untagged ResourceExhausted) is a retryable NOT_LEADER_OR_FOLLOWER, not
    // MESSAGE_TOO_LARGE, which kafka-python treats as fatal for a fetch. Only tonic's
    // size refusal (OutOfRange) is MESSAGE_TOO_LARGE.
    #[test]
    fn a_transport_push_back_is_retryable_and_only_a_size_refusal_is_too_large() {
        let calm = RouteError::Streamd(tonic::Status::resource_exhausted("h2 protocol error: GOAWAY"));
        assert_eq!(route(&calm), NOT_LEADER_OR_FOLLOWER);
        let size = RouteError::Streamd(tonic::Status::out_of_range("decoded message length too large"));
        assert_eq!(route(&size), MESSAGE_TOO_LARGE);
    }

    // D-9: topic admin during a metadata outage.
    #[test]
    fn topic_admin_during_an_outage_is_not_leader_or_follower() {
        let (code, _) = admin(&Err(ClientError::Unavailable("no quorum".into())));
        assert_eq!(code, NOT_LEADER_OR_FOLLOWER);
        let (code, _) = admin(&Ok(Rejection::new(
            weir_meta::model::RejectCode::AlreadyExists,
            "exists",
        )));
        assert_eq!(code, TOPIC_ALREADY_EXISTS);
    }
}
