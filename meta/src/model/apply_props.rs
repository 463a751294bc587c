//! Property tests of the apply rules over arbitrary sequences of every command kind.

use super::command::CommitRange;
use super::command::{Command, Proposal, Proposer};
use super::index::IndexRead;
use super::metadata::Metadata;
use super::rows::*;
use super::state::State;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestCaseError;
use std::collections::{BTreeMap, BTreeSet};
use weir_shared::ids::{Epoch, Incarnation, NodeId, ObjectKey, Offset, StreamEpoch, StreamId};

const NODES: [&str; 3] = ["a", "b", "c"];

fn node(i: usize) -> NodeId {
    NodeId::new(NODES[i % NODES.len()])
}

/// A command in terms of the state it will meet: indices pick existing streams, epochs
/// are the current one or a stale one, and commits continue the committed end (or not),
/// so that every kind of command both applies and is refused over a run.
#[derive(Clone, Debug)]
enum Op {
    Register(usize, bool),
    Heartbeat,
    Fence {
        node: usize,
        epoch: u64,
        seen: u64,
        exact: bool,
    },
    FenceSelf,
    MarkTerminating,
    Cordon(usize, bool),
    Uncordon(usize, bool),
    CreateTopic(usize, u32),
    DeleteTopic(usize),
    CreatePartitions(usize, u32),
    CreateStream(usize),
    DeleteStream(usize),
    Place(u64, usize),
    BeginTransfer {
        stream: u64,
        target: usize,
        stale: bool,
    },
    CancelTransfer {
        stream: u64,
        stale: bool,
    },
    /// A discard of the stream's current mark, or of another op's (`stale`).
    DiscardTransfer {
        stream: u64,
        stale: bool,
    },
    Open(u64),
    Close {
        stream: u64,
        stale: bool,
    },
    Commit {
        key: u8,
        ranges: Vec<(u64, u64, bool)>,
    },
    AcquireLease(Option<usize>),
    RenewLease,
    IssueToken(usize, bool),
    RevokeToken(usize),
    AllocateProducerIds(u32),
    Destroy(u64),
    BeginTakeover {
        node: usize,
        epoch: u64,
        agent: usize,
    },
    CompleteTakeover {
        node: usize,
        epoch: u64,
        by_agent: bool,
    },
    /// Trims to the start plus `quarter` quarters of the committed span; 5 is past
    /// the committed end.
    Trim {
        stream: u64,
        quarter: u64,
    },
    AlterConfig {
        topic: Option<usize>,
        stream: usize,
        retention_bytes: Option<u64>,
    },
    /// Compacts `count` ranges from the `from`-th into `pieces` objects; `stale` makes
    /// one replaced range differ from the index.
    Compact {
        stream: u64,
        from: usize,
        count: usize,
        pieces: u64,
        stale: bool,
    },
    /// Batches (D-23): many placements, opens or closes in one command.
    PlaceMany(Vec<(u64, usize)>),
    /// GC forgets the objects released this many entries back and before.
    Forget(u64),
    /// The holder reaps a node's row.
    Reap(usize),
    TransferMany(Vec<(u64, usize)>),
    OpenMany(Vec<u64>),
    CloseMany(Vec<(u64, bool)>),
    /// Compacts the first `count` ranges of up to `streams` streams with ranges into one
    /// shared object; `stale` makes the first stream's swap differ from the index.
    CompactMany {
        streams: usize,
        count: usize,
        stale: bool,
    },
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, prop::bool::weighted(0.2)).prop_map(|(n, gw)| Op::Register(n, gw)),
        6 => Just(Op::Heartbeat),
        3 => (0..3usize, 0..5u64, 0..6u64, any::<bool>()).prop_map(|(node, epoch, seen, exact)| Op::Fence { node, epoch, seen, exact }),
        1 => Just(Op::FenceSelf),
        1 => Just(Op::MarkTerminating),
        1 => (0..3usize, any::<bool>()).prop_map(|(n, op)| Op::Cordon(n, op)),
        1 => (0..3usize, any::<bool>()).prop_map(|(n, op)| Op::Uncordon(n, op)),
        1 => (0..2usize, 0..4u32).prop_map(|(t, p)| Op::CreateTopic(t, p)),
        1 => (0..2usize).prop_map(Op::DeleteTopic),
        1 => (0..2usize, 0..6u32).prop_map(|(t, p)| Op::CreatePartitions(t, p)),
        2 => (0..3usize).prop_map(Op::CreateStream),
        1 => (0..3usize).prop_map(Op::DeleteStream),
        3 => (0..8u64, 0..3usize).prop_map(|(s, n)| Op::Place(s, n)),
        2 => (0..8u64, 0..3usize, any::<bool>()).prop_map(|(stream, target, stale)| Op::BeginTransfer { stream, target, stale }),
        1 => (0..8u64, any::<bool>()).prop_map(|(stream, stale)| Op::CancelTransfer { stream, stale }),
        1 => (0..8u64, any::<bool>()).prop_map(|(stream, stale)| Op::DiscardTransfer { stream, stale }),
        3 => (0..8u64).prop_map(Op::Open),
        2 => (0..8u64, any::<bool>()).prop_map(|(stream, stale)| Op::Close { stream, stale }),
        4 => (0..6u8, prop::collection::vec((0..8u64, 1..5u64, prop::bool::weighted(0.85)), 1..4))
            .prop_map(|(key, ranges)| Op::Commit { key, ranges }),
        2 => prop::option::of(0..3usize).prop_map(Op::AcquireLease),
        2 => Just(Op::RenewLease),
        2 => (0..2usize, any::<bool>()).prop_map(|(n, good)| Op::IssueToken(n, good)),
        2 => (0..2usize).prop_map(Op::RevokeToken),
        1 => (0..3u32).prop_map(Op::AllocateProducerIds),
        1 => (0..8u64).prop_map(Op::Destroy),
        3 => (0..3usize, 0..5u64, 0..3usize).prop_map(|(node, epoch, agent)| Op::BeginTakeover { node, epoch, agent }),
        4 => (0..3usize, 0..5u64, any::<bool>()).prop_map(|(node, epoch, by_agent)| Op::CompleteTakeover { node, epoch, by_agent }),
        3 => (0..8u64, 0..6u64).prop_map(|(stream, quarter)| Op::Trim { stream, quarter }),
        1 => (prop::option::of(0..2usize), 0..3usize, prop::option::of(0..100u64))
            .prop_map(|(topic, stream, retention_bytes)| Op::AlterConfig { topic, stream, retention_bytes }),
        6 => (0..8u64, 0..3usize, 1..5usize, 1..4u64, prop::bool::weighted(0.2))
            .prop_map(|(stream, from, count, pieces, stale)| Op::Compact { stream, from, count, pieces, stale }),
        4 => (1..4usize, 1..5usize, prop::bool::weighted(0.3))
            .prop_map(|(streams, count, stale)| Op::CompactMany { streams, count, stale }),
        2 => prop::collection::vec((0..8u64, 0..3usize), 1..5).prop_map(Op::PlaceMany),
        1 => (0..10u64).prop_map(Op::Forget),
        2 => (0..3usize).prop_map(Op::Reap),
        2 => prop::collection::vec((0..8u64, 0..3usize), 1..5).prop_map(Op::TransferMany),
        2 => prop::collection::vec(0..8u64, 1..5).prop_map(Op::OpenMany),
        2 => prop::collection::vec((0..8u64, any::<bool>()), 1..5).prop_map(Op::CloseMany),
    ]
}

