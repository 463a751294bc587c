//! streamd's command-line flags; every flag also reads `WEIR_<FLAG>`.

use clap::{Parser, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use weir_meta::registration::NodeArgs;
use weir_shared::config::{ConfigError, TelemetryArgs};

/// Which WAL backend a node writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WalBackend {
    /// Segment files under --wal-dir, a volume every streamd can reach.
    File,
    /// Segment objects in the object store.
    Object,
}

/// A stream node: owns streams, writes a fenced WAL, uploads data objects.
#[derive(Parser, Clone, Debug)]
#[command(name = "streamd", version, about)]
pub struct StreamdArgs {
    #[command(flatten)]
    pub cluster_tls: weir_shared::cluster_tls::ClusterTlsArgs,

    /// Listen beyond loopback without mTLS (`--cluster-*`) on `--listen`, or at all on
    /// `--http-listen` (admin HTTP has no TLS or auth). Without it such a node refuses
    /// to start.
    #[arg(long, env = "WEIR_INSECURE", default_value_t = false)]
    pub insecure: bool,

    #[command(flatten)]
    pub node: NodeArgs,

    #[command(flatten)]
    pub listeners: weir_shared::listener::ListenerArgs,

    /// Local state directory.
    #[arg(long, env = "WEIR_DATA_DIR", default_value = "./streamd-data")]
    pub data_dir: PathBuf,

    /// Object store for data objects: file:///dir or s3://bucket[/prefix].
    #[arg(long, env = "WEIR_OBJECT_STORE")]
    pub object_store: String,

    #[arg(long, env = "WEIR_WAL_BACKEND", value_enum, default_value_t = WalBackend::File)]
    pub wal_backend: WalBackend,

    /// Root of the file WAL, shared by every streamd (default: <data-dir>/wal).
    #[arg(long, env = "WEIR_WAL_DIR")]
    pub wal_dir: Option<PathBuf>,

    /// Bytes the WAL may hold before appends are refused with a retryable error.
    #[arg(long, env = "WEIR_WAL_MAX_BYTES", default_value_t = 1 << 30)]
    pub wal_max_bytes: u64,

    /// Size at which the file WAL starts a new segment; whole segments are reclaimed.
    #[arg(long, env = "WEIR_WAL_SEGMENT_BYTES", default_value_t = 64 << 20)]
    pub wal_segment_bytes: u64,

    /// Object WAL: WAL objects being written at once. An append is acknowledged once its
    /// object and every one before it are durable.
    #[arg(long, env = "WEIR_WAL_MAX_INFLIGHT_PUTS", default_value_t = 8)]
    pub wal_max_inflight_puts: usize,

    /// Object WAL: most bytes of records one WAL object holds.
    #[arg(long, env = "WEIR_WAL_OBJECT_MAX_BYTES", default_value_t = 8 << 20)]
    pub wal_object_max_bytes: usize,

    /// Object WAL: while another WAL object is in flight, how long appends may wait to
    /// share the next one (with none in flight they are sent at once).
    #[arg(long, env = "WEIR_WAL_OBJECT_LINGER_MS", default_value_t = 5)]
    pub wal_object_linger_ms: u64,

    /// Object WAL: how long a WAL object whose PUT failed (after the client's own
    /// retries) is tried again on the same key, refusing new appends meanwhile, before
    /// the node stops acknowledging and fences itself.
    #[arg(long, env = "WEIR_WAL_PUT_RETRY_SEC", default_value_t = 120)]
    pub wal_put_retry_sec: u64,

    /// gRPC data-plane address.
    #[arg(long, env = "WEIR_LISTEN", default_value = "127.0.0.1:7500")]
    pub listen: SocketAddr,

    /// HTTP address for health and metrics.
    #[arg(long, env = "WEIR_HTTP_LISTEN", default_value = "127.0.0.1:7580")]
    pub http_listen: SocketAddr,

    /// Address gatewayd reaches the data plane at (default: --listen).
    #[arg(long, env = "WEIR_ADVERTISE")]
    pub advertise: Option<String>,

    /// Upload buffered records at least this often (milliseconds).
    #[arg(long, env = "WEIR_UPLOAD_INTERVAL_MS", default_value_t = 250)]
    pub upload_interval_ms: u64,

    /// Upload as soon as this many bytes are buffered.
    #[arg(long, env = "WEIR_UPLOAD_BYTES", default_value_t = 8 << 20)]
    pub upload_bytes: u64,

    /// Bytes of object ranges cached in memory for reads.
    #[arg(long, env = "WEIR_CACHE_BYTES", default_value_t = 256 << 20)]
    pub cache_bytes: u64,

    /// Largest single append, in bytes.
    #[arg(long, env = "WEIR_MAX_APPEND_BYTES", default_value_t = 8 << 20)]
    pub max_append_bytes: usize,

