//! Benchmark: do the metadata and the bucket stay bounded as a cluster ingests
//! (issues 15 and 16, D-19, D-20)?
//!
//! Part 1, the soak: a Kafka producer writes continuously to a topic of 1,000
//! partitions on two streamd nodes, with `retention.bytes` per partition and compaction
//! on. Every minute it prints the view's encoded size (the bytes of a Watch snapshot),
//! the object index's rows and ranges per stream, the data objects in the bucket,
//! metad's RSS and how long a newly started gatewayd takes to be ready. Goals: the view
//! under 2 KiB per stream and flat; catch-up under 2 s; index and bucket level off.
//!
//! Part 3, compaction: one partition written in small uploads with compaction off, then
//! the same with it on, at a fixed produce rate. It prints ranges (objects a read
//! touches) per MiB before and after compaction, compaction's throughput, and produce
//! p99 without and with compaction running.
//!
//! Part 2, a wide cluster: 10,000 streams (one topic) on three streamd nodes. It prints
//! the placement time (creation until every stream is open on an owner), the view's
//! size, the time and size of a Kafka Metadata response for all topics, and a new
//! gateway's catch-up.
//!
//! Asserts nothing. Run on a release build:
//! `cargo bench -p weir-tests --bench metadata_soak` (needs s3s-fs, see .ci/run).
//! `WEIR_SOAK_MINUTES` (default 10), `WEIR_SOAK_PARTITIONS` (default 1000),
//! `WEIR_SOAK_RETENTION_BYTES` (per partition, default 1 MiB), `WEIR_WIDE_STREAMS`
//! (default 10000) and `WEIR_COMPACTION_MIB` (default 64) scale it.
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
    let http = weir_tests::http();
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

/// streamd's `--compaction-target-bytes` default.
const COMPACTION_TARGET: u64 = 64 << 20;

/// Counters summed over the stack's streamd nodes.
#[derive(Default)]
struct NodeSums {
    uploads: f64,
    passes: f64,
    pass_seconds: f64,
    entries: f64,
}

impl NodeSums {
    async fn of(stack: &Stack) -> NodeSums {
        let mut sums = NodeSums::default();
        for node in &stack.nodes {
            let text = weir_tests::get_text(&format!("http://{}/metrics", node.http)).await;
            let value = |name| weir_tests::metric_value(&text, name).unwrap_or(0.0);
            sums.uploads += value("weir_streamd_objects_committed_total");
            sums.passes += value("weir_streamd_compaction_pass_seconds_count");
            sums.pass_seconds += value("weir_streamd_compaction_pass_seconds_sum");
            sums.entries += value("weir_streamd_compaction_commands_total");
        }
        sums
    }
}

/// The cluster's upload count sampled over time, for the uploads of a recent window.
#[derive(Default)]
struct UploadSamples(std::collections::VecDeque<(Instant, f64)>);

impl UploadSamples {
    fn push(&mut self, uploads: f64) {
        let now = Instant::now();
        self.0.push_back((now, uploads));
        // A few minutes of samples cover any interval and pass.
        while self
            .0
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > Duration::from_secs(300))
        {
            self.0.pop_front();
        }
    }

    /// Uploads since `secs` ago, counted from the last sample at or before then (so the
    /// window is never shorter than asked).
    fn within(&self, secs: f64) -> f64 {
        let Some(&(now, latest)) = self.0.back() else {
            return 0.0;
        };
        let from = now.checked_sub(Duration::from_secs_f64(secs));
        let before = self
            .0
            .iter()
            .rev()
            .find(|(at, _)| from.is_some_and(|f| *at <= f))
            .or(self.0.front())
            .map_or(0.0, |(_, u)| *u);
        latest - before
    }
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

/// Data objects in the bucket.
async fn bucket_objects(stack: &Stack) -> usize {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let listed: Vec<_> = stack
        .s3
        .store()
        .list(Some(&object_store::path::Path::from("data")))
        .try_collect()
        .await
        .unwrap_or_default();
    listed.len()
}

/// Sets `topic`'s `retention.bytes` through the metadata log.
async fn set_retention_bytes(stack: &Stack, topic: &str, bytes: u64) {
    use weir_meta::model::{Command, ConfigTarget, Proposer, StreamConfig};
    let command = Command::AlterConfig {
        target: ConfigTarget::Topic(topic.into()),
        config: StreamConfig {
            retention_bytes: Some(bytes),
            ..StreamConfig::default()
        },
        expected: None,
        topic_id: None,
    };
    let op = Proposer::Operator {
        principal: "bench".into(),
    };
    let (_, outcome) = stack.metad.client().propose(&op, command).await.expect("alter config");
    outcome.expect("config set");
}

