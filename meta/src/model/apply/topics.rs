//! Kafka topics: one stream per partition, created, grown and deleted together.

use super::{reject, validate_name, Txn, MAX_PARTITIONS};
use crate::model::command::{Applied, Outcome, Proposer, RejectCode};
use crate::model::rows::*;
use crate::model::state::RowKey;

impl Txn<'_> {
    pub(super) fn create_topic(
        &mut self,
        proposer: &Proposer,
        name: &str,
        partitions: u32,
        config: &StreamConfig,
    ) -> Outcome {
        self.privileged(proposer)?;
        validate_name("topic", name)?;
        if partitions == 0 || partitions > MAX_PARTITIONS {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("partitions must be 1 to {MAX_PARTITIONS}, got {partitions}"),
            ));
        }
        if self.state.topics.contains_key(name) {
            return Err(reject(
                RejectCode::AlreadyExists,
                format!("topic '{name}' already exists"),
            ));
        }
        let streams = (0..partitions)
            .map(|p| self.new_stream(format!("{name}/{p}"), Some((name, p)), config))
            .collect::<Vec<_>>();
        let topic = TopicRow {
            name: name.to_string(),
            topic_id: topic_id(name, self.index),
            partitions: streams.clone(),
            config: config.clone(),
        };
        self.state.topics.insert(name.to_string(), topic);
        self.touch(RowKey::Topic(name.to_string()));
        Ok(Applied::TopicCreated { streams })
    }

    pub(super) fn delete_topic(&mut self, proposer: &Proposer, name: &str, topic_id: Option<&[u8; 16]>) -> Outcome {
        self.privileged(proposer)?;
        let not_found = || reject(RejectCode::NotFound, format!("topic '{name}' does not exist"));
        let current = self.state.topics.get(name).ok_or_else(not_found)?;
        if topic_id.is_some_and(|id| *id != current.topic_id) {
            return Err(not_found());
        }
        let topic = self.state.topics.remove(name).ok_or_else(not_found)?;
        self.touch(RowKey::Topic(name.to_string()));
        for id in topic.partitions {
            self.mark_deleted(id);
        }
        Ok(Applied::Done)
    }

    pub(super) fn create_partitions(&mut self, proposer: &Proposer, name: &str, partitions: u32) -> Outcome {
        self.privileged(proposer)?;
        let topic = self
            .state
            .topics
            .get(name)
            .ok_or_else(|| reject(RejectCode::NotFound, format!("topic '{name}' does not exist")))?;
        let current = topic.partitions.len() as u32;
        if partitions <= current || partitions > MAX_PARTITIONS {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("topic '{name}' has {current} partitions; the new count must be above that and at most {MAX_PARTITIONS}, got {partitions}"),
            ));
        }
        let config = topic.config.clone();
        let added = (current..partitions)
            .map(|p| self.new_stream(format!("{name}/{p}"), Some((name, p)), &config))
            .collect::<Vec<_>>();
        let topic = self.state.topics.get_mut(name).expect("checked above");
        topic.partitions.extend(added.iter().copied());
        self.touch(RowKey::Topic(name.to_string()));
        Ok(Applied::TopicCreated { streams: added })
    }
}

/// A Kafka topic id: deterministic per (name, creating index), so every replica agrees.
fn topic_id(name: &str, index: u64) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(name.as_bytes())
        .chain_update(index.to_be_bytes())
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    // Version-4-shaped UUID bits so clients print it as a UUID; never all zeros.
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}