    /// Most bytes one record batch's compressed records may inflate to. A batch that
    /// would inflate past it is refused when produced (`too_large`, Kafka's
    /// MESSAGE_TOO_LARGE), so no stored batch is a decompression bomb for its readers.
    /// Keep it at most gatewayd's `--max-decompressed-bytes`.
    #[arg(long, env = "WEIR_MAX_DECOMPRESSED_BYTES", default_value_t = 64 << 20)]
    pub max_decompressed_bytes: usize,

    /// Most members one consumer group admits (Kafka's `group.max.size`); a new member
    /// past it is answered GROUP_MAX_SIZE_REACHED.
    #[arg(long, env = "WEIR_MAX_GROUP_MEMBERS", default_value_t = 1_000)]
    pub max_group_members: usize,

    /// How long the first rebalance of an empty classic consumer group waits for more
    /// members, each new member waiting it again up to the rebalance timeout (Kafka's
    /// `group.initial.rebalance.delay.ms`): consumers started together then share one
    /// rebalance instead of the first taking every partition and giving them back. 0
    /// (the default, for now) answers a first join at once: with 3,000, Kafka's default,
    /// kafka-python 3's static members did not complete their first rebalance (see
    /// `consumer_side::kafka_python_static_members_restart_without_a_rebalance`).
    #[arg(long, env = "WEIR_GROUP_INITIAL_REBALANCE_DELAY_MS", default_value_t = 0)]
    pub group_initial_rebalance_delay_ms: u64,

    /// How often members of a KIP-848 consumer group (`group.protocol=consumer`)
    /// heartbeat, told them in every answer (Kafka's
    /// `group.consumer.heartbeat.interval.ms`). A member learns of new partitions at its
    /// next heartbeat.
    #[arg(long, env = "WEIR_CONSUMER_HEARTBEAT_INTERVAL_MS", default_value_t = 5_000)]
    pub consumer_heartbeat_interval_ms: u64,

    /// How long a KIP-848 consumer group member may go without a heartbeat before it is
    /// removed and its partitions reassigned (Kafka's `group.consumer.session.timeout.ms`).
    #[arg(long, env = "WEIR_CONSUMER_SESSION_TIMEOUT_MS", default_value_t = 45_000)]
    pub consumer_session_timeout_ms: u64,

    /// Committed bytes per stream replayed at open to rebuild idempotent-producer state
    /// (duplicate detection of retried batches across moves and failover).
    #[arg(long, env = "WEIR_PRODUCER_STATE_BYTES", default_value_t = 16 << 20)]
    pub producer_state_bytes: u64,

    /// Longest transaction timeout a transactional producer may ask for (Kafka's
    /// `transaction.max.timeout.ms`).
    #[arg(long, env = "WEIR_TRANSACTION_MAX_TIMEOUT_MS", default_value_t = 900_000)]
    pub transaction_max_timeout_ms: u32,

    /// How long an idle transactional id is kept before it is forgotten (Kafka's
    /// `transactional.id.expiration.ms`).
    #[arg(long, env = "WEIR_TRANSACTIONAL_ID_EXPIRATION_MS", default_value_t = 604_800_000)]
    pub transactional_id_expiration_ms: u64,

    /// Seconds after which an uploaded but uncommitted object may be garbage-collected.
    #[arg(long, env = "WEIR_GC_DELAY_SEC", default_value_t = 3600)]
    pub gc_delay_sec: u64,

    /// Seconds an object must stay unreferenced (trimmed, compacted away, or never
    /// committed) before it is deleted, so reads that found it just before still can.
    #[arg(long, env = "WEIR_GC_GRACE_SEC", default_value_t = 60)]
    pub gc_grace_sec: u64,

    /// Size of the per-stream objects compaction rewrites small ranges into.
    #[arg(long, env = "WEIR_COMPACTION_TARGET_BYTES", default_value_t = 64 << 20)]
    pub compaction_target_bytes: u64,

    /// How often the owner compacts its streams' small ranges.
    #[arg(long, env = "WEIR_COMPACTION_INTERVAL_MS", default_value_t = 60_000)]
    pub compaction_interval_ms: u64,

    /// Bytes per second a compaction pass reads and writes, at most (Kafka's
    /// `log.cleaner.io.max.bytes.per.second`), so a backlog is rewritten without taking
    /// the disk from appends; raised for a pass that would not end within most of
    /// `--compaction-interval-ms` at it. 0 for no limit.
    #[arg(long, env = "WEIR_COMPACTION_MAX_BYTES_PER_SEC", default_value_t = 32 << 20)]
    pub compaction_max_bytes_per_sec: u64,

    /// How often the owner checks its streams' `retention.ms` and `retention.bytes`
    /// (Kafka's `log.retention.check.interval.ms`).
    #[arg(long, env = "WEIR_RETENTION_CHECK_INTERVAL_MS", default_value_t = 300_000)]
    pub retention_check_interval_ms: u64,

    #[command(flatten)]
    pub telemetry: TelemetryArgs,

