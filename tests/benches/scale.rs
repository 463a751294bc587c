//! Benchmark: Weir with many streams (issue 57). Prints figures, asserts nothing.
//!
//! - `weir dev`: creates N streams over HTTP from 16 clients (`WEIR_SCALE_CLIENTS`) (the rate and p99 of
//!   each 10,000), waits until all are open, measures idle CPU and memory per
//!   stream, then restarts it (SIGTERM, start) and times until all are open again.
//! - A cluster (3 metad, 2 streamd, 1 gateway; 1 s heartbeats, 4 s node timeout,
//!   file WAL): creates 2M streams, measures idle CPU and memory, writes a record to
//!   each of the M streams of one streamd, SIGKILLs it and times until each is
//!   writable again, checks every acknowledged record reads back once; restarts it,
//!   then SIGTERMs the other (now owning 2M) while 200 of its streams are written
//!   continuously, and reports its exit, its time, and the longest a probed stream
//!   stayed unwritable.
//!
//! Run (release binaries first): `cargo build --release --bins && cargo bench -p
//! weir-tests --bench scale`, with `WEIR_SCALE_STREAMS` (N, default 100,000),
//! `WEIR_SCALE_TAKEOVER` (M, default 10,000), `WEIR_SCALE_MODE` (`dev`, `cluster`,
//! or both, the default; `create` only creates in `weir dev`), `WEIR_SCALE_IDLE_SEC` (30)
//! and `WEIR_SCALE_CLIENTS` (16).
// The probes end with the benchmark process.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_tests::gateway::Gatewayd;
use weir_tests::process::Proc;
use weir_tests::scale;
use weir_tests::streamd::{Backend, Stack};
use weir_tests::{bin_path, free_port};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// HTTP clients creating streams.
fn clients() -> usize {
    env("WEIR_SCALE_CLIENTS", 16)
}

fn summary(windows: &[scale::Window]) {
    let (Some(first), Some(last)) = (windows.first(), windows.last()) else {
        return;
    };
    let total: usize = windows.iter().map(|w| w.count).sum();
    let secs: f64 = windows.iter().map(|w| w.elapsed.as_secs_f64()).sum();
    println!(
        "created {total} streams in {secs:.1} s ({:.0}/s); first window {:.0}/s p99 {:.1} ms, last window {:.0}/s p99 {:.1} ms (p99 ratio {:.2})",
        total as f64 / secs,
        first.rate(),
        first.p99.as_secs_f64() * 1e3,
        last.rate(),
        last.p99.as_secs_f64() * 1e3,
        last.p99.as_secs_f64() / first.p99.as_secs_f64().max(1e-9)
    );
}

/// `weir dev` on its own data directory and ports.
struct Dev {
    dir: std::path::PathBuf,
    http: String,
    metad_http: String,
    ports: Vec<(&'static str, String)>,
    proc: Proc,
}

impl Dev {
    fn new(dir: &std::path::Path) -> Self {
        let http = format!("127.0.0.1:{}", free_port());
        let metad_http = format!("127.0.0.1:{}", free_port());
        let ports = vec![
            ("--http-listen", http.clone()),
            ("--kafka-listen", format!("127.0.0.1:{}", free_port())),
            ("--metad-listen", format!("127.0.0.1:{}", free_port())),
            ("--metad-http-listen", metad_http.clone()),
            ("--streamd-listen", format!("127.0.0.1:{}", free_port())),
            ("--streamd-http-listen", format!("127.0.0.1:{}", free_port())),
        ];
        Dev {
            dir: dir.to_path_buf(),
            http,
            metad_http,
            ports,
            proc: Proc::new("weir-dev", dir.join("dev.log")),
        }
    }