/// The `i`-th stream in id order, if any.
fn nth_stream(state: &State, i: u64) -> Option<&StreamRow> {
    let n = state.streams.len() as u64;
    (n > 0).then(|| state.streams.values().nth((i % n) as usize)).flatten()
}

/// The stream's epoch, or a stale one.
fn epoch_of(state: &State, i: u64, stale: bool) -> (StreamId, StreamEpoch) {
    match nth_stream(state, i) {
        Some(s) if stale => (s.id, StreamEpoch(s.epoch.0.saturating_sub(1))),
        Some(s) => (s.id, s.epoch),
        None => (StreamId(i), StreamEpoch(0)),
    }
}

/// The command `op` stands for against `state` and its object `index`.
fn resolve(state: &State, index: &super::index::MemIndex, op: &Op) -> Command {
    let epoch_of_node = |n: usize| state.nodes.get(&node(n)).map_or(Epoch(1), |r| r.epoch);
    match op.clone() {
        Op::Register(n, gw) => Command::RegisterNode {
            node: node(n),
            kind: if gw { NodeKind::Gatewayd } else { NodeKind::Streamd },
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        },
        Op::Heartbeat => Command::Heartbeat,
        Op::Fence {
            node: n,
            epoch,
            seen,
            exact,
        } => match state.nodes.get(&node(n)) {
            Some(r) if exact => Command::FenceNode {
                node: node(n),
                epoch: r.epoch,
                seen_heartbeats: r.heartbeats,
            },
            _ => Command::FenceNode {
                node: node(n),
                epoch: Epoch(epoch),
                seen_heartbeats: seen,
            },
        },
        Op::FenceSelf => Command::FenceSelf,
        Op::MarkTerminating => Command::MarkTerminating,
        Op::Cordon(n, op) => Command::Cordon {
            node: node(n),
            by: if op { CordonBy::Operator } else { CordonBy::Drain },
        },
        Op::Uncordon(n, op) => Command::Uncordon {
            node: node(n),
            by: if op { CordonBy::Operator } else { CordonBy::Drain },
        },
        Op::CreateTopic(t, partitions) => Command::CreateTopic {
            name: format!("t{t}"),
            partitions,
            config: StreamConfig::default(),
        },
        Op::DeleteTopic(t) => Command::DeleteTopic {
            name: format!("t{t}"),
            topic_id: None,
        },
        Op::CreatePartitions(t, partitions) => Command::CreatePartitions {
            name: format!("t{t}"),
            partitions,
        },
        Op::CreateStream(n) => Command::CreateStream {
            name: format!("s{n}"),
            config: StreamConfig::default(),
        },
        Op::DeleteStream(n) => Command::DeleteStream {
            name: format!("s{n}"),
            id: None,
        },
        Op::Place(s, n) => Command::PlaceStream {
            stream: epoch_of(state, s, false).0,
            node: node(n),
        },
        Op::BeginTransfer { stream, target, stale } => {
            let (id, stream_epoch) = epoch_of(state, stream, stale);
            // Usually a node that could take it, so the transfer can begin.
            let owner = nth_stream(state, stream)
                .and_then(|r| r.owner.as_ref())
                .map(|o| o.node.clone());
            let eligible = (0..3)
                .map(|i| node(target + i))
                .find(|n| Some(n) != owner.as_ref() && super::check_destination(state, n).is_ok());
            Command::BeginTransfer {
                stream: id,
                stream_epoch,
                target: eligible.unwrap_or(node(target)),
            }
        }
        Op::CancelTransfer { stream, stale } => {
            let (stream, stream_epoch) = epoch_of(state, stream, stale);
            Command::CancelTransfer { stream, stream_epoch }
        }
        Op::DiscardTransfer { stream, stale } => {
            let (stream, _) = epoch_of(state, stream, false);
            let op = state.streams.get(&stream).and_then(|r| r.transfer_op).unwrap_or(0);
            Command::DiscardTransfer {
                stream,
                op: if stale { op + 1 } else { op },
                reason: "generated".into(),
            }
        }
        Op::Open(s) => Command::OpenStream {
            stream: epoch_of(state, s, false).0,
            stamps_leader_epochs: true,
        },
        Op::Close { stream, stale } => {
            let (stream, stream_epoch) = epoch_of(state, stream, stale);
            Command::CloseStream { stream, stream_epoch }
        }
        Op::Reap(n) => Command::ReapNode {
            node: node(n),
            epoch: state.nodes.get(&node(n)).map_or(Epoch(1), |r| r.epoch),
        },
        Op::Forget(back) => Command::ForgetReleased {
            through: state.applied_index.saturating_sub(back),
        },
        Op::PlaceMany(items) => Command::PlaceStreams {
            placements: items
                .into_iter()
                .map(|(s, n)| super::command::Placement {
                    stream: epoch_of(state, s, false).0,
                    node: node(n),
                })
                .collect(),
        },
        Op::TransferMany(items) => Command::BeginTransfers {
            transfers: items
                .into_iter()
                .map(|(s, n)| {
                    let (stream, stream_epoch) = epoch_of(state, s, false);
                    super::command::TransferTo {
                        stream,
                        stream_epoch,
                        target: node(n),
                    }
                })
                .collect(),
        },
        Op::OpenMany(items) => Command::OpenStreams {
            streams: items.into_iter().map(|s| epoch_of(state, s, false).0).collect(),
            stamps_leader_epochs: true,
        },
        Op::CloseMany(items) => Command::CloseStreams {
            streams: items
                .into_iter()
                .map(|(s, stale)| {
                    let (stream, stream_epoch) = epoch_of(state, s, stale);
                    super::command::StreamAt { stream, stream_epoch }
                })
                .collect(),
        },
        Op::Commit { key, ranges } => {
            let mut ends = std::collections::BTreeMap::new();
            let mut pos = 0;
            let ranges = ranges
                .into_iter()
                .map(|(s, len, continues)| {
                    let (stream, stream_epoch) = epoch_of(state, s, false);
                    let committed = nth_stream(state, s).map_or(0, |r| r.committed_end.0);
                    let start = *ends.get(&stream).unwrap_or(&committed) + u64::from(!continues);
                    ends.insert(stream, start + len);
                    pos += 10;
                    CommitRange {
                        stream,
                        stream_epoch,
                        start: Offset(start),
                        end: Offset(start + len),
                        pos: pos - 10,
                        len: 10,
                        crc: 0,
                        max_timestamp: NO_TIMESTAMP,
                        txns: Default::default(),
                    }
                })
                .collect::<Vec<_>>();
            Command::CommitObjects {
                key: ObjectKey(format!("data/k{key}")),
                size: pos,
                ranges,
            }
        }
        Op::AcquireLease(expected) => Command::AcquireLease {
            name: "failover".into(),
            expected: expected.map(|n| Incarnation {
                node: node(n),
                epoch: epoch_of_node(n),
            }),
        },
        Op::RenewLease => Command::RenewLease {
            name: "failover".into(),
        },
        Op::IssueToken(n, good) => Command::IssueToken {
            name: format!("tok{n}"),
            secret_sha256: if good { "AB".repeat(32) } else { "xyz".into() },
            scopes: vec!["admin".into()],
            expires_at_ms: (n % 2 == 0).then_some(n as u64 * 1_000),
            scram: None,
        },
        Op::RevokeToken(n) => Command::RevokeToken {
            name: format!("tok{n}"),
        },
        Op::AllocateProducerIds(count) => Command::AllocateProducerIds { count },
        Op::Destroy(s) => Command::DestroyStream {
            stream: epoch_of(state, s, false).0,
        },
        // Usually a dead owner of open streams, as the holder proposes; sometimes any.
        Op::BeginTakeover { node: n, epoch, agent } => {
            let dead_owners: Vec<Incarnation> = state
                .streams
                .owners()
                .filter_map(|(o, owned)| {
                    o.filter(|o| !owned.open.is_empty() && !is_live_proposer(state, &Proposer::Node((*o).clone())))
                })
                .cloned()
                .collect();
            match dead_owners.get(n).filter(|_| epoch < 4) {
                Some(dead) => Command::BeginTakeover {
                    node: dead.node.clone(),
                    epoch: dead.epoch,
                    agent: node(agent),
                },
                None => Command::BeginTakeover {
                    node: node(n),
                    epoch: Epoch(epoch),
                    agent: node(agent),
                },
            }
        }
        Op::CompleteTakeover { node: n, epoch, .. } => match state.takeovers.values().nth(n) {
            Some(t) => Command::CompleteTakeover {
                node: t.dead.node.clone(),
                epoch: t.dead.epoch,
            },
            None => Command::CompleteTakeover {
                node: node(n),
                epoch: Epoch(epoch),
            },
        },
        Op::Trim { stream, quarter } => {
            let (id, _) = epoch_of(state, stream, false);
            let (start, end) = nth_stream(state, stream).map_or((0, 0), |r| (r.start_offset.0, r.committed_end.0));
            Command::TrimStream {
                stream: id,
                start: Offset(start + (end - start) * quarter / 4 + u64::from(quarter == 5)),
            }
        }
        Op::Compact {
            stream,
            from,
            count,
            pieces,
            stale,
        } => {
            use super::command::{CompactedObject, ReplacedRange};
            // A stream with ranges, when there is one.
            let with_ranges: Vec<StreamId> = state
                .streams
                .keys()
                .copied()
                .filter(|id| !index.ranges_from(*id, Offset(0), 1).is_empty())
                .collect();
            let id = match with_ranges.len() {
                0 => epoch_of(state, stream, false).0,
                n => with_ranges[(stream % n as u64) as usize],
            };
            let ranges = index.ranges_from(id, Offset(0), usize::MAX);
            let run: Vec<_> = ranges.iter().skip(from).take(count).collect();
            let mut replaced: Vec<ReplacedRange> = run.iter().map(|r| ReplacedRange::from(*r)).collect();
            if stale {
                if let Some(r) = replaced.last_mut() {
                    r.key = ObjectKey("data/elsewhere".into());
                }
            }
            // The run's span cut into `pieces` (fewer when it is short), each its own object.
            let (lo, hi) = (run.first().map_or(0, |r| r.start.0), run.last().map_or(0, |r| r.end.0));
            let n = pieces.min(hi - lo).max(1);
            let objects = (0..n)
                .map(|i| {
                    let start = lo + (hi - lo) * i / n;
                    let end = lo + (hi - lo) * (i + 1) / n;
                    CompactedObject {
                        size: 10,
                        range: ObjectRange {
                            key: ObjectKey(format!("data/c{}-{lo}-{i}", state.applied_index)),
                            start: Offset(start),
                            end: Offset(end),
                            pos: 0,
                            len: 10,
                            crc: 0,
                            max_timestamp: NO_TIMESTAMP,
                            txns: Default::default(),
                        },
                    }
                })
                .collect();
            Command::CompactObjects {
                stream: id,
                replaced,
                objects,
            }
        }
        Op::CompactMany { streams, count, stale } => {
            use super::command::{NewObject, ReplacedRange, StreamSwap};
            let key = ObjectKey(format!("data/m{}", state.applied_index));
            let mut pos = 0;
            let swaps: Vec<StreamSwap> = state
                .streams
                .keys()
                .map(|id| (*id, index.ranges_from(*id, Offset(0), count)))
                .filter(|(_, run)| !run.is_empty())
                .take(streams)
                .enumerate()
                .map(|(i, (id, run))| {
                    let mut replaced: Vec<ReplacedRange> = run.iter().map(ReplacedRange::from).collect();
                    if stale && i == 0 {
                        replaced[0].key = ObjectKey("data/elsewhere".into());
                    }
                    let range = ObjectRange {
                        key: key.clone(),
                        start: run[0].start,
                        end: run[run.len() - 1].end,
                        pos,
                        len: 10,
                        crc: 0,
                        max_timestamp: NO_TIMESTAMP,
                        txns: Default::default(),
                    };
                    pos += 10;
                    StreamSwap {
                        stream: id,
                        replaced,
                        ranges: vec![range],
                    }
                })
                .collect();
            Command::CompactStreams {
                objects: vec![NewObject { key, size: pos.max(10) }],
                swaps,
            }
        }
        Op::AlterConfig {
            topic,
            stream,
            retention_bytes,
        } => Command::AlterConfig {
            target: match topic {
                Some(t) => super::command::ConfigTarget::Topic(format!("t{t}")),
                None => super::command::ConfigTarget::Stream(format!("s{stream}")),
            },
            config: StreamConfig {
                retention_bytes,
                ..StreamConfig::default()
            },
            expected: None,
            topic_id: None,
        },
    }
}

