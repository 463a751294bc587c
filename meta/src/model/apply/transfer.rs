//! Planned transfers (SD-DRN-2): the leader marks an open stream's destination, the
//! owner uploads and commits what it buffered and closes the stream, and that close
//! hands the stream to the destination in the same entry. The mark is the transfer's
//! gate in the log: cancelling it (or the owner's failed close) leaves the stream where
//! it was.

use super::{at_epoch, reject, Txn};
use crate::model::command::{Applied, Outcome, Proposer, RejectCode, Rejection};
use crate::model::rows::{NodeKind, NodeRow, StreamState};
use crate::model::state::{RowKey, State};
use weir_shared::ids::{NodeId, StreamEpoch, StreamId};

/// SD-TRM-6, OBS-14: whether `node` may receive a stream, checked in a fixed order;
/// the error names the first check that fails.
pub fn check_destination<'s>(state: &'s State, node: &NodeId) -> Result<&'s NodeRow, Rejection> {
    let row = state
        .nodes
        .get(node)
        .ok_or_else(|| reject(RejectCode::NotFound, format!("node '{node}' is not registered")))?;
    if row.kind != NodeKind::Streamd {
        return Err(reject(
            RejectCode::InvalidArgument,
            format!("node '{node}' is not a streamd"),
        ));
    }
    let unschedulable = if !row.is_live() {
        Some("not live")
    } else if row.terminating {
        Some("terminating")
    } else if row.cordon.is_some() {
        Some("cordoned")
    } else {
        None
    };
    match unschedulable {
        Some(why) => Err(reject(RejectCode::Conflict, format!("node '{node}' is {why}"))),
        None => Ok(row),
    }
}

