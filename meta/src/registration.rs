//! A node's registration and its life in the log: a new epoch on every start, the
//! heartbeat that keeps the incarnation alive in the failover clock (FO-LIV-1,
//! FO-LIV-10), the watch of its own row that stops it once fenced or replaced (FO-FEN-8),
//! the terminating mark and the self-fence of a clean stop. Used by streamd, gatewayd
//! and metad's failover loop.

use crate::client::{ClientError, MetadClient};
use crate::model::{Applied, Command, NodeAddrs, NodeKind, Proposer, RejectCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use weir_shared::config::HeartbeatArgs;
use weir_shared::ids::{Epoch, Incarnation, NodeId};

/// Registers `node` as a `kind` and returns its new incarnation; retries while metad is
/// unavailable or not yet initialized, and fails on a refusal (such as a clock mismatch, FO-LIV-14).
pub async fn register(
    metad: &MetadClient,
    node: &NodeId,
    kind: NodeKind,
    addrs: NodeAddrs,
    timing: HeartbeatArgs,
    cancel: &CancellationToken,
) -> anyhow::Result<Incarnation> {
    let command = Command::RegisterNode {
        node: node.clone(),
        kind,
        addrs,
        heartbeat_interval_sec: timing.heartbeat_interval_sec,
        node_timeout_sec: timing.node_timeout_sec,
    };
    let proposer = Proposer::Operator {
        principal: node.to_string(),
    };
    let mut warned = false;
    loop {
        match metad.propose(&proposer, command.clone()).await {
            Ok((index, Ok(Applied::Registered { epoch }))) => {
                tracing::info!(node_id = %node, epoch = %epoch, log_index = index, "registered");
                return Ok(Incarnation {
                    node: node.clone(),
                    epoch: Epoch(epoch.0),
                });
            }
            Ok((_, Err(r))) if r.code == RejectCode::NotReady => {}
            Ok((_, Err(r))) => anyhow::bail!("registration refused: {}", r.message),
            Ok((_, Ok(other))) => anyhow::bail!("unexpected answer to registration: {other:?}"),
            Err(ClientError::Unavailable(e)) => {
                if !warned {
                    tracing::warn!(error = %e, "metadata log unavailable; retrying registration");
                    warned = true;
                }
            }
            Err(e) => anyhow::bail!("registration failed: {e}"),
        }
        tokio::select! {
            _ = cancel.cancelled() => anyhow::bail!("stopped before registering"),
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// FO-FEN-3: a clean stop fences its own incarnation, so failover acts at once instead
/// of after the node timeout; bounded by `within`. Logged either way; a failure leaves
/// it to the timeout.
pub async fn fence_self(metad: &MetadClient, me: &Incarnation, within: Duration) {
    match tokio::time::timeout(within, metad.propose(&Proposer::Node(me.clone()), Command::FenceSelf)).await {
        Ok(Ok((index, Ok(_)))) => {
            tracing::info!(node_id = %me.node, epoch = %me.epoch, log_index = index, "fenced self")
        }
        Ok(Ok((_, Err(r)))) => tracing::warn!(rejection = %r, "self-fence refused"),
        Ok(Err(e)) => tracing::warn!(error = %e, "self-fence not landed; the node timeout will fence it"),
        Err(_) => tracing::warn!(
            timeout = ?within,
            "self-fence not landed within what the deadline leaves; the node timeout will fence it"
        ),
    }
}

/// Logs why this incarnation stops as fenced: an error, unless it is fencing itself for
/// a clean stop (SD-TD-1), when seeing its own fenced row is the expected outcome.
pub fn log_fenced(me: &Incarnation, why: &str, self_fencing: &AtomicBool) {
    if self_fencing.load(Ordering::Acquire) {
        tracing::info!(node_id = %me.node, epoch = %me.epoch, reason = why, "this incarnation fenced itself for the shutdown; stopping");
    } else {
        tracing::error!(node_id = %me.node, epoch = %me.epoch, reason = why, "this incarnation is fenced; stopping");
    }
}

/// D-4: a stopping incarnation records that it is terminating, so it gets no new
/// streams; bounded by `within`, and a failure never blocks the stop.
pub async fn mark_terminating(metad: &MetadClient, me: &Incarnation, within: Duration) {
    let proposer = Proposer::Node(me.clone());
    match tokio::time::timeout(within, metad.propose(&proposer, Command::MarkTerminating)).await {
        Ok(Ok((index, Ok(_)))) => {
            tracing::info!(node_id = %me.node, epoch = %me.epoch, log_index = index, "marked this incarnation terminating")
        }
        Ok(Ok((_, Err(r)))) => tracing::warn!(rejection = %r, "terminating mark refused"),
        Ok(Err(e)) => tracing::warn!(error = %e, "terminating mark not landed; stopping anyway"),
        Err(_) => tracing::warn!("terminating mark timed out; stopping anyway"),
    }
}

/// Proposes a heartbeat for `me` every interval until `cancel`; returns the reason when
/// the incarnation turns out fenced, replaced or unknown (the caller must stop).
/// `bounded`: each replica's attempt ends after one interval and the next replica is
/// asked (a node's heartbeats). metad's own heartbeats, which are the failover clock,
/// keep the client's bound: an unanswered attempt that lands anyway and its retry
/// would tick the clock twice.
pub async fn heartbeat_loop(
    metad: &MetadClient,
    me: &Incarnation,
    interval: Duration,
    bounded: bool,
    cancel: &CancellationToken,
) -> Option<String> {
    let proposer = Proposer::Node(me.clone());
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return None,
            _ = ticker.tick() => {}
        }
        // A node's heartbeat stuck on a slow or broken link must not outlast the next
        // one: the node timeout counts missed intervals, and with a short interval one
        // attempt at the client's bound would cover several of them.
        let sent = if bounded {
            metad
                .propose_each_within(&proposer, Command::Heartbeat, interval.min(metad.timeout()))
                .await
        } else {
            metad.propose(&proposer, Command::Heartbeat).await
        };
        match sent {
            Ok((_, Ok(_))) => {}
            Ok((_, Err(r)))
                if matches!(
                    r.code,
                    RejectCode::Fenced | RejectCode::Superseded | RejectCode::UnknownNode
                ) =>
            {
                return Some(r.message);
            }
            Ok((_, Err(r))) => tracing::warn!(rejection = %r, "heartbeat refused"),
            Err(e) => tracing::debug!(error = %e, "heartbeat not landed"),
        }
    }
}

/// The flags of every node that registers (streamd, gatewayd).
#[derive(clap::Args, Clone, Debug)]
pub struct NodeArgs {
    /// This node's stable name.
    #[arg(long, env = "WEIR_ID")]
    pub id: String,

    /// metad replicas, comma-separated HOST:PORT.
    #[arg(long, env = "WEIR_METAD")]
    pub metad: String,

    #[command(flatten)]
    pub heartbeat: HeartbeatArgs,
}

impl NodeArgs {
    /// Validates once at startup; errors name the flag.
    pub fn validate(&self) -> Result<(), weir_shared::config::ConfigError> {
        use weir_shared::config::ConfigError;
        crate::model::validate_name("node", &self.id).map_err(|e| ConfigError::new(format!("--id: {}", e.message)))?;
        if self.metad_addrs().is_empty() {
            return Err(ConfigError::new("--metad needs at least one HOST:PORT"));
        }
        self.heartbeat.validate()
    }

    pub fn metad_addrs(&self) -> Vec<String> {
        weir_shared::config::addr_list(&self.metad)
    }
}

/// Why `me` must stop, as its own row in `state` shows (FO-FEN-8, SD-TRG-3): fenced,
/// or replaced by a newer registration. `None` while it is the live incarnation, or
/// while the view does not show its row yet.
pub fn own_row_verdict(state: &crate::model::State, me: &Incarnation) -> Option<String> {
    let row = state.nodes.get(&me.node)?;
    // A lower epoch is a view that has not applied this registration yet.
    if row.epoch > me.epoch {
        return Some(format!("a newer registration (epoch {}) replaced it", row.epoch));
    }
    (row.epoch == me.epoch && row.fenced).then(|| "its node row is fenced".to_string())
}

/// A node (streamd or gatewayd) registered at a new epoch: its client of the metadata
/// log, its view of it, and the token that is cancelled when the incarnation must stop.
pub struct Registered {
    pub me: Incarnation,
    pub metad: std::sync::Arc<MetadClient>,
    pub view: std::sync::Arc<crate::view::View>,
    /// Cancelled once this incarnation is fenced or replaced: the process exits 75 (D-5).
    pub fenced: CancellationToken,
    /// Set just before a clean stop proposes its own fence (SD-TD-1): the fenced row the
    /// view then shows is expected, not an error.
    pub self_fencing: std::sync::Arc<AtomicBool>,
}

impl Registered {
    /// Registers the node `args` name with the replicas they list (retrying while the
    /// log is unavailable). SD-TRG-7: a stop request meanwhile is acted on once this returns.
    pub async fn join(args: &NodeArgs, kind: NodeKind, addrs: NodeAddrs) -> anyhow::Result<Self> {
        let metad = std::sync::Arc::new(MetadClient::new(&args.metad_addrs(), Duration::from_secs(5))?);
        let node = NodeId::new(args.id.clone());
        let cancel = CancellationToken::new();
        let me = register(&metad, &node, kind, addrs, args.heartbeat, &cancel).await?;
        Ok(Self {
            me,
            metad,
            view: Default::default(),
            fenced: CancellationToken::new(),
            self_fencing: Default::default(),
        })
    }

    /// Marks this incarnation fenced (logged once); the process stops and exits 75.
    pub fn fence(&self, why: &str) {
        if !self.fenced.is_cancelled() {
            log_fenced(&self.me, why, &self.self_fencing);
        }
        self.fenced.cancel();
    }

    /// Starts following the log on `tasks` until `stop`: the view and a watch of the
    /// node's own row; a fenced or replaced incarnation is fenced at once. The heartbeat
    /// runs apart ([`Registered::heartbeat`]).
    pub fn follow(self: &std::sync::Arc<Self>, tasks: &tokio_util::task::TaskTracker, stop: &CancellationToken) {
        tasks.spawn(crate::view::follow(self.view.clone(), self.metad.clone(), stop.clone()));
        let me = self.clone();
        let cancel = stop.clone();
        tasks.spawn(async move {
            let mut applied = me.view.subscribe();
            loop {
                if let Some(why) = me.view.with(|s| own_row_verdict(s, &me.me)) {
                    return me.fence(&why);
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = me.fenced.cancelled() => return,
                    changed = applied.changed() => if changed.is_err() { return },
                }
            }
        });
    }

    /// The heartbeat loop, until `stop` or the fence; a heartbeat refused as fenced
    /// fences this incarnation. The caller runs it as one of its background tasks, which
    /// terminal teardown stops first (SD-TD-2).
    pub fn heartbeat(
        self: &std::sync::Arc<Self>,
        timing: HeartbeatArgs,
        stop: &CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let me = self.clone();
        let cancel = stop.clone();
        async move {
            let interval = Duration::from_secs(timing.heartbeat_interval_sec);
            let stopped = tokio::select! {
                r = heartbeat_loop(&me.metad, &me.me, interval, true, &cancel) => r,
                _ = me.fenced.cancelled() => None,
            };
            if let Some(why) = stopped {
                me.fence(&why);
            }
        }
    }

    /// Waits for the catch-up fence (RR-FEN-1); false when the node was fenced or a stop
    /// was requested first, and it must not be admitted.
    pub async fn catch_up(&self, stop_requested: &CancellationToken) -> bool {
        // Failpoint for RR-FEN-5 tests: a window between registration and catch-up.
        weir_shared::failpoint::pause("catch_up_start").await;
        let never = CancellationToken::new();
        tokio::select! {
            admitted = crate::catch_up::catch_up(&self.view, &self.metad, &never) => admitted.is_some(),
            _ = self.fenced.cancelled() => false,
            _ = stop_requested.cancelled() => false,
        }
    }

    /// Waits until a stop is requested (a clean stop) or the incarnation is fenced.
    pub async fn until_stopped(&self, stop_requested: &CancellationToken) -> weir_shared::service::Exit {
        tokio::select! {
            _ = stop_requested.cancelled() => weir_shared::service::Exit::Clean,
            _ = self.fenced.cancelled() => weir_shared::service::Exit::Fenced,
        }
    }
}
