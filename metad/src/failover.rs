//! The failover loop of one metad replica (seed 000, D-11). The replica registers as a
//! node and heartbeats, so its heartbeats are its clock. It takes the `failover` lease
//! when the lease is free or its holder is dead, and while it holds the lease and is
//! live (FO-LIV-11, INV-8) it checks the rows once a second (FO-LIV-3): it fences
//! nodes silent for the threshold, and drives WAL takeovers and the closing of
//! recovered streams. Placement then moves closed streams (`placement`). Each action
//! is a compare-and-set in the log, so two holders at once are harmless (INV-9), and
//! each is logged with its `(node, epoch)` and log index and counted (OBS-18).

use crate::store::ViewHub;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use weir_meta::client::MetadClient;
use weir_meta::failover_plan::{holder_commands, Clock, FAILOVER_LEASE};
use weir_meta::model::rows::NodeAddrs;
use weir_meta::model::{Applied, Command, NodeKind, Proposer};
use weir_meta::registration;
use weir_shared::config::HeartbeatArgs;
use weir_shared::ids::{Incarnation, NodeId};

/// How often the holder looks for takeover steps to take when nothing is applied.
const STEP_TICK: Duration = Duration::from_millis(250);
/// How often the holder judges every node's liveness (FO-LIV-3).
const JUDGE_EVERY: Duration = Duration::from_secs(1);

/// Runs until `cancel`: registers (again whenever this incarnation is fenced), heartbeats,
/// and runs the failover ticks.
pub async fn run(
    own_addr: String,
    hub: Arc<ViewHub>,
    id: u64,
    timing: HeartbeatArgs,
    reap_after: Duration,
    cancel: CancellationToken,
) {
    // Fenced rows are reaped after this many of the holder's own heartbeats.
    let reap_beats = reap_after.as_secs().div_ceil(timing.heartbeat_interval_sec.max(1));
    let metad = match MetadClient::new(std::slice::from_ref(&own_addr), Duration::from_secs(5)) {
        Ok(c) => Arc::new(c),
        Err(e) => return tracing::error!(error = %e, "failover loop cannot reach its own replica"),
    };
    let node = NodeId::new(format!("metad-{id}"));
    let addrs = NodeAddrs {
        grpc: own_addr.clone(),
        http: String::new(),
    };
    loop {
        let me = match registration::register(&metad, &node, NodeKind::Metad, addrs.clone(), timing, &cancel).await {
            Ok(me) => me,
            Err(e) => {
                if !cancel.is_cancelled() {
                    tracing::error!(error = %format!("{e:#}"), "failover loop stops: cannot register");
                }
                return;
            }
        };
        let stop = cancel.child_token();
        let interval = Duration::from_secs(timing.heartbeat_interval_sec);
        // Heartbeats and ticks run side by side; either ending ends the other.
        let heartbeats = async {
            if let Some(why) = registration::heartbeat_loop(&metad, &me, interval, false, &stop).await {
                tracing::warn!(node_id = %me.node, epoch = %me.epoch, reason = why, "this metad incarnation is fenced; registering again");
            }
            stop.cancel();
        };
        let ticking = async {
            ticks(&metad, &hub, &me, reap_beats, &stop).await;
            stop.cancel();
        };
        tokio::join!(heartbeats, ticking);
        crate::metrics::metrics().failover_holder.set(0);
        if cancel.is_cancelled() {
            return;
        }
    }
}

async fn ticks(metad: &MetadClient, hub: &ViewHub, me: &Incarnation, reap_beats: u64, stop: &CancellationToken) {
    // Takeover steps follow each other as soon as each applies (a completed takeover's
    // streams are closed in the next entries); liveness is judged once a second (FO-LIV-3).
    let mut tick = tokio::time::interval(STEP_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut applied = hub.applied_changes();
    let mut next_judgement: Option<tokio::time::Instant> = None;
    let mut clock = Clock::default();
    let mut holding = false;
    let proposer = Proposer::Node(me.clone());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
            changed = applied.changed() => if changed.is_err() { return },
        }
        let holder = hub.with_state(|s| s.leases.get(FAILOVER_LEASE).map(|l| l.holder.clone()));
        // Failpoint (tests, INV-9): this replica ticks as a holder whether or not it holds
        // the lease, as one that missed losing it would, alongside the real holder.
        let overlapping = holder.as_ref() != Some(me) && weir_shared::failpoint::is_set("holder_ignore_lease_loss");
        if holder.as_ref() != Some(me) && !overlapping {
            if holding {
                tracing::info!(node_id = %me.node, epoch = %me.epoch, "lost the failover lease");
                crate::metrics::metrics().failover_holder.set(0);
            }
            holding = false;
            contend(metad, hub, me, holder, &mut clock).await;
            continue;
        }
        if !holding {
            // FO-LIV-12: a new holder judges only what it sees from now on.
            clock.reset();
            holding = true;
            crate::metrics::metrics().failover_holder.set(1);
            if overlapping {
                tracing::warn!(node_id = %me.node, epoch = %me.epoch, "failpoint: acting as failover holder without the lease");
            } else {
                tracing::info!(node_id = %me.node, epoch = %me.epoch, "holding the failover lease");
            }
        }
        let now = tokio::time::Instant::now();
        let judge = next_judgement.is_none_or(|t| now >= t);
        if judge {
            // On a fixed one-second grid, so waking between its points (step ticks,
            // applied entries) never stretches it; a loop that fell more than a second
            // behind (a slow proposal) starts the grid again from now.
            next_judgement = Some(match next_judgement {
                Some(t) if t + JUDGE_EVERY > now => t + JUDGE_EVERY,
                _ => now + JUDGE_EVERY,
            });
            crate::metrics::metrics().failover_judgements.inc();
        }
        let commands = hub.with_state(|s| holder_commands(s, me, &mut clock, judge, reap_beats));
        for command in commands {
            act(metad, &proposer, command).await;
        }
    }
}

