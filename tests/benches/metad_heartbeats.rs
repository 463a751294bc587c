//! Benchmark: Heartbeat proposals from 100 concurrent clients against 3 metad replicas
//! on loopback. Prints commands/s and p50/p99 commit latency; asserts nothing.
//! Run: `cargo bench -p weir-tests --bench metad_heartbeats`.
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_meta::model::{Command, NodeAddrs, NodeKind, Proposer};
use weir_shared::ids::{Epoch, Incarnation, NodeId};
use weir_tests::metad::Cluster;

const CLIENTS: usize = 100;
const RUN: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() {
    let cluster = Cluster::start(3, &[]).await;
    let client = Arc::new(cluster.client());
    let mut proposers = Vec::new();
    for i in 0..CLIENTS {
        let node = NodeId::new(format!("bench-{i}"));
        let register = Command::RegisterNode {
            node: node.clone(),
            kind: NodeKind::Streamd,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        let (_, outcome) = client
            .propose(
                &Proposer::Operator {
                    principal: "bench".into(),
                },
                register,
            )
            .await
            .expect("register");
        let epoch = match outcome.expect("registered") {
            weir_meta::model::Applied::Registered { epoch } => epoch,
            other => panic!("unexpected {other:?}"),
        };
        proposers.push(Proposer::Node(Incarnation {
            node,
            epoch: Epoch(epoch.0),
        }));
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for proposer in proposers {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while started.elapsed() < RUN {
                let t = Instant::now();
                if client.propose(&proposer, Command::Heartbeat).await.is_ok() {
                    latencies.push(t.elapsed());
                }
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client task"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!("metad heartbeat proposals: {CLIENTS} clients, 3 replicas, {elapsed:.1} s");
    println!("  commands/s: {:.0}", all.len() as f64 / elapsed);
    println!("  commit latency p50: {:?}  p99: {:?}", pct(0.50), pct(0.99));
}
