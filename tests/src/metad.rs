//! Real metad processes: a replica and a cluster of them.

use crate::process::Proc;
use crate::{bin_path, free_port, wait_for};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use weir_meta::client::MetadClient;

/// One metad process and where it keeps its data.
pub struct Replica {
    pub id: u64,
    pub grpc: String,
    pub http: String,
    pub data_dir: PathBuf,
    peers: String,
    extra: Vec<String>,
    /// Environment every start gets (failpoints), besides what a start adds.
    pub env: Vec<(String, String)>,
    proc: Proc,
}

impl Replica {
    /// Starts (or restarts) the process with the same data directory and ports.
    pub fn start(&mut self) {
        self.start_with_env(&[]);
    }

    /// Starts the process with extra environment variables (failpoints).
    pub fn start_with_env(&mut self, env: &[(&str, &str)]) {
        let mut command = Command::new(bin_path("metad"));
        command
            .args(["--id", &self.id.to_string()])
            .args(["--listen", &self.grpc])
            .args(["--http-listen", &self.http])
            .args(["--peers", &self.peers])
            .arg("--data-dir")
            .arg(&self.data_dir)
            // Short timing unless the test sets its own.
            .args(if self.extra.iter().any(|a| a == "--heartbeat-interval-sec") {
                &[][..]
            } else {
                &["--heartbeat-interval-sec", "1", "--node-timeout-sec", "3"][..]
            })
            .args(["--propose-timeout-ms", "3000", "--raft-heartbeat-ms", "100"])
            .args(["--log-format", "json"])
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(env.iter().copied());
        self.proc.spawn(command);
    }

    /// Restarts with `--peers` replaced, as an operator would after the first boot.
    pub fn set_peers(&mut self, peers: &str) {
        self.peers = peers.to_string();
    }

    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        self.proc.wait_exit(timeout).await
    }

    /// The exit code if the process exits within `timeout`; `None` while it runs on.
    pub async fn exited_within(&mut self, timeout: Duration) -> Option<i32> {
        self.proc.exited_within(timeout).await
    }

    pub fn kill(&mut self) {
        self.proc.kill();
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        crate::signal(self.proc.pid(), sig);
    }

    pub fn pause(&self) {
        self.proc.pause();
    }

    pub fn resume(&self) {
        self.proc.resume();
    }

    /// The running process's id (for its RSS in benchmarks).
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn log_text(&self) -> String {
        self.proc.log_text()
    }

    /// The log of the latest run only (a restarted process appends to one file).
    pub fn run_log_text(&self) -> String {
        self.proc.run_log_text()
    }

    pub fn client(&self) -> MetadClient {
        MetadClient::new(std::slice::from_ref(&self.grpc), Duration::from_secs(5)).expect("client")
    }

    /// A JSON document from this replica's admin HTTP, or `None` if it does not answer.
    pub async fn http_json(&self, path: &str) -> Option<Value> {
        let resp = crate::http()
            .get(format!("http://{}{path}", self.http))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        resp.json().await.ok()
    }
}

/// The secret of the `admin` token an mTLS cluster's first replica issues at bootstrap
/// (`--bootstrap-admin-token-file`), as the compose stack does.
pub const ADMIN_SECRET: &str = "weir_test-admin-secret";

