//! The streamd binary: exits 0 after a clean stop (1 if the shutdown deadline forced it), 75 when fenced (D-5), 1 on failure,
//! 2 on invalid flags.

use clap::Parser;
use std::process::ExitCode;
use weir_streamd::{Exit, StreamdArgs};

fn main() -> ExitCode {
    let args = StreamdArgs::parse();
    if let Err(e) = args.validate() {
        eprintln!("streamd: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("streamd: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async {
        // SD-TRG-6: the signal handlers come before any other work.
        let shutdown = weir_shared::shutdown::Shutdown::install(&args.shutdown);
        let _telemetry = match weir_shared::telemetry::init("streamd", &args.telemetry) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("streamd: cannot set up telemetry: {e}");
                return ExitCode::from(1);
            }
        };
        let result = weir_streamd::run(args, shutdown.clone()).await;
        match result {
            Ok(Exit::Clean) => ExitCode::from(shutdown.exit_code() as u8),
            Ok(Exit::Fenced) => ExitCode::from(75),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "streamd failed");
                eprintln!("streamd: {e:#}");
                ExitCode::from(1)
            }
        }
    })
}
