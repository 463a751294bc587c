//! Configuration habits every binary shares: clap flags that also read
//! `WEIR_<FLAG>`, validated once at startup with errors that name the flag.

use clap::{Args, ValueEnum};
use std::fmt;

/// A configuration value that was refused; names the flag(s) so an operator can fix it.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {message}")]
pub struct ConfigError {
    pub message: String,
}

impl ConfigError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

/// Secure by default (issue 18): a listener reachable beyond this host refuses to
/// start while `missing` names what would leave it open, unless `--insecure` was given.
pub fn refuse_exposed(
    flag: &str,
    addr: std::net::SocketAddr,
    missing: Option<&str>,
    insecure: bool,
) -> Result<(), ConfigError> {
    match missing {
        Some(missing) if !insecure && !addr.ip().is_loopback() => Err(ConfigError::new(format!(
            "{flag} {addr} is reachable beyond this host, and {missing}; \
             listen on loopback, or give --insecure to serve anyway"
        ))),
        _ => Ok(()),
    }
}

/// How logs are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line, for collectors and tests.
    Json,
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Human => "human",
            Self::Json => "json",
        })
    }
}

/// Logging and tracing flags, flattened into every binary's arguments.
#[derive(Args, Clone, Debug)]
pub struct TelemetryArgs {
    /// Log format: human or json.
    #[arg(long, env = "WEIR_LOG_FORMAT", default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,

    /// Log filter in tracing's EnvFilter syntax (for example `info,weir_metad=debug`).
    #[arg(long, env = "WEIR_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// OTLP/gRPC endpoint to export traces to (for example `http://127.0.0.1:4317`); off when unset.
    #[arg(long, env = "WEIR_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

impl TelemetryArgs {
    /// Refuses values that would only fail later.
    pub fn validate(&self) -> Result<(), ConfigError> {
        tracing_subscriber::EnvFilter::try_new(&self.log_level)
            .map_err(|e| ConfigError::new(format!("--log-level '{}': {e}", self.log_level)))?;
        if let Some(endpoint) = &self.otlp_endpoint {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(ConfigError::new(format!(
                    "--otlp-endpoint '{endpoint}' must start with http:// or https://"
                )));
            }
        }
        Ok(())
    }
}

/// The failover clock's timing, which must be the same across the cluster (FO-LIV-14).
#[derive(Args, Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeartbeatArgs {
    /// Seconds between a node's heartbeats to the metadata log.
    #[arg(long, env = "WEIR_HEARTBEAT_INTERVAL_SEC", default_value_t = 5)]
    pub heartbeat_interval_sec: u64,

    /// Seconds without a heartbeat after which a node is judged dead; must exceed the interval.
    #[arg(long, env = "WEIR_NODE_TIMEOUT_SEC", default_value_t = 30)]
    pub node_timeout_sec: u64,
}

impl HeartbeatArgs {
    /// FO-LIV-13: the node timeout must be greater than the heartbeat interval.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_heartbeat_timing(self.heartbeat_interval_sec, self.node_timeout_sec)
    }
}

/// A comma-separated `HOST:PORT` list (`--metad`), blanks dropped.
pub fn addr_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// FO-LIV-13: refuses a timing where the timeout is not greater than the interval,
/// naming both flags.
pub fn check_heartbeat_timing(interval_sec: u64, timeout_sec: u64) -> Result<(), ConfigError> {
    if interval_sec == 0 {
        return Err(ConfigError::new("--heartbeat-interval-sec must be at least 1"));
    }
    if timeout_sec <= interval_sec {
        return Err(ConfigError::new(format!(
            "--node-timeout-sec ({timeout_sec}) must be greater than --heartbeat-interval-sec ({interval_sec})"
        )));
    }
    Ok(())
}

/// Parses `ID=ADDR,ID=ADDR` lists such as metad's `--peers`.
pub fn parse_peer_list(flag: &str, value: &str) -> Result<Vec<(u64, String)>, ConfigError> {
    let mut peers = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| ConfigError::new(format!("{flag}: '{item}' is not of the form ID=HOST:PORT")))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| ConfigError::new(format!("{flag}: '{id}' is not a numeric replica id")))?;
        let addr = addr.trim();
        if addr.is_empty() || !addr.contains(':') {
            return Err(ConfigError::new(format!(
                "{flag}: address '{addr}' of replica {id} is not HOST:PORT"
            )));
        }
        if peers.iter().any(|(p, _)| *p == id) {
            return Err(ConfigError::new(format!("{flag}: replica {id} is listed twice")));
        }
        peers.push((id, addr.to_string()));
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Issue 18: only a listener beyond loopback with something missing is refused.
    #[test]
    fn an_exposed_listener_is_refused_unless_secure_or_insecure() {
        let any: std::net::SocketAddr = "0.0.0.0:7400".parse().unwrap();
        let lo: std::net::SocketAddr = "127.0.0.1:7400".parse().unwrap();
        let err = refuse_exposed("--listen", any, Some("no mTLS"), false).unwrap_err();
        assert_eq!(
            err.message,
            "--listen 0.0.0.0:7400 is reachable beyond this host, and no mTLS; \
             listen on loopback, or give --insecure to serve anyway"
        );
        assert!(refuse_exposed("--listen", any, Some("no mTLS"), true).is_ok());
        assert!(refuse_exposed("--listen", any, None, false).is_ok());
        assert!(refuse_exposed("--listen", lo, Some("no mTLS"), false).is_ok());
    }

    // FO-LIV-13
    #[test]
    fn heartbeat_timing_refuses_timeout_not_above_interval_and_names_both_flags() {
        for (interval, timeout) in [(5, 5), (5, 4)] {
            let err = check_heartbeat_timing(interval, timeout).unwrap_err().to_string();
            // FO-LIV-13: a timeout not above the interval is refused, naming both flags.
            assert!(err.contains("--node-timeout-sec"), "{err}");
            assert!(err.contains("--heartbeat-interval-sec"), "{err}");
        }
        // FO-LIV-13: a timeout above the interval is accepted.
        check_heartbeat_timing(5, 6).unwrap();
    }

    #[test]
    fn peer_lists_parse_and_refuse_malformed_items() {
        let peers = parse_peer_list("--peers", "1=127.0.0.1:7001, 2=host:7002").unwrap();
        assert_eq!(peers, vec![(1, "127.0.0.1:7001".into()), (2, "host:7002".into())]);
        for bad in ["1", "x=a:1", "1=nohost", "1=a:1,1=b:2"] {
            let err = parse_peer_list("--peers", bad).unwrap_err().to_string();
            assert!(err.contains("--peers"), "{bad}: {err}");
        }
    }
}