/// Several replicas bootstrapped together.
pub struct Cluster {
    pub replicas: Vec<Replica>,
    /// The cluster's certificates when it runs mTLS; the test's own calls then present
    /// an operator certificate.
    pub certs: Option<crate::tls::ClusterCerts>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` replicas with `extra` flags each and waits for a leader.
    pub async fn start(n: u64, extra: &[&str]) -> Cluster {
        Self::start_with_env(n, extra, &[]).await
    }

    /// As [`Cluster::start`], every replica with environment `env` (failpoints).
    pub async fn start_with_env(n: u64, extra: &[&str], env: &[(&str, &str)]) -> Cluster {
        Self::start_inner(n, extra, env, false).await
    }

    /// `n` replicas with mTLS between them and with every caller (D-21): a CA and
    /// certificates made by `weir certs`, each replica with its own.
    pub async fn start_mtls(n: u64, extra: &[&str]) -> Cluster {
        Self::start_inner(n, extra, &[], true).await
    }

    async fn start_inner(n: u64, extra: &[&str], env: &[(&str, &str)], mtls: bool) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let certs = mtls.then(|| crate::tls::ClusterCerts::make(&dir.path().join("certs")));
        let admin_token = dir.path().join("admin-token");
        std::fs::write(&admin_token, ADMIN_SECRET).expect("write the admin token file");
        let bootstrap_token = [
            "--bootstrap-admin-token-file".to_string(),
            admin_token.display().to_string(),
        ];
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
                peers: peers.clone(),
                extra: extra
                    .iter()
                    .map(|s| s.to_string())
                    .chain(certs.iter().flat_map(|c| c.flags("metad", &(i + 1).to_string())))
                    .chain(bootstrap_token.iter().filter(|_| mtls && i == 0).cloned())
                    .collect(),
                env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                proc: Proc::new(
                    format!("metad-{}", i + 1),
                    dir.path().join(format!("metad-{}.log", i + 1)),
                ),
            })
            .collect();
        for r in &mut replicas {
            r.start();
        }
        let cluster = Cluster {
            replicas,
            certs,
            _dir: dir,
        };
        cluster.wait_leader(&[]).await;
        // The settings entry lands right after the first election. Waiting for every
        // replica to apply it means each holds the membership before a test stops one:
        // a replica stopped before it heard from the leader has nothing to rejoin by.
        for i in 0..cluster.replicas.len() {
            cluster
                .wait_or_dump(
                    &format!("cluster settings on metad-{}", i + 1),
                    Duration::from_secs(20),
                    || async {
                        cluster.replicas[i]
                            .http_json("/admin/state/settings")
                            .await
                            .filter(|v| !v["settings"].is_null())
                    },
                )
                .await;
        }
        if mtls {
            cluster
                .wait_or_dump("the bootstrap admin token", Duration::from_secs(20), || async {
                    let tokens = cluster.client().admin("tokens", 0, 0).await.ok()?;
                    tokens.to_string().contains("\"admin\"").then_some(())
                })
                .await;
        }
        cluster
    }

    /// Every replica's log, for a failure message.
    pub fn logs(&self) -> String {
        self.replicas
            .iter()
            .map(|r| format!("--- metad-{} log:\n{}", r.id, r.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// As [`wait_for`], printing every replica's log when it times out.
    pub async fn wait_or_dump<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let found = tokio::time::timeout(timeout, wait_for(what, Duration::from_secs(3600), check)).await;
        match found {
            Ok(v) => v,
            Err(_) => panic!("timed out after {timeout:?} waiting for {what}\n{}", self.logs()),
        }
    }

    /// A client of every replica.
    pub fn client(&self) -> MetadClient {
        let addrs: Vec<String> = self.replicas.iter().map(|r| r.grpc.clone()).collect();
        let tls = self.certs.as_ref().map(|c| c.tls("operator", "test"));
        MetadClient::with_tls(&addrs, Duration::from_secs(5), tls.as_ref()).expect("client")
    }

    /// Creates Kafka topic `name` with `partitions` partitions, as an operator would.
    pub async fn create_topic(&self, name: &str, partitions: u32) {
        let (_, outcome) = self
            .client()
            .propose(
                &weir_meta::model::Proposer::Operator {
                    principal: "test".into(),
                },
                weir_meta::model::Command::CreateTopic {
                    name: name.into(),
                    partitions,
                    config: Default::default(),
                },
            )
            .await
            .expect("create topic");
        outcome.expect("topic created");
    }

    /// Issues API token `name` with `secret` as an operator would (`weir tokens issue`).
    pub async fn issue_token(&self, name: &str, secret: &str, scopes: &[&str]) {
        self.issue(name, secret, scopes, None).await;
    }

    /// Issues API token `name` with `secret`, no scopes, expiring at `expires_at_ms`
    /// (Unix ms), as `weir tokens issue --ttl-sec` would.
    pub async fn issue_expiring_token(&self, name: &str, secret: &str, expires_at_ms: u64) {
        self.issue(name, secret, &[], Some(expires_at_ms)).await;
    }

    async fn issue(&self, name: &str, secret: &str, scopes: &[&str], expires_at_ms: Option<u64>) {
        let (_, outcome) = self
            .client()
            .propose(
                &weir_meta::model::Proposer::Operator {
                    principal: "test".into(),
                },
                weir_meta::model::Command::IssueToken {
                    name: name.into(),
                    secret_sha256: weir_gatewayd::api::auth::secret_hash(secret),
                    scram: Some(weir_meta::scram::credentials(secret)),
                    scopes: scopes.iter().map(|s| s.to_string()).collect(),
                    expires_at_ms,
                },
            )
            .await
            .expect("issue");
        outcome.expect("issued");
    }

    /// Revokes API token `name` as an operator would (`weir tokens revoke`).
    pub async fn revoke_token(&self, name: &str) {
        let (_, outcome) = self
            .client()
            .propose(
                &weir_meta::model::Proposer::Operator {
                    principal: "test".into(),
                },
                weir_meta::model::Command::RevokeToken { name: name.into() },
            )
            .await
            .expect("revoke");
        outcome.expect("revoked");
    }

    /// Waits until a replica not in `excluding` reports itself leader; returns its index.
    pub async fn wait_leader(&self, excluding: &[usize]) -> usize {
        self.wait_or_dump("a metad leader", Duration::from_secs(30), || async {
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

    /// The state without the rows that change on their own (node heartbeats and
    /// registrations, the failover lease): what clients wrote.
    pub async fn data_state_of(&self, i: usize) -> Option<Value> {
        let mut v = self.state_of(i).await?;
        let o = v.as_object_mut()?;
        o.remove("nodes");
        o.remove("leases");
        Some(v)
    }

    /// The state (without its applied index) as replica `i` has applied it.
    pub async fn state_of(&self, i: usize) -> Option<Value> {
        let mut v = self.replicas[i].http_json("/admin/state/state").await?;
        v.as_object_mut()?.remove("applied_index");
        Some(v)
    }
}

/// Failpoint `late_<kind>` (`1*late while exists(<path>)`): the first such proposal is
/// answered as if its answer were lost and written only when [`LateProposal::land`]
/// removes the file, as a proposal held in a paused replica lands.
pub struct LateProposal {
    file: tempfile::NamedTempFile,
    key: String,
    value: String,
}

impl LateProposal {
    pub fn new(kind: &str) -> Self {
        let file = tempfile::NamedTempFile::new().expect("late file");
        let value = format!("1*late while exists({})", file.path().display());
        let key = format!("WEIR_FAILPOINT_LATE_{}", kind.to_ascii_uppercase());
        LateProposal { file, key, value }
    }

    /// The environment that sets the failpoint on a metad replica.
    pub fn env(&self) -> [(&str, &str); 1] {
        [(self.key.as_str(), self.value.as_str())]
    }

    /// Lets the held proposal land on `replica` (the leader) and waits for its outcome:
    /// whether it was refused.
    pub async fn land(self, replica: &Replica) -> bool {
        std::fs::remove_file(self.file.path()).expect("the late proposal lands now");
        wait_for("the late proposal landed", Duration::from_secs(30), || async {
            let log = replica.log_text();
            if log.contains("failpoint: the late proposal was refused") {
                Some(true)
            } else {
                log.contains("failpoint: the late proposal was").then_some(false)
            }
        })
        .await
    }
}
