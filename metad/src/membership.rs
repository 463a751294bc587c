//! Registration at a new epoch on every start, and the heartbeat that keeps an
//! incarnation alive in the failover clock (FO-LIV-1, FO-LIV-10). Used by streamd
//! and gatewayd.

use crate::client::{ClientError, MetadClient};
use crate::model::{Applied, Command, NodeAddrs, NodeKind, Proposer, RejectCode};
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
/// of after the node timeout. Logged either way; a failure leaves it to the timeout.
pub async fn fence_self(metad: &MetadClient, me: &Incarnation) {
    match metad.propose(&Proposer::Node(me.clone()), Command::FenceSelf).await {
        Ok((index, Ok(_))) => tracing::info!(node_id = %me.node, epoch = %me.epoch, log_index = index, "fenced self"),
        Ok((_, Err(r))) => tracing::warn!(rejection = %r, "self-fence refused"),
        Err(e) => tracing::warn!(error = %e, "self-fence not landed; the node timeout will fence it"),
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
pub async fn heartbeat_loop(
    metad: &MetadClient,
    me: &Incarnation,
    interval: Duration,
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
        match metad.propose(&proposer, Command::Heartbeat).await {
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
