//! Measuring Weir with many streams (issue 57): creating them over HTTP from several
//! clients with the rate and tail latency of each window, waiting until every one is
//! open, the CPU and memory processes spend on them idle, and how long each takes to
//! become writable again after a fault. Shared by the `scale` benchmark and the short
//! version of it the test suite runs.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One window of a creation run: how many streams, over how long, and its latencies.
#[derive(Clone, Debug)]
pub struct Window {
    /// Streams created before this window.
    pub from: usize,
    pub count: usize,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
}

impl Window {
    pub fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "streams {:>8}..{:<8} {:>7.0}/s  p50 {:>6.1} ms  p99 {:>6.1} ms",
            self.from,
            self.from + self.count,
            self.rate(),
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3
        )
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Creates `total` streams named `{prefix}{i}` through the gateway at `base`
/// (`http://host:port`), `clients` requests at a time, retrying what is retryable;
/// the figures of each `window` streams, printed as they complete when `print`.
pub async fn create_streams(
    base: &str,
    prefix: &str,
    total: usize,
    clients: usize,
    window: usize,
    print: bool,
) -> Vec<Window> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .build()
        .expect("http client");
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(Mutex::new(Vec::<(usize, Duration, Instant)>::with_capacity(total)));
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (http, next, done) = (http.clone(), next.clone(), done.clone());
            let (url, prefix) = (format!("{base}/v1/streams"), prefix.to_string());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return;
                    }
                    let body = json!({ "stream": format!("{prefix}{i}") });
                    let began = Instant::now();
                    loop {
                        let r = http.post(&url).json(&body).send().await;
                        match r.map(|r| r.status()) {
                            Ok(StatusCode::CREATED) => break,
                            // A retry after an unknown outcome may find it created.
                            Ok(StatusCode::CONFLICT) => break,
                            Ok(s) if s.is_server_error() => tokio::time::sleep(Duration::from_millis(50)).await,
                            Ok(s) => panic!("create {prefix}{i}: {s}"),
                            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                        }
                    }
                    done.lock().expect("lock").push((i, began.elapsed(), Instant::now()));
                }
            })
        })
        .collect();
    // Windows are cut by completion order as they fill.
    let mut windows = Vec::new();
    let mut window_start = started;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let finished = workers.iter().all(|w| w.is_finished());
        let mut done = done.lock().expect("lock");
        while done.len() >= window || (finished && !done.is_empty()) {
            let n = done.len().min(window);
            let batch: Vec<_> = done.drain(..n).collect();
            let end = batch.iter().map(|b| b.2).max().unwrap_or(window_start);
            let mut latencies: Vec<Duration> = batch.iter().map(|b| b.1).collect();
            latencies.sort();
            let w = Window {
                from: windows.iter().map(|w: &Window| w.count).sum(),
                count: n,
                elapsed: end.saturating_duration_since(window_start),
                p50: percentile(&latencies, 0.5),
                p99: percentile(&latencies, 0.99),
            };
            if print {
                println!("create {w}");
            }
            windows.push(w);
            window_start = end;
        }
        if finished && done.is_empty() {
            break;
        }
    }
    for w in workers {
        w.await.expect("creator");
    }
    windows
}

/// The nodes listing of metad's admin HTTP at `metad_http`.
pub async fn nodes(metad_http: &str) -> Option<Value> {
    crate::http()
        .get(format!("http://{metad_http}/admin/nodes"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// Streams open on each live streamd, by node id, as metad's listing says.
pub async fn open_by_node(metad_http: &str) -> Option<Vec<(String, u64)>> {
    let nodes = nodes(metad_http).await?;
    Some(
        nodes["nodes"]
            .as_array()?
            .iter()
            .filter(|n| n["kind"] == "streamd" && n["fenced"] == false)
            .map(|n| {
                (
                    n["node_id"].as_str().unwrap_or_default().to_string(),
                    n["open_streams"].as_u64().unwrap_or(0),
                )
            })
            .collect(),
    )
}

/// Waits until `total` streams are open on live streamd nodes; how long it took.
pub async fn wait_all_open(metad_http: &str, total: u64, within: Duration) -> Duration {
    let started = Instant::now();
    crate::wait_for(&format!("{total} streams open"), within, || async {
        let open: u64 = open_by_node(metad_http).await?.iter().map(|(_, n)| n).sum();
        (open >= total).then_some(())
    })
    .await;
    started.elapsed()
}

/// CPU seconds (user and system) process `pid` has used.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}

/// Resident memory of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The share of a core `pids` used together over `over`, idle.
pub async fn idle_cpu(pids: &[u32], over: Duration) -> f64 {
    let before: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    tokio::time::sleep(over).await;
    let after: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    (after - before) / over.as_secs_f64()
}

/// Appends one record `body` to each of `streams` through the gateway at `base`,
/// `concurrency` at a time, each retried until acknowledged under one idempotency key,
/// so a retry after an unknown outcome applies once; when each was acknowledged,
/// measured from `since`, in the order of `streams`.
pub async fn write_each(
    base: &str,
    streams: &[String],
    body: &str,
    concurrency: usize,
    since: Instant,
) -> Vec<Duration> {
    use futures::StreamExt;
    let http = reqwest::Client::new();
    futures::stream::iter(streams.iter().cloned())
        .map(|name| {
            let (http, url) = (
                http.clone(),
                format!("{base}/v1/streams/{}/records", name.replace('/', "%2F")),
            );
            let key = format!("{body}-{name}");
            let body = json!({"records": [{"body": body}]});
            async move {
                loop {
                    let r = http
                        .post(&url)
                        .header("idempotency-key", &key)
                        .json(&body)
                        .timeout(Duration::from_secs(30))
                        .send()
                        .await;
                    match r.map(|r| r.status()) {
                        Ok(StatusCode::OK) => return since.elapsed(),
                        Ok(s) if s.is_client_error() => panic!("append to {name}: {s}"),
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            }
        })
        .buffered(concurrency)
        .collect()
        .await
}

/// The bodies of every record of `stream`, read through the gateway at `base`.
pub async fn bodies(base: &str, stream: &str) -> Vec<String> {
    let http = crate::http();
    let url = format!("{base}/v1/streams/{}/records?seq_num=0", stream.replace('/', "%2F"));
    loop {
        if let Ok(r) = http.get(&url).send().await {
            if r.status() == StatusCode::OK {
                let v: Value = r.json().await.unwrap_or(Value::Null);
                return v["records"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r["body"].as_str().map(str::to_string))
                    .collect();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every stream the gateway at `base` lists, paging through them, with its owner node.
pub async fn list_streams(base: &str) -> Vec<(String, Option<String>)> {
    let http = crate::http();
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let page: Value = http
            .get(format!("{base}/v1/streams"))
            .query(&[("limit", "1000"), ("start_after", after.as_str())])
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("json");
        for s in page["streams"].as_array().into_iter().flatten() {
            let name = s["name"].as_str().expect("name").to_string();
            out.push((name.clone(), s["owner"]["node"].as_str().map(str::to_string)));
            after = name;
        }
        if page["has_more"] != true {
            return out;
        }
    }
}
