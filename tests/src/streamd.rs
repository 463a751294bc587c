//! Real streamd processes and a small stack (one metad, S3, streamd nodes) for tests.

use crate::metad::Cluster;
use crate::process::Proc;
use crate::s3::S3Server;
use crate::{bin_path, free_port, wait_for};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use weir_meta::model::{Applied, Command as MetaCommand, Proposer, StreamConfig};
use weir_proto::streamd::streamd_client::StreamdClient;
use weir_shared::grpc::Channel;
use weir_shared::ids::{NodeId, StreamId};

/// Streamd's own WAL segment size (64 MiB) instead of the suite's small one, for
/// benchmarks that measure what a deployment does.
pub const PRODUCTION_WAL: &[&str] = &["--wal-segment-bytes", "67108864"];

/// Flags that keep appended records in the WAL and the tail buffer (no upload until a
/// close or a takeover), for tests of what a stop or a crash does with them.
pub const WAL_ONLY: &[&str] = &["--upload-interval-ms", "600000", "--upload-bytes", "1000000000"];

/// A stop that stays 30 s in its readiness drain, well inside its drain timeout and
/// deadline: time for a test to act on a process mid-stop.
pub const LONG_DRAIN: &[&str] = &[
    "--shutdown-drain-sec",
    "30",
    "--drain-timeout-sec",
    "60",
    "--shutdown-deadline-sec",
    "60",
];

/// One streamd process.
pub struct Streamd {
    pub id: String,
    pub grpc: String,
    pub http: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    proc: Proc,
    /// On an mTLS stack, what the test's own calls to the node present: a metad
    /// certificate, as tests play both a gateway's part (appends, reads) and metad's
    /// (`CloseStream`), and the node accepts both from metad.
    tls: Option<weir_shared::cluster_tls::ClusterTls>,
}

impl Streamd {
    pub fn start(&mut self) {
        let mut command = Command::new(bin_path("streamd"));
        command
            .args(&self.args)
            .args(["--listen", &self.grpc, "--http-listen", &self.http])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        self.proc.spawn(command);
    }

    pub fn kill(&mut self) {
        self.proc.kill();
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Changes flags for the next [`Streamd::start`] (a restart with new settings).
    pub fn override_flags(&mut self, extra: &[&str]) {
        crate::override_flags(&mut self.args, extra);
    }

    pub fn term(&self) {
        self.proc.term();
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        crate::signal(self.proc.pid(), sig);
    }

    /// SIGSTOP: the process hangs, holding its sockets and files.
    pub fn pause(&self) {
        self.proc.pause();
    }

    pub fn resume(&self) {
        self.proc.resume();
    }

    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        self.proc.wait_exit(timeout).await
    }

    /// The exit code if the process exits within `timeout`; `None` while it runs on.
    pub async fn wait_exit_if_exited(&mut self, timeout: Duration) -> Option<i32> {
        self.proc.exited_within(timeout).await
    }

    pub fn log_text(&self) -> String {
        self.proc.log_text()
    }

    /// The log of the latest run only (a restarted process appends to one file).
    pub fn run_log_text(&self) -> String {
        self.proc.run_log_text()
    }

    pub async fn client(&self) -> StreamdClient<Channel> {
        let tls = self.tls.as_ref().map(|t| t.client());
        let ch = weir_shared::grpc::channel_with(&self.grpc, tls).expect("channel");
        StreamdClient::new(ch).max_decoding_message_size(64 << 20)
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&self) {
        let url = format!("http://{}/readyz", self.http);
        wait_for(
            &format!("streamd {} ready", self.id),
            Duration::from_secs(30),
            || async {
                let r = crate::http_get(&url).await.ok()?;
                r.status().is_success().then_some(())
            },
        )
        .await;
    }
}

/// Which WAL backend and object store a stack uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// File WAL on a shared directory, data objects in S3.
    FileWal,
    /// Object WAL and data objects in S3.
    ObjectWal,
}

