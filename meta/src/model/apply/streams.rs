//! Streams: creation, deletion and destruction, and their ownership cycle: placed on a
//! node, opened at the next stream epoch (INV-6), closed by the owner (or, once its WAL
//! is recovered, for a dead owner), possibly handing it to a planned transfer's target.

use super::transfer::check_destination;
use super::{at_epoch, reject, validate_name, Txn};
use crate::model::command::{Applied, Outcome, Proposer, RejectCode};
use crate::model::rows::*;
use crate::model::state::{Row, RowKey};
use weir_shared::ids::{NodeId, Offset, StreamEpoch, StreamId};

impl Txn<'_> {
    pub(super) fn new_stream(&mut self, name: String, topic: Option<(&str, u32)>, config: &StreamConfig) -> StreamId {
        let id = StreamId(self.state.counters.next_stream_id);
        self.state.counters.next_stream_id += 1;
        self.touch(RowKey::Counters);
        let row = StreamRow::new(id, name, topic, config);
        self.state.set_row(&RowKey::Stream(id), Some(Row::Stream(row)));
        self.touch(RowKey::Stream(id));
        id
    }

    pub(super) fn mark_deleted(&mut self, id: StreamId) {
        if let Some(mut row) = self.state.streams.get(&id).cloned() {
            row.state = StreamState::Deleted;
            row.clear_transfer();
            self.state.set_row(&RowKey::Stream(id), Some(Row::Stream(row)));
            self.touch(RowKey::Stream(id));
        }
    }

    pub(super) fn create_stream(&mut self, proposer: &Proposer, name: &str, config: &StreamConfig) -> Outcome {
        self.privileged(proposer)?;
        validate_name("stream", name)?;
        if self.state.streams.names().contains_key(name) {
            return Err(reject(
                RejectCode::AlreadyExists,
                format!("stream '{name}' already exists"),
            ));
        }
        let stream = self.new_stream(name.to_string(), None, config);
        Ok(Applied::StreamCreated { stream })
    }

    pub(super) fn delete_stream(&mut self, proposer: &Proposer, name: &str, id: Option<StreamId>) -> Outcome {
        self.privileged(proposer)?;
        let row = self
            .state
            .stream_by_name(name)
            .filter(|row| id.is_none_or(|id| row.id == id))
            .ok_or_else(|| reject(RejectCode::NotFound, format!("stream '{name}' does not exist")))?;
        if row.topic.is_some() {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("stream '{name}' is a topic partition; delete the topic instead"),
            ));
        }
        let id = row.id;
        self.mark_deleted(id);
        Ok(Applied::Done)
    }

    pub(super) fn destroy_stream(&mut self, proposer: &Proposer, id: StreamId) -> Outcome {
        self.privileged(proposer)?;
        let row = self.stream(id)?;
        if row.state != StreamState::Deleted {
            return Err(reject(RejectCode::Conflict, format!("stream {id} is not deleted")));
        }
        // A live owner destroys it itself once it has stopped serving it; anyone else waits.
        if let Some(owner) = &row.owner {
            let by_owner = matches!(proposer, Proposer::Node(who) if who == owner);
            if self.incarnation_live(owner) && !by_owner {
                return Err(reject(
                    RejectCode::Conflict,
                    format!("stream {id} is still held by live owner {owner}"),
                ));
            }
        }
        // Its ranges leave the index, and each object holding one no longer names it
        // (an object that names no stream is no longer committed; GC takes it).
        self.drop_ranges_below(id, Offset(u64::MAX));
        self.state.set_row(&RowKey::Stream(id), None);
        self.touch(RowKey::Stream(id));
        Ok(Applied::Done)
    }

    pub(super) fn place_stream(&mut self, proposer: &Proposer, id: StreamId, node: &NodeId) -> Outcome {
        self.privileged(proposer)?;
        // The target's checks come first: a refusal names the first failing one (OBS-14).
        let target = check_destination(self.state, node)?;
        let stream = self.stream_in(id, StreamState::Closed, "only a closed stream is placed")?;
        if let Some(owner) = &stream.owner {
            if self.incarnation_live(owner) && &owner.node != node {
                return Err(reject(
                    RejectCode::Conflict,
                    format!("stream '{}' is already placed on live {owner}", stream.name),
                ));
            }
        }
        let owner = target.incarnation();
        self.state
            .streams
            .update(&id, |row| {
                row.owner = Some(owner);
                row.clear_transfer();
            })
            .expect("checked");
        self.touch(RowKey::Stream(id));
        Ok(Applied::Done)
    }

    pub(super) fn open_stream(&mut self, proposer: &Proposer, id: StreamId, stamps_leader_epochs: bool) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let stream = self.stream(id)?;
        if stream.owner.as_ref() != Some(&who) {
            return Err(reject(
                RejectCode::NotOwner,
                format!("stream '{}' is not placed on {who}", stream.name),
            ));
        }
        match stream.state {
            // A retried open after an unknown outcome gets the same answer.
            StreamState::Open => Ok(Applied::StreamOpened {
                stream_epoch: stream.epoch,
                committed_end: stream.committed_end,
            }),
            StreamState::Deleted => Err(reject(
                RejectCode::NotFound,
                format!("stream '{}' is deleted", stream.name),
            )),
            // Acknowledged offsets past the committed end were lost to damage: opening
            // would hand them out again (issue 20).
            StreamState::Closed if stream.damage.as_ref().is_some_and(|d| d.until > stream.committed_end) => {
                Err(reject(
                    RejectCode::Conflict,
                    format!(
                        "stream '{}' lost acknowledged records {}..{} to damage; it opens again once an operator trims past it (weir streams repair --trim-past)",
                        stream.name,
                        stream.damage.as_ref().map_or(0, |d| d.from.0),
                        stream.damage.as_ref().map_or(0, |d| d.until.0)
                    ),
                ))
            }
            StreamState::Closed => {
                let gateways = stamps_leader_epochs
                    .then(|| crate::model::leader_epochs::gateway_changes(self.state));
                let applied = self
                    .state
                    .streams
                    .update(&id, |row| {
                        row.state = StreamState::Open;
                        row.epoch = row.epoch.next();
                        if let Some(gateways) = gateways {
                            crate::model::leader_epochs::record_open(row, gateways);
                        }
                        Applied::StreamOpened {
                            stream_epoch: row.epoch,
                            committed_end: row.committed_end,
                        }
                    })
                    .expect("checked");
                self.touch(RowKey::Stream(id));
                Ok(applied)
            }
        }
    }

    /// The owner closes its stream; another privileged proposer may close a dead
    /// owner's open stream only once that owner's WAL takeover has recovered it.
    pub(super) fn close_stream(&mut self, proposer: &Proposer, id: StreamId, stream_epoch: StreamEpoch) -> Outcome {
        self.privileged(proposer)?;
        let stream = self.stream(id)?;
        at_epoch(stream, stream_epoch)?;
        let owner = stream.owner.clone();
        let by_owner = matches!(proposer, Proposer::Node(who) if Some(who) == owner.as_ref());
        if !by_owner {
            let Some(owner) = owner.as_ref() else {
                return Err(reject(
                    RejectCode::Conflict,
                    format!("stream '{}' has no owner", stream.name),
                ));
            };
            if self.incarnation_live(owner) {
                return Err(reject(
                    RejectCode::NotOwner,
                    format!(
                        "stream '{}' is owned by live {owner}; only it may close it",
                        stream.name
                    ),
                ));
            }
            if stream.state == StreamState::Open {
                let recovered = self
                    .state
                    .takeovers
                    .get(&(owner.node.clone(), owner.epoch))
                    .is_some_and(|t| t.state != TakeoverState::Pending);
                if !recovered {
                    return Err(reject(
                        RejectCode::Conflict,
                        format!(
                            "stream '{}' is open on dead {owner} whose WAL is not recovered yet",
                            stream.name
                        ),
                    ));
                }
            }
        }
        if stream.state == StreamState::Deleted {
            return Err(reject(
                RejectCode::NotFound,
                format!("stream '{}' is deleted", stream.name),
            ));
        }
        // A planned transfer (or one a takeover interrupted) completes to its target in
        // this same entry, if the target can still take it and is the incarnation the
        // transfer began with (RR-INT-5); otherwise placement decides.
        let handed_to = stream
            .transfer_target
            .as_ref()
            .and_then(|t| check_destination(self.state, t).ok())
            .filter(|t| stream.transfer_target_epoch.is_none_or(|e| e == t.epoch))
            .map(NodeRow::incarnation);
        self.state
            .streams
            .update(&id, |row| {
                row.state = StreamState::Closed;
                row.owner = handed_to;
                row.clear_transfer();
            })
            .expect("checked");
        self.touch(RowKey::Stream(id));
        Ok(Applied::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_log::{op, Log};
    use crate::model::command::{Applied, RejectCode};
    use crate::model::rows::StreamConfig;
    use crate::model::Command;
    use weir_shared::ids::StreamId;

    fn create_stream(log: &mut Log, name: &str) -> StreamId {
        let command = Command::CreateStream {
            name: name.into(),
            config: StreamConfig::default(),
        };
        match log.apply(op(), command) {
            Ok(Applied::StreamCreated { stream }) => stream,
            other => panic!("create: {other:?}"),
        }
    }

    fn create_topic(log: &mut Log, name: &str) -> [u8; 16] {
        let command = Command::CreateTopic {
            name: name.into(),
            partitions: 1,
            config: StreamConfig::default(),
        };
        log.apply(op(), command).expect("create topic");
        log.meta.state.topics[name].topic_id
    }

    /// Issue 21: a delete that lands after its caller gave up, and after the stream or
    /// topic was deleted and recreated, names the incarnation it meant and deletes
    /// nothing; one naming the current incarnation deletes it.
    #[test]
    fn a_delete_by_id_spares_a_stream_or_topic_recreated_since() {
        let mut log = Log::new();
        let first = create_stream(&mut log, "x");
        let late = |id| Command::DeleteStream {
            name: "x".into(),
            id: Some(id),
        };
        log.apply(op(), late(first)).expect("the first delete");
        // A deleted row keeps its name until its data is reclaimed and it is destroyed.
        log.apply(op(), Command::DestroyStream { stream: first })
            .expect("destroy");
        let second = create_stream(&mut log, "x");
        assert_ne!(first, second);
        assert_eq!(log.apply(op(), late(first)), Err(RejectCode::NotFound));
        assert!(log.meta.state.stream_by_name("x").is_some_and(|r| r.id == second));
        assert_eq!(log.apply(op(), late(second)), Ok(Applied::Done));

        let old = create_topic(&mut log, "t");
        let by_id = |topic_id| Command::DeleteTopic {
            name: "t".into(),
            topic_id: Some(topic_id),
        };
        log.apply(op(), by_id(old)).expect("the first topic delete");
        let new = create_topic(&mut log, "t");
        assert_ne!(old, new);
        assert_eq!(log.apply(op(), by_id(old)), Err(RejectCode::NotFound));
        assert!(log.meta.state.topics.contains_key("t"), "the new topic stays");
        assert_eq!(log.apply(op(), by_id(new)), Ok(Applied::Done));
    }

    fn register(log: &mut Log, name: &str, kind: crate::model::rows::NodeKind) {
        let command = Command::RegisterNode {
            node: weir_shared::ids::NodeId::new(name),
            kind,
            addrs: Default::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        log.apply(op(), command).expect("register");
    }

    /// A deleted stream its live owner still holds is destroyed by that owner only,
    /// once it has stopped serving it; after the owner is fenced, by anyone privileged.
    #[test]
    fn a_deleted_stream_is_destroyed_by_its_live_owner_only() {
        use super::super::test_log::node;
        let mut log = Log::new();
        let delete = |name: &str| Command::DeleteStream {
            name: name.into(),
            id: None,
        };
        log.apply(op(), delete("a")).expect("delete a");
        log.apply(op(), delete("b")).expect("delete b");
        let destroy = |s| Command::DestroyStream { stream: StreamId(s) };
        assert_eq!(log.apply(op(), destroy(0)), Err(RejectCode::Conflict));
        assert_eq!(log.apply(node(), destroy(0)), Ok(Applied::Done));
        assert!(!log.meta.state.streams.contains_key(&StreamId(0)));
        log.apply(
            op(),
            Command::FenceNode {
                node: weir_shared::ids::NodeId::new("n"),
                epoch: weir_shared::ids::Epoch(1),
                seen_heartbeats: 0,
            },
        )
        .expect("fence n");
        assert_eq!(log.apply(op(), destroy(1)), Ok(Applied::Done), "its owner is gone");
    }

    /// A stream placed on a live node and not yet opened is placed again only on that
    /// node; and damage wholly inside committed data does not keep it from opening.
    #[test]
    fn a_closed_stream_of_a_live_owner_is_placed_only_on_its_node() {
        use super::super::test_log::node;
        use crate::model::rows::NodeKind;
        use weir_shared::ids::{NodeId, Offset};
        let mut log = Log::new();
        register(&mut log, "m", NodeKind::Streamd);
        log.commit("data/1", &[(0, 10, 100)]);
        log.apply(
            node(),
            Command::ReportDamage {
                stream: StreamId(0),
                from: Offset(5),
                until: Offset(10),
                what: "a range fails its checksum".into(),
            },
        )
        .expect("damage in committed data");
        log.close(0);
        let place = |to: &str| Command::PlaceStream {
            stream: StreamId(0),
            node: NodeId::new(to),
        };
        log.apply(op(), place("n")).expect("placed on n");
        // Placed, not yet opened: its placement on live n stands.
        assert_eq!(log.apply(op(), place("m")), Err(RejectCode::Conflict));
        log.apply(op(), place("n")).expect("placed on n again");
        assert!(
            matches!(log.apply(node(), Log::open_by_n(0)), Ok(Applied::StreamOpened { .. })),
            "damage below the committed end does not hold the open"
        );
    }

    /// D-23: a batch command holds 1 to `MAX_BATCH` items. At the bound it applies item
    /// by item, each refused or applied on its own; empty or past the bound it is
    /// refused whole, so one entry's apply stays bounded.
    #[test]
    fn a_batch_holds_one_to_max_batch_items() {
        use crate::model::command::{Placement, MAX_BATCH};
        let mut log = Log::new();
        let place = |n: u64| Command::PlaceStreams {
            placements: (0..n)
                .map(|i| Placement {
                    stream: StreamId(1_000 + i),
                    node: weir_shared::ids::NodeId::new("n"),
                })
                .collect(),
        };
        let bound = MAX_BATCH as u64;
        assert_eq!(log.apply(op(), place(0)), Err(RejectCode::InvalidArgument));
        assert_eq!(log.apply(op(), place(bound + 1)), Err(RejectCode::InvalidArgument));
        let Ok(Applied::Each { outcomes }) = log.apply(op(), place(bound)) else {
            panic!("a batch at the bound applies item by item")
        };
        assert_eq!(outcomes.len(), MAX_BATCH);
        // No such streams: each item is refused on its own.
        assert!(outcomes.iter().all(|o| o.is_err()), "{:?}", &outcomes[..1]);
    }

    /// Issue 22: each open records the leader epoch it starts at the committed end, and
    /// a retried open records nothing more.
    #[test]
    fn each_open_records_where_its_leader_epoch_starts() {
        use super::super::test_log::node;
        use weir_shared::ids::Offset;
        let mut log = Log::new();
        let first = log.row(0).leader_epochs.clone();
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].leader_epoch, first[0].start), (1, Offset(0)));
        log.commit("data/1", &[(0, 7, 70)]);
        log.close(0);
        log.place_on_n(0);
        let open = Log::open_by_n(0);
        log.apply(node(), open.clone()).expect("open");
        log.apply(node(), open).expect("retried open");
        let history: Vec<_> = log
            .row(0)
            .leader_epochs
            .iter()
            .map(|e| (e.leader_epoch, e.stream_epoch.0, e.start.0))
            .collect();
        assert_eq!(history, [(1, 1, 0), (2, 2, 7)]);
    }
}
