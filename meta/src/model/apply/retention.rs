//! The data lifecycle's log side: trims advance a stream's start offset and drop the
//! index ranges wholly below it (retention, Kafka DeleteRecords, HTTP trim), and
//! configs (retention, message size) change per topic or stream.

use super::{reject, Txn};
use crate::model::command::{Applied, ConfigTarget, Outcome, Proposer, RejectCode};
use crate::model::index::IndexChange;
use crate::model::rows::*;
use crate::model::state::RowKey;
use std::collections::BTreeMap;
use weir_shared::ids::{ObjectKey, Offset, StreamId};

impl Txn<'_> {
    /// Advances `id`'s start offset to `start`, never back and never past what is
    /// committed (the owner commits first), so every offset at or above the start
    /// stays in exactly one range.
    pub(super) fn trim_stream(&mut self, proposer: &Proposer, id: StreamId, start: Offset) -> Outcome {
        self.privileged(proposer)?;
        let row = self.stream(id)?;
        if row.state == StreamState::Deleted {
            return Err(reject(
                RejectCode::NotFound,
                format!("stream '{}' is deleted", row.name),
            ));
        }
        if start > row.committed_end {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!(
                    "stream '{}' cannot start at {start}: only offsets below its committed end {} can be trimmed",
                    row.name, row.committed_end
                ),
            ));
        }
        if start <= row.start_offset {
            return Ok(Applied::Trimmed {
                start: row.start_offset,
            });
        }
        let dropped = self.drop_ranges_below(id, start);
        self.state
            .streams
            .update(&id, |row| {
                row.start_offset = start;
                row.bytes = row.bytes.saturating_sub(dropped);
                crate::model::leader_epochs::prune(row);
            })
            .expect("checked above");
        self.touch(RowKey::Stream(id));
        Ok(Applied::Trimmed { start })
    }

    /// Removes `id`'s ranges that end at or below `below` from the index; each object
    /// holding one no longer names the stream (a stream has at most one range per
    /// object), and an object that names no stream leaves the index, so GC deletes it.
    /// Returns the bytes dropped.
    pub(super) fn drop_ranges_below(&mut self, id: StreamId, below: Offset) -> u64 {
        let mut objects: BTreeMap<ObjectKey, Option<ObjectRow>> = BTreeMap::new();
        let mut dropped = 0;
        for range in self.objects.ranges_before(id, below, usize::MAX) {
            if range.end > below {
                continue;
            }
            dropped += range.len;
            self.index_changes.push(IndexChange::DeleteRange {
                stream: id,
                start: range.start,
            });
            let object = self.objects.object(&range.key);
            objects.entry(range.key).or_insert(object);
        }
        self.release_objects(id, objects);
        dropped
    }

    /// The objects whose range of `id` was dropped no longer name the stream; one that
    /// names no stream leaves the index (GC then deletes it).
    pub(super) fn release_objects(&mut self, id: StreamId, objects: BTreeMap<ObjectKey, Option<ObjectRow>>) {
        for (key, object) in objects {
            let Some(mut object) = object else { continue };
            object.streams.retain(|s| *s != id);
            self.index_changes.push(if object.streams.is_empty() {
                IndexChange::DeleteObject(key)
            } else {
                IndexChange::PutObject(object)
            });
        }
    }

    pub(super) fn alter_config(
        &mut self,
        proposer: &Proposer,
        target: &ConfigTarget,
        config: &StreamConfig,
        expected: Option<&StreamConfig>,
        topic_id: Option<&[u8; 16]>,
    ) -> Outcome {
        self.privileged(proposer)?;
        validate_config(config)?;
        let streams = match target {
            ConfigTarget::Topic(name) => {
                let topic = self
                    .state
                    .topics
                    .get_mut(name)
                    .ok_or_else(|| reject(RejectCode::NotFound, format!("topic '{name}' does not exist")))?;
                if topic_id.is_some_and(|id| *id != topic.topic_id) {
                    return Err(reject(
                        RejectCode::NotFound,
                        format!("topic '{name}' was deleted and created again since its config was read"),
                    ));
                }
                check_unchanged(&format!("topic '{name}'"), &topic.config, expected)?;
                topic.config = config.clone();
                self.touched.insert(RowKey::Topic(name.clone()));
                topic.partitions.clone()
            }
            ConfigTarget::Stream(name) => {
                let row = self
                    .state
                    .stream_by_name(name)
                    .ok_or_else(|| reject(RejectCode::NotFound, format!("stream '{name}' does not exist")))?;
                if row.topic.is_some() {
                    return Err(reject(
                        RejectCode::InvalidArgument,
                        format!("stream '{name}' is a topic partition; change the topic's config instead"),
                    ));
                }
                check_unchanged(&format!("stream '{name}'"), &row.config, expected)?;
                vec![row.id]
            }
        };
        for id in streams {
            if self
                .state
                .streams
                .update(&id, |row| row.config = config.clone().into())
                .is_some()
            {
                self.touch(RowKey::Stream(id));
            }
        }
        Ok(Applied::Done)
    }
}