async fn soak(minutes: u64, partitions: u32, retention_bytes: u64) {
    // Placement on (metad's default), as a user's cluster runs; retention and compaction
    // checked every 10 s so a 10-minute soak shows where they level off.
    let compaction_interval = env_or("WEIR_SOAK_COMPACTION_INTERVAL_MS", 10_000).to_string();
    let flags = [
        "--retention-check-interval-ms",
        "10000",
        "--compaction-interval-ms",
        &compaction_interval,
        "--gc-delay-sec",
        "60",
        "--gc-grace-sec",
        "10",
    ];
    let stack = Stack::start_with(2, Backend::FileWal, &flags, &[]).await;
    stack.metad.create_topic("soak", partitions).await;
    set_retention_bytes(&stack, "soak", retention_bytes).await;
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
    println!(
        "soak: {partitions} partitions, 2 streamd, 1 metad, {RECORD}-byte records, {minutes} min, retention.bytes {retention_bytes} per partition"
    );
    // The bound on ranges per stream (D-20). "issue's bound" is ceil(retained / target)
    // plus the ranges one interval adds (one per upload of the owner). The bound the
    // compactor keeps adds what that leaves out:
    // - the size classes: a window is merged only when no range in it outweighs the rest
    //   (so a byte is rewritten at most log2(target / upload) times), which leaves one
    //   range per doubling between one interval's bytes and min(retained, target), plus
    //   the range that straddles the start after a trim;
    // - the pass: a range written just after a pass planned is merged by the next pass's
    //   commit, an interval plus a pass later.
    // The uploads in both are counted over the window that ends at the measurement
    // (sampled every second), not averaged over the minute: a minute whose start was
    // quieter would understate them.
    let interval_s = compaction_interval.parse::<f64>().expect("a number of ms") / 1e3;
    println!("| minute | records acked | MB/s | view bytes | bytes/stream | index ranges | ranges/stream | uploads/node/interval | issue's bound | bound (D-20) | within | compaction pass s | log entries/pass | index objects | bucket objects | metad RSS MiB | new gateway ready |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let started = Instant::now();
    let (mut last, mut last_sums) = (0, NodeSums::default());
    let mut uploads_seen = UploadSamples::default();
    uploads_seen.push(NodeSums::of(&stack).await.uploads);
    for minute in 1..=minutes {
        let mark = started + Duration::from_secs(60 * minute);
        while Instant::now() + Duration::from_secs(1) < mark {
            tokio::time::sleep(Duration::from_secs(1)).await;
            uploads_seen.push(NodeSums::of(&stack).await.uploads);
        }
        tokio::time::sleep_until(mark.into()).await;
        let total = acked.load(Ordering::Relaxed);
        let mbps = (total - last) as f64 * RECORD as f64 / 60.0 / 1e6;
        last = total;
        let sums = NodeSums::of(&stack).await;
        uploads_seen.push(sums.uploads);
        let nodes = stack.nodes.len() as f64;
        let passes = (sums.passes - last_sums.passes).max(1.0);
        let pass = (sums.pass_seconds - last_sums.pass_seconds) / passes;
        let entries = (sums.entries - last_sums.entries) / passes;
        last_sums = sums;
        // Ranges one owner added in the last interval, and in the last interval and pass.
        let uploads = uploads_seen.within(interval_s) / nodes;
        let uploads_pending = uploads_seen.within(interval_s + pass) / nodes;
        let full = retention_bytes.div_ceil(COMPACTION_TARGET) as f64;
        let issue_bound = full + uploads;
        let interval_bytes = (mbps * 1e6 / f64::from(partitions) * interval_s).max(1.0);
        let classes = (retention_bytes.min(COMPACTION_TARGET) as f64 / interval_bytes)
            .log2()
            .ceil()
            .max(0.0)
            + 1.0;
        let bound = full + classes + 1.0 + uploads_pending;
        let (view, _) = view_bytes(&client).await;
        let (ranges, objects) = index_rows(&stack).await;
        let rss = rss_mib(stack.metad.replicas[0].pid());
        let bucket = bucket_objects(&stack).await;
        let catch_up = gateway_catch_up(&stack, &format!("soak-new-{minute}")).await;
        let per_stream = ranges as f64 / f64::from(partitions);
        println!(
            "| {minute} | {total} | {mbps:.2} | {view} | {:.0} | {ranges} | {per_stream:.1} | {uploads:.1} | {issue_bound:.1} | {bound:.1} | {} | {pass:.2} | {entries:.1} | {objects} | {bucket} | {rss:.0} | {catch_up:.2?} |",
            view as f64 / f64::from(partitions),
            if per_stream <= bound { "yes" } else { "NO" }
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

/// p99 of `latencies`.
fn p99(latencies: &mut [Duration]) -> Duration {
    latencies.sort();
    latencies
        .get(latencies.len().saturating_sub(1) * 99 / 100)
        .copied()
        .unwrap_or_default()
}

/// Produces `mib` MiB of 1 KiB records to `topic` at `rate` records a second (one at a
/// time per sender), returning each acknowledgement's latency.
async fn produce_at(producer: &FutureProducer, topic: &str, mib: u64, rate: u64) -> Vec<Duration> {
    let count = mib * 1024;
    let value = vec![b'c'; 1024];
    let mut latencies = Vec::with_capacity(count as usize);
    let started = Instant::now();
    let mut pending = futures::stream::FuturesUnordered::new();
    for i in 0..count {
        tokio::time::sleep_until((started + Duration::from_secs_f64(i as f64 / rate as f64)).into()).await;
        let producer = producer.clone();
        let value = value.clone();
        let topic = topic.to_string();
        pending.push(async move {
            let sent = Instant::now();
            let record = FutureRecord::<(), [u8]>::to(&topic).partition(0).payload(&value);
            producer
                .send(record, Duration::from_secs(60))
                .await
                .ok()
                .map(|_| sent.elapsed())
        });
        while let Some(Some(l)) = futures::FutureExt::now_or_never(futures::StreamExt::next(&mut pending)).flatten() {
            latencies.push(l);
        }
    }
    while let Some(l) = futures::StreamExt::next(&mut pending).await {
        latencies.extend(l);
    }
    latencies
}

/// Waits until compaction's written bytes stop growing for 5 s; the bytes and the
/// seconds it was busy since `since`.
async fn compaction_settles(stack: &Stack, since: Instant) -> (f64, f64) {
    let url = format!("http://{}/metrics", stack.nodes[0].http);
    let (mut written, mut last_change) = (0.0, Instant::now());
    while last_change.elapsed() < Duration::from_secs(5) && since.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let text = weir_tests::get_text(&url).await;
        let now = weir_tests::metric_value(&text, "weir_streamd_compacted_bytes_total").unwrap_or(0.0);
        if now > written {
            (written, last_change) = (now, Instant::now());
        }
    }
    (written, last_change.duration_since(since).as_secs_f64().max(0.001))
}

async fn compaction_stack(flags: &[&str]) -> (Stack, Gatewayd, FutureProducer) {
    let stack = Stack::start_with(1, Backend::FileWal, flags, &[]).await;
    stack.metad.create_topic("compact", 1).await;
    let gw = Gatewayd::start("compact-gw", &stack.metad_addrs(), stack.dir.path(), &[]);
    gw.wait_ready().await;
    gw.wait_open("compact/0").await;
    let producer = producer(&gw.kafka);
    (stack, gw, producer)
}

async fn compaction(mib: u64) {
    const RATE: u64 = 2_000;
    const TARGET: &str = "8388608";
    let off = [
        "--upload-interval-ms",
        "100",
        "--compaction-target-bytes",
        TARGET,
        "--compaction-interval-ms",
        "3600000",
    ];
    let on = [
        "--upload-interval-ms",
        "100",
        "--compaction-target-bytes",
        TARGET,
        "--compaction-interval-ms",
        "2000",
    ];
    println!("compaction: 1 partition, {mib} MiB of 1 KiB records at {RATE}/s, uploads every 100 ms, target 8 MiB");

    // Compaction off while producing; then the node restarts with it on and compacts
    // everything at once: ranges (objects a read touches) per MiB before and after,
    // and compaction's own throughput.
    let (mut stack, _gw, producer) = compaction_stack(&off).await;
    let mut quiet = produce_at(&producer, "compact", mib, RATE).await;
    let (before, _) = index_rows(&stack).await;
    stack.nodes[0].term();
    let _ = stack.nodes[0].wait_exit(Duration::from_secs(60)).await;
    stack.nodes[0].override_flags(&on);
    let restarted = Instant::now();
    stack.nodes[0].start();
    let (written, busy) = compaction_settles(&stack, restarted).await;
    let (after, _) = index_rows(&stack).await;
    drop(stack);

    // Compaction on while producing: its effect on produce latency.
    let (stack, _gw, producer) = compaction_stack(&on).await;
    let mut busy_latencies = produce_at(&producer, "compact", mib, RATE).await;
    let (during, _) = compaction_settles(&stack, Instant::now()).await;
    println!("| produce p99, compaction off | produce p99, compaction on | ranges per MiB before | after | compaction MB/s (after a restart, incl. reopen) | bytes compacted while producing |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {:.2?} | {:.2?} | {:.1} | {:.2} | {:.1} | {:.0} |",
        p99(&mut quiet),
        p99(&mut busy_latencies),
        before as f64 / mib as f64,
        after as f64 / mib as f64,
        written / busy / 1e6,
        during
    );
}

#[tokio::main]
async fn main() {
    let minutes = env_or("WEIR_SOAK_MINUTES", 10);
    let partitions = env_or("WEIR_SOAK_PARTITIONS", 1000) as u32;
    let retention_bytes = env_or("WEIR_SOAK_RETENTION_BYTES", 1 << 20);
    let streams = env_or("WEIR_WIDE_STREAMS", 10_000) as u32;
    let compaction_mib = env_or("WEIR_COMPACTION_MIB", 64);
    if minutes > 0 {
        soak(minutes, partitions, retention_bytes).await;
    }
    if streams > 0 {
        wide(streams).await;
    }
    if compaction_mib > 0 {
        compaction(compaction_mib).await;
    }
}
