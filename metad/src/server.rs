//! Wires one metad replica together: storage, Raft, gRPC and HTTP servers,
//! bootstrap, and the cluster-settings initializer.

use crate::admin::AdminService;
use crate::client_service::ClientService;
use crate::config::MetadConfig;
use crate::leader::PeerChannels;
use crate::network::{GrpcNetwork, MAX_RAFT_MESSAGE};
use crate::raft_service::RaftService;
use crate::raft_types::Raft;
use crate::store::{open_db, LogStore, StateMachineStore, ViewHub};
use openraft::{BasicNode, SnapshotPolicy};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_meta::model::command::{Command, Proposal, Proposer};
use weir_meta::model::rows::ClusterSettings;
use weir_proto::metad::admin_server::AdminServer;
use weir_proto::metad::metad_server::MetadServer;
use weir_proto::raft::raft_server::RaftServer;
use weir_shared::grpc::MAX_MESSAGE;
use weir_shared::listener::{grpc_incoming, Listener};
use weir_shared::service::Exit;
use weir_shared::shutdown::{watch_listener, PhaseOutcome, Shutdown, StopSteps, TeardownStep};
use weir_shared::task_kinds::{KindTasks, TASK_GRACE};

/// Runs a replica until a stop is requested, then runs the shutdown phases: consensus
/// stays live through stop-requested and drain-support (SD-CS-10: no step-down, no
/// leadership transfer), and terminal teardown stops Raft and waits for storage to be
/// idle before releasing it (SD-TD-5).
pub async fn run(config: MetadConfig, stopping: Arc<Shutdown>) -> anyhow::Result<Exit> {
    let args = &config.args;
    args.cluster_tls.install()?;
    // Everything below runs until terminal teardown, not merely until the stop request.
    let shutdown = CancellationToken::new();
    let db = open_db(&args.data_dir)?;
    let log_store = LogStore::new(db.clone());
    let sm = StateMachineStore::open(db.clone(), &args.data_dir.join("snapshots"))?;
    let hub = sm.hub();

    let raft_config = openraft::Config {
        cluster_name: "weir-metad".into(),
        heartbeat_interval: args.raft_heartbeat_ms,
        election_timeout_min: args.raft_heartbeat_ms * 5,
        election_timeout_max: args.raft_heartbeat_ms * 10,
        install_snapshot_timeout: 10_000,
        // `snapshot_policy::snapshot_loop` triggers them, by entries and rows.
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: args.snapshot_logs / 2,
        purge_batch_size: (args.snapshot_logs / 2).clamp(1, 256),
        // Bounded messages (design 0002): snapshots travel in 1 MiB chunks, and one
        // append carries at most 64 entries.
        snapshot_max_chunk_size: 1 << 20,
        max_payload_entries: 64,
        ..Default::default()
    }
    .validate()?;
    let raft = Raft::new(args.id, Arc::new(raft_config), GrpcNetwork, log_store, sm.clone()).await?;

    let tasks = TaskTracker::new();
    let moves = TaskTracker::new();
    let grpc_listener = weir_shared::service::bind("--listen", args.listen).await?;
    let http_listener = weir_shared::service::bind("--http-listen", args.http_listen).await?;
    tracing::info!(
        id = args.id,
        grpc = %grpc_listener.local_addr()?,
        http = %http_listener.local_addr()?,
        advertise = %config.advertise,
        "metad listening"
    );

    let peers = Arc::new(PeerChannels::default());
    let timeout = Duration::from_millis(args.propose_timeout_ms);
    let limits = args.listeners.limits()?;
    let users = crate::authz::Directory::new(hub.clone(), args.allow_anonymous_gateways);
    let disk = weir_shared::disk_space::DiskWatch::new(
        vec![("metadata".to_owned(), args.data_dir.clone())],
        args.disk_space.clone(),
    );
    tasks.spawn(disk.watch(shutdown.child_token()));
    let runner =
        crate::transfer_runner::TransferRunner::new(raft.clone(), hub.clone(), args.id, args.drain_batch_streams);
    // Operators may come with an admin token instead of a certificate (`weir --token`).
    let grpc = weir_shared::grpc::server_with(&limits, true)?
        .layer(tonic::service::InterceptorLayer::new(
            crate::token_callers::TokenCallers::new(hub.clone()),
        ))
        .add_service(
            RaftServer::new(RaftService::new(raft.clone()))
                .max_decoding_message_size(MAX_RAFT_MESSAGE)
                .max_encoding_message_size(MAX_RAFT_MESSAGE),
        )
        .add_service(
            MetadServer::new(
                ClientService::new(
                    raft.clone(),
                    sm.clone(),
                    peers.clone(),
                    crate::client_service::Limits {
                        timeout,
                        max_watch_streams: args.max_watch_streams,
                    },
                    tasks.clone(),
                    shutdown.child_token(),
                    users.clone(),
                )
                .with_disk(disk.clone()),
            )
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE),
        )
        .add_service(
            AdminServer::new(AdminService::new(
                raft.clone(),
                sm.clone(),
                runner.clone(),
                peers,
                moves.clone(),
                users,
            ))
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE),
        )
        .serve_with_incoming_shutdown(
            grpc_incoming(Listener::new(grpc_listener, "grpc", limits)),
            shutdown.clone().cancelled_owned(),
        );
    // SD-TRG-2: a listener that fails stops the replica rather than leave it half-alive.
    tasks.spawn(watch_listener("grpc", grpc, stopping.clone(), shutdown.clone()));

    let http = weir_shared::http_server::serve(
        Listener::new(http_listener, "http", limits),
        crate::admin_http::router(raft.clone(), sm.clone(), args.id, disk.clone(), stopping.clone()),
        None,
        shutdown.clone().cancelled_owned(),
    );
    tasks.spawn(watch_listener("http", http, stopping.clone(), shutdown.clone()));

    tasks.spawn(crate::metrics::follow_raft(raft.clone(), args.id));
    bootstrap(&raft, &config).await?;
    // The replica's loops: the first thing terminal teardown stops (SD-TD-2), each
    // within the task grace (SD-TD-3/4).
    let background = KindTasks::new();
    let background_stop = CancellationToken::new();
    if let Some(path) = &args.bootstrap_admin_token_file {
        let secret = crate::bootstrap_token::read_secret(path)?;
        background.spawn(
            "bootstrap",
            "bootstrap admin token",
            None,
            crate::bootstrap_token::issue(config.advertise.clone(), hub.clone(), secret, background_stop.clone()),
        );
    }
    if args.auto_place {
        background.spawn(
            "placement",
            "placement",
            None,
            crate::placement_loop::placement_loop(raft.clone(), hub.clone(), args.id, background_stop.clone()),
        );
    }
    background.spawn(
        "snapshots",
        "snapshot policy",
        None,
        crate::snapshot_policy::snapshot_loop(
            raft.clone(),
            sm.clone(),
            crate::snapshot_policy::Policy {
                min_logs: args.snapshot_logs,
                rows_percent: args.snapshot_rows_percent,
            },
            background_stop.clone(),
        ),
    );
    background.spawn(
        "transfer marks",
        "transfer marks",
        None,
        runner.reconcile_marks(background_stop.clone()),
    );
    background.spawn(
        "failover",
        "failover",
        None,
        crate::failover::run(
            config.advertise.clone(),
            hub.clone(),
            args.id,
            args.heartbeat,
            Duration::from_secs(args.reap_after_sec),
            background_stop.clone(),
        ),
    );
    background.spawn(
        "bootstrap",
        "cluster settings",
        None,
        init_cluster_settings(raft.clone(), hub.clone(), config.clone(), background_stop.clone()),
    );

    // A Raft core that stops on its own (a storage write failed) ends the replica.
    let stop_requested = stopping.token();
    tokio::select! {
        _ = stop_requested.cancelled() => {}
        why = crate::raft_health::stopped_on_its_own(&raft) => {
            return Err(crate::raft_health::failure(&why, &disk));
        }
    }
    // The services, Raft and the loops hold their own handles; this one would keep the
    // store open past teardown (SD-TD-5).
    drop(sm);
    stopping
        .run_phases(&mut MetadStop {
            stopping: &stopping,
            hub,
            id: args.id,
            advertise: config.advertise.clone(),
            shutdown,
            background_stop,
            background,
            raft,
            tasks,
            moves,
            db: Some(db),
        })
        .await;
    Ok(Exit::Clean)
}

