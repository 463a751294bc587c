//! Benchmark: the object WAL at an object store's latency (issue 58). Prints figures,
//! asserts nothing.
//!
//! One metad, one streamd and one gatewayd; data objects (and the object WAL) in s3s-fs
//! behind a proxy that delays each S3 request by a time drawn from
//! `WEIR_BENCH_S3_LATENCY_MS` (`25-55`; `0` for none; a comma-separated list runs
//! each, default `0,25-55`), for each WAL in `WEIR_BENCH_WAL` (`object,file`). For each:
//! - produce 1 KiB acks=all (librdkafka, linger 5 ms) to 1 partition and to 16,
//!   `WEIR_BENCH_MESSAGES` (100,000) messages: MB/s;
//! - p50/p99/max of single 1 KiB messages at 200 a second to 1 partition (linger 0);
//! - p50/p99/max at 20,000 messages a second (100 B) over 16 partitions;
//! - each phase's S3 requests per GiB produced (all, and WAL PUTs) and bytes per WAL
//!   PUT, from streamd's `weir_streamd_object_requests_total`;
//! - S3 requests per idle hour, counted over `WEIR_BENCH_IDLE_SEC` (30) with no traffic.
//!
//! `WEIR_BENCH_PHASES` (`throughput,latency,idle`) picks the phases, and
//! `WEIR_BENCH_WIDE_RATE` (20000) the rate over 16 partitions.
//!
//! Run: `cargo build --release --bins && cargo bench -p weir-tests --bench object_wal`.

// The latency probes end with the benchmark process.
#![allow(clippy::disallowed_methods)]

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use weir_tests::gateway::Gatewayd;
use weir_tests::proxy::Proxy;
use weir_tests::streamd::{Backend, Stack};

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn config(gw: &Gatewayd) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &gw.kafka).set("broker.address.family", "v4");
    c
}

/// streamd's object-store requests so far, by `(op, kind)`.
async fn requests(node: &weir_tests::streamd::Streamd) -> BTreeMap<(String, String), f64> {
    let text = weir_tests::get_text(&format!("http://{}/metrics", node.http)).await;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("weir_streamd_object_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(&format!("{name}=\""))?.strip_suffix('"'))
                .unwrap_or("")
                .to_string()
        };
        out.insert((label("op"), label("kind")), value.trim().parse().unwrap_or(0.0));
    }
    out
}

/// Requests made between two counts: all of them, and WAL PUTs.
fn delta(before: &BTreeMap<(String, String), f64>, after: &BTreeMap<(String, String), f64>) -> (f64, f64) {
    let mut all = 0.0;
    let mut wal_puts = 0.0;
    for (k, v) in after {
        let d = v - before.get(k).copied().unwrap_or(0.0);
        all += d;
        if k.0 == "put" && k.1 == "wal" {
            wal_puts += d;
        }
    }
    (all, wal_puts)
}

/// Produces `count` messages of `size` bytes spread over `partitions`; MB/s.
async fn produce(gw: &Gatewayd, topic: &str, partitions: i32, size: usize, count: usize) -> f64 {
    let p: FutureProducer = config(gw)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "2000000")
        .create()
        .expect("producer");
    let payload = vec![b'x'; size];
    let started = Instant::now();
    let mut inflight = Vec::with_capacity(count);
    for i in 0..count {
        let record = FutureRecord::<(), _>::to(topic)
            .payload(&payload)
            .partition((i as i32) % partitions);
        inflight.push(p.send_result(record).expect("queued"));
    }
    for f in inflight {
        f.await.expect("delivery").map_err(|(e, _)| e).expect("acknowledged");
    }
    (size * count) as f64 / 1e6 / started.elapsed().as_secs_f64()
}

