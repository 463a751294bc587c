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
    let mut value = serde_json::to_value(state).unwrap_or(Value::Null);
    redact_secrets(&mut value);
    value
}

/// Replaces every token secret's hash in `value` (a state, a token row, a logged
/// `IssueToken` command, at any depth) with `<redacted>`: a SHA-256 of a token is enough
/// to try guesses offline, so no admin output carries one.
pub fn redact_secrets(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                // The SCRAM keys authenticate as well as the secret's digest does.
                if key == "secret_sha256" || key == "scram" {
                    *v = Value::String("<redacted>".into());
                } else {
                    redact_secrets(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_secrets),
        _ => {}
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Command;

    #[test]
    fn a_logged_token_issue_shows_no_secret_hash() {
        let digest = "ab".repeat(32);
        let mut entry = json!({
            "index": 7,
            "proposal": {
                "command": serde_json::to_value(Command::IssueToken {
                    name: "ci".into(),
                    secret_sha256: digest.clone(),
                    scopes: vec!["admin".into()],
                    expires_at_ms: None,
                    scram: Some(crate::scram::credentials("weir_x")),
                })
                .unwrap()
            }
        });
        redact_secrets(&mut entry);
        let text = entry.to_string();
        assert!(!text.contains(&digest), "{text}");
        assert!(text.contains("<redacted>") && text.contains("\"ci\""), "{text}");
    }
}
