//! gatewayd's command-line flags; every flag also reads `WEIR_<FLAG>`.

use clap::Parser;
use std::net::SocketAddr;
use weir_meta::registration::NodeArgs;
use weir_shared::config::{ConfigError, TelemetryArgs};
use weir_shared::listener::ListenerArgs;

/// The stateless gateway: HTTP and Kafka clients in, each request routed to its stream's owner.
#[derive(Parser, Clone, Debug)]
#[command(name = "gatewayd", version, about)]
pub struct GatewaydArgs {
    #[command(flatten)]
    pub node: NodeArgs,

    #[command(flatten)]
    pub listeners: ListenerArgs,

    /// HTTP API address (`/v1`, health, admin, metrics).
    #[arg(long, env = "WEIR_HTTP_LISTEN", default_value = "127.0.0.1:8080")]
    pub http_listen: SocketAddr,

    /// Address clients reach the HTTP API at, if not --http-listen (behind NAT or in containers).
    #[arg(long, env = "WEIR_HTTP_ADVERTISE")]
    pub http_advertise: Option<String>,

    /// Largest request body, in bytes; larger ones get 413 `too_large`.
    #[arg(long, env = "WEIR_MAX_BODY_BYTES", default_value_t = 8 << 20)]
    pub max_body_bytes: usize,

    /// Most bytes one record batch's compressed records are inflated to when the HTTP
    /// API or ListOffsets by timestamp reads them; a batch that would inflate further is
    /// answered `too_large` and never inflated. streamd refuses such batches when they
    /// are produced (its own `--max-decompressed-bytes`, which should not exceed this).
    #[arg(long, env = "WEIR_MAX_DECOMPRESSED_BYTES", default_value_t = 64 << 20)]
    pub max_decompressed_bytes: usize,

    /// Most SSE subscriptions open on this gateway; one more is answered 429
    /// `too_many_requests`.
    #[arg(long, env = "WEIR_MAX_SSE_SUBSCRIBERS", default_value_t = 10_000)]
    pub max_sse_subscribers: usize,

    /// Most HTTP reads waiting for records (`wait` above 0) at once on this gateway; one
    /// more is answered 429 `too_many_requests`.
    #[arg(long, env = "WEIR_MAX_LONG_POLLS", default_value_t = 10_000)]
    pub max_long_polls: usize,

    /// How long a request waits for a stream without a live owner (moving, recovering)
    /// before it is answered with a retryable 503.
    #[arg(long, env = "WEIR_ROUTE_RETRY_MS", default_value_t = 5000)]
    pub route_retry_ms: u64,

    /// Require `Authorization: Bearer <token>` on every API request (tokens issued by
    /// `weir tokens issue` or `POST /v1/admin/tokens`).
    #[arg(long, env = "WEIR_AUTH", default_value_t = false)]
    pub auth: bool,

    #[command(flatten)]
    pub tls: weir_shared::tls::ServerTlsArgs,

    #[command(flatten)]
    pub cluster_tls: weir_shared::cluster_tls::ClusterTlsArgs,

    /// Accept SASL/PLAIN on a Kafka listener without TLS, where passwords (token
    /// secrets) cross the network in clear. Without it a plaintext listener refuses PLAIN
    /// with UNSUPPORTED_SASL_MECHANISM.
    #[arg(long, env = "WEIR_KAFKA_ALLOW_PLAINTEXT_SASL", default_value_t = false)]
    pub kafka_allow_plaintext_sasl: bool,

    /// Serve on a non-loopback address without TLS (`--tls-cert`) or without `--auth`.
    /// Without it such a gateway refuses to start, as anyone who reaches the port could
    /// read and write every stream.
    #[arg(long, env = "WEIR_INSECURE", default_value_t = false)]
    pub insecure: bool,

    /// Kafka protocol address (gateways are the cluster's Kafka brokers).
    #[arg(long, env = "WEIR_KAFKA_LISTEN", default_value = "127.0.0.1:9092")]
    pub kafka_listen: SocketAddr,

    /// HOST:PORT Kafka clients reach this gateway at, if not --kafka-listen; it is what
    /// Metadata and FindCoordinator answer.
    #[arg(long, env = "WEIR_KAFKA_ADVERTISE")]
    pub kafka_advertise: Option<String>,