/// A replica's stop: consensus stays live through stop-requested and drain-support
/// (SD-CS-10: no step-down, no leadership transfer); terminal teardown waits for the
/// drains it runs, stops Raft and waits for storage to be idle before releasing it
/// (SD-TD-5).
struct MetadStop<'a> {
    stopping: &'a Shutdown,
    hub: Arc<ViewHub>,
    id: u64,
    advertise: String,
    /// Cancels everything that runs until terminal teardown.
    shutdown: CancellationToken,
    background_stop: CancellationToken,
    background: KindTasks,
    raft: Raft,
    tasks: TaskTracker,
    moves: TaskTracker,
    /// Taken and dropped at the end of teardown, closing the store.
    db: Option<Arc<rocksdb::DB>>,
}

impl StopSteps for MetadStop<'_> {
    async fn stop_requested(&mut self) {
        let within = self.stopping.step(Duration::from_secs(2));
        mark_terminating(&self.hub, self.id, &self.advertise, within).await;
    }

    async fn drain_support(&mut self) -> PhaseOutcome {
        // Nodes stopping alongside this replica still commit their hand-offs meanwhile.
        tokio::time::sleep(self.stopping.step(self.stopping.drain_window)).await;
        PhaseOutcome::Completed
    }

    /// SD-TD-2's steps, with one departure: the drains and transfers this replica runs
    /// come first, since they need its placement and failover loops (a stream a
    /// stopping node closed is placed by them) and propose through its Raft. Then the
    /// loops, Raft and the listeners with the transport drain (SD-DL-8), then the
    /// database.
    async fn terminal_teardown(&mut self) -> PhaseOutcome {
        TeardownStep::WorkInFlight.begin();
        self.moves.close();
        if !self.moves.is_empty() {
            tracing::info!(
                running = self.moves.len(),
                "waiting for drains and transfers this replica runs"
            );
        }
        // Within the deadline (the deadline thread ends the process past it).
        let _ = tokio::time::timeout(self.stopping.deadline_left(), self.moves.wait()).await;
        TeardownStep::BackgroundTasks.begin();
        self.background_stop.cancel();
        self.background.stop(TASK_GRACE).await;
        TeardownStep::RuntimeAndLinks.begin();
        self.shutdown.cancel();
        tracing::info!("metad stopping: shutting down raft");
        // The listeners' open requests and watch streams share the transport drain's
        // bound, so a request that will not end leaves storage its reserve; so does
        // Raft's own stop, which waits on its tasks (a stuck storage write, say).
        let end = self.stopping.transport_drain_end();
        match tokio::time::timeout_at(end, self.raft.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "raft shutdown reported an error"),
            Err(_) => tracing::warn!("raft did not shut down within the transport drain; going on to storage"),
        }
        self.tasks.close();
        let links = if tokio::time::timeout_at(end, self.tasks.wait()).await.is_err() {
            tracing::warn!("requests in flight did not end in the transport drain; closing them");
            PhaseOutcome::Abandoned
        } else {
            self.stopping.transport_drain(end).await
        };
        TeardownStep::Storage.begin();
        let Some(db) = self.db.take() else { return links };
        // Flush RocksDB and stop its workers before the handle is released.
        if let Err(e) = crate::store::db::prepare_close(&db) {
            // OBS-17: a storage failure at close is an error; the handle is released anyway.
            tracing::error!(error = %e, "flushing the metadata store failed");
        }
        tracing::debug!("storage idle; releasing the database");
        release_store(db, Duration::from_secs(1).min(self.stopping.deadline_left())).await;
        links
    }
}

