//! A coordinator's periodic upkeep while its stream is served here: decided transactions
//! taken up again, timed-out ones aborted, expired ids forgotten, and snapshots. Its own
//! file: no client request runs it.

use super::{TxnCoordinator, Txns, TICK};
use crate::coordinators::state_stream;
use crate::coordinators::txn::log::{self, Change};
use crate::coordinators::txn::state;
use std::sync::{Arc, Weak};
use weir_meta::model::now_ms;

impl Txns {
    /// Completes decided transactions nobody is completing, aborts transactions past
    /// their timeout, forgets ids idle past their expiration, and snapshots the table
    /// when due.
    async fn expire(self: &Arc<Self>, c: &Arc<TxnCoordinator>) {
        let now = now_ms();
        let (prepared, timed_out, expired): (Vec<_>, Vec<_>, Vec<_>) = {
            let table = c.table.lock().unwrap_or_else(|p| p.into_inner());
            let prepared = table
                .iter()
                .filter(|(_, e)| e.state.is_prepared())
                .map(|(id, _)| id.clone())
                .collect();
            let timed_out = table
                .iter()
                .filter(|(_, e)| state::abort_if_timed_out(e, now).is_some())
                .map(|(id, _)| id.clone())
                .collect();
            let expired = table
                .iter()
                .filter(|(_, e)| state::expired(e, self.limits.id_expiration_ms, now))
                .map(|(id, _)| id.clone())
                .collect();
            (prepared, timed_out, expired)
        };
        // A decided transaction whose completion could not be stored (its writer gave
        // up) is taken up again; one being written is left to its writer.
        for id in &prepared {
            self.complete_later(c, id);
        }
        for id in timed_out {
            let _decide = c.decide.lock().await;
            let Some(aborting) = c.entry(&id).and_then(|e| state::abort_if_timed_out(&e, now_ms())) else {
                continue;
            };
            match self.store(c, &id, &aborting).await {
                Ok(()) => {
                    tracing::info!(transactional_id = %id, producer_id = aborting.producer_id, epoch = aborting.epoch, "transaction timed out; aborting it");
                    self.complete_later(c, &id);
                }
                Err(e) => tracing::warn!(transactional_id = %id, error = %e, "timed-out transaction not aborted yet"),
            }
        }
        if !expired.is_empty() {
            let _decide = c.decide.lock().await;
            let still: Vec<Change> = expired
                .into_iter()
                .filter(|id| {
                    c.entry(id)
                        .is_some_and(|e| state::expired(&e, self.limits.id_expiration_ms, now_ms()))
                })
                .map(|id| Change::Forget { id })
                .collect();
            if let Err(e) = self.store_changes(c, still).await {
                tracing::warn!(stream = %c.stream, error = %e, "expired transactional ids not forgotten yet");
            }
        }
        self.maybe_snapshot(c);
    }

    fn maybe_snapshot(&self, c: &Arc<TxnCoordinator>) {
        let due = {
            let table = c.table.lock().unwrap_or_else(|p| p.into_inner());
            state_stream::snapshot_due(table.changes_since_snapshot(), table.len() as u64)
        };
        if due && c.log.begin_snapshot() {
            let (core, c) = (self.core.clone(), c.clone());
            let about = Some(c.stream.clone());
            self.core
                .tasks()
                .spawn("txn", "transaction state snapshot", about, async move {
                    let table = || c.table.lock().unwrap_or_else(|p| p.into_inner());
                    let stored = c
                        .log
                        .snapshot(
                            &core,
                            &c.stream,
                            || {
                                let t = table();
                                (t.snapshot(), t.changes_since_snapshot(), None)
                            },
                            log::encode,
                            || table().snapshotted(),
                            "transaction state",
                        )
                        .await;
                    if let Err(e) = stored {
                        tracing::warn!(stream = %c.stream, error = %e, "transaction state snapshot failed; will retry");
                    }
                    c.log.end_snapshot();
                });
        }
    }
}

/// Runs [`Txns::expire`] every [`TICK`] while the coordinator's stream is served here
/// at its epoch; then stops it, so its successor alone writes what is left.
pub(super) async fn tick(txns: Weak<Txns>, c: Arc<TxnCoordinator>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = c.stop.cancelled() => return,
        }
        let Some(txns) = txns.upgrade() else { return };
        let served = txns.core.serving_epoch(&c.stream) == Some(c.epoch);
        if !served {
            c.stop.cancel();
            txns.coordinators.remove(&c.stream, &c).await;
            return;
        }
        txns.expire(&c).await;
    }
}