    /// Largest Kafka request frame; a larger one closes the connection before it is read
    /// (Kafka's `socket.request.max.bytes`).
    #[arg(long, env = "WEIR_KAFKA_MAX_FRAME_BYTES", default_value_t = 100 << 20)]
    pub kafka_max_frame_bytes: usize,

    /// Largest Kafka request frame before SASL authentication (with `--auth`; never more
    /// than `--kafka-max-frame-bytes`): only ApiVersions and SASL requests come before
    /// it, and they are small.
    #[arg(long, env = "WEIR_KAFKA_MAX_UNAUTHENTICATED_FRAME_BYTES", default_value_t = 64 << 10)]
    pub kafka_max_unauthenticated_frame_bytes: usize,

    /// Largest record batch one partition of a Produce may carry; larger ones are
    /// answered MESSAGE_TOO_LARGE (Kafka's `message.max.bytes`).
    #[arg(long, env = "WEIR_KAFKA_MAX_MESSAGE_BYTES", default_value_t = 8 << 20)]
    pub kafka_max_message_bytes: usize,

    /// The most one Fetch response holds, whatever the request's `max_bytes` (Kafka's
    /// broker `fetch.max.bytes`). It is shared out among the partitions in request order
    /// before any is read, so a Fetch listing many partitions holds no more than this
    /// (plus one whole batch when nothing else fits, so consumers make progress).
    #[arg(long, env = "WEIR_KAFKA_FETCH_MAX_BYTES", default_value_t = 55 << 20)]
    pub kafka_fetch_max_bytes: usize,

    /// Incremental fetch sessions (KIP-227) this gateway keeps (Kafka's
    /// `max.incremental.fetch.session.cache.slots`). 0: none, every Fetch is answered
    /// whole.
    #[arg(long, env = "WEIR_KAFKA_FETCH_SESSIONS", default_value_t = 1_000)]
    pub kafka_fetch_sessions: usize,

    /// When the fetch sessions are full, a new one evicts the least recently used
    /// session idle this long, or else one at least this old with fewer partitions
    /// (Kafka's `min.incremental.fetch.session.eviction.ms`).
    #[arg(long, env = "WEIR_KAFKA_FETCH_SESSION_EVICTION_MS", default_value_t = 120_000)]
    pub kafka_fetch_session_eviction_ms: u64,

    /// Most Kafka connections one authenticated token holds at once on this gateway
    /// (with `--auth`); one more fails SASL authentication, naming this flag.
    #[arg(long, env = "WEIR_KAFKA_MAX_CONNECTIONS_PER_PRINCIPAL", default_value_t = 1_000)]
    pub kafka_max_connections_per_principal: usize,

    /// Create a topic a client asks Metadata for, as Kafka's `auto.create.topics.enable`.
    #[arg(long, env = "WEIR_KAFKA_AUTO_CREATE_TOPICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub kafka_auto_create_topics: bool,

    /// Partitions of an auto-created topic, and of CreateTopics asking for the default
    /// (Kafka's `num.partitions`).
    #[arg(long, env = "WEIR_KAFKA_DEFAULT_PARTITIONS", default_value_t = 1)]
    pub kafka_default_partitions: u32,

    #[command(flatten)]
    pub telemetry: TelemetryArgs,

    #[command(flatten)]
    pub shutdown: weir_shared::shutdown::ShutdownArgs,
}

