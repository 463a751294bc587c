//! gatewayd's command-line flags; every flag also reads `WEIR_<FLAG>`.

use clap::Parser;
use std::net::SocketAddr;
use weir_shared::config::{ConfigError, HeartbeatArgs, TelemetryArgs};

/// The stateless gateway: HTTP and Kafka clients in, each request routed to its stream's owner.
#[derive(Parser, Clone, Debug)]
#[command(name = "gatewayd", version, about)]
pub struct GatewaydArgs {
    /// This gateway's stable name.
    #[arg(long, env = "WEIR_ID")]
    pub id: String,

    /// metad replicas, comma-separated HOST:PORT.
    #[arg(long, env = "WEIR_METAD")]
    pub metad: String,

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

    #[command(flatten)]
    pub heartbeat: HeartbeatArgs,

    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

impl GatewaydArgs {
    /// Validates once at startup; errors name the flag.
    pub fn validate(&self) -> Result<(), ConfigError> {
        weir_metad::model::apply::validate_name("node", &self.id)
            .map_err(|e| ConfigError::new(format!("--id: {}", e.message)))?;
        if self.metad_addrs().is_empty() {
            return Err(ConfigError::new("--metad needs at least one HOST:PORT"));
        }
        if self.max_body_bytes < 1024 {
            return Err(ConfigError::new("--max-body-bytes must be at least 1024"));
        }
        self.heartbeat.validate()?;
        self.telemetry.validate()?;
        Ok(())
    }

    pub fn metad_addrs(&self) -> Vec<String> {
        weir_shared::config::addr_list(&self.metad)
    }
}
