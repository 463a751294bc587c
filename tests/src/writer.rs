//! A client that appends unique payloads over HTTP until told to stop, recording every
//! attempt's outcome in a [`History`] for the checker.

use crate::gateway::Gatewayd;
use crate::history::{History, Outcome};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One client: appends unique payloads to `stream` until `stop`, recording each outcome.
pub async fn client(gw: Arc<Gatewayd>, stream: &'static str, id: usize, history: Arc<History>, stop: Arc<AtomicBool>) {
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let payload = format!("c{id}-{i}");
        i += 1;
        let sent = gw
            .request(Method::POST, &format!("/v1/streams/{stream}/records"))
            .timeout(Duration::from_secs(20))
            .json(&json!({"records": [{"body": payload}]}))
            .send()
            .await;
        let outcome = match sent {
            Ok(r) if r.status() == StatusCode::OK => {
                let v: Value = r.json().await.unwrap_or(Value::Null);
                match v["start_seq_num"].as_u64() {
                    Some(o) => Outcome::Ok(o),
                    None => Outcome::Unknown,
                }
            }
            Ok(r) => {
                let status = r.status();
                let v: Value = r.json().await.unwrap_or(Value::Null);
                let unknown = v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("outcome unknown"));
                // A 5xx that is not the gateway's "nothing applied" answer may have applied
                // it: a 504 (`interrupted`, D-7), or no JSON at all.
                if status == StatusCode::GATEWAY_TIMEOUT || (status.is_server_error() && (unknown || v.is_null())) {
                    Outcome::Unknown
                } else {
                    Outcome::Failed
                }
            }
            Err(_) => Outcome::Unknown,
        };
        let pause = !matches!(outcome, Outcome::Ok(_));
        history.record(stream, &payload, outcome);
        if pause {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One [`client`] per stream of `streams`, with ids counting from `first_id`, until `stop`.
pub fn spawn_clients(
    gw: &Arc<Gatewayd>,
    streams: &[&'static str],
    first_id: usize,
    history: &Arc<History>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    streams
        .iter()
        .enumerate()
        .map(|(i, s)| tokio::spawn(client(gw.clone(), s, first_id + i, history.clone(), stop.clone())))
        .collect()
}

/// Every record of each of `streams`, as `(offset, payload)` in read order, for
/// [`History::check`].
pub async fn read_back(gw: &Gatewayd, streams: &[&str]) -> std::collections::HashMap<String, Vec<(u64, String)>> {
    let mut out = std::collections::HashMap::new();
    for &s in streams {
        // A partition's stream name has a slash, escaped in the path.
        let all = gw.read_all(&s.replace('/', "%2F")).await;
        let records = all
            .iter()
            .map(|r| {
                (
                    r["seq_num"].as_u64().expect("seq"),
                    r["body"].as_str().expect("body").to_string(),
                )
            })
            .collect();
        out.insert(s.to_string(), records);
    }
    out
}