/// A proposer that is usually the live incarnation of a node, sometimes stale, from the
/// future, or an operator.
fn arb_proposer() -> impl Strategy<Value = (usize, i64)> {
    (
        0..4usize,
        prop_oneof![6 => Just(0i64), 1 => Just(-1i64), 1 => Just(1i64)],
    )
}

fn proposer_for(state: &State, (n, skew): (usize, i64)) -> Proposer {
    if n == 3 {
        return Proposer::Operator { principal: "op".into() };
    }
    let current = state.nodes.get(&node(n)).map_or(1, |r| r.epoch.0);
    Proposer::Node(Incarnation {
        node: node(n),
        epoch: Epoch(current.saturating_add_signed(skew)),
    })
}

/// The owner of the `i`-th stream, as a proposer.
fn owner_of(state: &State, i: u64) -> Option<Proposer> {
    nth_stream(state, i).and_then(|r| r.owner.clone()).map(Proposer::Node)
}

fn initialized() -> Metadata {
    let mut state = Metadata::default();
    let init = Proposal {
        proposer: Proposer::Operator { principal: "op".into() },
        command: Command::InitCluster {
            settings: ClusterSettings {
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            },
        },
    };
    assert!(state.apply(1, &init).0.is_ok());
    state
}

fn is_live_proposer(state: &State, p: &Proposer) -> bool {
    match p {
        Proposer::Operator { .. } => true,
        Proposer::Node(i) => state
            .nodes
            .get(&i.node)
            .is_some_and(|r| r.epoch == i.epoch && !r.fenced),
    }
}

