//! The catch-up fence: a node serves nothing until its view has applied through an
//! index the metadata leader confirmed with a quorum (RR-FEN-1, RR-FEN-3, RR-FEN-5).

use crate::client::MetadClient;
use crate::view::View;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// RR-FEN-1, RR-FEN-5: retries a linearizable read every 0.5 s until one succeeds, then
/// waits for the view to apply through its index. Returns the admitted index.
pub async fn catch_up(view: &View, metad: &MetadClient, cancel: &CancellationToken) -> Option<u64> {
    let mut warned = false;
    loop {
        match metad.linearizable_read().await {
            Ok(index) => {
                tokio::select! {
                    _ = cancel.cancelled() => return None,
                    _ = view.wait_applied(index) => {}
                }
                tracing::info!(
                    committed_log_index = index,
                    "runtime execution admitted after linearizable consensus catch-up"
                );
                return Some(index);
            }
            Err(e) => {
                if !warned {
                    tracing::warn!(error = %e, "runtime execution is waiting for linearizable consensus catch-up");
                    warned = true;
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
