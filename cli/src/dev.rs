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

    /// Serve the HTTP API as HTTPS and Kafka as `SSL`, with a CA made in
    /// `DATA_DIR/tls` on first use (its `ca.pem` is what clients trust).
    #[arg(long, env = "WEIR_DEV_TLS")]
    tls: bool,

    /// Allow listening beyond loopback without TLS or auth (`weir dev` has neither
    /// inside, and no auth for clients).
    #[arg(long, env = "WEIR_INSECURE")]
    insecure: bool,

    #[command(flatten)]
    telemetry: TelemetryArgs,

    #[command(flatten)]
    disk_space: weir_shared::disk_space::DiskSpaceArgs,

    #[command(flatten)]
    shutdown: ShutdownArgs,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    // SD-TRG-6: the signal handlers come before any other work.
    let shutdown = Shutdown::install(&args.shutdown);
    let _telemetry = weir_shared::telemetry::init("weir-dev", &args.telemetry)?;
    // One process: the gateway calls streamd without the network (issue 62).
    weir_shared::in_process::enable();
    args.shutdown.warn_if_drain_outlasts_deadline();
    let metad = MetadArgs {
        id: 1,
        listen: args.metad_listen,
        advertise: None,
        http_listen: args.metad_http_listen,
        peers: String::new(),
        data_dir: args.data_dir.join("metad"),
        disk_space: args.disk_space.clone(),
        heartbeat: HeartbeatArgs {
            heartbeat_interval_sec: 5,
            node_timeout_sec: 30,
        },
        listeners: Default::default(),
        max_watch_streams: 10_000,
        propose_timeout_ms: 5000,
        raft_heartbeat_ms: 200,
        snapshot_logs: 10_000,
        snapshot_rows_percent: 50,
        auto_place: true,
        drain_batch_streams: weir_meta::drain_plan::DRAIN_BATCH,
        reap_after_sec: 3600,
        telemetry: TelemetryArgs {
            log_format: LogFormat::Human,
            ..args.telemetry.clone()
        },
        shutdown: args.shutdown.clone(),
        bootstrap_admin_token_file: None,
        cluster_tls: Default::default(),
        // One process, no cluster TLS: there is no gateway certificate to check.
        allow_anonymous_gateways: false,
        insecure: args.insecure,
    }
    .validate()?;
    weir_shared::durable_dir::create_dir_all(&args.data_dir)?;
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
    let streamd = weir_streamd::StreamdArgs {
        insecure: args.insecure,
        disk_space: args.disk_space.clone(),
        ..streamd
    };
    streamd.validate()?;
    let mut gatewayd_flags = vec![
        "gatewayd".to_string(),
        "--id".into(),
        "dev-gatewayd".into(),
        "--metad".into(),
        args.metad_listen.to_string(),
        "--http-listen".into(),
        args.http_listen.to_string(),
        "--kafka-listen".into(),
        args.kafka_listen.to_string(),
    ];
    let tls = args.tls.then(|| dev_certs(&data_dir, &args)).transpose()?;
    if let Some(t) = &tls {
        gatewayd_flags.extend(["--tls-cert".into(), t.cert.display().to_string()]);
        gatewayd_flags.extend(["--tls-key".into(), t.key.display().to_string()]);
    }
    if args.insecure {
        gatewayd_flags.push("--insecure".into());
    }
    let gatewayd = weir_gatewayd::GatewaydArgs::parse_from(gatewayd_flags);
    gatewayd.validate()?;
    match &tls {
        None => {
            println!("weir dev: HTTP API on http://{}", args.http_listen);
            println!(
                "weir dev: Kafka on {} (bootstrap.servers={})",
                args.kafka_listen, args.kafka_listen
            );
        }
        Some(t) => {
            println!(
                "weir dev: HTTP API on https://{} (curl --cacert {})",
                args.http_listen,
                t.ca.display()
            );
            println!(
                "weir dev: Kafka on {} (bootstrap.servers={} security.protocol=SSL ssl.ca.location={})",
                args.kafka_listen,
                args.kafka_listen,
                t.ca.display()
            );
        }
    }
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
    let mut metad_task = services.spawn(weir_metad::run(metad, metad_stop.clone()));
    let mut gatewayd_task = services.spawn(weir_gatewayd::run(gatewayd, shutdown.clone()));
    let mut streamd_task = services.spawn(weir_streamd::run(streamd, shutdown.clone()));
    // `weir dev` runs whole or not at all: the first component to end when no stop was
    // asked for (a listener that cannot bind, a fenced streamd) stops the others, and
    // its cause is the process's error.
    let (first, first_result) = tokio::select! {
        r = &mut streamd_task => ("streamd", r?),
        r = &mut gatewayd_task => ("gatewayd", r?),
        r = &mut metad_task => ("metad", r?),
    };
    let unasked = !shutdown.is_requested();
    if unasked {
        let why = match &first_result {
            Ok(exit) => format!("the dev {first} stopped on its own ({exit:?})"),
            Err(e) => format!("the dev {first} failed: {e:#}"),
        };
        tracing::error!(component = first, reason = %why, "a component of weir dev ended; stopping the others");
        shutdown.request(&why);
        if first == "metad" {
            // Without metad the others can neither register (a stop only takes effect
            // after registration, SD-TRG-7) nor hand anything off: end them now. What
            // they acknowledged is in the WAL, recovered at the next start.
            streamd_task.abort();
            gatewayd_task.abort();
        }
    }
    let mut results = vec![(first, first_result)];
    for (service, task) in [("streamd", streamd_task), ("gatewayd", gatewayd_task)] {
        if service != first {
            match task.await {
                Ok(result) => results.push((service, result)),
                Err(e) if e.is_cancelled() => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    metad_stop.request("streamd and gatewayd have stopped");
    if first != "metad" {
        results.push(("metad", metad_task.await?));
    }
    for (service, result) in results {
        match result {
            Err(e) => return Err(e.context(format!("the dev {service} failed"))),
            Ok(Exit::Fenced) => anyhow::bail!("the dev {service} was fenced"),
            Ok(Exit::Clean) if unasked && service == first => {
                anyhow::bail!("the dev {service} stopped though no stop was requested")
            }
            Ok(Exit::Clean) => {}
        }
    }
    if shutdown.exit_code() != 0 {
        anyhow::bail!("the shutdown deadline forced the stop");
    }
    Ok(())
}

/// `weir dev --tls`'s certificates: the CA is made once and kept, so clients keep
/// trusting it across restarts; the gateway's certificate is signed anew at each start.
struct DevTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn dev_certs(data_dir: &std::path::Path, args: &DevArgs) -> anyhow::Result<DevTls> {
    let dir = data_dir.join("tls");
    let ca = crate::certs::ca_cert_path(&dir);
    if !ca.exists() {
        crate::certs::new_ca(&dir, 3650)?;
    }
    let mut ips: Vec<std::net::IpAddr> = vec!["127.0.0.1".parse()?, "::1".parse()?];
    for ip in [args.http_listen.ip(), args.kafka_listen.ip()] {
        if !ip.is_unspecified() && !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    let (cert, key) = crate::certs::issue(
        &dir,
        weir_shared::peer::Role::Gatewayd,
        "dev-gatewayd",
        &["localhost".to_string()],
        &ips,
        365,
    )?;
    Ok(DevTls { ca, cert, key })
}
