//! The entry point every Weir service binary shares: signal handlers before any other
//! work (SD-TRG-6), telemetry, then the service's `run`, and one table of exit statuses:
//! 0 after a clean stop (1 when the shutdown deadline forced a phase), 75 when the
//! incarnation was fenced or replaced (D-5), 1 on failure, 2 on invalid flags.

use crate::config::TelemetryArgs;
use crate::shutdown::{Shutdown, ShutdownArgs};
use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;

/// How a service's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Stopped on request, after its shutdown phases.
    Clean,
    /// Fenced or replaced: exit 75 so a supervisor restarts it (D-5).
    Fenced,
}

/// Exit status of a fenced or replaced incarnation (D-5).
pub const EXIT_FENCED: u8 = 75;
/// Exit status of invalid flags.
pub const EXIT_USAGE: u8 = 2;

/// The flags [`main`] needs from a service's configuration.
pub trait ServiceConfig {
    fn shutdown_args(&self) -> &ShutdownArgs;
    fn telemetry_args(&self) -> &TelemetryArgs;
}

/// Runs service `name` from its validated `config` (an invalid one is printed, naming
/// the flag, and exits 2): installs the signal handlers and telemetry on a new runtime,
/// then awaits `run` with the process's shutdown and maps how it ended to the exit status.
pub fn main<C, E, F, Fut>(name: &'static str, config: Result<C, E>, run: F) -> ExitCode
where
    C: ServiceConfig,
    E: std::fmt::Display,
    F: FnOnce(C, Arc<Shutdown>) -> Fut,
    Fut: Future<Output = anyhow::Result<Exit>>,
{
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{name}: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async {
        // SD-TRG-6: the signal handlers come before any other work.
        let shutdown = Shutdown::install(config.shutdown_args());
        let _telemetry = match crate::telemetry::init(name, config.telemetry_args()) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("{name}: cannot set up telemetry: {e}");
                return ExitCode::from(1);
            }
        };
        config.shutdown_args().warn_if_drain_outlasts_deadline();
        match run(config, shutdown.clone()).await {
            Ok(Exit::Clean) => ExitCode::from(shutdown.exit_code() as u8),
            Ok(Exit::Fenced) => ExitCode::from(EXIT_FENCED),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "{name} failed");
                eprintln!("{name}: {e:#}");
                ExitCode::from(1)
            }
        }
    })
}

/// Binds a listener for flag `flag`; the error names the flag and the address, so a
/// port still held by another process is plain from the message.
pub async fn bind(flag: &str, addr: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} ({flag}): {e}"))
}