/// An alter's compare-and-set: refused when the config changed since it was read. A
/// config changed and changed back compares equal, and an alter computed from it then
/// produces what it would from a fresh read: it may land.
fn check_unchanged(
    what: &str,
    current: &StreamConfig,
    expected: Option<&StreamConfig>,
) -> Result<(), crate::model::Rejection> {
    match expected {
        Some(expected) if expected != current => Err(reject(
            RejectCode::Conflict,
            format!("the config of {what} changed since it was read; read it again"),
        )),
        _ => Ok(()),
    }
}

/// Limits every config must meet, checked by apply so no path stores a bad one.
pub fn validate_config(config: &StreamConfig) -> Result<(), crate::model::Rejection> {
    for (name, value) in [
        ("max.message.bytes", config.max_message_bytes),
        ("segment.bytes", config.segment_bytes),
    ] {
        if value == Some(0) {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("{name} must be at least 1"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_log::{node, op, Log};
    use crate::model::command::{Applied, ConfigTarget, RejectCode};
    use crate::model::index::IndexRead;
    use crate::model::rows::*;
    use crate::model::Command;
    use weir_shared::ids::{ObjectKey, Offset, StreamId};

    fn trim(stream: u64, start: u64) -> Command {
        Command::TrimStream {
            stream: StreamId(stream),
            start: Offset(start),
        }
    }

    #[test]
    fn a_trim_drops_ranges_below_the_start_and_an_object_leaves_once_no_stream_holds_it() {
        let mut log = Log::new();
        log.commit("data/1", &[(0, 10, 100), (1, 5, 50)]);
        log.commit("data/2", &[(0, 10, 100)]);
        assert_eq!(log.row(0).bytes, 200);

        // Inside the first range: nothing is dropped, the start moves.
        assert_eq!(log.apply(node(), trim(0, 4)), Ok(Applied::Trimmed { start: Offset(4) }));
        assert_eq!(log.meta.index.ranges_from(StreamId(0), Offset(0), 10).len(), 2);
        // Past it: its range goes, but stream 1 still holds data/1.
        assert_eq!(log.apply(op(), trim(0, 12)), Ok(Applied::Trimmed { start: Offset(12) }));
        assert_eq!(log.row(0).bytes, 100);
        let object = log
            .meta
            .index
            .object(&ObjectKey("data/1".into()))
            .expect("still committed");
        assert_eq!(object.streams, vec![StreamId(1)]);
        // Stream 1 lets it go too: the object leaves the index, so GC may delete it.
        assert_eq!(log.apply(node(), trim(1, 5)), Ok(Applied::Trimmed { start: Offset(5) }));
        assert_eq!(log.meta.index.object(&ObjectKey("data/1".into())), None);
        assert_eq!(log.row(1).bytes, 0);
        assert!(log.meta.index.ranges_from(StreamId(1), Offset(0), 10).is_empty());
        // Stream 1 goes on from its committed end.
        log.commit("data/3", &[(1, 2, 20)]);
        assert_eq!(log.row(1).bytes, 20);
    }

    #[test]
    fn a_trim_never_goes_back_nor_past_the_committed_end() {
        let mut log = Log::new();
        log.commit("data/1", &[(0, 10, 100)]);
        assert_eq!(log.apply(node(), trim(0, 6)), Ok(Applied::Trimmed { start: Offset(6) }));
        assert_eq!(log.apply(node(), trim(0, 3)), Ok(Applied::Trimmed { start: Offset(6) }));
        assert_eq!(log.row(0).start_offset, Offset(6));
        assert_eq!(log.apply(node(), trim(0, 11)), Err(RejectCode::InvalidArgument));
        assert_eq!(log.apply(node(), trim(9, 1)), Err(RejectCode::NotFound));
        log.apply(
            op(),
            Command::DeleteStream {
                name: "a".into(),
                id: None,
            },
        )
        .expect("delete");
        assert_eq!(log.apply(node(), trim(0, 8)), Err(RejectCode::NotFound));
    }

    #[test]
    fn a_topic_config_reaches_every_partition_and_a_partition_is_not_altered_alone() {
        let mut log = Log::new();
        log.apply(
            op(),
            Command::CreateTopic {
                name: "t".into(),
                partitions: 2,
                config: StreamConfig::default(),
            },
        )
        .expect("topic");
        let config = StreamConfig {
            retention_bytes: Some(10),
            max_message_bytes: Some(2 << 20),
            ..StreamConfig::default()
        };
        let alter = |target| Command::AlterConfig {
            target,
            config: config.clone(),
            expected: None,
            topic_id: None,
        };
        log.apply(op(), alter(ConfigTarget::Topic("t".into())))
            .expect("alter topic");
        for p in ["t/0", "t/1"] {
            assert_eq!(*log.meta.state.stream_by_name(p).expect("partition").config, config);
        }
        assert_eq!(log.meta.state.topics["t"].config, config);
        assert_eq!(
            log.apply(op(), alter(ConfigTarget::Stream("t/0".into()))),
            Err(RejectCode::InvalidArgument)
        );
        log.apply(op(), alter(ConfigTarget::Stream("a".into())))
            .expect("alter stream");
        assert_eq!(*log.row(0).config, config);
        assert_eq!(
            log.apply(op(), alter(ConfigTarget::Topic("none".into()))),
            Err(RejectCode::NotFound)
        );
        let zero = Command::AlterConfig {
            target: ConfigTarget::Stream("a".into()),
            config: StreamConfig {
                max_message_bytes: Some(0),
                ..StreamConfig::default()
            },
            expected: None,
            topic_id: None,
        };
        assert_eq!(log.apply(op(), zero), Err(RejectCode::InvalidArgument));
    }

    /// Issue 21: an alter names the config it read and the topic it read it from; one
    /// landing after a newer alter (its answer lost) is refused and changes nothing, for
    /// a topic and a stream, and so is one for a topic recreated since.
    #[test]
    fn an_alter_landing_after_a_newer_one_is_refused_and_changes_nothing() {
        let mut log = Log::new();
        let create = Command::CreateTopic {
            name: "t".into(),
            partitions: 1,
            config: StreamConfig::default(),
        };
        log.apply(op(), create).expect("topic");
        let retention = |ms| StreamConfig {
            retention_ms: ms,
            ..StreamConfig::default()
        };
        let id = log.meta.state.topics["t"].topic_id;
        let alter = |target: &str, to, read, topic_id| Command::AlterConfig {
            target: if target == "t" {
                ConfigTarget::Topic(target.into())
            } else {
                ConfigTarget::Stream(target.into())
            },
            config: retention(Some(to)),
            expected: Some(retention(read)),
            topic_id,
        };
        for (target, topic_id) in [("t", Some(id)), ("a", None)] {
            let late = alter(target, 1, None, topic_id);
            log.apply(op(), alter(target, 7, None, topic_id))
                .expect("the newer alter");
            assert_eq!(log.apply(op(), late), Err(RejectCode::Conflict), "{target}");
            log.apply(op(), alter(target, 9, Some(7), topic_id))
                .expect("read again");
        }
        assert_eq!(log.meta.state.topics["t"].config.retention_ms, Some(9));
        let partition = log.meta.state.stream_by_name("t/0").expect("partition");
        assert_eq!(partition.config.retention_ms, Some(9));
        assert_eq!(log.row(0).config.retention_ms, Some(9));
        let other_incarnation = alter("t", 3, Some(9), Some([7; 16]));
        assert_eq!(
            log.apply(op(), other_incarnation),
            Err(RejectCode::NotFound),
            "an alter read from a topic deleted since changes nothing"
        );
        assert_eq!(log.meta.state.topics["t"].config.retention_ms, Some(9));
    }
}
