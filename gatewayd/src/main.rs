//! The gatewayd binary: exits 0 after a clean stop (1 if the shutdown deadline forced it), 75 when fenced (D-5), 1 on failure,
//! 2 on invalid flags.

use clap::Parser;
use std::process::ExitCode;
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
        // SD-TRG-6: the signal handlers come before any other work.
        let shutdown = weir_shared::shutdown::Shutdown::install(&args.shutdown);
        let _telemetry = match weir_shared::telemetry::init("gatewayd", &args.telemetry) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("gatewayd: cannot set up telemetry: {e}");
                return ExitCode::from(1);
            }
        };
        let result = weir_gatewayd::run(args, shutdown.clone()).await;
        match result {
            Ok(Exit::Clean) => ExitCode::from(shutdown.exit_code() as u8),
            Ok(Exit::Fenced) => ExitCode::from(75),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "gatewayd failed");
                eprintln!("gatewayd: {e:#}");
                ExitCode::from(1)
            }
        }
    })
}
