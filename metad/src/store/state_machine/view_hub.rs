//! The applied view in memory ([`ViewHub`]): what the client, admin and watch
//! services read, and the recent deltas watchers resume from. Its own file: the state
//! machine only writes it; every reader of the view knows it alone.

use crate::raft_types::{LogId, StoredMembership};
use std::collections::VecDeque;
use std::sync::{Arc, RwLock};
use tokio::sync::{broadcast, watch};
use weir_meta::model::state::{Delta, State};

/// How many recent deltas a watcher can resume from without a new snapshot, and about
/// how many bytes of them: a commit's delta carries a row per stream it touched, so a
/// count alone let the kept deltas grow to gigabytes on a busy cluster (the soak's
/// metad grew 85 MiB a minute with 1,000 partitions).
const RECENT_DELTAS: usize = 16_384;
const RECENT_BYTES: usize = 32 << 20;
/// Deltas a watcher may fall behind the live ones before it resumes from the kept
/// deltas (or a snapshot); the channel keeps each until every watcher has read it.
const LIVE_DELTAS: usize = 1_024;
/// A change's rough size in memory, for [`RECENT_BYTES`] (a stream row is ~300 bytes).
const CHANGE_BYTES: usize = 320;

/// What a watcher receives.
#[derive(Clone, Debug)]
pub enum WatchItem {
    /// The changes of one applied entry, in index order.
    Delta(Arc<Delta>),
    /// The state was replaced by a snapshot install: start again from a snapshot.
    Reset,
}

pub(super) struct ViewInner {
    pub(super) state: State,
    pub(super) last_applied: Option<LogId>,
    pub(super) membership: StoredMembership,
    pub(super) recent: VecDeque<Arc<Delta>>,
    /// About how many bytes `recent` holds.
    pub(super) recent_bytes: usize,
}

/// The applied view in memory, shared by the state machine (writer) and the client,
/// admin and watch services (readers), and the index of the last batch written.
pub struct ViewHub {
    inner: RwLock<ViewInner>,
    pub(super) tx: broadcast::Sender<WatchItem>,
    /// The applied index whose batch (view and index rows) is in the store.
    pub(super) durable: watch::Sender<u64>,
    /// Snapshot installs begun and ended; odd while one replaces the store, whose rows
    /// a watch snapshot then must not read.
    pub(super) installs: std::sync::atomic::AtomicU64,
}

/// How a new watcher starts: from a backlog of deltas after its index, or, when
/// `snapshot`, from a snapshot of the store ([`StateMachineStore::watch_snapshot`])
/// followed by the deltas of `backlog` after it (every delta kept in memory) and `rx`.
///
/// [`StateMachineStore::watch_snapshot`]: super::StateMachineStore::watch_snapshot
pub struct WatchStart {
    pub snapshot: bool,
    pub backlog: Vec<Arc<Delta>>,
    pub rx: broadcast::Receiver<WatchItem>,
}

impl ViewHub {
    pub(super) fn new(state: State, last_applied: Option<LogId>, membership: StoredMembership) -> Self {
        let (tx, _) = broadcast::channel(LIVE_DELTAS);
        let durable = watch::channel(state.applied_index).0;
        Self {
            inner: RwLock::new(ViewInner {
                state,
                last_applied,
                membership,
                recent: VecDeque::new(),
                recent_bytes: 0,
            }),
            tx,
            durable,
            installs: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(super) fn read(&self) -> std::sync::RwLockReadGuard<'_, ViewInner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn write(&self) -> std::sync::RwLockWriteGuard<'_, ViewInner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` over the applied view.
    pub fn with_state<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.read().state)
    }

    pub fn applied_index(&self) -> u64 {
        self.read().state.applied_index
    }

    /// The applied index whose rows, view and index alike, are in the store.
    pub fn durable_index(&self) -> u64 {
        *self.durable.borrow()
    }

    /// Changes each time a batch of entries is applied and stored: the loops that plan
    /// from the view wake on it.
    pub fn applied_changes(&self) -> watch::Receiver<u64> {
        self.durable.subscribe()
    }

    /// Waits until the store holds what was applied through `index`.
    pub async fn wait_durable(&self, index: u64) {
        let _ = self.durable.subscribe().wait_for(|i| *i >= index).await;
    }

    /// Subscribes a watcher that has applied through `after` (or nothing).
    pub fn subscribe(&self, after: Option<u64>) -> WatchStart {
        let inner = self.read();
        let rx = self.tx.subscribe();
        let applied = inner.state.applied_index;
        let resumable = after
            .filter(|a| *a <= applied && (*a == applied || inner.recent.front().is_some_and(|d| d.index <= a + 1)));
        match resumable {
            Some(a) => WatchStart {
                snapshot: false,
                backlog: inner.recent.iter().filter(|d| d.index > a).cloned().collect(),
                rx,
            },
            // Not a copy of the view: the snapshot is read from the store, outside any
            // lock (a million rows took the view's lock for the length of a copy).
            None => WatchStart {
                snapshot: true,
                backlog: inner.recent.iter().cloned().collect(),
                rx,
            },
        }
    }

    pub(super) fn publish(inner: &mut ViewInner, tx: &broadcast::Sender<WatchItem>, delta: Delta) {
        let delta = Arc::new(delta);
        inner.recent_bytes += delta_bytes(&delta);
        inner.recent.push_back(delta.clone());
        while inner.recent.len() > RECENT_DELTAS || (inner.recent_bytes > RECENT_BYTES && inner.recent.len() > 1) {
            if let Some(old) = inner.recent.pop_front() {
                inner.recent_bytes -= delta_bytes(&old);
            }
        }
        // No receivers is fine: nobody watches yet.
        let _ = tx.send(WatchItem::Delta(delta));
    }
}

fn delta_bytes(delta: &Delta) -> usize {
    (delta.changes.len() + 1) * CHANGE_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_meta::model::{Change, RowKey};
    use weir_shared::ids::StreamId;

    fn delta(index: u64, changes: usize) -> Delta {
        Delta {
            index,
            changes: (0..changes as u64)
                .map(|s| Change {
                    key: RowKey::Stream(StreamId(s)),
                    row: None,
                })
                .collect(),
        }
    }

    /// The deltas kept for resuming watchers stay within their byte budget however
    /// large each is, and a watcher just behind still resumes without a snapshot.
    #[test]
    fn recent_deltas_are_bounded_by_bytes_and_the_latest_stay_resumable() {
        let hub = ViewHub::new(State::default(), None, StoredMembership::default());
        for index in 1..=2_000 {
            let mut inner = hub.write();
            inner.state.applied_index = index;
            ViewHub::publish(&mut inner, &hub.tx, delta(index, 1_000));
        }
        let inner = hub.read();
        assert!(inner.recent_bytes <= RECENT_BYTES, "{} bytes kept", inner.recent_bytes);
        assert!(
            inner.recent.len() < 2_000 && inner.recent.len() > 10,
            "{} deltas kept",
            inner.recent.len()
        );
        assert_eq!(inner.recent.back().map(|d| d.index), Some(2_000));
        drop(inner);
        let start = hub.subscribe(Some(1_990));
        assert!(!start.snapshot);
        assert_eq!(start.backlog.len(), 10);
        assert!(hub.subscribe(Some(5)).snapshot, "too far behind: a snapshot");
    }
}