/// Runs `ops` from an initialized state, checking every invariant after each entry;
/// returns the kinds of command that applied.
fn check_invariants(ops: Vec<((usize, i64), Op)>) -> Result<BTreeSet<&'static str>, TestCaseError> {
    let mut meta = initialized();
    let mut applied = BTreeSet::new();
    let mut fenced: BTreeMap<(NodeId, Epoch), ()> = BTreeMap::new();
    // The highest epoch each node id ever had, over the whole run (rows are reaped).
    let mut highest: BTreeMap<NodeId, Epoch> = BTreeMap::new();
    for (i, (who, op)) in ops.into_iter().enumerate() {
        let index = i as u64 + 2;
        let before_all = meta.clone();
        let before = &before_all.state;
        let command = resolve(before, &before_all.index, &op);
        let proposer = match (&op, &command) {
            // The agent reports its own takeover, as streamd does.
            (Op::CompleteTakeover { by_agent: true, .. }, Command::CompleteTakeover { node, epoch }) => before
                .takeovers
                .get(&(node.clone(), *epoch))
                .and_then(|t| t.agent.clone())
                .map_or_else(|| proposer_for(before, who), Proposer::Node),
            // The data path's commands usually come from the stream's owner, as they do
            // in a cluster, so runs reach streams with ranges to trim and compact.
            (Op::Open(s), _) if who.0 < 3 && who.1 == 0 => {
                owner_of(before, *s).unwrap_or_else(|| proposer_for(before, who))
            }
            (Op::OpenMany(s), _) if who.0 < 3 && who.1 == 0 => {
                owner_of(before, s[0]).unwrap_or_else(|| proposer_for(before, who))
            }
            // Any live node may compact.
            (Op::Compact { .. } | Op::CompactMany { .. }, _) if who.0 < 3 && who.1 == 0 => before
                .nodes
                .values()
                .find(|n| !n.fenced)
                .map(|n| Proposer::Node(n.incarnation()))
                .unwrap_or_else(|| proposer_for(before, who)),
            (Op::Commit { ranges, .. }, _) if who.0 < 3 && who.1 == 0 && !ranges.is_empty() => {
                owner_of(before, ranges[0].0).unwrap_or_else(|| proposer_for(before, who))
            }
            _ => proposer_for(before, who),
        };
        let proposal = Proposal {
            proposer: proposer.clone(),
            command: command.clone(),
        };
        let (outcome, changes) = meta.apply(index, &proposal);
        let state = &meta.state;
        // A batch counts once one of its items applied.
        let any_item = match &outcome {
            Ok(super::command::Applied::Each { outcomes }) => outcomes.iter().any(Result::is_ok),
            other => other.is_ok(),
        };
        if any_item {
            applied.insert(command.kind());
        }

        // GC's log of released objects: every object that left the index is in it at
        // this entry's index, and a forget drops exactly what it names (D-23).
        let gone: Vec<ObjectKey> = before_all
            .index
            .objects()
            .filter(|o| meta.index.object(&o.key).is_none())
            .map(|o| o.key.clone())
            .collect();
        for key in &gone {
            prop_assert!(
                meta.index
                    .released(index - 1, usize::MAX)
                    .iter()
                    .any(|(i, k)| *i == index && k == key),
                "{:?} left the index without being logged",
                key
            );
        }
        if let (Command::ForgetReleased { through }, true) = (&command, outcome.is_ok()) {
            prop_assert!(meta.index.released(0, usize::MAX).iter().all(|(i, _)| i > through));
            let kept = before_all.index.released(*through, usize::MAX);
            prop_assert_eq!(meta.index.released(*through, usize::MAX), kept);
        }
        // The indexes of the streams say what their rows do (D-23).
        prop_assert!(
            meta.state.streams.indexes_match_rows().is_ok(),
            "{:?}",
            meta.state.streams.indexes_match_rows()
        );
        // A batch is its items applied one after another, each with its own outcome.
        if let Some(singles) = singles_of(&command) {
            let mut one_by_one = before_all.clone();
            let mut expected = Vec::new();
            for single in singles {
                let proposal = Proposal {
                    proposer: proposer.clone(),
                    command: single,
                };
                expected.push(one_by_one.apply(index, &proposal).0);
            }
            match &outcome {
                Ok(super::command::Applied::Each { outcomes }) => {
                    prop_assert_eq!(outcomes, &expected);
                    prop_assert_eq!(&one_by_one.state, &meta.state);
                    prop_assert_eq!(&one_by_one.index, &meta.index);
                }
                Ok(other) => prop_assert!(false, "a batch answered {:?}", other),
                // Refused whole only for its proposer: then every item is refused alike.
                Err(r) => prop_assert!(expected
                    .iter()
                    .all(|e| e.as_ref().err().map(|e| e.code) == Some(r.code))),
            }
        }
        // A rejection changes nothing.
        if outcome.is_err() {
            let mut expect = before.clone();
            expect.applied_index = index;
            prop_assert_eq!(state, &expect);
            prop_assert!(changes.is_empty());
            prop_assert_eq!(&meta.index, &before_all.index);
        }
        // Node commands from a fenced or replaced incarnation are rejected (INV-5).
        let node_scoped = !matches!(command, Command::RegisterNode { .. });
        if node_scoped && matches!(proposer, Proposer::Node(_)) && !is_live_proposer(before, &proposer) {
            prop_assert!(outcome.is_err(), "dead proposer {:?} applied {:?}", proposer, command);
        }
        // A stale compaction changes nothing (D-20).
        if matches!(op, Op::Compact { stale: true, .. }) {
            prop_assert!(outcome.is_err(), "a stale compaction applied");
        }
        // A stale swap is skipped: its stream's ranges are as they were.
        if let (Op::CompactMany { stale: true, .. }, Command::CompactStreams { swaps, .. }) = (&op, &command) {
            if let Some(first) = swaps.first() {
                prop_assert_eq!(
                    meta.index.ranges_from(first.stream, Offset(0), usize::MAX),
                    before_all.index.ranges_from(first.stream, Offset(0), usize::MAX)
                );
                if let Ok(super::command::Applied::Compacted { skipped }) = &outcome {
                    prop_assert!(skipped.contains(&first.stream));
                }
            }
        }
        // FenceNode applies only on an exact match of an unfenced row (INV-4).
        if let Command::FenceNode {
            node,
            epoch,
            seen_heartbeats,
        } = &command
        {
            let row = before.nodes.get(node);
            let matches = row.is_some_and(|r| r.epoch == *epoch && r.heartbeats == *seen_heartbeats && !r.fenced);
            if !matches {
                prop_assert!(outcome.is_err());
            }
        }
        // A reaped row was fenced and nothing referred to it.
        for (id, old) in &before.nodes {
            if !state.nodes.contains_key(id) {
                prop_assert!(old.fenced, "{} reaped while live", id);
                prop_assert!(state.streams.owners().all(|(o, _)| o.is_none_or(|o| &o.node != id)));
                prop_assert!(state.takeovers.keys().all(|(n, _)| n != id), "{}'s takeovers stay", id);
            }
        }
        for (id, row) in &state.nodes {
            // Epochs never go back, even for an id whose row was reaped (FO-LIV-10).
            if let Some(top) = highest.get(id) {
                prop_assert!(
                    row.epoch >= *top,
                    "{} went back from epoch {} to {}",
                    id,
                    top,
                    row.epoch
                );
                if !before.nodes.contains_key(id) {
                    prop_assert!(row.epoch > *top, "{} registered again at epoch {}", id, row.epoch);
                }
            }
            highest.insert(id.clone(), row.epoch);
            if let Some(old) = before.nodes.get(id) {
                // Epochs only grow (FO-LIV-10).
                prop_assert!(row.epoch >= old.epoch);
                if row.epoch == old.epoch && old.fenced {
                    prop_assert!(row.fenced, "{} epoch {} was unfenced", id, row.epoch);
                }
            }
            if row.fenced {
                fenced.insert((id.clone(), row.epoch), ());
            }
        }
        // A fenced incarnation stays fenced for as long as it is the current one.
        for (id, epoch) in fenced.keys() {
            if let Some(row) = state.nodes.get(id) {
                if row.epoch == *epoch {
                    prop_assert!(row.fenced);
                }
            }
        }
        for (id, s) in state.streams.iter() {
            if let Some(old) = before.streams.get(id) {
                // Stream epochs (INV-6) and committed ends only grow.
                prop_assert!(s.epoch >= old.epoch);
                prop_assert!(s.committed_end >= old.committed_end);
            }
            // RR-WAL-4: committed ranges are contiguous from the one holding the start
            // offset to the committed end, and each names a committed object that names
            // the stream. Nothing wholly below the start is indexed, and the stream's
            // byte count is exactly what its ranges hold (retention.bytes).
            if let Some(old) = before.streams.get(id) {
                prop_assert!(s.start_offset >= old.start_offset, "the start offset went back");
            }
            prop_assert!(s.start_offset <= s.committed_end);
            let ranges = meta.index.ranges_from(*id, Offset(0), usize::MAX);
            prop_assert_eq!(ranges.iter().map(|r| r.len).sum::<u64>(), s.bytes);
            let mut at = ranges.first().map_or(s.start_offset, |r| r.start);
            prop_assert!(at <= s.start_offset);
            for r in &ranges {
                prop_assert_eq!(r.start, at);
                prop_assert!(r.end > r.start);
                prop_assert!(
                    r.end > s.start_offset,
                    "range {:?} lies wholly below the start {}",
                    r,
                    s.start_offset
                );
                at = r.end;
                let object = meta.index.object(&r.key);
                prop_assert!(
                    object.is_some_and(|o| o.streams.contains(id)),
                    "{:?} not committed for {}",
                    r.key,
                    id
                );
            }
            prop_assert_eq!(at, s.committed_end);
            // The index API finds every committed offset in exactly one range, and
            // pages of any size, either way, return every range exactly once.
            for offset in s.start_offset.0..s.committed_end.0 {
                let holding: Vec<_> = ranges
                    .iter()
                    .filter(|r| r.start.0 <= offset && offset < r.end.0)
                    .collect();
                prop_assert_eq!(holding.len(), 1);
                let (first, _) = super::index::page(&meta.index, *id, Offset(offset), false, 1);
                prop_assert_eq!(first.first(), holding.first().copied());
            }
            for limit in [1, 2, 1000] {
                let (mut forward, mut at, mut more) = (Vec::new(), s.start_offset, true);
                while more {
                    let (page, m) = super::index::page(&meta.index, *id, at, false, limit);
                    more = m;
                    if let Some(last) = page.last() {
                        at = last.end;
                    }
                    forward.extend(page);
                }
                prop_assert_eq!(&forward, &ranges);
                let (mut backward, mut at, mut more) = (Vec::new(), s.committed_end, true);
                while more {
                    let (page, m) = super::index::page(&meta.index, *id, at, true, limit);
                    more = m;
                    if let Some(last) = page.last() {
                        at = last.start;
                    }
                    backward.extend(page);
                }
                backward.reverse();
                prop_assert_eq!(&backward, &ranges);
            }
            // An open stream has an owner; a transfer mark sits only on an open stream.
            if s.state == StreamState::Open {
                prop_assert!(s.owner.is_some());
            }
            if s.transfer_target.is_some() {
                prop_assert_eq!(s.state, StreamState::Open);
            }
        }
        // Every committed object is referenced by the streams it names, and a destroyed
        // stream leaves no range behind.
        for o in meta.index.objects() {
            prop_assert!(!o.streams.is_empty());
            for id in &o.streams {
                let refs = meta
                    .index
                    .ranges_from(*id, Offset(0), usize::MAX)
                    .iter()
                    .any(|r| r.key == o.key);
                prop_assert!(refs, "object {:?} names {} which does not reference it", o.key, id);
            }
        }
        for (id, _) in meta.index.all_ranges() {
            prop_assert!(state.streams.contains_key(&id), "a range of destroyed stream {}", id);
        }
        // A topic's partitions are its own live streams, in order.
        for t in state.topics.values() {
            for (p, id) in t.partitions.iter().enumerate() {
                let row = state.streams.get(id);
                prop_assert!(
                    row.is_some_and(|r| r.topic.as_deref() == Some(t.name.as_str()) && r.partition == Some(p as u32))
                );
                // A topic's config is its partitions' config.
                prop_assert_eq!(row.map(|r| &*r.config), Some(&t.config));
            }
        }
        // Allocators and lease generations only grow; a takeover never goes back to pending.
        prop_assert!(state.counters.next_producer_id >= before.counters.next_producer_id);
        prop_assert!(state.counters.next_stream_id >= before.counters.next_stream_id);
        for (name, l) in &state.leases {
            if let Some(old) = before.leases.get(name) {
                prop_assert!(l.generation >= old.generation);
            }
        }
        for (key, t) in &state.takeovers {
            if before
                .takeovers
                .get(key)
                .is_some_and(|old| old.state != TakeoverState::Pending)
            {
                prop_assert!(t.state != TakeoverState::Pending);
            }
        }
        // The reported changes rebuild exactly the new state.
        let mut mirror = before.clone();
        mirror.apply_delta(&super::state::Delta { index, changes });
        prop_assert_eq!(&mirror, state);
    }
    // Migrated from format 1 (ranges in the view), the same view and index answer every
    // read the same way. Format 1 predates trims and compactions, whose streams count
    // commits that are no longer ranges.
    if !applied.contains("trim_stream") && !applied.contains("compact_objects") && !applied.contains("compact_streams")
    {
        let rows = super::format1::tests::format1_rows(&meta);
        let migrated = super::format1::tests::migrate_rows(&rows, meta.state.applied_index);
        // Format 1 had no log of released objects.
        prop_assert_eq!(&migrated.state, &meta.state);
        prop_assert_eq!(&migrated.index, &meta.index.without_released());
    }
    Ok(applied)
}

