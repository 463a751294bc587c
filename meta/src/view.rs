//! A node's mirror of the metadata view (streamd, gatewayd), followed through metad's
//! watch API: a snapshot in bounded chunks, then the delta of every applied entry in
//! index order. A frame the node cannot decode or apply is logged with its cause and
//! makes the node not ready (`/ready` says why) until a fresh snapshot replaces it.

use crate::client::MetadClient;
use crate::model::{codec, Delta, Row, RowKey, State};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use weir_proto::metad::watch_event::Kind;
use weir_proto::metad::WatchEvent;
use weir_shared::ids::StreamId;

/// The mirrored state, a signal of its applied index, why it cannot follow, if so, and
/// the trackers of changed streams of the loops that work per stream.
pub struct View {
    state: RwLock<State>,
    applied: watch::Sender<u64>,
    error: Mutex<Option<String>>,
    trackers: Mutex<Vec<Weak<Changed>>>,
}

impl Default for View {
    fn default() -> Self {
        Self {
            state: RwLock::new(State::default()),
            applied: watch::channel(0).0,
            error: Mutex::new(None),
            trackers: Mutex::new(Vec::new()),
        }
    }
}

/// The streams whose rows changed since a loop last took them (D-23): the loop visits
/// those, not every stream. A new tracker, and every tracker after the view is replaced
/// by a snapshot, reports `All`: the loop then visits every stream it cares about once.
#[derive(Default)]
pub struct Changed {
    inner: Mutex<ChangedInner>,
}

#[derive(Default)]
struct ChangedInner {
    all: bool,
    ids: HashSet<StreamId>,
}

/// What changed since the last [`Changed::take`].
#[derive(Debug, PartialEq, Eq)]
pub enum ChangedStreams {
    /// Anything may have: look at every stream.
    All,
    /// These streams' rows were written or removed.
    Some(HashSet<StreamId>),
}

impl Changed {
    fn lock(&self) -> std::sync::MutexGuard<'_, ChangedInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes what changed, leaving nothing.
    pub fn take(&self) -> ChangedStreams {
        let mut inner = self.lock();
        if std::mem::take(&mut inner.all) {
            inner.ids = HashSet::new();
            return ChangedStreams::All;
        }
        ChangedStreams::Some(std::mem::take(&mut inner.ids))
    }

    fn mark_all(&self) {
        let mut inner = self.lock();
        inner.all = true;
        inner.ids = HashSet::new();
    }
}

