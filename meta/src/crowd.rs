//! States holding many streams, for the tests that show a loop's cost follows what
//! changed and not how many streams there are (D-23). Built row by row: building one
//! through the log would apply a command per stream.

use crate::model::rows::{ClusterSettings, NodeAddrs, NodeKind, StreamConfig, StreamRow, StreamState};
use crate::model::{Applied, Command, MemIndex, Proposal, Proposer, State};
use weir_shared::ids::{Incarnation, NodeId, StreamEpoch, StreamId};

/// Applies `command` as an operator at the next index.
pub fn apply(state: &mut State, command: Command) -> crate::model::Outcome {
    let proposal = Proposal {
        proposer: Proposer::Operator {
            principal: "crowd".into(),
        },
        command,
    };
    state
        .apply(state.applied_index + 1, &proposal, &MemIndex::default())
        .outcome
}

/// Registers streamd `node`; its incarnation.
pub fn register(state: &mut State, node: &str) -> Incarnation {
    let registered = apply(
        state,
        Command::RegisterNode {
            node: NodeId::new(node),
            kind: NodeKind::Streamd,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        },
    );
    let Ok(Applied::Registered { epoch }) = registered else {
        panic!("registered: {registered:?}")
    };
    Incarnation {
        node: NodeId::new(node),
        epoch,
    }
}

/// An initialized state with streamd `a` registered and `n` streams open on it, ids
/// `0..n`, named `s0`, `s1`, …; and `a`'s incarnation.
pub fn open_on_one_node(n: u64) -> (State, Incarnation) {
    let mut state = State::default();
    apply(
        &mut state,
        Command::InitCluster {
            settings: ClusterSettings {
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            },
        },
    )
    .expect("init");
    let a = register(&mut state, "a");
    for i in 0..n {
        let mut row = StreamRow::new(StreamId(i), format!("s{i}"), None, &StreamConfig::default());
        row.owner = Some(a.clone());
        row.state = StreamState::Open;
        row.epoch = StreamEpoch(1);
        state.streams.insert(row);
    }
    state.counters.next_stream_id = n;
    (state, a)
}
