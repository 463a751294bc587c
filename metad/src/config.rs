//! metad's command-line flags; every flag also reads `WEIR_<FLAG>`.

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use weir_shared::config::{parse_peer_list, ConfigError, HeartbeatArgs, TelemetryArgs};

/// A metadata replica: Raft log and state machine in RocksDB, client, admin and Raft gRPC.
#[derive(Parser, Clone, Debug)]
#[command(name = "metad", version, about)]
pub struct MetadArgs {
    /// This replica's numeric Raft id (1, 2, 3, ...).
    #[arg(long, env = "WEIR_ID")]
    pub id: u64,

    /// gRPC address to listen on (Raft, client and admin APIs).
    #[arg(long, env = "WEIR_LISTEN", default_value = "127.0.0.1:7400")]
    pub listen: SocketAddr,

    /// Address peers and clients reach this replica at; defaults to its entry in --peers, else --listen.
    #[arg(long, env = "WEIR_ADVERTISE")]
    pub advertise: Option<String>,

    /// HTTP address for health, admin and metrics.
    #[arg(long, env = "WEIR_HTTP_LISTEN", default_value = "127.0.0.1:7480")]
    pub http_listen: SocketAddr,

    /// The initial replicas as ID=HOST:PORT,... Used once, to bootstrap; a restarted
    /// replica finds its peers in its stored membership (RR-FEN-9). Empty: a single replica.
    #[arg(long, env = "WEIR_PEERS", default_value = "")]
    pub peers: String,

    /// Directory of the RocksDB store.
    #[arg(long, env = "WEIR_DATA_DIR", default_value = "./metad-data")]
    pub data_dir: PathBuf,

    #[command(flatten)]
    pub heartbeat: HeartbeatArgs,

    #[command(flatten)]
    pub disk_space: weir_shared::disk_space::DiskSpaceArgs,

    #[command(flatten)]
    pub listeners: weir_shared::listener::ListenerArgs,

    #[command(flatten)]
    pub cluster_tls: weir_shared::cluster_tls::ClusterTlsArgs,

    /// Listen beyond loopback without mTLS (`--cluster-*`) on `--listen`, or at all on
    /// `--http-listen` (admin HTTP has no TLS or auth). Without it such a replica
    /// refuses to start.
    #[arg(long, env = "WEIR_INSECURE", default_value_t = false)]
    pub insecure: bool,

    /// On an mTLS cluster, accept user-level changes (streams, topics, configs, tokens,
    /// cordons, drains, transfers) that gateways running without `--auth` propose for
    /// their anonymous users. Without it only a user whose token grants the change may
    /// have a gateway propose it (issue 18).
    #[arg(long, env = "WEIR_ALLOW_ANONYMOUS_GATEWAYS", default_value_t = false)]
    pub allow_anonymous_gateways: bool,

    /// Most Watch streams (nodes' and gateways' views) this replica serves at once; one
    /// more is refused with RESOURCE_EXHAUSTED naming this flag.
    #[arg(long, env = "WEIR_MAX_WATCH_STREAMS", default_value_t = 10_000)]
    pub max_watch_streams: usize,

    /// Milliseconds a proposal or linearizable read may take before it fails as `unavailable`.
    #[arg(long, env = "WEIR_PROPOSE_TIMEOUT_MS", default_value_t = 5000)]
    pub propose_timeout_ms: u64,

    /// Raft heartbeat period in milliseconds; elections start after 5 to 10 of them are missed.
    #[arg(long, env = "WEIR_RAFT_HEARTBEAT_MS", default_value_t = 200)]
    pub raft_heartbeat_ms: u64,

    /// Log entries since the last snapshot that trigger a new one, at least.
    #[arg(long, env = "WEIR_SNAPSHOT_LOGS", default_value_t = 10_000)]
    pub snapshot_logs: u64,

    /// And at least this percent of the rows the store holds: a snapshot writes every
    /// row, so a large state snapshots less often (0: `--snapshot-logs` alone).
    #[arg(long, env = "WEIR_SNAPSHOT_ROWS_PERCENT", default_value_t = 50)]
    pub snapshot_rows_percent: u64,

    /// Streams a drain moves in one unit (one BeginTransfers entry and one close request
    /// to the source); each is unwritable for about as long as its unit takes.
    #[arg(long, env = "WEIR_DRAIN_BATCH_STREAMS", default_value_t = weir_meta::drain_plan::DRAIN_BATCH)]
    pub drain_batch_streams: usize,