/// One metad, one S3 server, and streamd nodes sharing a WAL root.
pub struct Stack {
    pub metad: Cluster,
    pub s3: S3Server,
    pub nodes: Vec<Streamd>,
    pub wal_root: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Stack {
    /// A stack where tests place streams themselves, on the node they name.
    pub async fn start(nodes: usize, backend: Backend, extra: &[&str]) -> Stack {
        Self::start_with(nodes, backend, extra, &["--auto-place", "false"]).await
    }

    /// A stack whose metad runs with `metad_extra` flags.
    pub async fn start_with(nodes: usize, backend: Backend, extra: &[&str], metad_extra: &[&str]) -> Stack {
        Self::start_replicas(1, nodes, backend, extra, metad_extra).await
    }

    /// A stack with `replicas` metad replicas.
    pub async fn start_replicas(
        replicas: u64,
        nodes: usize,
        backend: Backend,
        extra: &[&str],
        metad_extra: &[&str],
    ) -> Stack {
        Self::start_replicas_with_env(replicas, nodes, backend, extra, metad_extra, &[]).await
    }

    /// As [`Stack::start_replicas`], every metad replica with environment `metad_env`.
    pub async fn start_replicas_with_env(
        replicas: u64,
        nodes: usize,
        backend: Backend,
        extra: &[&str],
        metad_extra: &[&str],
        metad_env: &[(&str, &str)],
    ) -> Stack {
        let metad = Cluster::start_with_env(replicas, metad_extra, metad_env).await;
        Self::with_nodes(metad, nodes, backend, |_, _| {
            extra.iter().map(|s| s.to_string()).collect()
        })
        .await
    }

    /// A stack whose metad replicas, streamd nodes (and the gateways a test adds with
    /// [`Stack::cluster_flags`]) talk mTLS (D-21); streams are placed by metad.
    pub async fn start_mtls(replicas: u64, nodes: usize, backend: Backend) -> Stack {
        Self::secure(replicas, nodes, backend, &[], &[]).await
    }

    /// As [`Stack::start_replicas`], over mTLS: the test's own calls present real
    /// certificates (an operator's to metad, metad's to streamd), not forged
    /// identities a plaintext cluster would take on trust (issue 18).
    pub async fn secure(replicas: u64, nodes: usize, backend: Backend, extra: &[&str], metad_extra: &[&str]) -> Stack {
        let metad = Cluster::start_mtls(replicas, metad_extra).await;
        Self::with_nodes(metad, nodes, backend, |_, _| {
            extra.iter().map(|s| s.to_string()).collect()
        })
        .await
    }

    /// S3 and `nodes` streamd nodes `streamd-N` around `metad`, node `id` with
    /// `flags(stack, id)`; waits until every node is ready.
    async fn with_nodes(
        metad: Cluster,
        nodes: usize,
        backend: Backend,
        flags: impl Fn(&Stack, &str) -> Vec<String>,
    ) -> Stack {
        let s3 = S3Server::start().await;
        let dir = tempfile::tempdir().expect("temp dir");
        let wal_root = dir.path().join("wal");
        let mut stack = Stack {
            metad,
            s3,
            nodes: Vec::new(),
            wal_root,
            dir,
        };
        for i in 0..nodes {
            let id = format!("streamd-{}", i + 1);
            let flags = flags(&stack, &id);
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            stack.add_node(&id, backend, &flags);
        }
        for n in &stack.nodes {
            n.wait_ready().await;
        }
        stack
    }

    /// A gateway of this stack with `extra` flags, once ready. On an mTLS stack it has
    /// its certificate and `--auth`, and its requests carry the bootstrap admin token,
    /// so metad checks a real user's scopes for every change it proposes.
    pub async fn gateway(&self, id: &str, extra: &[&str]) -> crate::gateway::Gatewayd {
        let mut flags: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        if let Some(certs) = &self.metad.certs {
            flags.extend(certs.flags("gatewayd", id));
            flags.push("--auth".into());
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let mut gw = crate::gateway::Gatewayd::start(id, &self.metad_addrs(), self.dir.path(), &flags);
        if self.metad.certs.is_some() {
            gw.token = Some(crate::metad::ADMIN_SECRET.into());
        }
        gw.wait_ready().await;
        gw
    }

    /// The `--cluster-*` flags of `role` `id` in an mTLS stack.
    pub fn cluster_flags(&self, role: &str, id: &str) -> Vec<String> {
        self.metad.certs.as_ref().expect("an mTLS stack").flags(role, id)
    }

    pub fn add_node(&mut self, id: &str, backend: Backend, extra: &[&str]) {
        self.add_node_with_env(id, backend, extra, &[]);
    }

    /// Adds a node with extra environment variables (failpoints).
    pub fn add_node_with_env(&mut self, id: &str, backend: Backend, extra: &[&str], env: &[(&str, &str)]) {
        let grpc = format!("127.0.0.1:{}", free_port());
        self.add_node_at(id, backend, extra, env, grpc);
    }

    /// Adds a node whose data plane gatewayd reaches through a fault-injecting proxy
    /// (the node advertises the proxy's address); the proxy of that link.
    pub async fn add_node_behind_proxy(&mut self, id: &str, backend: Backend, extra: &[&str]) -> crate::proxy::Proxy {
        self.add_node_behind_proxy_with_env(id, backend, extra, &[]).await
    }

    /// As [`Stack::add_node_behind_proxy`], with extra environment (`AWS_ENDPOINT` for
    /// an object-store link through a proxy of its own).
    pub async fn add_node_behind_proxy_with_env(
        &mut self,
        id: &str,
        backend: Backend,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> crate::proxy::Proxy {
        let grpc = format!("127.0.0.1:{}", free_port());
        let proxy = crate::proxy::Proxy::start(&grpc).await;
        let mut flags = extra.to_vec();
        flags.extend(["--advertise", proxy.addr.as_str()]);
        self.add_node_at(id, backend, &flags, env, grpc);
        proxy
    }

    fn add_node_at(&mut self, id: &str, backend: Backend, extra: &[&str], env: &[(&str, &str)], grpc: String) {
        let mut args: Vec<String> = vec![
            "--id".into(),
            id.into(),
            "--metad".into(),
            self.metad_addrs(),
            "--data-dir".into(),
            self.dir.path().join(id).display().to_string(),
            "--object-store".into(),
            self.s3.url(),
            "--wal-dir".into(),
            self.wal_root.display().to_string(),
            "--heartbeat-interval-sec".into(),
            "1".into(),
            "--node-timeout-sec".into(),
            "3".into(),
            // Segments are zero-filled ahead: the default 64 MiB would write that much per
            // node start. Small ones keep the suite's disk traffic low, and roll often.
            "--wal-segment-bytes".into(),
            (4 << 20).to_string(),
            "--log-format".into(),
            "json".into(),
        ];
        if backend == Backend::ObjectWal {
            args.extend(["--wal-backend".into(), "object".into()]);
        }
        let certs = self.metad.certs.as_ref();
        args.extend(certs.into_iter().flat_map(|c| c.flags("streamd", id)));
        crate::override_flags(&mut args, extra);
        let mut node = Streamd {
            id: id.into(),
            grpc,
            http: format!("127.0.0.1:{}", free_port()),
            args,
            env: self
                .s3
                .env()
                .into_iter()
                .chain(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
                .collect(),
            proc: Proc::new(id, self.dir.path().join(format!("{id}.log"))),
            tls: certs.map(|c| c.tls("metad", "test")),
        };
        node.start();
        self.nodes.push(node);
    }

    /// Every metad replica's gRPC address, comma-separated (the `--metad` flag).
    pub fn metad_addrs(&self) -> String {
        self.metad
            .replicas
            .iter()
            .map(|r| r.grpc.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Creates stream `name` and places it on node `on`; waits until that node serves it.
    pub async fn create_stream(&self, name: &str, on: usize) -> StreamId {
        let client = self.metad.client();
        let op = Proposer::Operator {
            principal: "test".into(),
        };
        let (_, outcome) = client
            .propose(
                &op,
                MetaCommand::CreateStream {
                    name: name.into(),
                    config: StreamConfig::default(),
                },
            )
            .await
            .expect("create stream");
        let Ok(Applied::StreamCreated { stream }) = outcome else {
            panic!("create stream: {outcome:?}")
        };
        self.place(stream, on).await;
        self.wait_serving(name, on).await;
        stream
    }

    /// The id of stream `name` (an HTTP stream, or a topic's `topic/partition`).
    pub async fn stream_id(&self, name: &str) -> StreamId {
        let streams = self.metad.client().admin("streams", 0, 0).await.expect("streams");
        let id = streams["streams"]
            .as_object()
            .and_then(|rows| rows.values().find(|r| r["name"] == name))
            .and_then(|r| r["id"].as_u64())
            .unwrap_or_else(|| panic!("no stream '{name}'"));
        StreamId(id)
    }

    /// Creates topic `name`, its partition `p` placed on node `on[p]`, once served.
    pub async fn create_topic_on(&self, name: &str, on: &[usize]) {
        self.metad.create_topic(name, on.len() as u32).await;
        for (p, &node) in on.iter().enumerate() {
            let stream = format!("{name}/{p}");
            self.place(self.stream_id(&stream).await, node).await;
            self.wait_serving(&stream, node).await;
        }
    }

    pub async fn place(&self, stream: StreamId, on: usize) {
        let client = self.metad.client();
        let op = Proposer::Operator {
            principal: "test".into(),
        };
        let node = NodeId::new(self.nodes[on].id.clone());
        let (_, outcome) = client
            .propose(
                &op,
                MetaCommand::PlaceStream {
                    stream,
                    node: node.clone(),
                },
            )
            .await
            .expect("place");
        if let Err(rejection) = outcome {
            // With automatic placement on, the placement loop may have placed it first,
            // on the node wanted: as good as placed.
            let streams = client.admin("streams", 0, 0).await.expect("streams");
            let owner = streams["streams"]
                .as_object()
                .and_then(|rows| rows.values().find(|r| r["id"] == stream.0))
                .map(|r| r["owner"]["node"].clone());
            assert_eq!(
                owner,
                Some(serde_json::json!(node.as_str())),
                "placing {stream} on {node}: {rejection}"
            );
        }
    }

    /// Places `stream` on node `on` as soon as it can be placed: once a failover has
    /// recovered and closed it (stacks without automatic placement).
    pub async fn place_once_closed(&self, stream: StreamId, on: usize) {
        let client = self.metad.client();
        let op = Proposer::Operator {
            principal: "test".into(),
        };
        let node = NodeId::new(self.nodes[on].id.clone());
        wait_for(
            &format!("stream {stream} placed on {node}"),
            Duration::from_secs(60),
            || {
                let (client, op, node) = (&client, &op, node.clone());
                async move {
                    let command = MetaCommand::PlaceStream { stream, node };
                    matches!(client.propose(op, command).await, Ok((_, Ok(_)))).then_some(())
                }
            },
        )
        .await;
    }

    /// Waits until node `on` reports every record of `stream` below `end` committed and
    /// nothing buffered.
    pub async fn wait_committed(&self, on: usize, stream: &str, end: u64) {
        let client = self.nodes[on].client().await;
        wait_for(
            &format!("{stream} committed through {end} on {}", self.nodes[on].id),
            Duration::from_secs(60),
            || {
                let mut c = client.clone();
                let req = weir_proto::streamd::StatusRequest { stream: stream.into() };
                async move {
                    let s = c.status(req).await.ok()?.into_inner();
                    (s.committed_end == end && s.buffered_bytes == 0).then_some(())
                }
            },
        )
        .await;
    }

    pub async fn wait_serving(&self, name: &str, on: usize) {
        let client = self.nodes[on].client().await;
        wait_for(
            &format!("{} serves {name}", self.nodes[on].id),
            Duration::from_secs(20),
            || {
                let req = weir_proto::streamd::StatusRequest { stream: name.into() };
                let mut client = client.clone();
                async move { client.status(req).await.ok().map(|_| ()) }
            },
        )
        .await;
    }
}
