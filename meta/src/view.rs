//! A node's mirror of the metadata state (streamd, gatewayd), followed through metad's
//! watch API: a snapshot, then the delta of every applied entry in index order.

use crate::client::MetadClient;
use crate::model::{codec, Delta, State};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use weir_proto::metad::watch_event::Kind;

/// The mirrored state and a signal of its applied index.
pub struct View {
    state: RwLock<State>,
    applied: watch::Sender<u64>,
}

impl Default for View {
    fn default() -> Self {
        Self {
            state: RwLock::new(State::default()),
            applied: watch::channel(0).0,
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

    fn replace(&self, mut state: State) {
        state.reindex();
        let index = state.applied_index;
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = state;
        self.applied.send_replace(index);
    }

    fn apply(&self, delta: &Delta) {
        self.state.write().unwrap_or_else(|p| p.into_inner()).apply_delta(delta);
        self.applied.send_replace(delta.index);
    }
}

/// Follows metad's watch into `view` until `cancel`, reconnecting (and resuming from the
/// last applied index) whenever the stream breaks.
pub async fn follow(view: Arc<View>, metad: Arc<MetadClient>, cancel: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let after = (view.applied_index() > 0).then(|| view.applied_index());
        let stream = tokio::select! {
            _ = cancel.cancelled() => return,
            s = metad.watch(after) => s,
        };
        match stream {
            Ok(mut stream) => loop {
                let event = tokio::select! {
                    _ = cancel.cancelled() => return,
                    e = stream.message() => e,
                };
                match event {
                    Ok(Some(event)) => {
                        backoff = Duration::from_millis(100);
                        match event.kind {
                            Some(Kind::Snapshot(bytes)) => match codec::decode::<State>(&bytes) {
                                Ok(state) => view.replace(state),
                                Err(e) => {
                                    tracing::error!(error = %e, "undecodable metadata snapshot");
                                    break;
                                }
                            },
                            Some(Kind::Delta(bytes)) => match codec::decode::<Delta>(&bytes) {
                                Ok(delta) => view.apply(&delta),
                                Err(e) => {
                                    tracing::error!(error = %e, "undecodable metadata delta");
                                    break;
                                }
                            },
                            None => {}
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(error = %status, "metadata watch broke; reconnecting");
                        break;
                    }
                }
            },
            Err(e) => tracing::debug!(error = %e, "cannot open metadata watch; retrying"),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}
