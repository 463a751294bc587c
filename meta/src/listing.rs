//! Operator views of the metadata state as JSON, shared by metad's admin API, the
//! gateway's admin endpoints and `weir`: the same document wherever it is asked for.

use crate::model::State;
use serde_json::{json, Value};
use weir_shared::ids::StreamId;

/// OBS-5: every registered node with its epoch, heartbeats, flags and owned-stream count.
pub fn nodes_json(state: &State) -> Value {
    let owned = state.streams.load_by_node();
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
                // Open on its current incarnation: how many it serves.
                "open_streams": state.streams.owned(&n.incarnation()).map_or(0, |o| o.open.len()),
                "addrs": n.addrs,
                "registered_index": n.registered_index,
                "last_heartbeat_index": n.last_heartbeat_index,
                "fenced_index": n.fenced_index,
            })
        })
        .collect();
    json!({ "applied_index": state.applied_index, "nodes": nodes })
}

/// Most streams one listing page holds: no answer grows with the number of streams.
pub const MAX_LIST_PAGE: usize = 1_000;

/// A page of streams: from stream id `from` on, at most `limit` (0 or over
/// [`MAX_LIST_PAGE`]: that many), as a map by id; `next` is the id the next page
/// starts at, `null` after the last.
pub fn streams_page(state: &State, from: u64, limit: usize) -> Value {
    let limit = if limit == 0 {
        MAX_LIST_PAGE
    } else {
        limit.min(MAX_LIST_PAGE)
    };
    let mut rows = state.streams.range(StreamId(from)..);
    let page: serde_json::Map<String, Value> = rows
        .by_ref()
        .take(limit)
        .map(|(id, row)| (id.to_string(), serde_json::to_value(row).unwrap_or(Value::Null)))
        .collect();
    let next = rows.next().map(|(id, _)| id.0);
    json!({ "applied_index": state.applied_index, "streams": page, "next": next })
}

/// The streams marked damaged, paged as [`streams_page`].
pub fn damaged_page(state: &State, from: u64, limit: usize) -> Value {
    let limit = if limit == 0 {
        MAX_LIST_PAGE
    } else {
        limit.min(MAX_LIST_PAGE)
    };
    let mut ids = state.streams.damaged().range(StreamId(from)..);
    let page: serde_json::Map<String, Value> = ids
        .by_ref()
        .take(limit)
        .filter_map(|id| {
            state
                .streams
                .get(id)
                .map(|row| (id.to_string(), serde_json::to_value(row).unwrap_or(Value::Null)))
        })
        .collect();
    let next = ids.next().map(|id| id.0);
    json!({ "applied_index": state.applied_index, "streams": page, "next": next })
}

/// One stream by name, `null` when there is none.
pub fn stream_json(state: &State, name: &str) -> Value {
    json!({ "applied_index": state.applied_index, "stream": state.stream_by_name(name) })
}

/// The state with token secrets' hashes left out and its streams paged as
/// [`streams_page`] (from id `from`, at most `limit`; `next` says where the rest starts).
pub fn state_json(state: &State, from: u64, limit: usize) -> Value {
    let page = streams_page(state, from, limit);
    let mut value = json!({
        "applied_index": state.applied_index,
        "settings": state.settings,
        "counters": state.counters,
        "nodes": state.nodes,
        "streams": page["streams"],
        "next": page["next"],
        "topics": state.topics,
        "leases": state.leases,
        "takeovers": state.takeovers.values().collect::<Vec<_>>(),
        "tokens": state.tokens,
    });
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

/// One section of the state by name; `from` and `limit` page the streams of
/// `streams`, `damaged` and `state`.
pub fn section_json(state: &State, what: &str, from: u64, limit: usize) -> Option<Value> {
    let section = |name: &str, value: Value| {
        let mut v = json!({ "applied_index": state.applied_index, name: value });
        redact_secrets(&mut v);
        v
    };
    Some(match what {
        "nodes" => nodes_json(state),
        "state" => state_json(state, from, limit),
        "streams" => streams_page(state, from, limit),
        "damaged" => damaged_page(state, from, limit),
        "topics" => section("topics", json!(state.topics)),
        "leases" => section("leases", json!(state.leases)),
        "tokens" => section("tokens", json!(state.tokens)),
        "takeovers" => section("takeovers", json!(state.takeovers.values().collect::<Vec<_>>())),
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
