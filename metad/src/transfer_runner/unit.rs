//! One unit of transfers, from its marks to its streams' activation: `BeginTransfers`,
//! the owner's close within the prepare bound (after a quorum read), then the wait for
//! each destination to open its streams. Its own file: drains and single transfers share it.

use super::TransferRunner;
use crate::metrics::metrics;
use std::time::Duration;
use tokio::time::Instant;
use weir_meta::drain_plan::{prepare_bound, Moved, Planned, Reason};
use weir_meta::model::{Applied, Command, State, StreamState, TransferTo};
use weir_proto::streamd::streamd_client::StreamdClient;
use weir_proto::streamd::CloseStreamsRequest;
use weir_shared::ids::{Epoch, Incarnation, NodeId, StreamEpoch, StreamId};

impl TransferRunner {
    /// One unit of planned transfers, bounded by `unit` (SD-DRN-2, SD-DRN-6,
    /// SD-DRN-7): what became of each stream, in order.
    pub(super) async fn move_batch(
        &self,
        batch: Vec<Planned>,
        owner: &Incarnation,
        unit: Duration,
        reason: Reason,
    ) -> Vec<Moved> {
        let deadline = Instant::now() + unit;
        let moved = self.try_move_batch(&batch, owner, unit, deadline).await;
        for (p, moved) in batch.iter().zip(&moved) {
            let outcome = if moved.moved { "moved" } else { "failed" };
            metrics().transfers.with_label_values(&[outcome, reason.label()]).inc();
            match &moved.error {
                None => {
                    tracing::info!(stream = p.name, from = %owner, to = moved.to.as_deref().unwrap_or(""), reason = reason.label(), closed_at = moved.closed_at, "stream transferred")
                }
                Some(e) => {
                    tracing::warn!(stream = p.name, from = %owner, to = %p.target, reason = reason.label(), error = %e, "stream not transferred")
                }
            }
        }
        moved
    }