/// p50, p99 and max of messages of `size` bytes sent at `rate` a second for `secs`,
/// spread over `partitions`, with `linger` ms.
async fn latency(
    gw: &Gatewayd,
    topic: &str,
    partitions: i32,
    size: usize,
    rate: u64,
    secs: u64,
    linger: &str,
) -> [Duration; 3] {
    let p: FutureProducer = config(gw)
        .set("acks", "all")
        .set("linger.ms", linger)
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer");
    let payload = vec![b'x'; size];
    // Steady state: every partition has taken a record before the timing starts.
    let warm = Instant::now();
    for partition in 0..partitions {
        p.send(
            FutureRecord::<(), _>::to(topic).payload(&payload).partition(partition),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("warm-up acknowledged");
    }
    println!(
        "  (warm-up: a record to each of {partitions} partition(s) in {:?})",
        warm.elapsed()
    );
    // Sent in ticks of at most 1 ms, as many as the rate asks for each.
    let per_tick = rate.div_ceil(1000).max(1);
    let tick_every = Duration::from_micros(1_000_000 * per_tick / rate);
    let mut tick = tokio::time::interval(tick_every);
    let mut pending = Vec::with_capacity((rate * secs) as usize);
    let mut i = 0i32;
    for _ in 0..(rate * secs / per_tick) {
        tick.tick().await;
        for _ in 0..per_tick {
            let sent = Instant::now();
            let record = FutureRecord::<(), _>::to(topic)
                .payload(&payload)
                .partition(i % partitions);
            i += 1;
            let f = p.send_result(record).expect("queued");
            pending.push(tokio::spawn(async move {
                f.await.expect("delivery").map_err(|(e, _)| e).expect("acknowledged");
                sent.elapsed()
            }));
        }
    }
    let mut lat = Vec::with_capacity(pending.len());
    for t in pending {
        lat.push(t.await.expect("task"));
    }
    lat.sort();
    let pct = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    [pct(0.5), pct(0.99), lat[lat.len() - 1]]
}

/// Cumulative counts of histogram `prefix` (a metric name and any leading labels) on
/// the server at `http`, by bucket bound.
async fn server_view(http: &str, prefix: &str) -> BTreeMap<String, f64> {
    let text = weir_tests::get_text(&format!("http://{http}/metrics")).await;
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("weir_")?.strip_prefix(prefix)?;
            let le = rest.split("le=\"").nth(1)?.split('"').next()?.to_string();
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// The share of what a histogram counted between two views answered within each of
/// 25, 50, 100, 250 and 1000 ms.
fn shares(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> String {
    let count = |m: &BTreeMap<String, f64>, le: &str| m.get(le).copied().unwrap_or(0.0);
    let total = count(after, "+Inf") - count(before, "+Inf");
    if total <= 0.0 {
        return "–".into();
    }
    ["0.025", "0.05", "0.1", "0.25", "1"]
        .iter()
        .map(|le| {
            let n = count(after, le) - count(before, le);
            if after.contains_key(*le) {
                format!("{:.0} %", n / total * 100.0)
            } else {
                "?".into()
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The delay range of `spec` (`25-55`, `40`, `0`).
fn parse_latency(spec: &str) -> (Duration, Duration) {
    let ms = |s: &str| Duration::from_millis(s.trim().parse().expect("WEIR_BENCH_S3_LATENCY_MS: milliseconds"));
    match spec.split_once('-') {
        Some((a, b)) => (ms(a), ms(b)),
        None => (ms(spec), ms(spec)),
    }
}

async fn run(wal: &str, spec: &str, count: usize, idle: u64) {
    let backend = match wal {
        "object" => Backend::ObjectWal,
        "file" => Backend::FileWal,
        other => panic!("WEIR_BENCH_WAL: unknown WAL {other:?} (object, file)"),
    };
    let (min, max) = parse_latency(spec);
    let mut stack = Stack::start_with(0, backend, &[], &[]).await;
    let s3 = Proxy::start(stack.s3.endpoint.trim_start_matches("http://")).await;
    s3.delay_requests(min, max);
    let endpoint = format!("http://{}", s3.addr);
    stack.add_node_with_env(
        "streamd-1",
        backend,
        weir_tests::streamd::PRODUCTION_WAL,
        &[("AWS_ENDPOINT", &endpoint)],
    );
    stack.nodes[0].wait_ready().await;
    let gw = Gatewayd::start("gw-1", &stack.metad_addrs(), stack.dir.path(), &[]);
    gw.wait_ready().await;
    let admin: AdminClient<DefaultClientContext> = config(&gw).create().expect("admin");
    let node = &stack.nodes[0];
    let label = format!("{wal} WAL, S3 +{spec} ms");
    let mut topic_n = 0;
    let mut topic = |partitions: i32| {
        topic_n += 1;
        let name = format!("t{topic_n}-{partitions}");
        let admin = &admin;
        let gw = &gw;
        async move {
            let created = admin
                .create_topics(
                    &[NewTopic::new(&name, partitions, TopicReplication::Fixed(1))],
                    &AdminOptions::new(),
                )
                .await
                .expect("create topic");
            assert!(created.iter().all(Result::is_ok), "{created:?}");
            for p in 0..partitions {
                gw.wait_open(&format!("{name}/{p}")).await;
            }
            name
        }
    };
    let phases = env_or("WEIR_BENCH_PHASES", "throughput,latency,idle");
    let wide_rate: u64 = env_or("WEIR_BENCH_WIDE_RATE", "20000")
        .parse()
        .expect("WEIR_BENCH_WIDE_RATE");
    for partitions in [1, 16] {
        if !phases.contains("throughput") {
            break;
        }
        let t = topic(partitions).await;
        let before = requests(node).await;
        let mb_s = produce(&gw, &t, partitions, 1024, count).await;
        let (all, wal_puts) = delta(&before, &requests(node).await);
        let gib = (1024 * count) as f64 / (1u64 << 30) as f64;
        println!(
            "{label}: produce 1 KiB acks=all, {partitions} partition(s): {mb_s:.1} MB/s; per GiB {:.0} S3 requests, {:.0} WAL PUTs ({:.0} KiB a WAL PUT)",
            all / gib,
            wal_puts / gib,
            if wal_puts > 0.0 { (1024 * count) as f64 / wal_puts / 1024.0 } else { 0.0 },
        );
    }
    for (partitions, size, rate, secs, linger) in [
        (1, 1024, 200, 8, "0"),
        (
            16,
            100,
            wide_rate,
            5,
            Box::leak(env_or("WEIR_BENCH_WIDE_LINGER", "5").into_boxed_str()),
        ),
    ] {
        if !phases.contains("latency") {
            break;
        }
        let t = topic(partitions).await;
        let before = requests(node).await;
        let (gw_before, node_before) = (
            server_view(&gw.http, "gatewayd_kafka_request_seconds_bucket{api=\"Produce\"").await,
            server_view(&node.http, "streamd_append_seconds_bucket").await,
        );
        let [p50, p99, max] = latency(&gw, &t, partitions, size, rate, secs, linger).await;
        let (gw_after, node_after) = (
            server_view(&gw.http, "gatewayd_kafka_request_seconds_bucket{api=\"Produce\"").await,
            server_view(&node.http, "streamd_append_seconds_bucket").await,
        );
        println!(
            "  servers' view, share answered within 25/50/100/250/1000 ms: gateway Produce {}; streamd appends {}",
            shares(&gw_before, &gw_after),
            shares(&node_before, &node_after)
        );
        let (all, wal_puts) = delta(&before, &requests(node).await);
        println!(
            "{label}: {rate} msg/s of {size} B over {partitions} partition(s), linger {linger} ms: p50 {p50:?}, p99 {p99:?}, max {max:?}; {:.0} S3 requests/s, {:.0} WAL PUTs/s",
            all / secs as f64,
            wal_puts / secs as f64,
        );
    }
    if !phases.contains("idle") {
        return;
    }
    // Idle: once uploads of what was produced are done, count what no traffic costs.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = requests(node).await;
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let after = requests(node).await;
    let per_hour = 3600.0 / idle as f64;
    let by_op: Vec<String> = after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (d > 0.0).then(|| format!("{} {} {:.0}", k.0, k.1, d * per_hour))
        })
        .collect();
    let (all, wal_puts) = delta(&before, &after);
    println!(
        "{label}: idle {idle} s: {:.0} S3 requests per idle hour, {:.0} WAL PUTs ({})",
        all * per_hour,
        wal_puts * per_hour,
        if by_op.is_empty() {
            "none".to_string()
        } else {
            by_op.join(", ")
        }
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let count: usize = env_or("WEIR_BENCH_MESSAGES", "100000")
        .parse()
        .expect("WEIR_BENCH_MESSAGES");
    let idle: u64 = env_or("WEIR_BENCH_IDLE_SEC", "30")
        .parse()
        .expect("WEIR_BENCH_IDLE_SEC");
    let wals = env_or("WEIR_BENCH_WAL", "object,file");
    let latencies = env_or("WEIR_BENCH_S3_LATENCY_MS", "0,25-55");
    for spec in latencies.split(',') {
        for wal in wals.split(',') {
            run(wal.trim(), spec.trim(), count, idle).await;
        }
    }
}
