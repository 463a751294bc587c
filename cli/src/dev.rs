//! `weir dev`: Weir on local disk in one process, no other setup.

use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;
use weir_metad::MetadArgs;
use weir_shared::config::{HeartbeatArgs, LogFormat, TelemetryArgs};

#[derive(Args)]
pub struct DevArgs {
    /// Where all state lives.
    #[arg(long, env = "WEIR_DATA_DIR", default_value = "./weir-data")]
    data_dir: PathBuf,

    /// metad's gRPC address (admin commands use it).
    #[arg(long, env = "WEIR_METAD_LISTEN", default_value = "127.0.0.1:7400")]
    metad_listen: SocketAddr,

    /// metad's admin HTTP address.
    #[arg(long, env = "WEIR_METAD_HTTP_LISTEN", default_value = "127.0.0.1:7480")]
    metad_http_listen: SocketAddr,

    #[command(flatten)]
    telemetry: TelemetryArgs,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let _telemetry = weir_shared::telemetry::init("weir-dev", &args.telemetry)?;
    let metad = MetadArgs {
        id: 1,
        listen: args.metad_listen,
        advertise: None,
        http_listen: args.metad_http_listen,
        peers: String::new(),
        data_dir: args.data_dir.join("metad"),
        heartbeat: HeartbeatArgs {
            heartbeat_interval_sec: 5,
            node_timeout_sec: 30,
        },
        propose_timeout_ms: 5000,
        raft_heartbeat_ms: 200,
        snapshot_logs: 10_000,
        auto_place: true,
        telemetry: TelemetryArgs {
            log_format: LogFormat::Human,
            ..args.telemetry.clone()
        },
    }
    .validate()?;
    println!("weir dev: data in {}", args.data_dir.display());
    println!(
        "weir dev: metad gRPC on {} (weir --metad {} nodes list)",
        args.metad_listen, args.metad_listen
    );
    println!("weir dev: metad admin HTTP on http://{}", args.metad_http_listen);
    let shutdown = CancellationToken::new();
    let signals = weir_shared::signals::stop_on_signal(shutdown.clone());
    let result = weir_metad::run(metad, shutdown).await;
    signals.abort();
    result
}
