//! The streams this incarnation serves, by handle. A stream the view shows open here
//! (placed on this incarnation and opened by it at its stream epoch) gets its handle
//! on first use, not at open: an idle stream costs only its row in the view, and a
//! node opens a hundred thousand streams with a hundred entries and no allocation per
//! stream (D-23). A stream this incarnation stopped serving is not served at that
//! epoch again, even while the view still shows it open here (a close that landed
//! before the view applied it): its appends would be lost to the next owner.

use super::Node;
use crate::error::StreamdError;
use crate::stream::StreamHandle;
use std::sync::Arc;
use weir_meta::model::{StreamRow, StreamState};
use weir_shared::ids::StreamId;

impl Node {
    /// The served stream named `name`, or why it is not served here.
    pub fn stream(&self, name: &str) -> Result<Arc<StreamHandle>, StreamdError> {
        if self.fenced.is_cancelled() {
            return Err(StreamdError::Fenced);
        }
        if !self.is_admitted() {
            return Err(StreamdError::Unavailable(
                "node is catching up with the metadata log".into(),
            ));
        }
        let (id, owner) = self
            .view
            .with(|s| {
                s.stream_by_name(name)
                    .map(|row| (row.id, row.owner.as_ref().map(|o| o.to_string())))
            })
            .ok_or_else(|| StreamdError::NotFound(name.to_string()))?;
        match self.handle(id) {
            Some(h) if h.is_serving() => Ok(h),
            _ => Err(StreamdError::NotOwner {
                stream: name.to_string(),
                owner,
            }),
        }
    }

    /// The handle of stream `id` if this incarnation serves it: the one in use, or a
    /// new one when the view shows the stream open here and it has none yet.
    pub fn handle(&self, id: StreamId) -> Option<Arc<StreamHandle>> {
        if let Some(h) = self.served(id) {
            return Some(h);
        }
        if self.fenced.is_cancelled() || !self.is_admitted() {
            return None;
        }
        let row = self.view.with(|s| {
            s.streams
                .get(&id)
                .filter(|r| r.state == StreamState::Open && r.owner.as_ref() == Some(&self.me))
                .cloned()
        })?;
        if self.stopped_at(id) == Some(row.epoch) {
            return None;
        }
        let mut streams = self.streams.write().unwrap_or_else(|p| p.into_inner());
        let handle = streams.entry(id).or_insert_with(|| Arc::new(handle_of(&row)));
        Some(handle.clone())
    }

    /// The handle of stream `id` if one is in use here; none is made.
    pub fn served(&self, id: StreamId) -> Option<Arc<StreamHandle>> {
        self.streams.read().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }

    /// The handles in use.
    pub fn all_streams(&self) -> Vec<Arc<StreamHandle>> {
        self.streams
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The ids of the streams with a handle in use.
    pub fn served_ids(&self) -> Vec<StreamId> {
        self.streams
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// The streams the view shows open on this incarnation, with a handle or not.
    pub fn open_here(&self) -> Vec<StreamId> {
        self.view.with(|s| {
            s.streams
                .owned(&self.me)
                .map(|o| o.open.iter().copied().collect())
                .unwrap_or_default()
        })
    }

    /// The streams with a handle or open here: what a loop working per stream looks at
    /// when it must look at every one (after a snapshot).
    pub fn served_or_open(&self) -> Vec<StreamId> {
        let mut ids = self.served_ids();
        ids.extend(self.open_here());
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The streams with a handle or placed here in any state: what reconciliation
    /// looks at when it must look at every one (after a snapshot).
    pub fn served_or_owned(&self) -> Vec<StreamId> {
        let mut ids = self.served_ids();
        self.view.with(|s| {
            if let Some(owned) = s.streams.owned(&self.me) {
                ids.extend(owned.open.iter().chain(&owned.closed).chain(&owned.deleted).copied());
            }
        });
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// How many streams the view shows open on this incarnation.
    pub fn served_count(&self) -> usize {
        self.view
            .with(|s| s.streams.owned(&self.me).map_or(0, |o| o.open.len()))
    }

    pub(super) fn remove_stream(&self, id: StreamId, end: u64) -> Option<Arc<StreamHandle>> {
        let removed = self.streams.write().unwrap_or_else(|p| p.into_inner()).remove(&id);
        self.stopped_serving(id, end, removed.as_ref());
        removed
    }

    /// Stops serving `handle`, unless the stream is already served at another epoch.
    pub(super) fn remove_served(&self, handle: &Arc<StreamHandle>, end: u64) {
        let removed = {
            let mut streams = self.streams.write().unwrap_or_else(|p| p.into_inner());
            let same = streams
                .get(&handle.id)
                .is_some_and(|served| Arc::ptr_eq(served, handle));
            if !same {
                return;
            }
            streams.remove(&handle.id)
        };
        self.stopped_serving(handle.id, end, removed.as_ref());
    }

    fn stopped_serving(&self, id: StreamId, end: u64, removed: Option<&Arc<StreamHandle>>) {
        if let Some(h) = removed {
            self.stopped
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, h.epoch);
            h.stop();
        }
        // Its records up to `end` are committed; the rest are no longer this
        // incarnation's to upload.
        self.wal.reclaim([(id, end)]);
        self.ranges.forget(id);
    }

    /// The epoch this incarnation stopped serving `id` at, while the view may still
    /// show it open here at that epoch.
    fn stopped_at(&self, id: StreamId) -> Option<weir_shared::ids::StreamEpoch> {
        self.stopped.lock().unwrap_or_else(|p| p.into_inner()).get(&id).copied()
    }

    /// Forgets that `id` was stopped once the view no longer shows it open here at the
    /// epoch it was stopped at (reconciliation looks at every stream whose row changed).
    pub(super) fn forget_stopped_if_settled(&self, id: StreamId) {
        let mut stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        let Some(epoch) = stopped.get(&id).copied() else { return };
        let settled = self.view.with(|s| {
            s.streams
                .get(&id)
                .is_none_or(|r| r.state != StreamState::Open || r.owner.as_ref() != Some(&self.me) || r.epoch != epoch)
        });
        if settled {
            stopped.remove(&id);
        }
    }
}

/// A handle for `row`, open here: its epoch, the leader epoch its open recorded, and
/// its offsets. Nothing is appended to a stream before it has a handle, so its
/// committed end is still where the open left it, and its producer state is rebuilt
/// from there on first need.
fn handle_of(row: &StreamRow) -> StreamHandle {
    let leader_epoch = weir_meta::model::leader_epochs::stamped_at(row, row.epoch);
    StreamHandle::new(
        row.id,
        row.name.clone(),
        row.epoch,
        leader_epoch,
        row.start_offset.0,
        row.committed_end.0,
    )
}
