//! OffsetCommit and TxnOffsetCommit: a commit's membership is checked, then its offsets
//! are appended to the offsets stream (a transaction's held pending until its marker).

use super::membership::code;
use super::offsets::{self, Change, Committed};
use super::{instance, GroupCoordinator, Groups, NOT_COORDINATOR};
use crate::error::StreamdError;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::{
    OffsetCommitRequest, OffsetCommitResponse, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use kafka_protocol::ResponseError as Kafka;
use std::time::Instant;

const OFFSET_METADATA_TOO_LARGE: i16 = Kafka::OffsetMetadataTooLarge.code();
/// Kafka's `offset.metadata.max.bytes`.
const MAX_METADATA: usize = 4096;

impl Groups {
    pub(super) async fn commit(
        &self,
        c: &GroupCoordinator,
        r: OffsetCommitRequest,
        version: i16,
    ) -> OffsetCommitResponse {
        let group = r.group_id.0.to_string();
        let check = c.with(|st| {
            if let Some(g) = st.consumer_groups.get(&group) {
                return g.check_member(&r.member_id, r.generation_id_or_member_epoch, Some(version));
            }
            match st.groups.get_mut(&group) {
                Some(g) => g.check_commit(
                    &r.member_id,
                    instance(&r.group_instance_id),
                    r.generation_id_or_member_epoch,
                    Instant::now(),
                ),
                None if r.generation_id_or_member_epoch < 0 => code::NONE,
                None => code::UNKNOWN_MEMBER_ID,
            }
        });
        let mut changes = vec![];
        for t in &r.topics {
            for p in &t.partitions {
                changes.push(Change::Commit {
                    group: group.clone(),
                    topic: t.name.0.to_string(),
                    partition: p.partition_index,
                    committed: Committed {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                    },
                });
            }
        }
        let too_large = changes.iter().any(|ch| match ch {
            Change::Commit { committed, .. } => committed.metadata.as_ref().is_some_and(|m| m.len() > MAX_METADATA),
            Change::DeleteGroup { .. } | Change::DeleteOffset { .. } => false,
        });
        let error = if too_large {
            OFFSET_METADATA_TOO_LARGE
        } else if check != code::NONE || changes.is_empty() {
            check
        } else {
            match self.store(c, changes).await {
                Ok(()) => code::NONE,
                Err(e) => {
                    tracing::warn!(group = %group, error = %e, "offset commit was not stored");
                    NOT_COORDINATOR
                }
            }
        };
        OffsetCommitResponse::default().with_topics(
            r.topics
                .iter()
                .map(|t| {
                    OffsetCommitResponseTopic::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    OffsetCommitResponsePartition::default()
                                        .with_partition_index(p.partition_index)
                                        .with_error_code(error)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
    }

    /// TxnOffsetCommit (issue 23): the offsets are appended as a transactional batch of
    /// the producer, which the stream admits only once the transaction's coordinator
    /// confirms this stream is in the transaction (AddOffsetsToTxn, KIP-890); they are
    /// held pending until the transaction's marker reaches this stream.
    pub(super) async fn txn_commit(
        &self,
        c: &GroupCoordinator,
        r: TxnOffsetCommitRequest,
        version: i16,
    ) -> TxnOffsetCommitResponse {
        use kafka_protocol::messages::txn_offset_commit_response::{
            TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
        };
        let group = r.group_id.0.to_string();
        // From v3 a producer may name the consumer's member and generation, checked as
        // OffsetCommit's; without them nothing is checked, as in Kafka.
        let named = version >= 3 && (!r.member_id.is_empty() || r.generation_id >= 0);
        let check = if named {
            c.with(|st| {
                if let Some(g) = st.consumer_groups.get(&group) {
                    return g.check_member(&r.member_id, r.generation_id, None);
                }
                match st.groups.get_mut(&group) {
                    Some(g) => g.check_commit(
                        &r.member_id,
                        instance(&r.group_instance_id),
                        r.generation_id,
                        Instant::now(),
                    ),
                    None => code::UNKNOWN_MEMBER_ID,
                }
            })
        } else {
            code::NONE
        };
        let changes: Vec<Change> = r
            .topics
            .iter()
            .flat_map(|t| {
                let group = &group;
                t.partitions.iter().map(move |p| Change::Commit {
                    group: group.clone(),
                    topic: t.name.0.to_string(),
                    partition: p.partition_index,
                    committed: Committed {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                    },
                })
            })
            .collect();
        let too_large = changes.iter().any(|ch| match ch {
            Change::Commit { committed, .. } => committed.metadata.as_ref().is_some_and(|m| m.len() > MAX_METADATA),
            Change::DeleteGroup { .. } | Change::DeleteOffset { .. } => false,
        });
        let error = if too_large {
            OFFSET_METADATA_TOO_LARGE
        } else if check != code::NONE || changes.is_empty() {
            check
        } else {
            let producer = (r.producer_id.0, r.producer_epoch);
            let batch = offsets::encode_as(&changes, Some(producer));
            let stored = c
                .log
                .store_as(&self.core, &c.stream, batch, Some(&r.transactional_id), |base| {
                    c.with(|st| st.offsets.add_pending(producer.0, base, changes))
                })
                .await;
            match stored {
                Ok(()) => code::NONE,
                Err(StreamdError::InvalidTxnState(_)) => Kafka::InvalidTxnState.code(),
                Err(StreamdError::InvalidProducerEpoch(_)) => Kafka::InvalidProducerEpoch.code(),
                Err(e) => {
                    tracing::warn!(group = %group, error = %e, "transactional offset commit was not stored");
                    NOT_COORDINATOR
                }
            }
        };
        TxnOffsetCommitResponse::default().with_topics(
            r.topics
                .iter()
                .map(|t| {
                    TxnOffsetCommitResponseTopic::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    TxnOffsetCommitResponsePartition::default()
                                        .with_partition_index(p.partition_index)
                                        .with_error_code(error)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
    }
}
