//! Operator views of the metadata state as JSON, shared by metad's admin API, the
//! gateway's admin endpoints and `weir`: the same document wherever it is asked for.

use crate::model::rows::streams_per_owner;
use crate::model::State;
use serde_json::{json, Value};

/// OBS-5: every registered node with its epoch, heartbeats, flags and owned-stream count.
pub fn nodes_json(state: &State) -> Value {
    let owned = streams_per_owner(&state.streams);
    let nodes: Vec<Value> = state
        .nodes
        .values()
        .map(|n| {
            json!({
                "node_id": n.id,
                "kind": n.kind,
                "epoch": n.epoch,
                "heartbeats": n.heartbeats,
                "fenced": n.fenced,
                "terminating": n.terminating,
                "cordoned": n.cordon.is_some(),
                "cordoned_by": n.cordon,
                "streams": owned.get(&n.id).copied().unwrap_or(0),
                "addrs": n.addrs,
                "registered_index": n.registered_index,
                "last_heartbeat_index": n.last_heartbeat_index,
                "fenced_index": n.fenced_index,
            })
        })
        .collect();
    json!({ "applied_index": state.applied_index, "nodes": nodes })
}

/// The whole state, with token secrets' hashes left out.
pub fn state_json(state: &State) -> Value {
    let mut state = state.clone();
    for token in state.tokens.values_mut() {
        token.secret_sha256 = "<redacted>".into();
    }
    serde_json::to_value(&state).unwrap_or(Value::Null)
}

/// One section of the state by name.
pub fn section_json(state: &State, what: &str) -> Option<Value> {
    let redacted = state_json(state);
    Some(match what {
        "nodes" => nodes_json(state),
        "state" => redacted,
        "streams" | "topics" | "leases" | "tokens" | "takeovers" => json!({
            "applied_index": state.applied_index,
            what: redacted.get(what).cloned().unwrap_or(Value::Null),
        }),
        "settings" => json!({ "applied_index": state.applied_index, "settings": state.settings }),
        _ => return None,
    })
}
