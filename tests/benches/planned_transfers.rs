//! Benchmark: moving streams off a node by planned transfer. An operator drain of a
//! node owning N streams (each with buffered, not yet uploaded records), then a SIGTERM
//! of the node that received them, which drains itself through the metad leader.
//! Prints the total and per-stream times; asserts nothing.
//!
//! Run: `cargo bench -p weir-tests --bench planned_transfers` (needs s3s-fs, see .ci/run);
//! `WEIR_BENCH_STREAMS` sets N (default 100).

use reqwest::Method;
use std::time::{Duration, Instant};
use weir_proto::metad::DrainRequest;
use weir_tests::gateway::Gatewayd;
use weir_tests::streamd::{Backend, Stack};

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("WEIR_BENCH_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let timing = [
        "--drain-timeout-sec",
        "120",
        "--shutdown-deadline-sec",
        "150",
        "--shutdown-drain-sec",
        "0",
        "--upload-interval-ms",
        "600000",
    ];
    let mut stack = Stack::start_with(2, Backend::FileWal, &timing, &[]).await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), &[]);
    gw.wait_ready().await;
    let (a, b) = (stack.nodes[0].id.clone(), stack.nodes[1].id.clone());
    gw.send(gw.request(Method::POST, &format!("/admin/nodes/{b}/cordon")))
        .await;
    for i in 0..n {
        let name = format!("bench-{i:03}");
        gw.create_stream(&name).await;
        gw.wait_open(&name).await;
        gw.append(&name, &["a", "b", "c"]).await;
    }
    gw.send(gw.request(Method::POST, &format!("/admin/nodes/{b}/uncordon")))
        .await;

    let started = Instant::now();
    let report = stack
        .metad
        .client()
        .drain(
            DrainRequest {
                node: a.clone(),
                budget_ms: 600_000,
                requester: Vec::new(),
                principal: String::new(),
            },
            Duration::from_secs(610),
        )
        .await
        .expect("drain");
    let took = started.elapsed();
    let moved = report["streams"]
        .as_array()
        .map_or(0, |s| s.iter().filter(|m| m["moved"] == true).count());
    println!(
        "operator drain of {n} streams: {moved} moved in {:.2} s ({:.1} ms per stream)",
        took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / n as f64
    );

    gw.send(gw.request(Method::POST, &format!("/admin/nodes/{a}/uncordon")))
        .await;
    let started = Instant::now();
    stack.nodes[1].term();
    let code = stack.nodes[1].wait_exit(Duration::from_secs(200)).await;
    let took = started.elapsed();
    let log = stack.nodes[1].log_text();
    let drained = log.contains("drained local node before graceful shutdown");
    println!(
        "shutdown drain of {n} streams: exit {code:?} after {:.2} s ({:.1} ms per stream), handed over: {drained}",
        took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / n as f64
    );
}
