//! The gatewayd binary: exits 0 after a clean stop, 75 when fenced (D-5), 1 on failure,
//! 2 on invalid flags.

use clap::Parser;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;
use weir_gatewayd::{Exit, GatewaydArgs};

fn main() -> ExitCode {
    let args = GatewaydArgs::parse();
    if let Err(e) = args.validate() {
        eprintln!("gatewayd: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gatewayd: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async {
        let _telemetry = match weir_shared::telemetry::init("gatewayd", &args.telemetry) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("gatewayd: cannot set up telemetry: {e}");
                return ExitCode::from(1);
            }
        };
        let shutdown = CancellationToken::new();
        let signals = weir_shared::signals::stop_on_signal(shutdown.clone());
        let result = weir_gatewayd::run(args, shutdown).await;
        signals.abort();
        match result {
            Ok(Exit::Clean) => ExitCode::SUCCESS,
            Ok(Exit::Fenced) => ExitCode::from(75),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "gatewayd failed");
                eprintln!("gatewayd: {e:#}");
                ExitCode::from(1)
            }
        }
    })
}