/// The single commands a batch command stands for, in order.
fn singles_of(command: &Command) -> Option<Vec<Command>> {
    Some(match command {
        Command::PlaceStreams { placements } => placements
            .iter()
            .map(|p| Command::PlaceStream {
                stream: p.stream,
                node: p.node.clone(),
            })
            .collect(),
        Command::OpenStreams {
            streams,
            stamps_leader_epochs,
        } => streams
            .iter()
            .map(|&stream| Command::OpenStream {
                stream,
                stamps_leader_epochs: *stamps_leader_epochs,
            })
            .collect(),
        Command::BeginTransfers { transfers } => transfers
            .iter()
            .map(|t| Command::BeginTransfer {
                stream: t.stream,
                stream_epoch: t.stream_epoch,
                target: t.target.clone(),
            })
            .collect(),
        Command::CloseStreams { streams } => streams
            .iter()
            .map(|s| Command::CloseStream {
                stream: s.stream,
                stream_epoch: s.stream_epoch,
            })
            .collect(),
        _ => return None,
    })
}

/// Two streams open on node `a` with a few uploads committed: half the runs start
/// here, so trims and compactions (which need ranges) meet streams that have some.
fn with_data() -> Vec<((usize, i64), Op)> {
    let (operator, owner) = ((3, 0), (0, 0));
    let mut ops = vec![
        (operator, Op::Register(0, false)),
        (operator, Op::CreateStream(0)),
        (operator, Op::CreateStream(1)),
        (operator, Op::Place(0, 0)),
        (operator, Op::Place(1, 0)),
        (owner, Op::Open(0)),
        (owner, Op::Open(1)),
    ];
    for key in 0..4 {
        ops.push((
            owner,
            Op::Commit {
                key,
                ranges: vec![(0, 2, true), (1, 1, true)],
            },
        ));
    }
    ops
}

