//! Benchmark: streamd's acknowledged appends next to what the disk can do.
//! Prints, asserts nothing:
//! - raw write+fdatasync of 4 KiB in a loop (syncs/s) vs streamd appends/s at concurrency 1;
//! - the disk's sequential write bandwidth vs streamd MB/s for 1 KiB appends at
//!   concurrency 64, with p50/p99 acknowledgement latency;
//! - the same with 64 KiB appends, where one gRPC call per append costs less against the
//!   bytes it carries, so the figure is nearer what the WAL itself writes.
//!
//! Run: `cargo bench -p weir-tests --bench streamd_appends` (needs s3s-fs, see .ci/run).
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};
use weir_proto::streamd::AppendRequest;
use weir_tests::batches::batch;
use weir_tests::streamd::{Backend, Stack};

const RUN: Duration = Duration::from_secs(8);

async fn load(stack: &Stack, stream: &str, concurrency: usize, value: usize) -> (usize, f64, Vec<Duration>) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    let payload = bytes::Bytes::from(batch(&vec![b'v'; value]));
    for _ in 0..concurrency {
        let mut client = stack.nodes[0].client().await;
        let payload = payload.clone();
        let stream = stream.to_string();
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
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    all.sort();
    (all.len(), started.elapsed().as_secs_f64(), all)
}

fn pct(v: &[Duration], p: f64) -> Duration {
    v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// Prints a concurrency-64 load's rate and bandwidth against the disk's sequential `seq` MB/s.
fn bandwidth(label: &str, size: usize, (n, secs, lat): (usize, f64, &[Duration]), seq: f64) {
    let mbs = n as f64 * size as f64 / secs / 1e6;
    println!(
        "streamd concurrency 64 ({label}): {:.0} appends/s, {mbs:.1} MB/s ({:.0}% of sequential), p50 {:?} p99 {:?}",
        n as f64 / secs,
        100.0 * mbs / seq,
        pct(lat, 0.5),
        pct(lat, 0.99)
    );
}

#[tokio::main]
async fn main() {
    let stack = Stack::start(1, Backend::FileWal, weir_tests::streamd::PRODUCTION_WAL).await;
    let raw = weir_tests::disk::raw_sync_rate(stack.dir.path());
    let seq = weir_tests::disk::sequential_bandwidth(stack.dir.path());
    stack.create_stream("bench-1", 0).await;
    stack.create_stream("bench-64", 0).await;
    stack.create_stream("bench-64-large", 0).await;
    let (n1, s1, l1) = load(&stack, "bench-1", 1, 4096 - 80).await;
    let (n64, s64, l64) = load(&stack, "bench-64", 64, 1024).await;
    let (nl, sl, ll) = load(&stack, "bench-64-large", 64, 64 * 1024).await;
    println!("disk: raw 4 KiB write+fdatasync {raw:.0}/s, sequential write {seq:.0} MB/s");
    println!(
        "streamd concurrency 1 (4 KiB): {:.0} appends/s ({:.0}% of raw), p50 {:?} p99 {:?}",
        n1 as f64 / s1,
        100.0 * n1 as f64 / s1 / raw,
        pct(&l1, 0.5),
        pct(&l1, 0.99)
    );
    bandwidth("1 KiB", 1024, (n64, s64, &l64), seq);
    bandwidth("64 KiB", 64 * 1024, (nl, sl, &ll), seq);
}
