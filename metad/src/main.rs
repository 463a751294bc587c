//! The metad binary: parse flags, set up telemetry, run until SIGINT or SIGTERM.

use clap::Parser;
use weir_metad::MetadArgs;

fn main() -> std::process::ExitCode {
    let args = MetadArgs::parse();
    let config = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("metad: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("metad: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    runtime.block_on(async {
        // SD-TRG-6: the signal handlers come before any other work.
        let shutdown = weir_shared::shutdown::Shutdown::install(&config.args.shutdown);
        let _telemetry = match weir_shared::telemetry::init("metad", &config.args.telemetry) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("metad: cannot set up telemetry: {e}");
                return std::process::ExitCode::from(1);
            }
        };
        let result = weir_metad::run(config, shutdown.clone()).await;
        match result {
            Ok(()) => std::process::ExitCode::from(shutdown.exit_code() as u8),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "metad failed");
                std::process::ExitCode::from(1)
            }
        }
    })
}
