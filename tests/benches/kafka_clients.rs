//! Benchmark: real Kafka clients against one gateway and one streamd, by issue 17's
//! method. Produce and consume throughput (msg/s, MB/s) for 100 B and 1 KiB messages at
//! acks=all (one partition, linger 5 ms, 200,000 messages), then produce latency
//! p50/p99 at 200 msg/s, each the median of 3 runs on fresh topics, with the disk's raw
//! fdatasync rate and sequential bandwidth measured in the same run. Two clients:
//! librdkafka through the `rdkafka` crate (native, so the client is not the bound) and
//! confluent-kafka (Python; `tests/clients/confluent_bench.py`). Consume MB/s counts
//! from the first message; the time to it is printed apart. Consumers set
//! `fetch.queue.backoff.ms` to 10 ms: librdkafka's default pauses fetching for 1 s
//! whenever its queue holds 100,000 messages, which made consume rates bimodal. The
//! gateway's and the streamd nodes' CPU time per MB is printed for each phase
//! (`/proc/<pid>/stat`), with confluent-kafka's own, so a TLS run's cost on the server
//! can be told from its client's. For each message size it prints the bytes the servers
//! wrote to disk per byte produced (`/proc/<pid>/io`: WAL, objects, compaction, metad),
//! from idle before the first run to idle after the last. Prints; asserts nothing.
//!
//! Run: `cargo bench -p weir-tests --bench kafka_clients` (needs s3s-fs and
//! confluent-kafka, see .ci/run). `WEIR_BENCH_MAX_IN_FLIGHT` caps the producer's
//! requests in flight per connection; `WEIR_BENCH_CLIENTS` (`rdkafka,confluent`),
//! `WEIR_BENCH_RUNS` (3) and `WEIR_BENCH_MESSAGES` (200000) narrow it;
//! `WEIR_BENCH_PHASES` (`throughput,latency`) picks the phases;
//! `WEIR_BENCH_OBJECT_STORE` is `file` (the default, as `weir dev`) or `s3` (s3s-fs);
//! `WEIR_BENCH_CLUSTER=1` runs 3 metad replicas and 2 streamd instead of one of each.
//! `WEIR_BENCH_TLS=1` serves Kafka over TLS (`SSL`, a certificate from `weir certs`) to
//! confluent-kafka only: the `rdkafka` crate here is built without OpenSSL.
//! `WEIR_BENCH_TLS=compare` runs a plaintext and a TLS stack alike, their runs
//! interleaved, and prints TLS's loss in throughput and in server capacity (MB per
//! CPU-second of the gateway and streamd; issue 18's goal). There each run starts once
//! the servers are idle, so one run's uploads and compaction do not fall in the next
//! (the other stack's) run. `WEIR_BENCH_PIN=1` binds the
//! servers to CPU 0 and the clients to CPU 1 (needs 2 CPUs).
//! `WEIR_BENCH_PRODUCER` (`plain`, `idempotent`, `transactional`) picks confluent-kafka's
//! producer (`tests/clients/confluent_bench.py`; issue 23's transactional ratio).
//! `WEIR_BENCH_PARTITIONS` (1) spreads the throughput runs' keyed messages over that many
//! partitions (issue 62's 16-partition figures). `WEIR_BENCH_DEV=1` runs `weir dev` instead: metad, streamd and the gateway in one
//! process, the gateway calling streamd in process (issue 62); its CPU per MB is that
//! process's, printed as the gateway's.
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

const LATENCY_RATE: u64 = 200;
const LATENCY_SECS: u64 = 8;

fn config(gw: &Gatewayd) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &gw.kafka).set("broker.address.family", "v4");
    c
}

