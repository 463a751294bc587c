//! The APIs and versions this gateway implements, exactly what ApiVersions advertises.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

/// (API, lowest, highest version). Ranges stop where a newer version would need
/// something not built (topic ids in Fetch v13+, Produce v10+'s leader hints,
/// ListOffsets v7+'s max-timestamp lookup, topic ids in OffsetCommit v10+ and OffsetFetch
/// v10+, and the transaction APIs' KIP-890 part 2 versions: AddPartitionsToTxn v4+ is
/// for brokers only, and part 2's per-transaction epoch bump is not built).
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 6),
    (ApiKey::Metadata, 1, 12),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    (ApiKey::DescribeLogDirs, 0, 4),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::ListTransactions, 0, 2),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
];

/// The Kafka release (and metadata version) whose APIs the table above matches, as
/// DescribeConfigs' `inter.broker.protocol.version` tells consoles: KIP-848's
/// ConsumerGroupHeartbeat came in 3.7, DescribeTopicPartitions in 3.8's IV0.
pub const KAFKA_RELEASE: &str = "3.8-IV0";

/// Wire versions served by the codec of another version with the same schema:
/// DescribeLogDirs v0, the only one kafka-python sends, is v1's schema (v1 changed only
/// when a throttled broker answers), and `kafka-protocol` knows only v1 and later.
const SAME_SCHEMA: &[(ApiKey, i16, i16)] = &[(ApiKey::DescribeLogDirs, 0, 1)];

/// The version of `key` to decode and encode a `version` request's body with.
pub fn codec_version(key: ApiKey, version: i16) -> i16 {
    SAME_SCHEMA
        .iter()
        .find(|(k, wire, _)| *k == key && *wire == version)
        .map_or(version, |(_, _, codec)| *codec)
}

pub fn supported(key: ApiKey, version: i16) -> bool {
    SUPPORTED
        .iter()
        .any(|(k, lo, hi)| *k == key && (*lo..=*hi).contains(&version))
}

/// The ApiVersions answer; `error` is UNSUPPORTED_VERSION when the client asked for an
/// ApiVersions version above ours (it then retries at one we listed).
pub fn api_versions(error: i16) -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_error_code(error).with_api_keys(
        SUPPORTED
            .iter()
            .map(|(k, lo, hi)| {
                ApiVersion::default()
                    .with_api_key(*k as i16)
                    .with_min_version(*lo)
                    .with_max_version(*hi)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_advertised_version_is_one_the_codec_can_handle() {
        for (key, lo, hi) in SUPPORTED {
            let codec = key.valid_versions();
            assert!(
                codec.min <= codec_version(*key, *lo) && *hi <= codec.max,
                "{key:?} {lo}..={hi} is outside the codec's {codec}"
            );
        }
        assert!(supported(ApiKey::Produce, 9));
        assert!(!supported(ApiKey::Produce, 10));
        assert!(supported(ApiKey::AddPartitionsToTxn, 3));
        assert!(!supported(ApiKey::AddPartitionsToTxn, 4), "v4+ is for brokers");
        assert!(
            !supported(ApiKey::WriteTxnMarkers, 0),
            "markers are written inside the cluster"
        );
    }
}
