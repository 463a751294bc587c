//! Benchmark: time from SIGKILL of a streamd to the first acknowledged append on each
//! of its streams, through a gateway, for the short test timing (1 s heartbeats, 3 s
//! node timeout) and the defaults (5 s, 30 s). The goal is node timeout + under 2 s.
//! Prints figures, asserts nothing.
//!
//! Run: `cargo bench -p weir-tests --bench failover_recovery` (needs s3s-fs, see .ci/run).

use reqwest::Method;
use serde_json::json;
use std::time::{Duration, Instant};
use weir_tests::gateway::Gatewayd;
use weir_tests::streamd::{Backend, Stack};

const STREAMS: usize = 4;

async fn measure(interval: &str, timeout: &str) {
    let timing = ["--heartbeat-interval-sec", interval, "--node-timeout-sec", timeout];
    let mut stack = Stack::start_replicas(1, 2, Backend::FileWal, &timing, &timing).await;
    let gw = Gatewayd::start("bench-gw", &stack.metad_addrs(), stack.dir.path(), &timing);
    gw.wait_ready().await;
    let names: Vec<String> = (0..STREAMS).map(|i| format!("r-{i}")).collect();
    for n in &names {
        gw.create_stream(n).await;
        gw.wait_open(n).await;
        gw.append(n, &["before"]).await;
    }
    // Kill the node owning the first stream; measure the streams it owned.
    let (_, d) = gw.send(gw.request(Method::GET, "/v1/streams/r-0")).await;
    let victim_id = d["owner"]["node"].as_str().expect("owner").to_string();
    let mut owned = Vec::new();
    for n in &names {
        let (_, d) = gw.send(gw.request(Method::GET, &format!("/v1/streams/{n}"))).await;
        if d["owner"]["node"] == victim_id.as_str() {
            owned.push(n.clone());
        }
    }
    let victim = stack.nodes.iter().position(|n| n.id == victim_id).expect("victim");
    let killed = Instant::now();
    stack.nodes[victim].kill();
    let mut times = Vec::new();
    for n in &owned {
        loop {
            let r = gw
                .request(Method::POST, &format!("/v1/streams/{n}/records"))
                .json(&json!({"records": [{"body": "after"}]}))
                .send()
                .await;
            if r.is_ok_and(|r| r.status().is_success()) {
                times.push(killed.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    times.sort();
    println!(
        "heartbeat {interval} s, node timeout {timeout} s: {} streams back; first ack after SIGKILL: min {:?}, max {:?} (timeout + {:?})",
        times.len(),
        times.first().copied().unwrap_or_default(),
        times.last().copied().unwrap_or_default(),
        times
            .last()
            .copied()
            .unwrap_or_default()
            .saturating_sub(Duration::from_secs(timeout.parse().unwrap_or(0)))
    );
}

#[tokio::main]
async fn main() {
    measure("1", "3").await;
    measure("5", "30").await;
}