/// SD-TD-5: closes the store within teardown, so its LOCK is released by the process
/// rather than by the OS at exit. Raft's core and the listeners' requests drop their
/// handles as they end (all stopped above); this waits, within `bound`, for the last.
async fn release_store(db: Arc<rocksdb::DB>, bound: Duration) {
    let until = tokio::time::Instant::now() + bound;
    while Arc::strong_count(&db) > 1 {
        if tokio::time::Instant::now() >= until {
            tracing::warn!(
                holders = Arc::strong_count(&db) - 1,
                "the metadata store is still in use; its lock is released when the process exits"
            );
            return;
        }
        // Nothing announces a dropped handle; the holders are tasks already stopping.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(db);
    tracing::info!("metadata store closed and its lock released");
}

/// SD-TRM-5, SD-REL-7: this replica's `metad-<id>` incarnation is marked terminating,
/// so stopping nodes can tell whether a live metadata quorum stays; it stays a voter.
async fn mark_terminating(hub: &ViewHub, id: u64, advertise: &str, within: Duration) {
    let me = hub.with_state(|s| {
        s.nodes
            .get(&weir_shared::ids::NodeId::new(format!("metad-{id}")))
            .filter(|n| n.is_live())
            .map(|n| n.incarnation())
    });
    let (Some(me), Ok(client)) = (
        me,
        weir_meta::client::MetadClient::new(&[advertise.to_string()], within),
    ) else {
        return;
    };
    weir_meta::registration::mark_terminating(&client, &me, within).await;
}

/// Initializes the cluster once: only on a replica with no stored state, and only on
/// the lowest id among the initial voters, so two replicas can never bootstrap twice.
async fn bootstrap(raft: &Raft, config: &MetadConfig) -> anyhow::Result<()> {
    if raft.is_initialized().await? {
        tracing::info!("resuming from stored raft state");
        return Ok(());
    }
    let lowest = config.peers.iter().map(|(id, _)| *id).min().unwrap_or(config.args.id);
    if lowest != config.args.id {
        tracing::info!(
            bootstrapper = lowest,
            "waiting to be joined by the bootstrapping replica"
        );
        return Ok(());
    }
    let members: BTreeMap<u64, BasicNode> = config
        .peers
        .iter()
        .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
        .collect();
    tracing::info!(voters = ?members.keys().collect::<Vec<_>>(), "bootstrapping the metadata cluster");
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        Err(openraft::error::RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Once this replica leads a cluster without settings, proposes its configured
/// heartbeat timing; the first to apply wins and later ones must match (FO-LIV-14).
async fn init_cluster_settings(
    raft: Raft,
    hub: Arc<crate::store::ViewHub>,
    config: MetadConfig,
    cancel: CancellationToken,
) {
    let settings = ClusterSettings {
        heartbeat_interval_sec: config.args.heartbeat.heartbeat_interval_sec,
        node_timeout_sec: config.args.heartbeat.node_timeout_sec,
    };
    let mut metrics = raft.metrics();
    loop {
        if let Some(current) = hub.with_state(|s| s.settings) {
            if current != settings {
                tracing::warn!(
                    cluster_interval = current.heartbeat_interval_sec,
                    cluster_timeout = current.node_timeout_sec,
                    local_interval = settings.heartbeat_interval_sec,
                    local_timeout = settings.node_timeout_sec,
                    "this replica's --heartbeat-interval-sec/--node-timeout-sec differ from the cluster's; the cluster's apply"
                );
            }
            return;
        }
        let leading = metrics.borrow().current_leader == Some(config.args.id);
        if leading {
            let proposal = Proposal {
                proposer: Proposer::Operator {
                    principal: format!("metad-{}", config.args.id),
                },
                command: Command::InitCluster { settings },
            };
            match raft.client_write(proposal).await {
                Ok(resp) => {
                    tracing::info!(log_index = resp.log_id.index, outcome = ?resp.data, "cluster settings proposed")
                }
                Err(e) => tracing::debug!(error = %e, "cluster settings not proposed yet"),
            }
            continue;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = metrics.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