/// Produces `count` messages of `size` bytes.
async fn produce(gw: &Gatewayd, topic: &str, size: usize, count: usize) -> Figure {
    let mut c = config(gw);
    c.set("acks", "all")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        // Every message is queued before the first is awaited.
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "2000000");
    // `WEIR_BENCH_MAX_IN_FLIGHT` caps the requests in flight per connection.
    if let Ok(n) = std::env::var("WEIR_BENCH_MAX_IN_FLIGHT") {
        c.set("max.in.flight.requests.per.connection", &n);
    }
    let p: FutureProducer = c.create().expect("producer");
    let payload = vec![b'x'; size];
    let started = Instant::now();
    let mut inflight = Vec::with_capacity(count);
    for i in 0..count {
        let key = (i % 64).to_string();
        inflight.push(
            p.send_result(FutureRecord::to(topic).key(&key).payload(&payload))
                .expect("queued"),
        );
    }
    for f in inflight {
        f.await.expect("delivery").map_err(|(e, _)| e).expect("acknowledged");
    }
    Figure::rate(count, size, started.elapsed())
}

/// Consumes `count` messages of `size` bytes from the start; the rate counts from the
/// first message, whose wait is `first`.
fn consume(gw: &Gatewayd, topic: &str, partitions: i32, size: usize, count: usize) -> Figure {
    let c: BaseConsumer = config(gw)
        .set("group.id", "bench")
        .set("enable.auto.commit", "false")
        // As confluent_bench.py: no 1 s pause of fetching when the local queue is full.
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let started = Instant::now();
    let mut first = None;
    let mut n = 0;
    while n < count {
        if let Some(m) = c.poll(Duration::from_secs(10)) {
            m.expect("message");
            n += 1;
            first.get_or_insert_with(Instant::now);
        }
    }
    let first = first.expect("a message");
    let mut f = Figure::rate(n - 1, size, first.elapsed());
    f.first = Some(first - started);
    f
}

/// p50, p99 and max of single 1 KiB messages at LATENCY_RATE.
async fn latency(gw: &Gatewayd, topic: &str) -> [Duration; 3] {
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
    [pct(0.5), pct(0.99), lat[lat.len() - 1]]
}

/// Cumulative counts of the servers' latency histograms: the gateway's Produce requests
/// (`weir_gatewayd_kafka_request_seconds`) and the streamd nodes' appends
/// (`weir_streamd_append_seconds`), so a run can tell the time spent in Weir from the time
/// spent in the client and between the processes.
#[derive(Clone, Default)]
struct ServerLatency {
    produce: Vec<f64>,
    append: Vec<f64>,
}

/// Bucket bounds the two histograms share (seconds, as `le` prints them), and `+Inf`.
const LE: [&str; 5] = ["0.0005", "0.001", "0.002", "0.005", "+Inf"];

impl ServerLatency {
    async fn scrape(gw: &Gatewayd, nodes: &[String]) -> Self {
        let gateway = gw.metrics().await;
        let mut streamd = String::new();
        for http in nodes {
            streamd += &weir_tests::get_text(&format!("http://{http}/metrics")).await;
        }
        let sum = |text: &str, line: String| -> f64 {
            text.lines()
                .filter_map(|l| {
                    l.strip_prefix(line.as_str())?
                        .strip_prefix(' ')?
                        .trim()
                        .parse::<f64>()
                        .ok()
                })
                .sum()
        };
        Self {
            produce: LE
                .iter()
                .map(|le| {
                    sum(
                        &gateway,
                        format!("weir_gatewayd_kafka_request_seconds_bucket{{api=\"Produce\",le=\"{le}\"}}"),
                    )
                })
                .collect(),
            append: LE
                .iter()
                .map(|le| sum(&streamd, format!("weir_streamd_append_seconds_bucket{{le=\"{le}\"}}")))
                .collect(),
        }
    }

