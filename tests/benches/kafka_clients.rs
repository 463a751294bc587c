//! Benchmark: a real Kafka client (librdkafka through `rdkafka`) against one gateway and
//! one streamd. Produce and consume throughput (msg/s, MB/s) for 100 B and 1 KiB
//! messages at acks=all (one partition, linger 5 ms), then produce latency p50/p99 at
//! 200 msg/s, with the disk's raw fdatasync rate and sequential bandwidth measured in
//! the same run. Prints figures; asserts nothing.
//!
//! Run: `cargo bench -p weir-tests --bench kafka_clients` (needs s3s-fs, see .ci/run);
//! `WEIR_BENCH_MAX_IN_FLIGHT` caps the producer's requests in flight per connection.
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};
use weir_tests::gateway::Gatewayd;
use weir_tests::streamd::{Backend, Stack};

const MESSAGES: usize = 50_000;
const LATENCY_RATE: u64 = 200;
const LATENCY_SECS: u64 = 8;

fn config(gw: &Gatewayd) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &gw.kafka).set("broker.address.family", "v4");
    c
}

/// Produces MESSAGES of `size` bytes; MB/s.
async fn produce(gw: &Gatewayd, topic: &str, size: usize) -> f64 {
    let mut c = config(gw);
    c.set("acks", "all").set("linger.ms", "5").set("batch.size", "1000000");
    // `WEIR_BENCH_MAX_IN_FLIGHT` caps the requests in flight per connection.
    if let Ok(n) = std::env::var("WEIR_BENCH_MAX_IN_FLIGHT") {
        c.set("max.in.flight.requests.per.connection", &n);
    }
    let p: FutureProducer = c.create().expect("producer");
    let payload = vec![b'x'; size];
    let started = Instant::now();
    let mut inflight = Vec::with_capacity(MESSAGES);
    for i in 0..MESSAGES {
        let key = (i % 64).to_string();
        inflight.push(
            p.send_result(FutureRecord::to(topic).key(&key).payload(&payload))
                .expect("queued"),
        );
    }
    for f in inflight {
        f.await.expect("delivery").map_err(|(e, _)| e).expect("acknowledged");
    }
    let secs = started.elapsed().as_secs_f64();
    let mbps = (MESSAGES * size) as f64 / secs / 1e6;
    println!(
        "produce {size} B acks=all: {:.0} msg/s, {mbps:.2} MB/s",
        MESSAGES as f64 / secs,
    );
    mbps
}

/// Consumes MESSAGES of `size` bytes from the start; MB/s.
fn consume(gw: &Gatewayd, topic: &str, size: usize) -> f64 {
    let c: BaseConsumer = config(gw)
        .set("group.id", "bench")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning).expect("tpl");
    c.assign(&tpl).expect("assign");
    let started = Instant::now();
    let mut n = 0;
    while n < MESSAGES {
        if let Some(m) = c.poll(Duration::from_secs(10)) {
            m.expect("message");
            n += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let mbps = (n * size) as f64 / secs / 1e6;
    println!("consume {size} B: {:.0} msg/s, {mbps:.2} MB/s", n as f64 / secs);
    mbps
}

async fn latency(gw: &Gatewayd, topic: &str) {
    let p: FutureProducer = config(gw)
        .set("acks", "all")
        .set("linger.ms", "0")
        .create()
        .expect("producer");
    let payload = vec![b'x'; 1024];
    // Steady state: the producer's connection and metadata are set up before timing.
    p.send(
        FutureRecord::<(), _>::to(topic).payload(&payload),
        Duration::from_secs(30),
    )
    .await
    .map_err(|(e, _)| e)
    .expect("warm-up acknowledged");
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / LATENCY_RATE));
    let mut pending = vec![];
    for _ in 0..LATENCY_RATE * LATENCY_SECS {
        tick.tick().await;
        let sent = Instant::now();
        let f = p
            .send_result(FutureRecord::<(), _>::to(topic).payload(&payload))
            .expect("queued");
        pending.push(tokio::spawn(async move {
            f.await.expect("delivery").map_err(|(e, _)| e).expect("acknowledged");
            sent.elapsed()
        }));
    }
    let mut lat = vec![];
    for t in pending {
        lat.push(t.await.expect("task"));
    }
    lat.sort();
    let pct = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    println!(
        "produce latency at {LATENCY_RATE} msg/s, 1 KiB, acks=all: p50 {:?}, p99 {:?}, max {:?}",
        pct(0.5),
        pct(0.99),
        lat[lat.len() - 1]
    );
}

#[tokio::main]
async fn main() {
    let stack = Stack::start_with(1, Backend::FileWal, weir_tests::streamd::PRODUCTION_WAL, &[]).await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), &[]);
    gw.wait_ready().await;
    let admin: AdminClient<DefaultClientContext> = config(&gw).create().expect("admin");
    for t in ["b100", "b1024", "lat"] {
        admin
            .create_topics(
                &[NewTopic::new(t, 1, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
            )
            .await
            .expect("create");
        gw.wait_open(&format!("{t}/0")).await;
    }
    // The disk under the stack, measured in the same run (the figures are ratios of it).
    let raw = weir_tests::disk::raw_sync(stack.dir.path());
    let seq = weir_tests::disk::sequential_bandwidth(stack.dir.path());
    println!(
        "disk: 4 KiB write+fdatasync {:.0}/s (p50 {:?}, p99 {:?}, max {:?}), sequential write {seq:.0} MB/s",
        raw.rate, raw.p50, raw.p99, raw.max
    );
    for (topic, size) in [("b100", 100), ("b1024", 1024)] {
        let produced = produce(&gw, topic, size).await;
        let gw_ref = &gw;
        let consumed = tokio::task::block_in_place(|| consume(gw_ref, topic, size));
        println!(
            "  {size} B: produce {:.1} %, consume {:.1} % of sequential write bandwidth",
            produced / seq * 100.0,
            consumed / seq * 100.0
        );
    }
    latency(&gw, "lat").await;
}