fn arb_ops() -> impl Strategy<Value = Vec<((usize, i64), Op)>> {
    (any::<bool>(), prop::collection::vec((arb_proposer(), arb_op()), 1..120)).prop_map(|(prefixed, ops)| {
        if prefixed {
            with_data().into_iter().chain(ops).collect()
        } else {
            ops
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// FO-LIV-10, FO-FEN-1, FO-FEN-2, FO-FEN-5, INV-4, INV-5, INV-6, RR-WAL-4: over any
    /// sequence of every kind of command, epochs only grow, a fenced incarnation stays
    /// fenced, stale fences and dead proposers change nothing, committed ranges stay
    /// contiguous and match the objects, and the reported changes rebuild the state.
    /// With trims and compactions among them (issue 16, D-20): every offset at or above
    /// a stream's start is in exactly one range, nothing wholly below it is, the start
    /// never goes back, and a stale compaction changes nothing.
    #[test]
    fn apply_preserves_its_invariants_over_every_command_kind(ops in arb_ops()) {
        // FO-LIV-10, FO-FEN-1, FO-FEN-2, FO-FEN-5, INV-4, INV-5, INV-6: check_invariants
        // asserts each after every entry (epochs only grow, a fence is for good, stale
        // fences and dead proposers change nothing, ranges contiguous and matching).
        check_invariants(ops)?;
    }
}

/// The generator reaches every command kind with commands that apply, so the property
/// above checks each kind's successful path, not only its refusals.
#[test]
fn every_command_kind_applies_somewhere_in_the_generated_runs() {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]));
    let mut applied = BTreeSet::new();
    for _ in 0..400 {
        let ops = arb_ops().new_tree(&mut runner).expect("a run").current();
        applied.extend(check_invariants(ops).expect("invariants hold"));
    }
    let all = [
        "init_cluster",
        "register_node",
        "heartbeat",
        "fence_node",
        "fence_self",
        "mark_terminating",
        "cordon",
        "uncordon",
        "create_topic",
        "delete_topic",
        "create_partitions",
        "create_stream",
        "delete_stream",
        "place_stream",
        "begin_transfer",
        "cancel_transfer",
        "discard_transfer",
        "open_stream",
        "close_stream",
        "commit_objects",
        "acquire_lease",
        "renew_lease",
        "issue_token",
        "revoke_token",
        "allocate_producer_ids",
        "destroy_stream",
        "begin_takeover",
        "complete_takeover",
        "trim_stream",
        "alter_config",
        "compact_objects",
        "compact_streams",
        "place_streams",
        "open_streams",
        "close_streams",
        "begin_transfers",
        "forget_released",
        "reap_node",
    ];
    applied.insert("init_cluster");
    let missing: Vec<_> = all.iter().filter(|k| !applied.contains(*k)).collect();
    assert!(missing.is_empty(), "never applied: {missing:?}");
}

