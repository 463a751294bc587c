//! Completing a decided transaction: its markers written into every partition, then
//! its completion stored, on a task of its own per transactional id. Its own file: an
//! EndTxn, a fencing InitProducerId, a new owner and the tick all start it.

use super::{TxnCoordinator, Txns};
use crate::coordinators::txn::peer_calls::Sent;
use crate::coordinators::txn::state;
use crate::error::StreamdError;
use crate::partition::marker::Marker;
use std::sync::Arc;
use weir_meta::model::now_ms;

impl Txns {
    /// Writes the markers of `id`'s decided transaction, then completes it, on a task
    /// of its own (unless one is already at it).
    pub(super) fn complete_later(self: &Arc<Self>, c: &Arc<TxnCoordinator>, id: &str) {
        if !c
            .completing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string())
        {
            return;
        }
        let (txns, c, id) = (self.clone(), c.clone(), id.to_string());
        let about = Some(format!("{} {id}", c.stream));
        self.core
            .tasks()
            .spawn("txn", "transaction markers", about, async move {
                txns.complete(&c, &id).await;
                c.completing.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            });
    }

    async fn complete(&self, c: &Arc<TxnCoordinator>, id: &str) {
        let Some(decided) = c.entry(id).filter(|e| e.state.is_prepared()) else {
            return;
        };
        let marker = Marker {
            producer_id: decided.producer_id,
            epoch: decided.epoch,
            commit: decided.state == state::TxnState::PrepareCommit,
            coordinator_epoch: i32::try_from(c.epoch.0).unwrap_or(i32::MAX),
        };
        let writes = decided
            .partitions
            .iter()
            .map(|stream| async move { (stream, self.peers.send(&self.core, stream, marker, &c.stop).await) });
        for (stream, sent) in futures::future::join_all(writes).await {
            match sent {
                Some(Sent::Written) => {}
                Some(Sent::Obsolete(why)) => {
                    tracing::warn!(transactional_id = id, stream = %stream, reason = %why, "transaction marker not written: obsolete")
                }
                // The state stream moved: its next owner resumes the markers.
                None => return,
            }
        }
        let _decide = c.decide.lock().await;
        let Some(done) = c
            .entry(id)
            .filter(|e| *e == decided)
            .and_then(|e| state::complete(&e, now_ms()))
        else {
            return;
        };
        let stored = if weir_shared::failpoint::fails("txn_completion") {
            // Tests: the completion cannot be stored (the state stream refuses it).
            Err(StreamdError::Unavailable("failpoint txn_completion".into()))
        } else {
            self.store(c, id, &done).await
        };
        match stored {
            Ok(()) => {
                c.completed.notify_waiters();
                tracing::info!(
                    transactional_id = id,
                    producer_id = decided.producer_id,
                    epoch = decided.epoch,
                    outcome = done.state.name(),
                    partitions = decided.partitions.len(),
                    "transaction completed"
                )
            }
            Err(e) => {
                tracing::warn!(transactional_id = id, error = %e, "transaction completion not stored; its next coordinator completes it")
            }
        }
    }
}
