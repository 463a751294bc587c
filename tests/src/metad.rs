//! Real metad processes: a replica and a cluster of them.

use crate::{bin_path, free_port, signal, wait_for};
use nix::sys::signal::Signal;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use weir_metad::client::MetadClient;

/// One metad process and where it keeps its data and log.
pub struct Replica {
    pub id: u64,
    pub grpc: String,
    pub http: String,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    peers: String,
    extra: Vec<String>,
    child: Option<Child>,
}

impl Replica {
    /// Starts (or restarts) the process with the same data directory and ports.
    pub fn start(&mut self) {
        self.start_with_env(&[]);
    }

    /// Starts the process with extra environment variables (failpoints).
    pub fn start_with_env(&mut self, env: &[(&str, &str)]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open replica log");
        let child = Command::new(bin_path("metad"))
            .args(["--id", &self.id.to_string()])
            .args(["--listen", &self.grpc])
            .args(["--http-listen", &self.http])
            .args(["--peers", &self.peers])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--heartbeat-interval-sec", "1", "--node-timeout-sec", "3"])
            .args(["--propose-timeout-ms", "3000", "--raft-heartbeat-ms", "100"])
            .args(["--log-format", "json"])
            .args(&self.extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn metad");
        self.child = Some(child);
    }

    /// Restarts with `--peers` replaced, as an operator would after the first boot.
    pub fn set_peers(&mut self, peers: &str) {
        self.peers = peers.to_string();
    }

    /// Waits for the process to exit by itself; returns its exit code.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let mut child = self.child.take()?;
        let status = wait_for("metad to exit", timeout, || {
            let status = child.try_wait().ok().flatten();
            async move { status }
        })
        .await;
        status.code()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("replica is running").id()
    }

    /// SIGKILL, and reap the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn pause(&self) {
        signal(self.pid(), Signal::SIGSTOP);
    }

    pub fn resume(&self) {
        signal(self.pid(), Signal::SIGCONT);
    }

    pub fn client(&self) -> MetadClient {
        MetadClient::new(std::slice::from_ref(&self.grpc), Duration::from_secs(5)).expect("client")
    }

    /// A JSON document from this replica's admin HTTP, or `None` if it does not answer.
    pub async fn http_json(&self, path: &str) -> Option<Value> {
        let resp = reqwest::Client::new()
            .get(format!("http://{}{path}", self.http))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        resp.json().await.ok()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            signal(child.id(), Signal::SIGCONT);
        }
        self.kill();
    }
}

/// Several replicas bootstrapped together.
pub struct Cluster {
    pub replicas: Vec<Replica>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` replicas with `extra` flags each and waits for a leader.
    pub async fn start(n: u64, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let grpc: Vec<String> = (0..n).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let peers = grpc
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut replicas: Vec<Replica> = (0..n)
            .map(|i| Replica {
                id: i + 1,
                grpc: grpc[i as usize].clone(),
                http: format!("127.0.0.1:{}", free_port()),
                data_dir: dir.path().join(format!("metad-{}", i + 1)),
                log_path: dir.path().join(format!("metad-{}.log", i + 1)),
                peers: peers.clone(),
                extra: extra.iter().map(|s| s.to_string()).collect(),
                child: None,
            })
            .collect();
        for r in &mut replicas {
            r.start();
        }
        let cluster = Cluster { replicas, _dir: dir };
        cluster.wait_leader(&[]).await;
        // The settings entry lands right after the first election.
        wait_for("cluster settings", Duration::from_secs(20), || async {
            cluster.replicas[0]
                .http_json("/admin/state/settings")
                .await
                .filter(|v| !v["settings"].is_null())
        })
        .await;
        cluster
    }

    /// A client of every replica.
    pub fn client(&self) -> MetadClient {
        let addrs: Vec<String> = self.replicas.iter().map(|r| r.grpc.clone()).collect();
        MetadClient::new(&addrs, Duration::from_secs(5)).expect("client")
    }

    /// Waits until a replica not in `excluding` reports itself leader; returns its index.
    pub async fn wait_leader(&self, excluding: &[usize]) -> usize {
        wait_for("a metad leader", Duration::from_secs(30), || async {
            for (i, r) in self.replicas.iter().enumerate() {
                if excluding.contains(&i) {
                    continue;
                }
                if let Some(status) = r.http_json("/admin/status").await {
                    if status["state"] == "Leader" {
                        return Some(i);
                    }
                }
            }
            None
        })
        .await
    }

    /// The state (without its applied index) as replica `i` has applied it.
    pub async fn state_of(&self, i: usize) -> Option<Value> {
        let mut v = self.replicas[i].http_json("/admin/state/state").await?;
        v.as_object_mut()?.remove("applied_index");
        Some(v)
    }
}
