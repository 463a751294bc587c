//! A real gatewayd process and an HTTP client of its API for tests.

use crate::process::Proc;
use crate::{bin_path, free_port, wait_for};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// One gatewayd process.
pub struct Gatewayd {
    pub id: String,
    pub http: String,
    /// The Kafka listener (bootstrap servers).
    pub kafka: String,
    /// The program run: `gatewayd`, or `weir` for [`Gatewayd::dev`].
    binary: &'static str,
    args: Vec<String>,
    env: Vec<(String, String)>,
    proc: Proc,
    http_client: reqwest::Client,
    /// Sent as `Authorization: Bearer` when set.
    pub token: Option<String>,
    /// `https` once [`Gatewayd::trust`] was called.
    scheme: &'static str,
}

impl Gatewayd {
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Starts appending `body` to `stream` and returns once `owner`'s WAL holds the
    /// write (failpoint `wal_persist=sleep(..)` on it): the append is admitted and
    /// unanswered. The task ends with the HTTP answer.
    pub async fn append_held_at(
        &self,
        owner: &crate::streamd::Streamd,
        stream: &str,
        body: &str,
    ) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
        let held = || crate::records(&owner.log_text(), "failpoint: sleeping").len();
        let before = held();
        let request = self
            .request(Method::POST, &format!("/v1/streams/{stream}/records"))
            .json(&json!({"records": [{"body": body}]}));
        let appending = tokio::spawn(async move { request.send().await });
        wait_for(
            "the owner holds the append's WAL write",
            Duration::from_secs(10),
            || async { (held() > before).then_some(()) },
        )
        .await;
        appending
    }

    /// Starts gatewayd `id` against metad `metad` with `extra` flags (1 s heartbeats).
    pub fn start(id: &str, metad: &str, dir: &Path, extra: &[&str]) -> Gatewayd {
        Self::start_with_env(id, metad, dir, extra, &[])
    }

    /// As [`Gatewayd::start`], with extra environment (failpoints).
    pub fn start_with_env(id: &str, metad: &str, dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Gatewayd {
        let mut args: Vec<String> = vec![
            "--id".into(),
            id.into(),
            "--metad".into(),
            metad.into(),
            "--heartbeat-interval-sec".into(),
            "1".into(),
            "--node-timeout-sec".into(),
            "3".into(),
            "--log-format".into(),
            "json".into(),
        ];
        crate::override_flags(&mut args, extra);
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self::spawned("gatewayd", id, args, env, dir)
    }

    /// Runs `binary` with `args` and `env`, its HTTP and Kafka listeners on free ports,
    /// logging to `dir/ID.log`.
    fn spawned(binary: &'static str, id: &str, args: Vec<String>, env: Vec<(String, String)>, dir: &Path) -> Gatewayd {
        let mut g = Gatewayd {
            binary,
            id: id.into(),
            http: format!("127.0.0.1:{}", free_port()),
            kafka: format!("127.0.0.1:{}", free_port()),
            args,
            env,
            proc: Proc::new(id, dir.join(format!("{id}.log"))),
            http_client: crate::http_builder()
                .timeout(Duration::from_secs(90))
                .build()
                .expect("http client"),
            token: None,
            scheme: "http",
        };
        g.spawn();
        g
    }

    /// Runs `weir dev` (metad, streamd and the gateway in one process) with its data in
    /// `dir`: the gateway is this process's (issue 62 measures the in-process hop).
    pub fn dev(dir: &Path) -> Gatewayd {
        let mut args: Vec<String> = vec![
            "dev".into(),
            "--data-dir".into(),
            dir.join("data").display().to_string(),
        ];
        for flag in [
            "--metad-listen",
            "--metad-http-listen",
            "--streamd-listen",
            "--streamd-http-listen",
        ] {
            args.extend([flag.to_string(), format!("127.0.0.1:{}", free_port())]);
        }
        Self::spawned("weir", "weir-dev", args, vec![], dir)
    }

    /// Talks HTTPS to a gateway started with `--tls-cert`, trusting only the CA `ca`.
    pub fn trust(&mut self, ca: &Path) {
        self.scheme = "https";
        self.http_client = crate::http_builder()
            .timeout(Duration::from_secs(90))
            .use_preconfigured_tls(crate::tls::client_config(ca))
            .build()
            .expect("https client");
    }

    pub fn spawn(&mut self) {
        let mut command = Command::new(bin_path(self.binary));
        command
            .args(&self.args)
            .args(["--http-listen", &self.http, "--kafka-listen", &self.kafka])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        self.proc.spawn(command);
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        crate::signal(self.proc.pid(), sig);
    }

    pub fn proc(&mut self) -> &mut Proc {
        &mut self.proc
    }

    pub fn log_text(&self) -> String {
        self.proc.log_text()
    }

    /// The log of the latest run only (a restarted process appends to one file).
    pub fn run_log_text(&self) -> String {
        self.proc.run_log_text()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme, self.http)
    }

    /// The value of one line of the gateway's `/metrics` (`name{labels}`), 0 when absent.
    pub async fn metric(&self, line: &str) -> f64 {
        crate::metric_value(&self.metrics().await, line).unwrap_or(0.0)
    }

    /// The gateway's `/metrics` text, over HTTPS when the gateway serves it.
    pub async fn metrics(&self) -> String {
        self.request(Method::GET, "/metrics")
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    pub async fn wait_ready(&self) {
        let url = self.url("/readyz");
        wait_for(
            &format!("gatewayd {} ready", self.id),
            Duration::from_secs(30),
            || async {
                let r = self.http_client.get(&url).send().await.ok()?;
                r.status().is_success().then_some(())
            },
        )
        .await;
    }

    /// A request to the API, with the bearer token when set.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http_client.request(method, self.url(path));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Sends a request and returns its status and JSON body (`null` when not JSON).
    pub async fn send(&self, req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let r = req.send().await.expect("request sent");
        let status = r.status();
        let body = r.json::<Value>().await.unwrap_or(Value::Null);
        (status, body)
    }

    /// Creates `name`, retrying a retryable 503 as a client should (a retry after an
    /// unknown outcome may find the stream already created).
    pub async fn create_stream(&self, name: &str) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut retried = false;
        loop {
            let (status, body) = self
                .send(
                    self.request(Method::POST, "/v1/streams")
                        .json(&json!({ "stream": name })),
                )
                .await;
            match status {
                StatusCode::CREATED => return body,
                StatusCode::CONFLICT if retried => {
                    return self
                        .send(self.request(Method::GET, &format!("/v1/streams/{name}")))
                        .await
                        .1
                }
                StatusCode::SERVICE_UNAVAILABLE if std::time::Instant::now() < deadline => {
                    retried = true;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                _ => panic!("create {name}: {status} {body}"),
            }
        }
    }

    /// Appends text records; returns `(start, end)` sequence numbers.
    pub async fn append(&self, stream: &str, bodies: &[&str]) -> (u64, u64) {
        let records: Vec<Value> = bodies.iter().map(|b| json!({ "body": b })).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = self
                .send(
                    self.request(Method::POST, &format!("/v1/streams/{stream}/records"))
                        .json(&json!({ "records": records })),
                )
                .await;
            // A 503 says nothing was applied: retried, as a client would (a 504 may
            // have been applied).
            if status == StatusCode::SERVICE_UNAVAILABLE && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            assert_eq!(status, StatusCode::OK, "append to {stream}: {body}");
            return (
                body["start_seq_num"].as_u64().expect("start"),
                body["end_seq_num"].as_u64().expect("end"),
            );
        }
    }

    /// The bodies of every record from 0 to the tail, in order.
    pub async fn bodies(&self, stream: &str) -> Vec<String> {
        self.read_all(stream)
            .await
            .iter()
            .map(|r| r["body"].as_str().expect("body").to_string())
            .collect()
    }

    /// Reads every record from 0 to the tail, page by page.
    pub async fn read_all(&self, stream: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut next = 0;
        loop {
            let (status, body) = self
                .send(self.request(Method::GET, &format!("/v1/streams/{stream}/records?seq_num={next}")))
                .await;
            assert_eq!(status, StatusCode::OK, "read {stream} at {next}: {body}");
            let records = body["records"].as_array().cloned().unwrap_or_default();
            out.extend(records);
            next = body["next_seq_num"].as_u64().expect("next_seq_num");
            if next >= body["tail"].as_u64().expect("tail") {
                return out;
            }
        }
    }

    /// Waits until the stream has a live owner that answers (its tail is readable).
    pub async fn wait_open(&self, stream: &str) {
        // A topic partition's stream is `topic/partition`; the slash is escaped in a path.
        let path = format!("/v1/streams/{}/records/tail", stream.replace('/', "%2F"));
        wait_for(&format!("{stream} open"), Duration::from_secs(90), || async {
            let r = self.request(Method::GET, &path).send().await.ok()?;
            r.status().is_success().then_some(())
        })
        .await;
    }
}

/// One parsed server-sent event.
#[derive(Debug, Clone, Default)]
pub struct SseEvent {
    pub event: String,
    pub id: Option<String>,
    pub data: String,
}

/// Reads server-sent events from a streaming response.
pub struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event (comments and keep-alives skipped), or `None` when the stream ends.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut ev = SseEvent::default();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        ev.event = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        ev.id = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        ev.data.push_str(v.trim_start());
                    }
                }
                if ev.event.is_empty() && ev.data.is_empty() {
                    continue;
                }
                return Some(ev);
            }
            let chunk = self.response.chunk().await.ok()??;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}