/// FO-FEN-3, FO-FEN-4: a self-fence is unconditional for the current incarnation and
/// rejected from a replaced one.
#[test]
fn self_fence_is_unconditional_but_not_for_a_replaced_epoch() {
    let mut state = initialized();
    let register = Proposal {
        proposer: Proposer::Operator { principal: "op".into() },
        command: Command::RegisterNode {
            node: node(0),
            kind: NodeKind::Streamd,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        },
    };
    assert!(state.apply(2, &register).0.is_ok());
    assert!(state.apply(3, &register).0.is_ok());
    let old = Proposer::Node(Incarnation {
        node: node(0),
        epoch: Epoch(1),
    });
    let current = Proposer::Node(Incarnation {
        node: node(0),
        epoch: Epoch(2),
    });
    let (outcome, _) = state.apply(
        4,
        &Proposal {
            proposer: old,
            command: Command::FenceSelf,
        },
    );
    // FO-FEN-4: the replaced incarnation's late self-fence is rejected as superseded...
    assert_eq!(outcome.unwrap_err().code, super::command::RejectCode::Superseded);
    // FO-FEN-4: ...and leaves the current incarnation unfenced.
    assert!(!state.state.nodes[&node(0)].fenced);
    let hb = Proposal {
        proposer: current.clone(),
        command: Command::Heartbeat,
    };
    assert!(state.apply(5, &hb).0.is_ok());
    let (outcome, _) = state.apply(
        6,
        &Proposal {
            proposer: current.clone(),
            command: Command::FenceSelf,
        },
    );
    // FO-FEN-3: the current incarnation's self-fence applies though its heartbeat count has
    // moved since anyone read it: it names no count to match.
    assert!(outcome.is_ok());
    assert!(state.state.nodes[&node(0)].fenced);
    // FO-FEN-5: a fenced node's commands are rejected.
    let (outcome, _) = state.apply(7, &hb);
    assert_eq!(outcome.unwrap_err().code, super::command::RejectCode::Fenced);
}

