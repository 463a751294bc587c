//! A node's mirror of the metadata view (streamd, gatewayd), followed through metad's
//! watch API: a snapshot in bounded chunks, then the delta of every applied entry in
//! index order. A frame the node cannot decode or apply is logged with its cause and
//! makes the node not ready (`/ready` says why) until a fresh snapshot replaces it.

use crate::client::MetadClient;
use crate::model::{codec, Delta, Row, State};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use weir_proto::metad::watch_event::Kind;
use weir_proto::metad::WatchEvent;

/// The mirrored state, a signal of its applied index, and why it cannot follow, if so.
pub struct View {
    state: RwLock<State>,
    applied: watch::Sender<u64>,
    error: Mutex<Option<String>>,
}

impl Default for View {
    fn default() -> Self {
        Self {
            state: RwLock::new(State::default()),
            applied: watch::channel(0).0,
            error: Mutex::new(None),
        }
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

    /// Why the view cannot follow the log right now; `None` while it can.
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_error(&self, error: Option<String>) {
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    fn replace(&self, mut state: State) {
        state.reindex();
        let index = state.applied_index;
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = state;
        self.set_error(None);
        self.applied.send_replace(index);
    }

    fn apply(&self, delta: &Delta) {
        self.state.write().unwrap_or_else(|p| p.into_inner()).apply_delta(delta);
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