impl Txn<'_> {
    pub(super) fn begin_transfer(
        &mut self,
        proposer: &Proposer,
        id: StreamId,
        stream_epoch: StreamEpoch,
        target: &NodeId,
    ) -> Outcome {
        self.privileged(proposer)?;
        let target_epoch = check_destination(self.state, target)?.epoch;
        let stream = self.stream_in(id, StreamState::Open, "only an open stream is transferred")?;
        at_epoch(stream, stream_epoch)?;
        let Some(owner) = stream.owner.clone() else {
            return Err(reject(
                RejectCode::Conflict,
                format!("stream '{}' has no owner", stream.name),
            ));
        };
        if &owner.node == target {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("stream '{}' is already on node '{target}'", stream.name),
            ));
        }
        if !self.incarnation_live(&owner) {
            return Err(reject(
                RejectCode::Conflict,
                format!("stream '{}' is owned by {owner}, which is not live", stream.name),
            ));
        }
        let op = self.index;
        self.state
            .streams
            .update(&id, |row| {
                row.transfer_target = Some(target.clone());
                row.transfer_target_epoch = Some(target_epoch);
                row.transfer_op = Some(op);
            })
            .expect("checked");
        self.touch(RowKey::Stream(id));
        Ok(Applied::Done)
    }

    /// Idempotent: a transfer already ended (or never begun at that epoch) stays ended.
    pub(super) fn cancel_transfer(&mut self, proposer: &Proposer, id: StreamId, stream_epoch: StreamEpoch) -> Outcome {
        self.privileged(proposer)?;
        let stream = self.stream(id)?;
        if stream.epoch == stream_epoch && stream.transfer_target.is_some() {
            self.state
                .streams
                .update(&id, crate::model::rows::StreamRow::clear_transfer)
                .expect("checked");
            self.touch(RowKey::Stream(id));
        }
        Ok(Applied::Done)
    }

    /// RR-INT-4: discards the mark of transfer `op` (its `BeginTransfer`'s log index)
    /// after its coordinator is gone. Exact and idempotent: a mark another transfer set
    /// since, or none, stays as it is. A mark from before operation ids (none recorded)
    /// is discarded as op 0.
    pub(super) fn discard_transfer(&mut self, proposer: &Proposer, id: StreamId, op: u64) -> Outcome {
        self.privileged(proposer)?;
        let stream = self.stream(id)?;
        if stream.transfer_target.is_some() && stream.transfer_op.unwrap_or(0) == op {
            self.state
                .streams
                .update(&id, crate::model::rows::StreamRow::clear_transfer)
                .expect("checked");
            self.touch(RowKey::Stream(id));
        }
        Ok(Applied::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::command::{Command, Proposal};
    use crate::model::rows::{ClusterSettings, CordonBy, NodeAddrs};
    use crate::model::Applied;
    use weir_shared::ids::Incarnation;

    struct Log {
        state: State,
        index: u64,
    }

    impl Log {
        fn new() -> Self {
            let mut log = Log {
                state: State::default(),
                index: 0,
            };
            log.op(Command::InitCluster {
                settings: ClusterSettings {
                    heartbeat_interval_sec: 1,
                    node_timeout_sec: 3,
                },
            })
            .unwrap();
            log
        }

        fn run(&mut self, proposer: Proposer, command: Command) -> Outcome {
            self.index += 1;
            self.state
                .apply(
                    self.index,
                    &Proposal { proposer, command },
                    &crate::model::MemIndex::default(),
                )
                .outcome
        }

        fn op(&mut self, command: Command) -> Outcome {
            self.run(
                Proposer::Operator {
                    principal: "test".into(),
                },
                command,
            )
        }

        fn register(&mut self, name: &str, kind: NodeKind) -> Incarnation {
            let Ok(Applied::Registered { epoch }) = self.op(Command::RegisterNode {
                node: NodeId::new(name),
                kind,
                addrs: NodeAddrs::default(),
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            }) else {
                panic!("registration failed")
            };
            Incarnation {
                node: NodeId::new(name),
                epoch,
            }
        }

        /// A stream opened on `owner`; its id and epoch.
        fn open_stream(&mut self, name: &str, owner: &Incarnation) -> (StreamId, StreamEpoch) {
            let Ok(Applied::StreamCreated { stream }) = self.op(Command::CreateStream {
                name: name.into(),
                config: Default::default(),
            }) else {
                panic!("create failed")
            };
            self.op(Command::PlaceStream {
                stream,
                node: owner.node.clone(),
            })
            .unwrap();
            let Ok(Applied::StreamOpened { stream_epoch, .. }) =
                self.run(Proposer::Node(owner.clone()), Command::open(stream))
            else {
                panic!("open failed")
            };
            (stream, stream_epoch)
        }

        fn begin(&mut self, stream: StreamId, stream_epoch: StreamEpoch, target: &str) -> Outcome {
            self.op(Command::BeginTransfer {
                stream,
                stream_epoch,
                target: NodeId::new(target),
            })
        }

        fn close(&mut self, proposer: Proposer, stream: StreamId, stream_epoch: StreamEpoch) -> Outcome {
            self.run(proposer, Command::CloseStream { stream, stream_epoch })
        }

        fn first_failure(&self, node: &str) -> String {
            check_destination(&self.state, &NodeId::new(node)).unwrap_err().message
        }
    }

    /// SD-TRM-6, OBS-14: the destination checks run in a fixed order and the error
    /// names the first one that fails; a node both terminating and cordoned is reported
    /// as terminating.
    #[test]
    fn destination_checks_name_the_first_failure_in_order() {
        let mut log = Log::new();
        let fenced = log.register("fenced", NodeKind::Streamd);
        let terminating = log.register("terminating", NodeKind::Streamd);
        let both = log.register("both", NodeKind::Streamd);
        log.register("cordoned", NodeKind::Streamd);
        log.register("metad-1", NodeKind::Metad);
        log.run(Proposer::Node(fenced), Command::FenceSelf).unwrap();
        log.run(Proposer::Node(terminating), Command::MarkTerminating).unwrap();
        log.run(Proposer::Node(both), Command::MarkTerminating).unwrap();
        for node in ["both", "cordoned"] {
            log.op(Command::Cordon {
                node: NodeId::new(node),
                by: CordonBy::Operator,
            })
            .unwrap();
        }
        // SD-TRM-6: an unknown node, a metad and a fenced node each get their own check's error.
        assert_eq!(log.first_failure("ghost"), "node 'ghost' is not registered");
        assert_eq!(log.first_failure("metad-1"), "node 'metad-1' is not a streamd");
        assert_eq!(log.first_failure("fenced"), "node 'fenced' is not live");
        // OBS-14: the exact client-facing strings for a terminating and a cordoned node.
        assert_eq!(log.first_failure("terminating"), "node 'terminating' is terminating");
        // SD-TRM-6: terminating is checked before cordoned, so a node in both is terminating.
        assert_eq!(log.first_failure("both"), "node 'both' is terminating");
        // OBS-14, SD-TRM-6: cordoned, the last check.
        assert_eq!(log.first_failure("cordoned"), "node 'cordoned' is cordoned");
    }

    /// SD-DRN-2 step 4: the owner's close commits the new ownership to the transfer's
    /// target in the same entry; a cancelled transfer leaves the stream to placement.
    #[test]
    fn a_close_hands_a_transferring_stream_to_its_target() {
        let mut log = Log::new();
        let a = log.register("a", NodeKind::Streamd);
        let b = log.register("b", NodeKind::Streamd);
        let (x, epoch) = log.open_stream("x", &a);
        let refused = log.begin(x, epoch, "a").unwrap_err();
        assert_eq!(refused.code, RejectCode::InvalidArgument, "{refused}");
        log.begin(x, epoch, "b").unwrap();
        assert_eq!(log.state.streams[&x].transfer_target, Some(NodeId::new("b")));
        log.close(Proposer::Node(a.clone()), x, epoch).unwrap();
        let row = &log.state.streams[&x];
        assert_eq!(row.state, StreamState::Closed);
        // SD-DRN-2 (step 4): the new ownership commits in the entry of the source's close, its
        // drain done, and not before: the source still owned the stream to close it.
        assert_eq!(row.owner, Some(b.clone()), "handed to the target in the close's entry");
        assert_eq!(row.transfer_target, None);
        let Ok(Applied::StreamOpened { stream_epoch, .. }) = log.run(Proposer::Node(b), Command::open(x)) else {
            panic!("the target opens it")
        };
        assert!(stream_epoch > epoch, "INV-6: a higher epoch at the target");

        // A cancelled transfer: the close leaves the stream unowned, for placement.
        let (y, epoch) = log.open_stream("y", &a);
        log.begin(y, epoch, "b").unwrap();
        log.op(Command::CancelTransfer {
            stream: y,
            stream_epoch: epoch,
        })
        .unwrap();
        log.op(Command::CancelTransfer {
            stream: y,
            stream_epoch: epoch,
        })
        .expect("cancelling twice is harmless");
        log.close(Proposer::Node(a), y, epoch).unwrap();
        assert_eq!(log.state.streams[&y].owner, None);
    }

    /// INV-6: a close or a transfer made at a stream epoch the stream has left (the
    /// owner of an earlier opening) is refused `not_owner` and changes nothing.
    #[test]
    fn a_close_or_transfer_at_a_stream_epoch_since_left_is_refused() {
        let mut log = Log::new();
        let a = log.register("a", NodeKind::Streamd);
        log.register("b", NodeKind::Streamd);
        let (x, first) = log.open_stream("x", &a);
        log.close(Proposer::Node(a.clone()), x, first).unwrap();
        log.op(Command::PlaceStream {
            stream: x,
            node: NodeId::new("a"),
        })
        .unwrap();
        let Ok(Applied::StreamOpened {
            stream_epoch: second, ..
        }) = log.run(Proposer::Node(a.clone()), Command::open(x))
        else {
            panic!("opened again")
        };
        assert!(second > first);
        let before = log.state.streams[&x].clone();
        // INV-6: the earlier epoch's close and transfer are refused as not the owner's.
        let stale_close = log.close(Proposer::Node(a.clone()), x, first).unwrap_err();
        assert_eq!(stale_close.code, RejectCode::NotOwner, "{stale_close}");
        let stale_transfer = log.begin(x, first, "b").unwrap_err();
        assert_eq!(stale_transfer.code, RejectCode::NotOwner, "{stale_transfer}");
        assert_eq!(log.state.streams[&x], before, "nothing changed");
        log.begin(x, second, "b").expect("at the current epoch");
        // A cancel made at the earlier epoch leaves the current transfer alone.
        log.op(Command::CancelTransfer {
            stream: x,
            stream_epoch: first,
        })
        .expect("a stale cancel is harmless");
        assert_eq!(log.state.streams[&x].transfer_target, Some(NodeId::new("b")));
        log.close(Proposer::Node(a), x, second).expect("at the current epoch");
    }

    /// A destination that became ineligible after the transfer began does not get the
    /// stream: the close leaves it to placement.
    #[test]
    fn a_close_does_not_hand_a_stream_to_a_destination_that_stopped() {
        let mut log = Log::new();
        let a = log.register("a", NodeKind::Streamd);
        let b = log.register("b", NodeKind::Streamd);
        let (x, epoch) = log.open_stream("x", &a);
        log.begin(x, epoch, "b").unwrap();
        log.run(Proposer::Node(b), Command::MarkTerminating).unwrap();
        log.close(Proposer::Node(a), x, epoch).unwrap();
        assert_eq!(log.state.streams[&x].owner, None);
    }

    /// RR-INT-5: a destination restarted after the transfer began (a new incarnation)
    /// does not get the stream from the close: the transfer was with the old one. A
    /// later transfer onto the new incarnation goes through.
    #[test]
    fn a_close_does_not_hand_a_stream_to_a_restarted_destination() {
        let mut log = Log::new();
        let a = log.register("a", NodeKind::Streamd);
        log.register("b", NodeKind::Streamd);
        let (x, epoch) = log.open_stream("x", &a);
        log.begin(x, epoch, "b").unwrap();
        let b2 = log.register("b", NodeKind::Streamd);
        log.close(Proposer::Node(a.clone()), x, epoch).unwrap();
        // RR-INT-5: the restart invalidated the transfer: the new incarnation does not get it.
        assert_eq!(log.state.streams[&x].owner, None, "not handed to {b2}");
        assert_eq!(log.state.streams[&x].transfer_target_epoch, None);

        let (y, epoch) = log.open_stream("y", &a);
        log.begin(y, epoch, "b").unwrap();
        log.close(Proposer::Node(a), y, epoch).unwrap();
        // RR-INT-5: a later transfer onto the restarted node succeeds normally.
        assert_eq!(log.state.streams[&y].owner, Some(b2));
    }

    /// FO-TKO-4, issue 6: a transfer interrupted by its source's death completes to its
    /// target: once the takeover has recovered the stream, the holder's close hands it
    /// to the target, not back to placement.
    #[test]
    fn a_pending_transfer_completes_to_its_target_after_a_takeover() {
        let mut log = Log::new();
        let a = log.register("a", NodeKind::Streamd);
        let b = log.register("b", NodeKind::Streamd);
        let c = log.register("c", NodeKind::Streamd);
        let (x, epoch) = log.open_stream("x", &a);
        log.begin(x, epoch, "b").unwrap();
        let seen = log.state.nodes[&a.node].heartbeats;
        log.op(Command::FenceNode {
            node: a.node.clone(),
            epoch: a.epoch,
            seen_heartbeats: seen,
        })
        .unwrap();
        let close = Command::CloseStream {
            stream: x,
            stream_epoch: epoch,
        };
        let early = log.op(close.clone()).unwrap_err();
        assert_eq!(
            early.code,
            RejectCode::Conflict,
            "not before the WAL is recovered: {early}"
        );
        log.op(Command::BeginTakeover {
            node: a.node.clone(),
            epoch: a.epoch,
            agent: c.node.clone(),
        })
        .unwrap();
        log.run(
            Proposer::Node(c),
            Command::CompleteTakeover {
                node: a.node.clone(),
                epoch: a.epoch,
            },
        )
        .unwrap();
        log.op(close).unwrap();
        // FO-TKO-4: the transfer pending on the fenced source completes to its target.
        assert_eq!(log.state.streams[&x].owner, Some(b), "the target gets it");
    }

    /// RR-INT-4: a discard names the transfer by its operation id (its `BeginTransfer`'s
    /// log index). It clears that mark only: a stale discard, after a newer transfer
    /// marked the stream, changes nothing, and a repeated one is harmless.
    #[test]
    fn rr_int_4_a_discard_clears_exactly_its_own_transfer_mark() {
        let mut log = Log::new();
        let a = log.register("a", NodeKind::Streamd);
        log.register("b", NodeKind::Streamd);
        log.register("c", NodeKind::Streamd);
        let (x, epoch) = log.open_stream("x", &a);
        log.begin(x, epoch, "b").unwrap();
        let first = log.state.streams[&x].transfer_op.expect("the op is recorded");
        assert_eq!(first, log.index, "the op is the BeginTransfer's log index");
        let discard = |op| Command::DiscardTransfer {
            stream: x,
            op,
            reason: "its coordinator is gone".into(),
        };
        log.op(discard(first)).unwrap();
        assert_eq!(log.state.streams[&x].transfer_target, None);
        log.begin(x, epoch, "c").unwrap();
        let second = log.state.streams[&x].transfer_op.expect("op");
        assert!(second > first);
        log.op(discard(first)).expect("a stale discard is harmless");
        let row = &log.state.streams[&x];
        // RR-INT-4: a discard is exact per operation id: the stale one left the newer mark.
        assert_eq!(row.transfer_target, Some(NodeId::new("c")), "another op's mark stays");
        assert_eq!(row.transfer_op, Some(second));
        log.op(discard(second)).unwrap();
        log.op(discard(second)).expect("a repeated discard is harmless");
        let row = &log.state.streams[&x];
        // RR-INT-4: its own discard clears it, and repeating that discard is harmless.
        assert_eq!(
            (row.transfer_target.as_ref(), row.transfer_target_epoch, row.transfer_op),
            (None, None, None)
        );
        // The stream stays where it was: its owner's close leaves it to placement.
        log.close(Proposer::Node(a), x, epoch).unwrap();
        assert_eq!(log.state.streams[&x].owner, None);
    }
}