/// FO-LIV-14: a node whose timing differs from the cluster's is refused, naming both values.
#[test]
fn registration_with_another_heartbeat_timing_is_refused() {
    let mut state = initialized();
    let p = Proposal {
        proposer: Proposer::Operator { principal: "op".into() },
        command: Command::RegisterNode {
            node: node(0),
            kind: NodeKind::Streamd,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 10,
            node_timeout_sec: 30,
        },
    };
    let err = state.apply(2, &p).0.unwrap_err();
    // FO-LIV-14: the registration is refused with an error naming the node's interval and the cluster's.
    assert!(err.message.contains("--heartbeat-interval-sec 10"), "{}", err.message);
    assert!(err.message.contains("--heartbeat-interval-sec 1"), "{}", err.message);
    assert!(state.state.nodes.is_empty());
}

// Issue 18: `anonymous` is who a gateway without --auth acts for; no token takes it.
#[test]
fn the_anonymous_token_name_is_reserved() {
    let mut state = initialized();
    let issue = |name: &str| Proposal {
        proposer: Proposer::Operator { principal: "op".into() },
        command: Command::IssueToken {
            name: name.into(),
            secret_sha256: "AB".repeat(32),
            scopes: vec!["read".into()],
            expires_at_ms: None,
            scram: None,
        },
    };
    let err = state.apply(2, &issue("anonymous")).0.unwrap_err();
    assert!(err.message.contains("reserved"), "{}", err.message);
    assert!(state.state.tokens.is_empty());
    assert!(state.apply(3, &issue("app")).0.is_ok());
}