    async fn start(&mut self) {
        let mut command = Command::new(bin_path("weir"));
        command
            .arg("dev")
            .args(["--data-dir", &self.dir.join("data").display().to_string()]);
        for (flag, addr) in &self.ports {
            command.args([*flag, addr.as_str()]);
        }
        self.proc.spawn(command);
        let url = format!("http://{}/readyz", self.http);
        weir_tests::wait_for("weir dev ready", Duration::from_secs(600), || async {
            let r = weir_tests::http().get(&url).send().await.ok()?;
            r.status().is_success().then_some(())
        })
        .await;
    }
}

async fn dev(n: usize, idle: Duration) {
    println!("== weir dev, {n} streams");
    let dir = tempfile::tempdir().expect("dir");
    let mut dev = Dev::new(dir.path());
    dev.start().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let baseline = scale::rss_bytes(dev.proc.pid());
    let base = format!("http://{}", dev.http);
    // Half, then the other half: what the second half adds is what a stream costs,
    // past the caches every process fills up to their bounds.
    let mut windows = scale::create_streams(&base, "s-", n / 2, clients(), 10_000, true).await;
    scale::wait_all_open(&dev.metad_http, (n / 2) as u64, Duration::from_secs(1800)).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let half = scale::rss_bytes(dev.proc.pid());
    windows.extend(scale::create_streams(&base, "t-", n - n / 2, clients(), 10_000, true).await);
    summary(&windows);
    let opened = scale::wait_all_open(&dev.metad_http, n as u64, Duration::from_secs(1800)).await;
    println!("all {n} open {:.1} s after the last was created", opened.as_secs_f64());
    // Settled: placement, opens and their log entries are behind it.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cpu = scale::idle_cpu(&[dev.proc.pid()], idle).await;
    let rss = scale::rss_bytes(dev.proc.pid());
    println!(
        "idle over {} s: {:.2} % of a core; RSS {:.0} MiB ({:.0} MiB before the streams, {:.0} MiB at half): {:.0} bytes per stream in all, {:.0} per stream of the second half",
        idle.as_secs(),
        cpu * 100.0,
        rss as f64 / (1 << 20) as f64,
        baseline as f64 / (1 << 20) as f64,
        half as f64 / (1 << 20) as f64,
        rss.saturating_sub(baseline) as f64 / n as f64,
        rss.saturating_sub(half) as f64 / (n - n / 2) as f64
    );
    let stopping = Instant::now();
    dev.proc.term();
    let code = dev.proc.wait_exit(Duration::from_secs(300)).await;
    println!("SIGTERM: exit {code:?} after {:.1} s", stopping.elapsed().as_secs_f64());
    let restarting = Instant::now();
    dev.start().await;
    let ready = restarting.elapsed();
    scale::wait_all_open(&dev.metad_http, n as u64, Duration::from_secs(1800)).await;
    println!(
        "restart: ready {:.1} s, all {n} open {:.1} s after the start",
        ready.as_secs_f64(),
        restarting.elapsed().as_secs_f64()
    );
    dev.proc.term();
    let _ = dev.proc.wait_exit(Duration::from_secs(300)).await;
}

/// Creation alone, in `weir dev`: the rate and p99 per 10,000.
async fn create_only(n: usize) {
    println!("== weir dev, creating {n} streams from {} clients", clients());
    let dir = tempfile::tempdir().expect("dir");
    let mut dev = Dev::new(dir.path());
    dev.start().await;
    let windows = scale::create_streams(&format!("http://{}", dev.http), "s-", n, clients(), 10_000, true).await;
    summary(&windows);
    dev.proc.term();
    let _ = dev.proc.wait_exit(Duration::from_secs(300)).await;
}

async fn cluster(m: usize, idle: Duration) {
    let n = 2 * m;
    println!("== cluster: 3 metad, 2 streamd, 1 gateway; {n} streams");
    let timing = ["--heartbeat-interval-sec", "1", "--node-timeout-sec", "4"];
    let mut stack = Stack::start_replicas(3, 2, Backend::FileWal, &timing, &timing).await;
    let gw = Gatewayd::start("gw-scale", &stack.metad_addrs(), stack.dir.path(), &timing);
    gw.wait_ready().await;
    let base = gw.url("");
    let base = base.trim_end_matches('/').to_string();
    let metad_http = stack.metad.replicas[0].http.clone();
    let mut pids: Vec<u32> = stack.metad.replicas.iter().map(|r| r.pid()).collect();
    pids.extend(stack.nodes.iter().map(|n| n.pid()));
    pids.push(gw.pid());
    let baseline: u64 = pids.iter().map(|p| scale::rss_bytes(*p)).sum();
    let windows = scale::create_streams(&base, "c-", n, clients(), 10_000, true).await;
    summary(&windows);
    let opened = scale::wait_all_open(&metad_http, n as u64, Duration::from_secs(1800)).await;
    println!("all {n} open {:.1} s after the last was created", opened.as_secs_f64());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cpu = scale::idle_cpu(&pids, idle).await;
    let rss: u64 = pids.iter().map(|p| scale::rss_bytes(*p)).sum();
    println!(
        "idle over {} s: {:.2} % of a core (6 processes); RSS {:.0} MiB ({:.0} MiB before): {:.0} bytes per stream",
        idle.as_secs(),
        cpu * 100.0,
        rss as f64 / (1 << 20) as f64,
        baseline as f64 / (1 << 20) as f64,
        rss.saturating_sub(baseline) as f64 / n as f64
    );

    // SIGKILL the node owning the most, with a record acknowledged on each of its streams.
    let streams = scale::list_streams(&base).await;
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, owner) in streams {
        by_node.entry(owner.unwrap_or_default()).or_default().push(name);
    }
    let (victim_id, owned) = by_node
        .into_iter()
        .max_by_key(|(_, s)| s.len())
        .expect("a node owns streams");
    let victim = stack.nodes.iter().position(|n| n.id == victim_id).expect("victim");
    let t = Instant::now();
    scale::write_each(&base, &owned, "before", 64, t).await;
    println!(
        "wrote one record to each of {}'s {} streams in {:.1} s",
        victim_id,
        owned.len(),
        t.elapsed().as_secs_f64()
    );
    stack.nodes[victim].kill();
    let killed = Instant::now();
    let mut back = scale::write_each(&base, &owned, "after", 256, killed).await;
    back.sort();
    let pct = |p: f64| back[((back.len() - 1) as f64 * p) as usize].as_secs_f64();
    println!(
        "SIGKILL of a streamd owning {}: writable again after p50 {:.2} s, p99 {:.2} s, last {:.2} s (node timeout 4 s)",
        owned.len(),
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    let (mut lost, mut doubled) = (0, 0);
    for name in &owned {
        let bodies = scale::bodies(&base, name).await;
        let count = |b: &str| bodies.iter().filter(|x| x.as_str() == b).count();
        lost += usize::from(count("before") == 0) + usize::from(count("after") == 0);
        doubled += usize::from(count("before") > 1) + usize::from(count("after") > 1);
    }
    println!("read back every stream: {lost} acknowledged records lost, {doubled} read twice");

    // SIGTERM the other, which now owns them all, while 200 of its streams are written.
    stack.nodes[victim].start();
    stack.nodes[victim].wait_ready().await;
    let survivor = 1 - victim;
    let sample: Vec<String> = owned
        .iter()
        .step_by((owned.len() / 200).max(1))
        .take(200)
        .cloned()
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let probes: Vec<_> = sample
        .iter()
        .map(|name| {
            let (url, stop) = (format!("{base}/v1/streams/{name}/records"), stop.clone());
            tokio::spawn(async move {
                let http = weir_tests::http();
                let (mut last_ok, mut longest) = (Instant::now(), Duration::ZERO);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let r = http
                        .post(&url)
                        .header("idempotency-key", format!("probe-{i}"))
                        .json(&serde_json::json!({"records": [{"body": format!("p-{i}")}]}))
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await;
                    if r.is_ok_and(|r| r.status().is_success()) {
                        longest = longest.max(last_ok.elapsed());
                        last_ok = Instant::now();
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                longest.max(last_ok.elapsed())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stopping = Instant::now();
    stack.nodes[survivor].term();
    let code = stack.nodes[survivor].wait_exit(Duration::from_secs(120)).await;
    let took = stopping.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut longest = Duration::ZERO;
    for p in probes {
        longest = longest.max(p.await.expect("probe"));
    }
    println!(
        "SIGTERM of a streamd owning {n}: exit {code:?} after {:.1} s; the longest a probed stream was unwritable: {:.2} s",
        took.as_secs_f64(),
        longest.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    let n = env("WEIR_SCALE_STREAMS", 100_000);
    let m = env("WEIR_SCALE_TAKEOVER", 10_000);
    let idle = Duration::from_secs(env("WEIR_SCALE_IDLE_SEC", 30) as u64);
    let mode = std::env::var("WEIR_SCALE_MODE").unwrap_or_default();
    if mode == "create" {
        create_only(n).await;
    }
    if mode.is_empty() || mode == "dev" {
        dev(n, idle).await;
    }
    if mode.is_empty() || mode == "cluster" {
        cluster(m, idle).await;
    }
}
