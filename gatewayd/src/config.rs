//! gatewayd's command-line flags; every flag also reads `WEIR_<FLAG>`.

use clap::Parser;
use std::net::SocketAddr;
use weir_meta::registration::NodeArgs;
use weir_shared::config::{ConfigError, TelemetryArgs};

/// The stateless gateway: HTTP and Kafka clients in, each request routed to its stream's owner.
#[derive(Parser, Clone, Debug)]
#[command(name = "gatewayd", version, about)]
pub struct GatewaydArgs {
    #[command(flatten)]
    pub node: NodeArgs,

    /// HTTP API address (`/v1`, health, admin, metrics).
    #[arg(long, env = "WEIR_HTTP_LISTEN", default_value = "127.0.0.1:8080")]
    pub http_listen: SocketAddr,

    /// Address clients reach the HTTP API at, if not --http-listen (behind NAT or in containers).
    #[arg(long, env = "WEIR_HTTP_ADVERTISE")]
    pub http_advertise: Option<String>,

    /// Largest request body, in bytes; larger ones get 413 `too_large`.
    #[arg(long, env = "WEIR_MAX_BODY_BYTES", default_value_t = 8 << 20)]
    pub max_body_bytes: usize,

    /// How long a request waits for a stream without a live owner (moving, recovering)
    /// before it is answered with a retryable 503.
    #[arg(long, env = "WEIR_ROUTE_RETRY_MS", default_value_t = 5000)]
    pub route_retry_ms: u64,

    /// Require `Authorization: Bearer <token>` on every API request (tokens issued by
    /// `weir tokens issue` or `POST /v1/admin/tokens`).
    #[arg(long, env = "WEIR_AUTH", default_value_t = false)]
    pub auth: bool,

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
        self.telemetry.validate()?;
        self.shutdown.validate()?;
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
