//! Property tests of the apply rules over arbitrary command sequences.

use super::command::{Command, Proposal, Proposer};
use super::rows::*;
use super::state::State;
use proptest::prelude::*;
use std::collections::BTreeMap;
use weir_shared::ids::{Epoch, Incarnation, NodeId, StreamId};

const NODES: [&str; 3] = ["a", "b", "c"];

fn node(i: usize) -> NodeId {
    NodeId::new(NODES[i % NODES.len()])
}

/// A proposer that is sometimes current, sometimes stale or from the future.
fn arb_proposer() -> impl Strategy<Value = Proposer> {
    prop_oneof![
        1 => Just(Proposer::Operator { principal: "op".into() }),
        4 => (0..3usize, 0..5u64).prop_map(|(n, e)| Proposer::Node(Incarnation { node: node(n), epoch: Epoch(e) })),
    ]
}

fn arb_command() -> impl Strategy<Value = Command> {
    prop_oneof![
        3 => (0..3usize).prop_map(|n| Command::RegisterNode {
            node: node(n),
            kind: NodeKind::Streamd,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        }),
        6 => Just(Command::Heartbeat),
        4 => (0..3usize, 0..5u64, 0..6u64).prop_map(|(n, e, h)| Command::FenceNode { node: node(n), epoch: Epoch(e), seen_heartbeats: h }),
        1 => Just(Command::FenceSelf),
        1 => Just(Command::MarkTerminating),
        1 => (0..3usize).prop_map(|n| Command::CreateStream { name: format!("s{n}"), config: StreamConfig::default() }),
        2 => (0..3u64, 0..3usize).prop_map(|(s, n)| Command::PlaceStream { stream: StreamId(s), node: node(n) }),
        2 => (0..3u64).prop_map(|s| Command::OpenStream { stream: StreamId(s) }),
        1 => (0..3u64, 0..4u64).prop_map(|(s, e)| Command::CloseStream { stream: StreamId(s), stream_epoch: weir_shared::ids::StreamEpoch(e) }),
        1 => (0..3usize).prop_map(|n| Command::AcquireLease { name: "failover".into(), expected: None.or(Some(Incarnation { node: node(n), epoch: Epoch(1) })) }),
    ]
}

fn initialized() -> State {
    let mut state = State::default();
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// FO-LIV-10, FO-FEN-1, FO-FEN-2, FO-FEN-5, INV-4, INV-5, INV-6: over any command sequence,
    /// node and stream epochs only grow, a fenced incarnation never becomes unfenced,
    /// a FenceNode with a stale epoch or count changes nothing, and a fenced or replaced
    /// proposer's node command changes nothing.
    #[test]
    fn apply_preserves_fencing_invariants(cmds in prop::collection::vec((arb_proposer(), arb_command()), 1..80)) {
        let mut state = initialized();
        let mut fenced: BTreeMap<(NodeId, Epoch), ()> = BTreeMap::new();
        for (i, (proposer, command)) in cmds.into_iter().enumerate() {
            let index = i as u64 + 2;
            let before = state.clone();
            let proposal = Proposal { proposer: proposer.clone(), command: command.clone() };
            let (outcome, changes) = state.apply(index, &proposal);

            // A rejection changes nothing.
            if outcome.is_err() {
                let mut expect = before.clone();
                expect.applied_index = index;
                prop_assert_eq!(&state, &expect);
                prop_assert!(changes.is_empty());
            }
            // Node commands from a fenced or replaced incarnation are rejected (INV-5).
            let node_scoped = !matches!(command, Command::RegisterNode { .. });
            if node_scoped && matches!(proposer, Proposer::Node(_)) && !is_live_proposer(&before, &proposer) {
                prop_assert!(outcome.is_err(), "dead proposer {:?} applied {:?}", proposer, command);
            }
            // FenceNode applies only on an exact match of an unfenced row (INV-4).
            if let Command::FenceNode { node, epoch, seen_heartbeats } = &command {
                let row = before.nodes.get(node);
                let matches = row.is_some_and(|r| r.epoch == *epoch && r.heartbeats == *seen_heartbeats && !r.fenced);
                if !matches {
                    prop_assert!(outcome.is_err());
                }
            }
            for (id, row) in &state.nodes {
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
            // Stream epochs only grow (INV-6).
            for (id, s) in &state.streams {
                if let Some(old) = before.streams.get(id) {
                    prop_assert!(s.epoch >= old.epoch);
                }
            }
            // The reported changes rebuild exactly the new state.
            let mut mirror = before.clone();
            mirror.apply_delta(&super::state::Delta { index, changes });
            prop_assert_eq!(&mirror, &state);
        }
    }
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
    assert_eq!(outcome.unwrap_err().code, super::command::RejectCode::Superseded);
    assert!(!state.nodes[&node(0)].fenced);
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
    assert!(outcome.is_ok());
    assert!(state.nodes[&node(0)].fenced);
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
    assert!(err.message.contains("--heartbeat-interval-sec 10"), "{}", err.message);
    assert!(err.message.contains("--heartbeat-interval-sec 1"), "{}", err.message);
    assert!(state.nodes.is_empty());
}
