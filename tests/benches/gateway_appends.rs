//! Benchmark: appends through gatewayd's HTTP API next to the same load sent to
//! streamd directly over gRPC, so the gateway's cost is visible. 1 KiB records at
//! concurrency 1 and 64; prints appends/s, MB/s, p50 and p99; asserts nothing.
//!
//! Run: `cargo bench -p weir-tests --bench gateway_appends` (needs s3s-fs, see .ci/run).
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_proto::streamd::AppendRequest;
use weir_tests::batches::batch;
use weir_tests::gateway::Gatewayd;
use weir_tests::streamd::{Backend, Stack};

const RUN: Duration = Duration::from_secs(8);
const RECORD: usize = 1024;

struct Figures {
    count: usize,
    secs: f64,
    latencies: Vec<Duration>,
}

impl Figures {
    fn print(&self, what: &str) {
        let pct = |p: f64| {
            self.latencies
                .get(((self.latencies.len() as f64 * p) as usize).min(self.latencies.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        let rate = self.count as f64 / self.secs;
        println!(
            "{what}: {rate:.0} appends/s, {:.2} MB/s, p50 {:?}, p99 {:?}",
            rate * RECORD as f64 / 1e6,
            pct(0.5),
            pct(0.99)
        );
    }
}

async fn collect(tasks: Vec<tokio::task::JoinHandle<Vec<Duration>>>, started: Instant) -> Figures {
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("task"));
    }
    latencies.sort();
    Figures {
        count: latencies.len(),
        secs: started.elapsed().as_secs_f64(),
        latencies,
    }
}

async fn through_gateway(gw: &Arc<Gatewayd>, stream: &str, concurrency: usize) -> Figures {
    let body = Arc::new(json!({ "records": [{ "body": "v".repeat(RECORD) }] }));
    let started = Instant::now();
    let tasks = (0..concurrency)
        .map(|_| {
            let (gw, body, path) = (gw.clone(), body.clone(), format!("/v1/streams/{stream}/records"));
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while started.elapsed() < RUN {
                    let t = Instant::now();
                    let r = gw.request(reqwest::Method::POST, &path).json(&*body).send().await;
                    if r.is_ok_and(|r| r.status().is_success()) {
                        lat.push(t.elapsed());
                    }
                }
                lat
            })
        })
        .collect();
    collect(tasks, started).await
}

async fn direct(stack: &Stack, stream: &str, concurrency: usize) -> Figures {
    let payload = bytes::Bytes::from(batch(&vec![b'v'; RECORD]));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (mut client, payload, stream) = (stack.nodes[0].client().await, payload.clone(), stream.to_string());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while started.elapsed() < RUN {
                let t = Instant::now();
                let req = AppendRequest {
                    stream: stream.clone(),
                    batches: payload.clone(),
                    match_next_offset: None,
                    transactional_id: None,
                };
                if client.append(req).await.is_ok() {
                    lat.push(t.elapsed());
                }
            }
            lat
        }));
    }
    collect(tasks, started).await
}

#[tokio::main]
async fn main() {
    let stack = Stack::start(1, Backend::FileWal, weir_tests::streamd::PRODUCTION_WAL).await;
    let gw = Arc::new(Gatewayd::start(
        "bench-gw",
        &stack.metad.replicas[0].grpc,
        stack.dir.path(),
        &[],
    ));
    gw.wait_ready().await;
    for name in ["direct-1", "direct-64", "gw-1", "gw-64"] {
        stack.create_stream(name, 0).await;
    }
    gw.wait_open("gw-64").await;
    direct(&stack, "direct-1", 1)
        .await
        .print("streamd direct, concurrency 1");
    through_gateway(&gw, "gw-1", 1)
        .await
        .print("through gatewayd, concurrency 1");
    direct(&stack, "direct-64", 64)
        .await
        .print("streamd direct, concurrency 64");
    through_gateway(&gw, "gw-64", 64)
        .await
        .print("through gatewayd, concurrency 64");
}