    /// What was observed since `before`, as the share at or under each bound.
    fn since(&self, before: &Self) -> String {
        let shares = |now: &[f64], then: &[f64]| {
            let total = now[LE.len() - 1] - then[LE.len() - 1];
            LE[..LE.len() - 1]
                .iter()
                .enumerate()
                .map(|(i, le)| {
                    format!(
                        "≤{} ms {:.2} %",
                        le.parse::<f64>().expect("bound") * 1e3,
                        (now[i] - then[i]) / total.max(1.0) * 100.0
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "gateway Produce {}; streamd appends {}",
            shares(&self.produce, &before.produce),
            shares(&self.append, &before.append)
        )
    }
}

/// One throughput figure.
#[derive(Debug, Clone, Copy, Default)]
struct Figure {
    msg_s: f64,
    mb_s: f64,
    /// Consume: the wait for the first message (connection, metadata, ListOffsets).
    first: Option<Duration>,
    /// The client process's CPU time over the phase (confluent-kafka only).
    client_cpu: Option<Duration>,
}

impl Figure {
    fn rate(count: usize, size: usize, took: Duration) -> Self {
        let secs = took.as_secs_f64();
        Self {
            msg_s: count as f64 / secs,
            mb_s: (count * size) as f64 / secs / 1e6,
            first: None,
            client_cpu: None,
        }
    }

    fn from_json(v: &serde_json::Value) -> Self {
        let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
        Self {
            msg_s: f("msg_s"),
            mb_s: f("mb_s"),
            first: v["first_ms"].as_f64().map(|ms| Duration::from_secs_f64(ms / 1e3)),
            client_cpu: v["cpu_s"].as_f64().map(Duration::from_secs_f64),
        }
    }
}

/// CPU time the gateway and the streamd nodes used (issue 18: what TLS costs the
/// server, apart from what it costs a client sharing the machine).
#[derive(Default)]
struct ServerCpu {
    gateway: Duration,
    streamd: Duration,
}

impl ServerCpu {
    /// Under `weir dev` the gateway's process is the whole server.
    fn now(gw: &Gatewayd, stack: Option<&Stack>) -> ServerCpu {
        ServerCpu {
            gateway: weir_tests::process::cpu_time(gw.pid()),
            streamd: stack
                .map(|s| s.nodes.iter().map(|n| weir_tests::process::cpu_time(n.pid())).sum())
                .unwrap_or_default(),
        }
    }

    fn total(&self) -> Duration {
        self.gateway + self.streamd
    }

    /// Adds what was used between `from` and `to`.
    fn add(&mut self, from: &ServerCpu, to: &ServerCpu) {
        self.gateway += to.gateway.saturating_sub(from.gateway);
        self.streamd += to.streamd.saturating_sub(from.streamd);
    }
}

/// The median run by MB/s, and the range of all runs.
fn median(mut runs: Vec<Figure>) -> (Figure, f64, f64) {
    runs.sort_by(|a, b| a.mb_s.total_cmp(&b.mb_s));
    (runs[runs.len() / 2], runs[0].mb_s, runs[runs.len() - 1].mb_s)
}

/// Runs one phase of `tests/clients/confluent_bench.py`; its JSON answer.
fn confluent(gw: &Gatewayd, ca: Option<&std::path::Path>, args: &[String]) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/confluent_bench.py");
    let mut command = std::process::Command::new("python3");
    if let Some(ca) = ca {
        command.env("WEIR_BENCH_CA", ca);
    }
    let out = command
        .arg(script)
        .arg(&gw.kafka)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "confluent_bench.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON line")
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Client {
    Rdkafka,
    Confluent,
}

#[tokio::main]
async fn main() {
    let runs: usize = env_or("WEIR_BENCH_RUNS", 3).max(1);
    let count: usize = env_or("WEIR_BENCH_MESSAGES", 200_000);
    // `WEIR_BENCH_PHASES=latency` measures latency alone, without the background work
    // (uploads, compaction) that the throughput runs leave behind.
    let phases = env_or("WEIR_BENCH_PHASES", "throughput,latency".to_string());
    let phases: Vec<&str> = phases.split(',').map(str::trim).collect();
    for p in &phases {
        assert!(
            ["throughput", "latency"].contains(p),
            "WEIR_BENCH_PHASES: unknown phase {p:?} (throughput, latency)"
        );
    }
    let clients: Vec<Client> = env_or("WEIR_BENCH_CLIENTS", "rdkafka,confluent".to_string())
        .split(',')
        .map(|c| match c.trim() {
            "rdkafka" => Client::Rdkafka,
            "confluent" => Client::Confluent,
            other => panic!("WEIR_BENCH_CLIENTS: unknown client {other:?} (rdkafka, confluent)"),
        })
        .collect();
    // Issue 17 measured `weir dev`: data objects on the local filesystem. `s3` puts them
    // in s3s-fs instead, which then shares the machine's cores (it hashes every PUT).
    let store = env_or("WEIR_BENCH_OBJECT_STORE", "file".to_string());
    assert!(
        ["file", "s3"].contains(&store.as_str()),
        "WEIR_BENCH_OBJECT_STORE: unknown store {store:?} (file, s3)"
    );
    // `WEIR_BENCH_CLUSTER=1`: 3 metad replicas and 2 streamd, as compose runs them.
    let cluster = env_or("WEIR_BENCH_CLUSTER", 0u8) == 1;
    // `WEIR_BENCH_TLS`: `0` serves Kafka in clear, `1` over TLS (`SSL`, a certificate
    // from `weir certs`), `compare` both: two stacks alike, one per listener, their runs
    // interleaved, so the TLS loss is measured against plaintext on the same disk in the
    // same minutes (issue 18's goal). Not one stack with two gateways: every gateway of
    // a cluster is a broker its clients may be sent to, and a cluster's listeners speak
    // one protocol.
    let mode = env_or("WEIR_BENCH_TLS", "0".to_string());
    let kinds: &[bool] = match mode.as_str() {
        "0" => &[false],
        "1" => &[true],
        "compare" => &[false, true],
        other => panic!("WEIR_BENCH_TLS: unknown value {other:?} (0, 1, compare)"),
    };
    assert!(
        !kinds.contains(&true) || clients == [Client::Confluent],
        "WEIR_BENCH_TLS={mode} needs WEIR_BENCH_CLIENTS=confluent (the rdkafka crate here has no OpenSSL)"
    );
    // `WEIR_BENCH_PARTITIONS`: the throughput topics' partitions (keyed messages spread
    // over them); latency stays on one.
    let partitions: i32 = env_or("WEIR_BENCH_PARTITIONS", 1).max(1);
    // `WEIR_BENCH_DEV=1`: `weir dev`, one process (issue 62's in-process hop).
    let dev = env_or("WEIR_BENCH_DEV", 0u8) == 1;
    let mut listeners = vec![];
    for &tls in kinds {
        listeners.push(Listener::start(&store, cluster, tls, dev).await);
    }
    // `WEIR_BENCH_PIN=1`: the servers on CPU 0, this process and the clients it starts
    // on CPU 1, so what TLS costs a client is not taken from the servers' CPU, as when
    // clients run on machines of their own.
    let pinned = env_or("WEIR_BENCH_PIN", 0u8) == 1;
    if pinned {
        for l in &listeners {
            let stack = l.stack.iter();
            let servers = stack.clone().flat_map(|s| s.metad.replicas.iter().map(|r| r.pid()));
            let servers = servers.chain(stack.flat_map(|s| s.nodes.iter().map(|n| n.pid())));
            for pid in servers.chain([l.gw.pid()]) {
                pin(pid, "0");
            }
        }
        pin(std::process::id(), "1");
    }
    let (metads, streamds) = listeners[0]
        .stack
        .as_ref()
        .map_or((1, 1), |s| (s.metad.replicas.len(), s.nodes.len()));
    println!(
        "{} stack(s) of {} metad, {} streamd and one gatewayd{}; kafka listeners: {}; {}",
        listeners.len(),
        metads,
        streamds,
        if dev { ", all in one weir dev process" } else { "" },
        listeners.iter().map(|l| l.name).collect::<Vec<_>>().join(", "),
        if pinned {
            "servers on CPU 0, clients on CPU 1"
        } else {
            "servers and clients share the CPUs"
        }
    );
    // The disk under the stack, measured in the same run (the figures are ratios of it).
    let raw = weir_tests::disk::raw_sync(&listeners[0].dir);
    let seq = weir_tests::disk::sequential_bandwidth(&listeners[0].dir);
    println!(
        "disk: 4 KiB write+fdatasync {:.0}/s (p50 {:?}, p99 {:?}, max {:?}), sequential write {seq:.0} MB/s",
        raw.rate, raw.p50, raw.p99, raw.max
    );
    println!(
        "{count} messages per run over {partitions} partition(s), median of {runs} runs (range in brackets), data objects on {store}"
    );
    for client in clients {
        for size in [100, 1024] {
            if !phases.contains(&"throughput") {
                break;
            }
            let mut results: Vec<Throughput> = listeners.iter().map(|_| Throughput::default()).collect();
            // Issue 62: bytes the servers wrote to disk per byte produced, from before the
            // first run to when the uploads and compaction the runs left have ended.
            settle(&listeners).await;
            let written_before: Vec<u64> = listeners.iter().map(Listener::bytes_written).collect();
            for run in 0..runs {
                // One run on each listener in turn, so drift (the disk, compaction)
                // falls on both alike.
                for (l, result) in listeners.iter().zip(results.iter_mut()) {
                    if listeners.len() > 1 {
                        settle(&listeners).await;
                    }
                    let topic = l
                        .create(format!("{client:?}-{size}-{run}").to_lowercase(), partitions)
                        .await;
                    let (gw, stack) = (&l.gw, l.stack.as_ref());
                    let args = |phase: &str| [phase.to_string(), topic.clone(), size.to_string(), count.to_string()];
                    let before = ServerCpu::now(gw, stack);
                    let p = match client {
                        Client::Rdkafka => produce(gw, &topic, size, count).await,
                        Client::Confluent => tokio::task::block_in_place(|| {
                            Figure::from_json(&confluent(gw, l.ca.as_deref(), &args("produce")))
                        }),
                    };
                    let mid = ServerCpu::now(gw, stack);
                    result.produce_cpu.add(&before, &mid);
                    let before = mid;
                    let c = tokio::task::block_in_place(|| match client {
                        Client::Rdkafka => consume(gw, &topic, partitions, size, count),
                        Client::Confluent => Figure::from_json(&confluent(gw, l.ca.as_deref(), &args("consume"))),
                    });
                    result.consume_cpu.add(&before, &ServerCpu::now(gw, stack));
                    result.produced.push(p);
                    result.consumed.push(c);
                }
            }
            let mb = (size * count * runs) as f64 / 1e6;
            settle(&listeners).await;
            let mut summaries = vec![];
            for ((l, result), before) in listeners.iter().zip(results).zip(written_before) {
                let written = l.bytes_written().saturating_sub(before);
                let ((p, plo, phi), (c, clo, chi)) = (median(result.produced.clone()), median(result.consumed.clone()));
                println!(
                    "{client:?} {size} B over {}: produce acks=all {:.0} msg/s, {:.2} MB/s [{plo:.1}–{phi:.1}] ({:.1} % of sequential); \
                     consume {:.0} msg/s, {:.2} MB/s [{clo:.1}–{chi:.1}] ({:.1} %), first message after {:?}",
                    l.name,
                    p.msg_s,
                    p.mb_s,
                    p.mb_s / seq * 100.0,
                    c.msg_s,
                    c.mb_s,
                    c.mb_s / seq * 100.0,
                    c.first.unwrap_or_default(),
                );
                println!(
                    "  disk bytes written per byte produced: {:.2} (WAL, objects, compaction and metad, from /proc/<pid>/io, once the servers were idle)",
                    written as f64 / (mb * 1e6)
                );
                let per_mb = |d: Duration| d.as_secs_f64() * 1e3 / mb;
                let client = |runs: &[Figure]| {
                    let cpu: Option<Duration> = runs.iter().map(|f| f.client_cpu).sum();
                    cpu.map_or("–".to_string(), |d| format!("{:.2} ms", per_mb(d)))
                };
                if l.stack.is_some() {
                    println!(
                        "  CPU per MB: produce gateway {:.2} ms, streamd {:.2} ms, client {}; consume gateway {:.2} ms, streamd {:.2} ms, client {}",
                        per_mb(result.produce_cpu.gateway),
                        per_mb(result.produce_cpu.streamd),
                        client(&result.produced),
                        per_mb(result.consume_cpu.gateway),
                        per_mb(result.consume_cpu.streamd),
                        client(&result.consumed),
                    );
                } else {
                    println!(
                        "  CPU per MB: produce weir dev {:.2} ms, client {}; consume weir dev {:.2} ms, client {}",
                        per_mb(result.produce_cpu.gateway),
                        client(&result.produced),
                        per_mb(result.consume_cpu.gateway),
                        client(&result.consumed),
                    );
                }
                summaries.push([
                    (p.mb_s, per_mb(result.produce_cpu.total())),
                    (c.mb_s, per_mb(result.consume_cpu.total())),
                ]);
            }
            if let [plain, tls] = summaries[..] {
                let loss = |(plain_mb_s, plain_cpu): (f64, f64), (tls_mb_s, tls_cpu): (f64, f64)| {
                    format!(
                        "throughput {:+.1} %, server CPU per MB {plain_cpu:.2} → {tls_cpu:.2} ms (server capacity {:+.1} %)",
                        (tls_mb_s / plain_mb_s - 1.0) * 100.0,
                        (plain_cpu / tls_cpu - 1.0) * 100.0,
                    )
                };
                println!(
                    "  TLS against plaintext: produce {}; consume {}",
                    loss(plain[0], tls[0]),
                    loss(plain[1], tls[1])
                );
            }
        }
        if !phases.contains(&"latency") {
            continue;
        }
        for l in &listeners {
            let gw = &l.gw;
            // Under `weir dev` streamd's histograms are in the gateway's /metrics.
            let nodes: Vec<String> = match &l.stack {
                Some(stack) => stack.nodes.iter().map(|n| n.http.clone()).collect(),
                None => vec![l.gw.http.clone()],
            };
            let mut lat = vec![];
            let before = ServerLatency::scrape(gw, &nodes).await;
            for run in 0..runs {
                let topic = l.create(format!("{client:?}-lat-{run}").to_lowercase(), 1).await;
                lat.push(match client {
                    Client::Rdkafka => latency(gw, &topic).await,
                    Client::Confluent => tokio::task::block_in_place(|| {
                        let v = confluent(
                            gw,
                            l.ca.as_deref(),
                            &[
                                "latency".into(),
                                topic,
                                LATENCY_RATE.to_string(),
                                LATENCY_SECS.to_string(),
                            ],
                        );
                        ["p50_ms", "p99_ms", "max_ms"].map(|k| Duration::from_secs_f64(v[k].as_f64().expect(k) / 1e3))
                    }),
                });
            }
            lat.sort_by_key(|l| l[1]);
            let [p50, p99, max] = lat[lat.len() / 2];
            println!(
                "{client:?} latency over {} at {LATENCY_RATE} msg/s, 1 KiB, acks=all: p50 {p50:?}, p99 {p99:?}, max {max:?} (median run by p99; p99s {:?}); raw fdatasync p99 {:?}",
                l.name,
                lat.iter().map(|l| l[1]).collect::<Vec<_>>(),
                raw.p99
            );
            println!(
                "  server side over those runs: {}",
                ServerLatency::scrape(gw, &nodes).await.since(&before)
            );
        }
    }
}

/// Waits until the servers are idle (under 5 % of a CPU over half a second, for at most
/// a minute): a run's uploads and compaction end before the next run starts, so they
/// neither slow it nor count in its CPU per MB, whichever stack they belong to.
async fn settle(listeners: &[Listener]) {
    let busy = || -> Duration {
        listeners
            .iter()
            .map(|l| {
                let stack = l.stack.as_ref();
                let metad: Duration = stack
                    .iter()
                    .flat_map(|s| s.metad.replicas.iter())
                    .map(|r| weir_tests::process::cpu_time(r.pid()))
                    .sum();
                metad + ServerCpu::now(&l.gw, stack).total()
            })
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut before = busy();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = busy();
        if now.saturating_sub(before) < Duration::from_millis(25) {
            return;
        }
        before = now;
    }
    println!("  (the servers were still busy after a minute; running anyway)");
}

/// Binds every thread of process `pid` to `cpus` (a `taskset` list).
fn pin(pid: u32, cpus: &str) {
    let out = std::process::Command::new("taskset")
        .args(["--all-tasks", "--cpu-list", "--pid", cpus, &pid.to_string()])
        .output()
        .expect("taskset runs");
    assert!(
        out.status.success(),
        "taskset {cpus} {pid}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A stack and its gateway, whose Kafka listener is plaintext or `SSL`.
struct Listener {
    name: &'static str,
    gw: Gatewayd,
    /// The CA its certificate is from, under TLS.
    ca: Option<std::path::PathBuf>,
    admin: AdminClient<DefaultClientContext>,
    /// `None` under `weir dev`, whose gateway process holds the whole server.
    stack: Option<Stack>,
    /// Where the servers keep their data (the disk measured).
    dir: std::path::PathBuf,
    /// Data objects with `WEIR_BENCH_OBJECT_STORE=file`; `weir dev`'s data directory.
    _objects: tempfile::TempDir,
}

impl Listener {
    async fn start(store: &str, cluster: bool, tls: bool, dev: bool) -> Listener {
        let objects = tempfile::tempdir().expect("temp dir");
        if dev {
            assert!(
                store == "file" && !cluster && !tls,
                "WEIR_BENCH_DEV=1 runs weir dev: data objects on its local disk, one of each service, no TLS"
            );
            let gw = Gatewayd::dev(objects.path());
            gw.wait_ready().await;
            return Listener {
                name: "PLAINTEXT (weir dev)",
                admin: config(&gw).create().expect("admin"),
                gw,
                ca: None,
                stack: None,
                dir: objects.path().to_path_buf(),
                _objects: objects,
            };
        }
        let objects_url = format!("file://{}", objects.path().display());
        let mut flags = weir_tests::streamd::PRODUCTION_WAL.to_vec();
        if store == "file" {
            flags.extend(["--object-store", objects_url.as_str()]);
        }
        let stack = if cluster {
            Stack::start_replicas(3, 2, Backend::FileWal, &flags, &[]).await
        } else {
            Stack::start_with(1, Backend::FileWal, &flags, &[]).await
        };
        let certs = tls.then(|| weir_tests::tls::Certs::make(&stack.dir.path().join("certs"), "gw-1"));
        let gw_flags = certs.as_ref().map(|c| c.flags()).unwrap_or_default();
        let gw_flags: Vec<&str> = gw_flags.iter().map(String::as_str).collect();
        let mut gw = Gatewayd::start("gw-1", &stack.metad_addrs(), stack.dir.path(), &gw_flags);
        let ca = certs.map(|c| c.ca);
        if let Some(ca) = &ca {
            gw.trust(ca);
        }
        gw.wait_ready().await;
        Listener {
            name: if tls { "SSL" } else { "PLAINTEXT" },
            admin: config(&gw).create().expect("admin"),
            gw,
            ca,
            dir: stack.dir.path().to_path_buf(),
            stack: Some(stack),
            _objects: objects,
        }
    }

    /// Bytes the servers' processes have written to disk so far.
    fn bytes_written(&self) -> u64 {
        let stack = self.stack.iter();
        let metad = stack.clone().flat_map(|s| s.metad.replicas.iter().map(|r| r.pid()));
        let streamd = stack.flat_map(|s| s.nodes.iter().map(|n| n.pid()));
        metad
            .chain(streamd)
            .chain([self.gw.pid()])
            .map(weir_tests::process::bytes_written)
            .sum()
    }

    /// Creates a topic of `partitions` partitions and waits until the gateway serves
    /// each.
    async fn create(&self, topic: String, partitions: i32) -> String {
        if self.ca.is_some() {
            weir_tests::tls::weir(&[
                "--metad",
                &self.stack.as_ref().expect("TLS runs a stack").metad_addrs(),
                "topics",
                "create",
                &topic,
                "--partitions",
                &partitions.to_string(),
            ]);
        } else {
            self.admin
                .create_topics(
                    &[NewTopic::new(&topic, partitions, TopicReplication::Fixed(1))],
                    &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
                )
                .await
                .expect("create");
        }
        for p in 0..partitions {
            self.gw.wait_open(&format!("{topic}/{p}")).await;
        }
        topic
    }
}

/// One listener's runs of a throughput phase.
#[derive(Default)]
struct Throughput {
    produced: Vec<Figure>,
    consumed: Vec<Figure>,
    produce_cpu: ServerCpu,
    consume_cpu: ServerCpu,
}
