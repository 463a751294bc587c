//! Benchmark: does the metadata stay small as a cluster ingests (issue 15, D-19)?
//!
//! Part 1, the soak: a Kafka producer writes continuously to a topic of 1,000
//! partitions on two streamd nodes. Every minute it prints the view's encoded size (the
//! bytes of a Watch snapshot), the object index's rows, metad's RSS and how long a newly
//! started gatewayd takes to be ready. Goals: the view under 2 KiB per stream and flat;
//! catch-up under 2 s.
//!
//! Part 2, a wide cluster: 10,000 streams (one topic) on three streamd nodes. It prints
//! the placement time (creation until every stream is open on an owner), the view's
//! size, the time and size of a Kafka Metadata response for all topics, and a new
//! gateway's catch-up.
//!
//! Asserts nothing. Run on a release build:
//! `cargo bench -p weir-tests --bench metadata_soak` (needs s3s-fs, see .ci/run).
//! `WEIR_SOAK_MINUTES` (default 10), `WEIR_SOAK_PARTITIONS` (default 1000) and
//! `WEIR_WIDE_STREAMS` (default 10000) scale it.
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_meta::client::MetadClient;
use weir_proto::metad::watch_event::Kind;
use weir_tests::gateway::Gatewayd;
use weir_tests::streamd::{Backend, Stack};

const RECORD: usize = 256;
/// Produce requests in flight at once.
const IN_FLIGHT: usize = 2_000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The view's encoded size: the bytes of the rows of a Watch snapshot, and how long
/// the snapshot took to arrive.
async fn view_bytes(client: &MetadClient) -> (usize, Duration) {
    let started = Instant::now();
    let mut watch = client.watch(None).await.expect("watch");
    let mut bytes = 0;
    loop {
        match watch.message().await.expect("event").expect("open stream").kind {
            Some(Kind::SnapshotRows(rows)) => bytes += rows.len(),
            Some(Kind::SnapshotEnd(_)) => return (bytes, started.elapsed()),
            _ => {}
        }
    }
}

/// Resident set size of a process, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Starts a gatewayd and returns how long it took to answer `/readyz`; stops it.
async fn gateway_catch_up(stack: &Stack, id: &str) -> Duration {
    let started = Instant::now();
    let mut gw = Gatewayd::start(id, &stack.metad_addrs(), stack.dir.path(), &[]);
    let url = gw.url("/readyz");
    let http = reqwest::Client::new();
    loop {
        if http.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    gw.proc().kill();
    took
}

async fn index_rows(stack: &Stack) -> (u64, u64) {
    let index = stack.metad.replicas[0]
        .http_json("/admin/index")
        .await
        .unwrap_or_default();
    (
        index["ranges"].as_u64().unwrap_or(0),
        index["objects"].as_u64().unwrap_or(0),
    )
}

fn producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "60000")
        .create()
        .expect("producer")
}

async fn soak(minutes: u64, partitions: u32) {
    // Placement on (metad's default), as a user's cluster runs.
    let stack = Stack::start_with(2, Backend::FileWal, &[], &[]).await;
    stack.metad.create_topic("soak", partitions).await;
    let gw = Gatewayd::start("soak-gw", &stack.metad_addrs(), stack.dir.path(), &[]);
    gw.wait_ready().await;
    for p in 0..partitions {
        gw.wait_open(&format!("soak/{p}")).await;
    }
    let client = stack.metad.client();
    let producer = producer(&gw.kafka);
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..IN_FLIGHT)
        .map(|w| {
            let (producer, acked, stop) = (producer.clone(), acked.clone(), stop.clone());
            tokio::spawn(async move {
                let value = vec![b'v'; RECORD];
                let mut p = w as u32 % partitions;
                while !stop.load(Ordering::Relaxed) {
                    let record = FutureRecord::<(), [u8]>::to("soak").partition(p as i32).payload(&value);
                    if producer.send(record, Duration::from_secs(60)).await.is_ok() {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    p = (p + IN_FLIGHT as u32) % partitions;
                }
            })
        })
        .collect();
    println!("soak: {partitions} partitions, 2 streamd, 1 metad, {RECORD}-byte records, {minutes} min");
    println!("| minute | records acked | MB/s | view bytes | bytes/stream | index ranges | index objects | metad RSS MiB | new gateway ready |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let started = Instant::now();
    let mut last = 0;
    for minute in 1..=minutes {
        tokio::time::sleep_until((started + Duration::from_secs(60 * minute)).into()).await;
        let total = acked.load(Ordering::Relaxed);
        let mbps = (total - last) as f64 * RECORD as f64 / 60.0 / 1e6;
        last = total;
        let (view, _) = view_bytes(&client).await;
        let (ranges, objects) = index_rows(&stack).await;
        let rss = rss_mib(stack.metad.replicas[0].pid());
        let catch_up = gateway_catch_up(&stack, &format!("soak-new-{minute}")).await;
        println!(
            "| {minute} | {total} | {mbps:.2} | {view} | {:.0} | {ranges} | {objects} | {rss:.0} | {catch_up:.2?} |",
            view as f64 / f64::from(partitions)
        );
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    let _ = producer.flush(Duration::from_secs(30));
}

async fn wide(streams: u32) {
    let stack = Stack::start_with(3, Backend::FileWal, &[], &[]).await;
    let client = stack.metad.client();
    let started = Instant::now();
    stack.metad.create_topic("wide", streams).await;
    loop {
        let section = stack.metad.replicas[0]
            .http_json("/admin/state/streams")
            .await
            .unwrap_or_default();
        let open = section["streams"]
            .as_object()
            .map_or(0, |s| s.values().filter(|r| r["state"] == "open").count());
        if open >= streams as usize {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let placement = started.elapsed();
    let (view, snapshot) = view_bytes(&client).await;
    let catch_up = gateway_catch_up(&stack, "wide-new").await;
    let gw = Gatewayd::start("wide-gw", &stack.metad_addrs(), stack.dir.path(), &[]);
    gw.wait_ready().await;
    let producer = producer(&gw.kafka);
    let started = Instant::now();
    let metadata = producer
        .client()
        .fetch_metadata(None, Duration::from_secs(60))
        .expect("metadata");
    let metadata_time = started.elapsed();
    let partitions: usize = metadata.topics().iter().map(|t| t.partitions().len()).sum();
    // The raw response's size, as a Kafka client receives it.
    let kcat = tokio::process::Command::new("kcat")
        .args(["-b", &gw.kafka, "-L", "-J"])
        .output()
        .await
        .map(|o| o.stdout.len())
        .unwrap_or(0);
    println!("wide cluster: {streams} streams, 3 streamd, 1 metad");
    println!("| placement (create → all open) | view bytes | bytes/stream | watch snapshot | Kafka Metadata (all topics) | partitions in it | kcat -L -J bytes | new gateway ready |");
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {placement:.2?} | {view} | {:.0} | {snapshot:.2?} | {metadata_time:.2?} | {partitions} | {kcat} | {catch_up:.2?} |",
        view as f64 / f64::from(streams)
    );
}

#[tokio::main]
async fn main() {
    let minutes = env_or("WEIR_SOAK_MINUTES", 10);
    let partitions = env_or("WEIR_SOAK_PARTITIONS", 1000) as u32;
    let streams = env_or("WEIR_WIDE_STREAMS", 10_000) as u32;
    if minutes > 0 {
        soak(minutes, partitions).await;
    }
    if streams > 0 {
        wide(streams).await;
    }
}
