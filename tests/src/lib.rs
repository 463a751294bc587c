//! Test harness for black-box tests: starts the built binaries as real processes on
//! loopback ports in temp dirs, waits on conditions (never fixed sleeps), and
//! injects process faults (SIGKILL, SIGSTOP/SIGCONT, SIGTERM).
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

pub mod batches;
pub mod disk;
pub mod fuzz;
pub mod gateway;
pub mod history;
pub mod kafka_wire;
pub mod metad;
pub mod process;
pub mod proxy;
pub mod readback;
pub mod s3;
pub mod scale;
pub mod streamd;
pub mod syscalls;
pub mod tls;
pub mod writer;

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A randomized test's seed: `WEIR_SEED` when set (any randomized test replays from
/// it), else the test's own `$var`, else a fresh one. It is printed with how to replay it.
pub fn seed(var: &str) -> u64 {
    let from = |name: &str| std::env::var(name).ok().and_then(|s| s.parse().ok());
    let seed = from("WEIR_SEED")
        .or_else(|| from(var))
        .unwrap_or_else(rand::random::<u64>);
    println!("seed {seed}; replay with WEIR_SEED={seed} (or {var}={seed})");
    seed
}

/// The path of a workspace binary next to the running test executable.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe.parent().and_then(|d| d.parent()).expect("target profile dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` (or `cargo test --workspace`, which builds it)",
        path.display()
    );
    path
}

/// A loopback port free at the time of the call, taken below the kernel's ephemeral
/// range so an outgoing connection cannot grab it before the service binds it.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    // Start each test binary at a different place, so a port a previous binary left in
    // TIME_WAIT is unlikely to come up again. The pid is scattered (times a prime), so
    // binaries started one after the other, with near pids, and run side by side do
    // not walk the same ports.
    let _ = NEXT.compare_exchange(
        0,
        1 + ((u64::from(std::process::id()) * 7919) % u64::from(SPAN)) as u16,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN);
}

/// Appends `extra` to `args`, first dropping each default flag (and its value) that
/// `extra` sets again, so tests override defaults without clap's duplicate-flag error.
pub fn override_flags(args: &mut Vec<String>, extra: &[&str]) {
    for flag in extra.iter().filter(|f| f.starts_with("--")) {
        if let Some(i) = args.iter().position(|a| a == flag) {
            args.drain(i..(i + 2).min(args.len()));
        }
    }
    args.extend(extra.iter().map(|s| s.to_string()));
}

/// Polls `check` every 50 ms until it yields `Some`, or fails the test after `timeout`
/// naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `signal` to `pid`.
pub fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(pid, signal);
}

/// The body of a GET, failing the test if it cannot be fetched.
/// An HTTP client for tests. reqwest is built with rustls and no provider of its own
/// (HTTPS to gateways with `--tls-cert`), so the process's provider is installed first.
pub fn http() -> reqwest::Client {
    http_builder().build().expect("http client")
}

/// As [`http`], to configure.
pub fn http_builder() -> reqwest::ClientBuilder {
    static PROVIDER: std::sync::Once = std::sync::Once::new();
    PROVIDER.call_once(|| {
        // Err only when one is installed already, which is as good.
        let _ = tokio_rustls::rustls::crypto::aws_lc_rs::default_provider().install_default();
    });
    reqwest::Client::builder()
}

/// `reqwest::get` through [`http`].
pub async fn http_get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    http().get(url).send().await
}

pub async fn get_text(url: &str) -> String {
    crate::http_get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .text()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// The resident set size of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    proc_status_bytes(pid, "VmRSS")
}

/// The anonymous part of process `pid`'s resident set (its heap and stacks, not the
/// files it maps), in bytes.
pub fn rss_anon_bytes(pid: u32) -> u64 {
    proc_status_bytes(pid, "RssAnon")
}

fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The last `n` bytes of `text` or fewer, from a line start.
pub fn tail_of(text: &str, n: usize) -> &str {
    let mut from = text.len().saturating_sub(n);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    let from = text[from..].find('\n').map_or(from, |i| from + i + 1);
    &text[from..]
}

/// The value of a Prometheus sample line `name` (labels included) in `metrics`.
pub fn metric_value(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The row of node `id` in an `/admin/nodes` (or `weir nodes`) answer; `Null` when absent.
pub fn node_row<'a>(nodes: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    static NULL: serde_json::Value = serde_json::Value::Null;
    nodes["nodes"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["node_id"] == id))
        .unwrap_or(&NULL)
}

/// The row of the stream named `name` in an admin `streams` answer.
pub fn stream_named(streams: &serde_json::Value, name: &str) -> Option<serde_json::Value> {
    streams["streams"]
        .as_object()?
        .values()
        .find(|s| s["name"] == name)
        .cloned()
}

/// Every file under `dir`, recursively (none when it does not exist).
pub fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Every JSON record of a process's log, in order (lines that are not JSON skipped).
pub fn log_records(log: &str) -> impl Iterator<Item = serde_json::Value> + '_ {
    log.lines().filter_map(|l| serde_json::from_str(l).ok())
}