impl View {
    pub fn with<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.state.read().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn applied_index(&self) -> u64 {
        *self.applied.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// Waits until the view has applied through `index`.
    pub async fn wait_applied(&self, index: u64) {
        let mut rx = self.subscribe();
        let _ = rx.wait_for(|i| *i >= index).await;
    }

    /// A tracker of the streams that change from now on; it first reports `All`.
    pub fn track(&self) -> Arc<Changed> {
        let changed = Arc::new(Changed::default());
        changed.mark_all();
        let mut trackers = self.trackers.lock().unwrap_or_else(|p| p.into_inner());
        trackers.retain(|t| t.strong_count() > 0);
        trackers.push(Arc::downgrade(&changed));
        changed
    }

    /// Tells every live tracker what a delta, or a whole new state (`None`), changed.
    fn notify(&self, delta: Option<&Delta>) {
        let trackers = self.trackers.lock().unwrap_or_else(|p| p.into_inner());
        for tracker in trackers.iter().filter_map(Weak::upgrade) {
            match delta {
                None => tracker.mark_all(),
                Some(delta) => {
                    let mut inner = tracker.lock();
                    if inner.all {
                        continue;
                    }
                    for change in &delta.changes {
                        if let RowKey::Stream(id) = change.key {
                            inner.ids.insert(id);
                        }
                    }
                }
            }
        }
    }

    /// Why the view cannot follow the log right now; `None` while it can.
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_error(&self, error: Option<String>) {
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    /// Installs a whole state, as a snapshot of the watch does (tests of the loops that
    /// follow a view use it without a metad).
    pub fn install(&self, state: State) {
        self.replace(state);
    }

    /// Applies one delta, as the watch does.
    pub fn install_delta(&self, delta: &Delta) {
        self.apply(delta);
    }

    fn replace(&self, state: State) {
        let index = state.applied_index;
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = state;
        self.notify(None);
        self.set_error(None);
        self.applied.send_replace(index);
    }

    fn apply(&self, delta: &Delta) {
        self.state.write().unwrap_or_else(|p| p.into_inner()).apply_delta(delta);
        // Told before the index moves, so a loop woken by the index finds the change.
        self.notify(Some(delta));
        self.applied.send_replace(delta.index);
    }
}

/// A snapshot being received in chunks.
struct Incoming {
    state: State,
    rows: u64,
}

/// Applies one watch event; `Err` names why the watch must start over.
fn receive(view: &View, incoming: &mut Option<Incoming>, event: WatchEvent) -> Result<(), String> {
    match event.kind {
        Some(Kind::SnapshotBegin(_)) => {
            *incoming = Some(Incoming {
                state: State::default(),
                rows: 0,
            });
        }
        Some(Kind::SnapshotRows(bytes)) => {
            let snapshot = incoming
                .as_mut()
                .ok_or("metadata snapshot rows arrived outside a snapshot")?;
            let rows: Vec<Row> =
                codec::decode(&bytes).map_err(|e| format!("undecodable metadata snapshot rows: {e}"))?;
            snapshot.rows += rows.len() as u64;
            for row in rows {
                snapshot.state.set_row(&row.key(), Some(row));
            }
        }
        Some(Kind::SnapshotEnd(end)) => {
            let mut snapshot = incoming.take().ok_or("metadata snapshot ended before it began")?;
            if snapshot.rows != end.rows {
                return Err(format!(
                    "metadata snapshot at index {} held {} rows, not the {} announced",
                    event.index, snapshot.rows, end.rows
                ));
            }
            snapshot.state.applied_index = event.index;
            view.replace(snapshot.state);
        }
        Some(Kind::Delta(bytes)) => {
            let delta: Delta = codec::decode(&bytes).map_err(|e| format!("undecodable metadata delta: {e}"))?;
            view.apply(&delta);
        }
        Some(Kind::Snapshot(_)) => {
            return Err("metad sent a whole-state snapshot of metadata format 1; upgrade metad to this release".into())
        }
        None => {}
    }
    Ok(())
}

/// Follows metad's watch into `view` until `cancel`, reconnecting (and resuming from the
/// last applied index) whenever the stream breaks, and from a fresh snapshot after a
/// frame it could not apply.
pub async fn follow(view: Arc<View>, metad: Arc<MetadClient>, cancel: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let after = (view.applied_index() > 0 && view.error().is_none()).then(|| view.applied_index());
        let stream = tokio::select! {
            _ = cancel.cancelled() => return,
            s = metad.watch(after) => s,
        };
        match stream {
            Ok(mut stream) => {
                let mut incoming = None;
                loop {
                    let event = tokio::select! {
                        _ = cancel.cancelled() => return,
                        e = stream.message() => e,
                    };
                    match event {
                        Ok(Some(event)) => {
                            // Tests: this process's view lags while the point fails.
                            while weir_shared::failpoint::fails("view_apply") {
                                tokio::select! {
                                    _ = cancel.cancelled() => return,
                                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                                }
                            }
                            // Tests: the frame cannot be applied, as a defective one could
                            // not (RR-FEN-7).
                            let applied = if weir_shared::failpoint::fails("view_install") {
                                Err("failpoint view_install: the frame could not be applied".to_string())
                            } else {
                                receive(&view, &mut incoming, event)
                            };
                            if let Err(why) = applied {
                                tracing::error!(error = %why, "cannot follow the metadata log; not ready until a snapshot applies");
                                view.set_error(Some(why));
                                break;
                            }
                            backoff = Duration::from_millis(100);
                        }
                        Ok(None) => break,
                        Err(status) => {
                            // A frame over the message limit (tonic's OutOfRange) is a defect
                            // to report, not a broken link. A transport push-back such as
                            // GOAWAY(ENHANCE_YOUR_CALM), an untagged ResourceExhausted, is one.
                            if status.code() == tonic::Code::OutOfRange {
                                let why = format!("a metadata watch frame was refused: {}", status.message());
                                tracing::error!(error = %why, "cannot follow the metadata log");
                                view.set_error(Some(why));
                            } else {
                                tracing::debug!(error = %status, "metadata watch broke; reconnecting");
                            }
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot open metadata watch; retrying"),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_proto::metad::{SnapshotBegin, SnapshotEnd};

    fn event(index: u64, kind: Kind) -> WatchEvent {
        WatchEvent {
            index,
            kind: Some(kind),
        }
    }

    /// A snapshot in chunks replaces the view only once complete; a frame that does not
    /// decode is reported with its cause.
    #[test]
    fn a_chunked_snapshot_applies_at_its_end_and_a_bad_frame_is_reported() {
        let view = View::default();
        let mut incoming = None;
        let mut state = State::default();
        state.counters.next_stream_id = 7;
        let rows = state.rows();
        receive(&view, &mut incoming, event(5, Kind::SnapshotBegin(SnapshotBegin {}))).unwrap();
        for chunk in rows.chunks(1) {
            receive(
                &view,
                &mut incoming,
                event(5, Kind::SnapshotRows(codec::encode(&chunk.to_vec()))),
            )
            .unwrap();
            assert_eq!(view.applied_index(), 0, "not before the end");
        }
        let end = SnapshotEnd {
            rows: rows.len() as u64,
        };
        receive(&view, &mut incoming, event(5, Kind::SnapshotEnd(end))).unwrap();
        assert_eq!(view.applied_index(), 5);
        assert_eq!(view.with(|s| s.counters.next_stream_id), 7);

        let mut bad = codec::encode(&Delta {
            index: 6,
            changes: Vec::new(),
        });
        bad[1] = codec::FORMAT_VERSION + 1;
        let why = receive(&view, &mut incoming, event(6, Kind::Delta(bad))).unwrap_err();
        assert!(
            why.contains("undecodable metadata delta") && why.contains("not supported"),
            "{why}"
        );
        let missing = receive(&view, &mut None, event(7, Kind::SnapshotEnd(SnapshotEnd { rows: 0 }))).unwrap_err();
        assert!(missing.contains("before it began"), "{missing}");
    }
}