    /// Seconds a fenced streamd or gatewayd row stays in the view, once nothing refers
    /// to it any more, before the failover holder removes it (counted in its own
    /// heartbeats, as liveness is).
    #[arg(long, env = "WEIR_REAP_AFTER_SEC", default_value_t = 3600)]
    pub reap_after_sec: u64,

    /// Place closed streams without a live owner on the least loaded streamd (the leader does).
    #[arg(long, env = "WEIR_AUTO_PLACE", default_value_t = true, action = clap::ArgAction::Set)]
    pub auto_place: bool,

    /// A file holding the first admin token's secret: this replica issues the token
    /// `admin` once, unless it exists (give it to the bootstrapping replica only).
    #[arg(long, env = "WEIR_BOOTSTRAP_ADMIN_TOKEN_FILE")]
    pub bootstrap_admin_token_file: Option<PathBuf>,

    #[command(flatten)]
    pub telemetry: TelemetryArgs,

    #[command(flatten)]
    pub shutdown: weir_shared::shutdown::ShutdownArgs,
}

/// Validated settings derived from [`MetadArgs`].
#[derive(Clone, Debug)]
pub struct MetadConfig {
    pub args: MetadArgs,
    /// Initial voters, this replica included.
    pub peers: Vec<(u64, String)>,
    pub advertise: String,
}

impl MetadArgs {
    /// Validates once at startup; errors name the flag.
    pub fn validate(self) -> Result<MetadConfig, ConfigError> {
        if self.id == 0 {
            return Err(ConfigError::new("--id must be at least 1"));
        }
        self.heartbeat.validate()?;
        self.listeners.limits()?;
        if !(1..=weir_meta::model::MAX_BATCH).contains(&self.drain_batch_streams) {
            return Err(ConfigError::new(format!(
                "--drain-batch-streams must be 1 to {}, got {}",
                weir_meta::model::MAX_BATCH,
                self.drain_batch_streams
            )));
        }
        if self.max_watch_streams == 0 {
            return Err(ConfigError::new("--max-watch-streams must be at least 1"));
        }
        self.telemetry.validate()?;
        self.shutdown.validate()?;
        self.cluster_tls.check_node(
            weir_shared::peer::Role::Metad,
            &self.id.to_string(),
            self.listen,
            self.http_listen,
            self.insecure,
        )?;
        if self.propose_timeout_ms == 0 {
            return Err(ConfigError::new("--propose-timeout-ms must be at least 1"));
        }
        if self.raft_heartbeat_ms < 10 {
            return Err(ConfigError::new("--raft-heartbeat-ms must be at least 10"));
        }
        if self.snapshot_logs < 10 {
            return Err(ConfigError::new("--snapshot-logs must be at least 10"));
        }
        let mut peers = parse_peer_list("--peers", &self.peers)?;
        let advertise = match (&self.advertise, peers.iter().find(|(id, _)| *id == self.id)) {
            (Some(a), _) => a.clone(),
            (None, Some((_, a))) => a.clone(),
            (None, None) => {
                if self.listen.ip().is_unspecified() {
                    return Err(ConfigError::new(format!(
                        "--listen {} is a wildcard address; set --advertise to the address peers reach",
                        self.listen
                    )));
                }
                self.listen.to_string()
            }
        };
        if !peers.iter().any(|(id, _)| *id == self.id) {
            if !peers.is_empty() {
                return Err(ConfigError::new(format!(
                    "--peers does not list this replica's --id {}",
                    self.id
                )));
            }
            peers.push((self.id, advertise.clone()));
        }
        if peers.len() % 2 == 0 {
            return Err(ConfigError::new(format!(
                "--peers lists {} replicas; use an odd number (1, 3 or 5) so a majority survives a failure",
                peers.len()
            )));
        }
        Ok(MetadConfig {
            args: self,
            peers,
            advertise,
        })
    }
}

impl weir_shared::service::ServiceConfig for MetadConfig {
    fn shutdown_args(&self) -> &weir_shared::shutdown::ShutdownArgs {
        &self.args.shutdown
    }

    fn telemetry_args(&self) -> &TelemetryArgs {
        &self.args.telemetry
    }
}