impl GatewaydArgs {
    /// Validates once at startup; errors name the flag.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.node.validate()?;
        self.listeners.limits()?;
        if self.max_sse_subscribers == 0 || self.max_long_polls == 0 {
            return Err(ConfigError::new(
                "--max-sse-subscribers and --max-long-polls must be at least 1",
            ));
        }
        if self.max_body_bytes < 1024 {
            return Err(ConfigError::new("--max-body-bytes must be at least 1024"));
        }
        if self.kafka_max_frame_bytes < 1024 {
            return Err(ConfigError::new("--kafka-max-frame-bytes must be at least 1024"));
        }
        if self.kafka_max_unauthenticated_frame_bytes < 1024 {
            return Err(ConfigError::new(
                "--kafka-max-unauthenticated-frame-bytes must be at least 1024",
            ));
        }
        if self.kafka_max_connections_per_principal == 0 {
            return Err(ConfigError::new(
                "--kafka-max-connections-per-principal must be at least 1",
            ));
        }
        if self.kafka_fetch_max_bytes < 1024 {
            return Err(ConfigError::new("--kafka-fetch-max-bytes must be at least 1024"));
        }
        if self.max_decompressed_bytes < 1024 {
            return Err(ConfigError::new("--max-decompressed-bytes must be at least 1024"));
        }
        if self.kafka_max_message_bytes < 1024 || self.kafka_max_message_bytes > self.kafka_max_frame_bytes {
            return Err(ConfigError::new(
                "--kafka-max-message-bytes must be at least 1024 and at most --kafka-max-frame-bytes",
            ));
        }
        if self.kafka_default_partitions == 0 {
            return Err(ConfigError::new("--kafka-default-partitions must be at least 1"));
        }
        if let Some(a) = &self.kafka_advertise {
            if crate::kafka::brokers::split_host_port(a).is_none() {
                return Err(ConfigError::new(format!("--kafka-advertise '{a}' is not HOST:PORT")));
            }
        }
        self.tls.load(&[])?;
        self.cluster_tls
            .check_names(weir_shared::peer::Role::Gatewayd, &self.node.id)?;
        self.refuse_insecure_exposure()?;
        self.telemetry.validate()?;
        self.shutdown.validate()?;
        Ok(())
    }

    /// Secure by default (issue 18): a gateway reachable beyond this host serves TLS
    /// and authenticates, unless `--insecure` says otherwise.
    fn refuse_insecure_exposure(&self) -> Result<(), ConfigError> {
        let secure = self.tls.tls_cert.is_some() && self.auth;
        if secure || self.insecure {
            return Ok(());
        }
        for (flag, addr) in [
            ("--http-listen", self.http_listen),
            ("--kafka-listen", self.kafka_listen),
        ] {
            if !addr.ip().is_loopback() {
                let missing = match (self.tls.tls_cert.is_some(), self.auth) {
                    (false, false) => "no TLS (--tls-cert, --tls-key) and no --auth",
                    (false, true) => "no TLS (--tls-cert, --tls-key)",
                    _ => "no --auth",
                };
                return Err(ConfigError::new(format!(
                    "{flag} {addr} is reachable beyond this host, and the gateway has {missing}: \
                     clients' records and credentials would be open to anyone on the network; \
                     give TLS and --auth, or --insecure to serve anyway"
                )));
            }
        }
        Ok(())
    }
}

impl weir_shared::service::ServiceConfig for GatewaydArgs {
    fn shutdown_args(&self) -> &weir_shared::shutdown::ShutdownArgs {
        &self.shutdown
    }

    fn telemetry_args(&self) -> &TelemetryArgs {
        &self.telemetry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> GatewaydArgs {
        let mut argv = vec!["gatewayd", "--id", "gw-1", "--metad", "127.0.0.1:7400"];
        argv.extend_from_slice(extra);
        GatewaydArgs::parse_from(argv)
    }

    // Issue 18, secure by default: beyond loopback a gateway needs TLS and --auth, or
    // --insecure; on loopback it needs neither.
    #[test]
    fn a_gateway_beyond_loopback_needs_tls_and_auth_or_insecure() {
        let refused = |extra: &[&str]| args(extra).refuse_insecure_exposure().err().map(|e| e.message);
        assert_eq!(refused(&[]), None, "loopback is the default and needs nothing");
        let why = refused(&["--kafka-listen", "0.0.0.0:9092"]).expect("refused");
        assert!(
            why.starts_with("--kafka-listen 0.0.0.0:9092 is reachable beyond this host"),
            "{why}"
        );
        assert!(why.contains("no TLS (--tls-cert, --tls-key) and no --auth"), "{why}");
        let why = refused(&["--http-listen", "10.0.0.1:80", "--auth"]).expect("refused");
        assert!(why.contains("has no TLS (--tls-cert, --tls-key):"), "{why}");
        let tls = ["--tls-cert", "c.pem", "--tls-key", "k.pem"];
        let why = refused(&[&["--http-listen", "0.0.0.0:80"], &tls[..]].concat()).expect("refused");
        assert!(why.contains("has no --auth:"), "{why}");
        assert_eq!(
            refused(&[&["--http-listen", "0.0.0.0:80", "--auth"], &tls[..]].concat()),
            None
        );
        assert_eq!(refused(&["--http-listen", "0.0.0.0:80", "--insecure"]), None);
    }
}