/// The JSON log records whose message is `message`.
pub fn records(log: &str, message: &str) -> Vec<serde_json::Value> {
    log_records(log).filter(|r| r["message"] == message).collect()
}

/// Seconds into the day of a JSON log record's `timestamp` (`…THH:MM:SS.ffffffZ`);
/// compare two with `(b - a).rem_euclid(86_400.0)` so midnight does not matter.
pub fn seconds_of_day(record: &serde_json::Value) -> f64 {
    let ts = record["timestamp"].as_str().expect("timestamp");
    let clock = ts.split('T').nth(1).expect("time").trim_end_matches('Z');
    let mut parts = clock.split(':').map(|p| p.parse::<f64>().expect("number"));
    let (h, m, s) = (
        parts.next().unwrap_or(0.0),
        parts.next().unwrap_or(0.0),
        parts.next().unwrap_or(0.0),
    );
    h * 3600.0 + m * 60.0 + s
}

/// The exit status a clean shutdown's log calls for (SD-EX-1/2, SD-DL-3/4): 1 when the
/// deadline expired or any phase finished `Forced`, else 0, whatever else was
/// `Abandoned`. A test of a stop asserts the status equals this, so a process that
/// exits 1 after a graceful stop, or 0 after a forced one, fails it.
pub fn shutdown_exit_code(log: &str) -> i32 {
    let forced = log_records(log).any(|r| {
        let message = r["message"].as_str().unwrap_or_default();
        message == "shutdown deadline expired; abandoning graceful shutdown"
            || (message.ends_with("phase finished") && r["outcome"] == "Forced")
    });
    i32::from(forced)
}

/// SD-EX-1: a stop that ran all three phases within its deadline exits 0, whatever
/// phase was `Abandoned`. Asserts the scenario's outcome outright (three phase records,
/// none `Forced`, no expiry) as well as the status, so a process that exits 1, or exits
/// 0 after a forced stop, fails.
pub fn assert_graceful_exit(code: Option<i32>, log: &str) {
    let phases: Vec<serde_json::Value> = log_records(log)
        .filter(|r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("shutdown ") && m.ends_with(" phase finished"))
        })
        .collect();
    let names: Vec<&str> = phases.iter().filter_map(|r| r["phase"].as_str()).collect();
    assert_eq!(
        names,
        ["stop-requested", "drain-support", "terminal-teardown"],
        "SD-EX-1: every phase finished: {log}"
    );
    assert!(
        phases.iter().all(|r| r["outcome"] != "Forced"),
        "SD-EX-1: no phase forced: {phases:?}"
    );
    assert_eq!(
        shutdown_exit_code(log),
        0,
        "SD-EX-1: the deadline did not expire: {log}"
    );
    assert_eq!(code, Some(0), "SD-EX-1: a graceful stop exits 0: {log}");
}

/// SD-EX-2: a stop the deadline cut short exits 1, and its log says so.
pub fn assert_forced_exit(code: Option<i32>, log: &str) {
    assert_eq!(
        shutdown_exit_code(log),
        1,
        "SD-EX-2: the log shows a forced stop: {log}"
    );
    assert_eq!(code, Some(1), "SD-EX-2: a forced stop exits 1: {log}");
}

/// The entries of a metadata log dump (`admin("log", ..)`), each batch command
/// (`place_streams`, `open_streams`, `close_streams`, `begin_transfers`, issue 57)
/// split into its items, each shown as the single command it stands for with its own
/// outcome, at the batch's index. Assertions about single streams' steps then read
/// the same whether the steps came one per entry or many.
pub fn flatten_batches(dump: &serde_json::Value) -> Vec<serde_json::Value> {
    use serde_json::{json, Value};
    let mut out = Vec::new();
    for entry in dump["entries"].as_array().into_iter().flatten() {
        let command = &entry["proposal"]["command"];
        let (single, items) = match command["type"].as_str() {
            Some("place_streams") => ("place_stream", &command["placements"]),
            Some("open_streams") => ("open_stream", &command["streams"]),
            Some("close_streams") => ("close_stream", &command["streams"]),
            Some("begin_transfers") => ("begin_transfer", &command["transfers"]),
            _ => {
                out.push(entry.clone());
                continue;
            }
        };
        let Some(outcomes) = entry["outcome"]["Ok"]["outcomes"].as_array() else {
            // Refused whole: every item alike.
            out.push(entry.clone());
            continue;
        };
        for (item, outcome) in items.as_array().into_iter().flatten().zip(outcomes) {
            let mut single_command = match item {
                Value::Object(fields) => Value::Object(fields.clone()),
                // `open_streams` lists bare ids.
                id => json!({ "stream": id }),
            };
            single_command["type"] = json!(single);
            out.push(json!({
                "index": entry["index"],
                "term": entry["term"],
                "proposal": { "proposer": entry["proposal"]["proposer"], "command": single_command },
                "outcome": outcome,
            }));
        }
    }
    out
}