    async fn try_move_batch(
        &self,
        batch: &[Planned],
        owner: &Incarnation,
        unit: Duration,
        deadline: Instant,
    ) -> Vec<Moved> {
        let mut out: Vec<Option<Moved>> = vec![None; batch.len()];
        let Some(addr) = self
            .hub
            .with_state(|s| s.nodes.get(&owner.node).map(|n| n.addrs.grpc.clone()))
        else {
            return batch
                .iter()
                .map(|p| Moved::failed(&p.name, format!("node '{}' is not registered", owner.node)))
                .collect();
        };
        // The streams still open on the owner, each held by this transfer alone.
        let mut begun = Vec::new();
        let mut holds = Vec::new();
        for (i, p) in batch.iter().enumerate() {
            let epoch = self.hub.with_state(|s| {
                let row = s.streams.get(&p.stream)?;
                (row.state == StreamState::Open && row.owner.as_ref() == Some(owner)).then_some(row.epoch)
            });
            let Some(epoch) = epoch else {
                out[i] = Some(Moved::failed(
                    &p.name,
                    format!("stream '{}' is no longer open on {owner}", p.name),
                ));
                continue;
            };
            // The mark this transfer sets is its own until it ends (RR-INT-4).
            let Some(holding) = self.running.hold(p.stream) else {
                out[i] = Some(Moved::failed(
                    &p.name,
                    format!("a transfer of stream '{}' is already running", p.name),
                ));
                continue;
            };
            holds.push(holding);
            begun.push((i, epoch));
        }
        let begin = Command::BeginTransfers {
            transfers: begun
                .iter()
                .map(|&(i, stream_epoch)| TransferTo {
                    stream: batch[i].stream,
                    stream_epoch,
                    target: batch[i].target.clone(),
                })
                .collect(),
        };
        let mut gates = Vec::new();
        if !begun.is_empty() {
            match self.propose(self.operator(), begin).await {
                Ok((op, Ok(Applied::Each { outcomes }))) => {
                    for (&(i, epoch), outcome) in begun.iter().zip(outcomes) {
                        match outcome {
                            Ok(_) => gates.push(Gate {
                                i,
                                stream: batch[i].stream,
                                op,
                                epoch,
                                begun: self.begun_with(batch[i].stream),
                            }),
                            Err(r) => {
                                out[i] = Some(Moved::failed(
                                    &batch[i].name,
                                    format!("transfer refused: {}", r.message),
                                ))
                            }
                        }
                    }
                }
                Ok((_, Ok(other))) => {
                    for &(i, _) in &begun {
                        out[i] = Some(Moved::failed(
                            &batch[i].name,
                            format!("unexpected answer to BeginTransfers: {other:?}"),
                        ));
                    }
                }
                Ok((_, Err(r))) => {
                    for &(i, _) in &begun {
                        out[i] = Some(Moved::failed(
                            &batch[i].name,
                            format!("transfer refused: {}", r.message),
                        ));
                    }
                }
                Err(e) => {
                    for &(i, _) in &begun {
                        out[i] = Some(Moved::failed(&batch[i].name, e.message().to_string()));
                    }
                }
            }
        }
        // Preparation: the owner closes the unit's streams; each close hands its stream
        // to its target in the same entry (SD-DRN-2).
        let prepare = prepare_bound(unit);
        let closed = match tokio::time::timeout(prepare, self.prepare(&gates, batch, &addr, prepare)).await {
            Ok(closed) => closed,
            Err(_) => gates
                .iter()
                .map(|_| Err(format!("prepare did not finish within {prepare:?}")))
                .collect(),
        };
        let mut activating = Vec::new();
        for (gate, closed) in gates.iter().zip(closed) {
            let p = &batch[gate.i];
            match closed {
                Ok(end) => activating.push((gate, end)),
                Err(why) => {
                    self.cancel(gate.stream, gate.op).await;
                    // The close may still have landed just as the bound ended.
                    if self.hub.with_state(|s| owned_by(s, gate.stream, owner)) {
                        out[gate.i] = Some(Moved::failed(&p.name, why));
                    } else {
                        tracing::info!(
                            stream = p.name,
                            "the owner's close landed after the prepare bound; waiting for activation"
                        );
                        activating.push((gate, 0));
                    }
                }
            }
        }
        // Activation: each destination opens its streams at the next epoch (SD-DRN-2 step 5).
        let mut applied = self.hub.applied_changes();
        loop {
            activating.retain(|(gate, closed_at)| {
                let p = &batch[gate.i];
                // RR-INT-5: a target restarted since the transfer began makes it void,
                // whatever placement does with the stream next.
                if self.target_restarted(&p.target, &gate.begun) {
                    out[gate.i] = Some(Moved {
                        error: Some(restarted(&p.target)),
                        ..Moved::toward(&p.name, &p.target, Some(*closed_at))
                    });
                    return false;
                }
                let opened = self.hub.with_state(|s| {
                    s.streams.get(&gate.stream).and_then(|r| {
                        (r.state == StreamState::Open && r.epoch > gate.epoch)
                            .then(|| r.owner.as_ref().map(|o| o.node.clone()))
                            .flatten()
                    })
                });
                match opened {
                    Some(at) => {
                        out[gate.i] = Some(Moved {
                            moved: true,
                            ..Moved::toward(&p.name, &at, Some(*closed_at))
                        });
                        false
                    }
                    None => true,
                }
            });
            if activating.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                for (gate, closed_at) in &activating {
                    let p = &batch[gate.i];
                    out[gate.i] = Some(Moved {
                        error: Some(format!(
                            "closed, but '{}' did not open it within the unit's bound",
                            p.target
                        )),
                        ..Moved::toward(&p.name, &p.target, Some(*closed_at))
                    });
                }
                break;
            }
            tokio::select! {
                _ = applied.changed() => {}
                _ = tokio::time::sleep_until(deadline.min(Instant::now() + ACTIVATION_RECHECK)) => {}
            }
        }
        drop(holds);
        out.into_iter()
            .zip(batch)
            .map(|(m, p)| m.unwrap_or_else(|| Moved::failed(&p.name, "not tried")))
            .collect()
    }

    /// Asks the owner to close the gates' streams within `bound`; for each gate, its
    /// committed end, or why it did not close. Not a stream whose target restarted
    /// since the transfer began (RR-INT-5), nor one whose mark is no longer this
    /// transfer's (RR-INT-4): it stays put.
    async fn prepare(
        &self,
        gates: &[Gate],
        batch: &[Planned],
        addr: &str,
        bound: Duration,
    ) -> Vec<Result<u64, String>> {
        let deadline = Instant::now() + bound;
        let mut results: Vec<Result<u64, String>> = gates.iter().map(|_| Err("not asked".to_string())).collect();
        if gates.is_empty() {
            return results;
        }
        weir_shared::failpoint::pause("transfer_prepare").await;
        // A deposed coordinator's mark may already be discarded by the next leader, whose
        // discard its own view has not seen yet: it asks for no close unless a quorum
        // still confirms it leads.
        if let Err(why) = self.confirm_leading(deadline).await {
            return gates.iter().map(|_| Err(why.clone())).collect();
        }
        // Judged after the quorum read, so on a view at least as new as the log it
        // confirmed.
        let mut asked = Vec::new();
        for (k, gate) in gates.iter().enumerate() {
            let target = &batch[gate.i].target;
            if self.target_restarted(target, &gate.begun) {
                results[k] = Err(restarted(target));
                continue;
            }
            let held = self.hub.with_state(|s| {
                s.streams
                    .get(&gate.stream)
                    .is_some_and(|r| r.transfer_target.is_some() && r.transfer_op == Some(gate.op))
            });
            if !held {
                results[k] = Err(format!(
                    "the transfer's mark (operation {}) is no longer in the log",
                    gate.op
                ));
                continue;
            }
            asked.push(k);
        }
        // Only the time this prepare has left; a close asked with (almost) none would
        // get the owner's default instead, so none is asked.
        let left = deadline.saturating_duration_since(Instant::now());
        if left < MIN_CLOSE_TIME || asked.is_empty() {
            for &k in &asked {
                results[k] = Err("no time left in the prepare bound for the close".into());
            }
            return results;
        }
        let channel = match weir_shared::grpc::channel(addr) {
            Ok(c) => c,
            Err(e) => {
                for &k in &asked {
                    results[k] = Err(format!("owner address '{addr}': {e}"));
                }
                return results;
            }
        };
        let request = CloseStreamsRequest {
            streams: asked.iter().map(|&k| batch[gates[k].i].name.clone()).collect(),
            timeout_ms: left.as_millis() as u64,
        };
        match StreamdClient::new(channel).close_streams(request).await {
            Ok(reply) => {
                for (&k, closed) in asked.iter().zip(reply.into_inner().streams) {
                    results[k] = if closed.error.is_empty() {
                        Ok(closed.end_offset)
                    } else {
                        Err(closed.error)
                    };
                }
            }
            Err(status) => {
                for &k in &asked {
                    results[k] = Err(status.message().to_string());
                }
            }
        }
        results
    }

    /// Confirms by a quorum read that this replica still leads. A round that misses its
    /// quorum (one slow or partitioned follower) is tried again while this replica
    /// leads, up to `deadline`.
    async fn confirm_leading(&self, deadline: Instant) -> Result<(), String> {
        let lost = || "lost the metadata leadership before asking the owner to close".to_string();
        let unconfirmed =
            || "the metadata leadership was not confirmed by a quorum within the prepare bound".to_string();
        loop {
            if !self.leading() {
                return Err(lost());
            }
            let round = tokio::time::timeout_at(deadline, self.raft.ensure_linearizable()).await;
            match round {
                Ok(Ok(_)) if self.leading() => return Ok(()),
                Ok(Ok(_)) => return Err(lost()),
                Ok(Err(e)) => tracing::debug!(error = %e, "quorum read before a transfer's close failed; trying again"),
                Err(_) => return Err(unconfirmed()),
            }
            if Instant::now() >= deadline {
                return Err(unconfirmed());
            }
            tokio::time::sleep(QUORUM_RETRY).await;
        }
    }

    /// The target incarnation's epoch a begun transfer of `stream` recorded.
    fn begun_with(&self, stream: StreamId) -> Option<Epoch> {
        self.hub
            .with_state(|s| s.streams.get(&stream).and_then(|r| r.transfer_target_epoch))
    }

    /// Whether `target` is no longer at the epoch the transfer began with.
    fn target_restarted(&self, target: &NodeId, begun: &Option<Epoch>) -> bool {
        let Some(begun) = begun else { return false };
        self.hub
            .with_state(|s| s.nodes.get(target).is_none_or(|n| n.epoch != *begun))
    }

    /// Releases this transfer's own mark, exactly by its op: a mark another transfer set
    /// since stays. Best effort: the owner's next close or the leader's reconciliation
    /// clears it otherwise.
    async fn cancel(&self, stream: StreamId, op: u64) {
        let discard = Command::DiscardTransfer {
            stream,
            op,
            reason: "its coordinator cancelled it".into(),
        };
        if let Err(e) = self.propose(self.operator(), discard).await {
            tracing::warn!(stream = %stream, error = %e.message(), "transfer mark not released; the owner's next close or the leader's reconciliation clears it");
        }
    }
}

/// The least time left in a prepare for which the owner is still asked to close.
const MIN_CLOSE_TIME: Duration = Duration::from_millis(100);

/// The pause between quorum reads that missed their quorum.
const QUORUM_RETRY: Duration = Duration::from_millis(50);

fn owned_by(state: &State, stream: StreamId, owner: &Incarnation) -> bool {
    state
        .streams
        .get(&stream)
        .is_some_and(|r| r.state == StreamState::Open && r.owner.as_ref() == Some(owner))
}

/// A begun transfer's gate in the log: its place in the unit, its stream and the
/// stream epoch it was begun at, its operation id (the `BeginTransfers`' log index)
/// and the destination epoch it recorded.
struct Gate {
    i: usize,
    stream: StreamId,
    op: u64,
    epoch: StreamEpoch,
    begun: Option<Epoch>,
}

/// How often activation looks again when nothing is applied.
const ACTIVATION_RECHECK: Duration = Duration::from_millis(100);

/// RR-INT-5: the report of a transfer whose target restarted during it.
fn restarted(target: &NodeId) -> String {
    format!("destination node '{target}' changed process incarnation during ownership handoff")
}