    #[command(flatten)]
    pub disk_space: weir_shared::disk_space::DiskSpaceArgs,

    #[command(flatten)]
    pub shutdown: weir_shared::shutdown::ShutdownArgs,
}

impl StreamdArgs {
    /// Validates once at startup; errors name the flag.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.node.validate()?;
        self.cluster_tls.check_node(
            weir_shared::peer::Role::Streamd,
            &self.node.id,
            self.listen,
            self.http_listen,
            self.insecure,
        )?;
        self.listeners.limits()?;
        self.telemetry.validate()?;
        self.shutdown.validate()?;
        for (flag, v) in [
            ("--upload-interval-ms", self.upload_interval_ms),
            ("--upload-bytes", self.upload_bytes),
            ("--wal-max-bytes", self.wal_max_bytes),
            ("--retention-check-interval-ms", self.retention_check_interval_ms),
            ("--compaction-interval-ms", self.compaction_interval_ms),
        ] {
            if v == 0 {
                return Err(ConfigError::new(format!("{flag} must be at least 1")));
            }
        }
        if self.compaction_target_bytes < 4096 {
            return Err(ConfigError::new("--compaction-target-bytes must be at least 4096"));
        }
        if self.gc_delay_sec == 0 {
            return Err(ConfigError::new("--gc-delay-sec must be at least 1"));
        }
        if !(1..=1024).contains(&self.wal_max_inflight_puts) {
            return Err(ConfigError::new(format!(
                "--wal-max-inflight-puts {} must be between 1 and 1024",
                self.wal_max_inflight_puts
            )));
        }
        if self.wal_object_max_bytes < 4096 {
            return Err(ConfigError::new("--wal-object-max-bytes must be at least 4096"));
        }
        if self.wal_object_linger_ms > 10_000 {
            return Err(ConfigError::new(format!(
                "--wal-object-linger-ms {} must be at most 10000",
                self.wal_object_linger_ms
            )));
        }
        if self.wal_segment_bytes < 4096 {
            return Err(ConfigError::new("--wal-segment-bytes must be at least 4096"));
        }
        // An append larger than a WAL record could be acknowledged but never replayed.
        let record_limit = crate::wal::record::MAX_RECORD - crate::wal::record::RECORD_OVERHEAD;
        if self.max_append_bytes == 0 || self.max_append_bytes > record_limit {
            return Err(ConfigError::new(format!(
                "--max-append-bytes {} must be between 1 and {record_limit}, the WAL's record limit ({} bytes less a {}-byte record header)",
                self.max_append_bytes,
                crate::wal::record::MAX_RECORD,
                crate::wal::record::RECORD_OVERHEAD
            )));
        }
        if self.max_group_members == 0 {
            return Err(ConfigError::new("--max-group-members must be at least 1"));
        }
        if self.consumer_heartbeat_interval_ms == 0
            || self.consumer_heartbeat_interval_ms >= self.consumer_session_timeout_ms
        {
            return Err(ConfigError::new(format!(
                "--consumer-heartbeat-interval-ms {} must be at least 1 and below --consumer-session-timeout-ms {}",
                self.consumer_heartbeat_interval_ms, self.consumer_session_timeout_ms
            )));
        }
        if self.max_decompressed_bytes < 1024 {
            return Err(ConfigError::new("--max-decompressed-bytes must be at least 1024"));
        }
        Ok(())
    }

    /// How the object WAL batches and pipelines its PUTs.
    pub fn object_wal_pipelining(&self) -> crate::wal::object::Pipelining {
        crate::wal::object::Pipelining {
            max_inflight: self.wal_max_inflight_puts,
            max_bytes: self.wal_object_max_bytes,
            linger: Duration::from_millis(self.wal_object_linger_ms),
            put_retry: Duration::from_secs(self.wal_put_retry_sec),
        }
    }

    pub fn wal_root(&self) -> PathBuf {
        self.wal_dir.clone().unwrap_or_else(|| self.data_dir.join("wal"))
    }

    /// The volumes whose free space is watched (issue 60): named by what they hold, a
    /// volume holding several things once, by its first.
    pub fn watched_volumes(&self) -> Vec<(String, PathBuf)> {
        let mut volumes = Vec::new();
        if self.wal_backend == WalBackend::File {
            volumes.push(("wal".to_owned(), self.wal_root()));
        }
        volumes.push(("data".to_owned(), self.data_dir.clone()));
        if let Some(dir) = crate::object::store::local_dir(&self.object_store) {
            volumes.push(("objects".to_owned(), dir));
        }
        weir_shared::disk_space::distinct_volumes(volumes)
    }
}

impl weir_shared::service::ServiceConfig for StreamdArgs {
    fn shutdown_args(&self) -> &weir_shared::shutdown::ShutdownArgs {
        &self.shutdown
    }

    fn telemetry_args(&self) -> &TelemetryArgs {
        &self.telemetry
    }
}