/// Takes the lease when it is free or its holder is not live; a live holder that has
/// gone silent is judged on this replica's own clock like any node, and fenced first.
async fn contend(metad: &MetadClient, hub: &ViewHub, me: &Incarnation, holder: Option<Incarnation>, clock: &mut Clock) {
    let proposer = Proposer::Node(me.clone());
    let verdict = hub.with_state(|s| {
        let my_count = s
            .nodes
            .get(&me.node)
            .filter(|r| r.epoch == me.epoch && r.is_live())?
            .heartbeats;
        let threshold = s.settings?.missed_heartbeats_threshold();
        let Some(holder) = &holder else {
            return Some(None);
        };
        match s.nodes.get(&holder.node) {
            Some(row) if row.epoch == holder.epoch && row.is_live() => {
                clock.observe(row, my_count, threshold).map(|seen_heartbeats| {
                    Some(Command::FenceNode {
                        node: holder.node.clone(),
                        epoch: holder.epoch,
                        seen_heartbeats,
                    })
                })
            }
            _ => Some(None),
        }
    });
    match verdict {
        // Not live ourselves, or the holder is alive.
        None => {}
        Some(Some(fence)) => act(metad, &proposer, fence).await,
        Some(None) => {
            let command = Command::AcquireLease {
                name: FAILOVER_LEASE.into(),
                expected: holder,
            };
            if let Ok((index, Ok(_))) = metad.propose(&proposer, command).await {
                tracing::info!(node_id = %me.node, epoch = %me.epoch, log_index = index, "took the failover lease");
            }
        }
    }
}

/// Proposes one failover action and logs what was applied (OBS-18).
async fn act(metad: &MetadClient, proposer: &Proposer, command: Command) {
    let action = command.kind();
    match metad.propose(proposer, command.clone()).await {
        Ok((index, Ok(applied))) => {
            crate::metrics::metrics()
                .failover_actions
                .with_label_values(&[action])
                .inc();
            match &command {
                Command::FenceNode {
                    node,
                    epoch,
                    seen_heartbeats,
                } => tracing::warn!(
                    node_id = %node, epoch = %epoch, seen_heartbeats, log_index = index,
                    "fenced a node that missed the heartbeat threshold"
                ),
                Command::BeginTakeover { node, epoch, agent } => tracing::info!(
                    node_id = %node, epoch = %epoch, agent = %agent, log_index = index,
                    "WAL takeover started"
                ),
                Command::CloseStream { stream, stream_epoch } => tracing::info!(
                    stream = %stream, stream_epoch = %stream_epoch, log_index = index,
                    "closed a recovered stream of a dead owner"
                ),
                Command::CloseStreams { streams } => {
                    let outcomes = match &applied {
                        Applied::Each { outcomes } => outcomes.as_slice(),
                        _ => &[],
                    };
                    for (s, outcome) in streams.iter().zip(outcomes) {
                        match outcome {
                            Ok(_) => tracing::info!(
                                stream = %s.stream, stream_epoch = %s.stream_epoch, log_index = index,
                                "closed a recovered stream of a dead owner"
                            ),
                            Err(r) => {
                                tracing::debug!(stream = %s.stream, rejection = %r, "close of a recovered stream refused")
                            }
                        }
                    }
                }
                Command::ReapNode { node, epoch } => tracing::info!(
                    node_id = %node, epoch = %epoch, log_index = index,
                    "reaped the row of a node fenced long ago"
                ),
                Command::DestroyStream { stream } => tracing::info!(
                    stream = %stream, log_index = index,
                    "destroyed a deleted stream of a dead owner"
                ),
                other => tracing::info!(action = other.kind(), log_index = index, "failover action applied"),
            }
        }
        // A CAS that lost (the node heartbeated, another holder acted): nothing to do.
        Ok((_, Err(r))) => tracing::debug!(action, rejection = %r, "failover action refused"),
        Err(e) => tracing::debug!(action, error = %e, "failover action not landed"),
    }
}
