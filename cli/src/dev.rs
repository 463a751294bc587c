//! `weir dev`: Weir on local disk in one process, no other setup.

use clap::{Args, Parser};
use std::net::SocketAddr;
use std::path::PathBuf;
use weir_metad::MetadArgs;
use weir_shared::config::{HeartbeatArgs, LogFormat, TelemetryArgs};
use weir_shared::service::Exit;
use weir_shared::shutdown::{Shutdown, ShutdownArgs};

#[derive(Args)]
pub struct DevArgs {
    /// Where all state lives.
    #[arg(long, env = "WEIR_DATA_DIR", default_value = "./weir-data")]
    data_dir: PathBuf,

    /// The HTTP API's address.
    #[arg(long, env = "WEIR_HTTP_LISTEN", default_value = "127.0.0.1:8080")]
    http_listen: SocketAddr,

    /// The Kafka protocol's address (point Kafka clients' bootstrap servers here).
    #[arg(long, env = "WEIR_KAFKA_LISTEN", default_value = "127.0.0.1:9092")]
    kafka_listen: SocketAddr,

    /// metad's gRPC address (admin commands use it).
    #[arg(long, env = "WEIR_METAD_LISTEN", default_value = "127.0.0.1:7400")]
    metad_listen: SocketAddr,

    /// metad's admin HTTP address.
    #[arg(long, env = "WEIR_METAD_HTTP_LISTEN", default_value = "127.0.0.1:7480")]
    metad_http_listen: SocketAddr,

    /// streamd's data-plane gRPC address.
    #[arg(long, env = "WEIR_STREAMD_LISTEN", default_value = "127.0.0.1:7500")]
    streamd_listen: SocketAddr,

    /// streamd's health HTTP address.
    #[arg(long, env = "WEIR_STREAMD_HTTP_LISTEN", default_value = "127.0.0.1:7580")]
    streamd_http_listen: SocketAddr,

    #[command(flatten)]
    telemetry: TelemetryArgs,

    #[command(flatten)]
    shutdown: ShutdownArgs,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    // SD-TRG-6: the signal handlers come before any other work.
    let shutdown = Shutdown::install(&args.shutdown);
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
        shutdown: args.shutdown.clone(),
        bootstrap_admin_token_file: None,
    }
    .validate()?;
    std::fs::create_dir_all(&args.data_dir)?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    let streamd = weir_streamd::StreamdArgs::parse_from([
        "streamd",
        "--id",
        "dev-streamd",
        "--metad",
        &args.metad_listen.to_string(),
        "--data-dir",
        &data_dir.join("streamd").display().to_string(),
        "--object-store",
        &format!("file://{}", data_dir.join("objects").display()),
        "--wal-dir",
        &data_dir.join("wal").display().to_string(),
        "--listen",
        &args.streamd_listen.to_string(),
        "--http-listen",
        &args.streamd_http_listen.to_string(),
    ]);
    streamd.validate()?;
    let gatewayd = weir_gatewayd::GatewaydArgs::parse_from([
        "gatewayd",
        "--id",
        "dev-gatewayd",
        "--metad",
        &args.metad_listen.to_string(),
        "--http-listen",
        &args.http_listen.to_string(),
        "--kafka-listen",
        &args.kafka_listen.to_string(),
    ]);
    gatewayd.validate()?;
    println!("weir dev: HTTP API on http://{}", args.http_listen);
    println!(
        "weir dev: Kafka on {} (bootstrap.servers={})",
        args.kafka_listen, args.kafka_listen
    );
    println!("weir dev: data in {}", args.data_dir.display());
    println!(
        "weir dev: metad gRPC on {} (weir --metad {} nodes list)",
        args.metad_listen, args.metad_listen
    );
    println!("weir dev: metad admin HTTP on http://{}", args.metad_http_listen);
    println!(
        "weir dev: streamd data plane on {} (health on http://{})",
        args.streamd_listen, args.streamd_http_listen
    );
    // streamd hands off before metad stops: it stops first, then metad, which has a
    // shutdown of its own (same deadline) requested once the others are done.
    let metad_stop = weir_shared::shutdown::Shutdown::new(&args.shutdown);
    let services = tokio_util::task::TaskTracker::new();
    let metad_task = services.spawn(weir_metad::run(metad, metad_stop.clone()));
    let gatewayd_task = services.spawn(weir_gatewayd::run(gatewayd, shutdown.clone()));
    let streamd_result = weir_streamd::run(streamd, shutdown.clone()).await;
    let gatewayd_result = gatewayd_task.await?;
    metad_stop.request("streamd and gatewayd have stopped");
    let metad_result = metad_task.await?;
    for (service, result) in [
        ("streamd", streamd_result),
        ("gatewayd", gatewayd_result),
        ("metad", metad_result),
    ] {
        if result? == Exit::Fenced {
            anyhow::bail!("the dev {service} was fenced");
        }
    }
    if shutdown.exit_code() != 0 {
        anyhow::bail!("the shutdown deadline forced the stop");
    }
    Ok(())
}
