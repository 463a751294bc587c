//! Caps on reads that stay open (issue 19): SSE subscriptions and long polls each hold
//! a task, a channel and an owner's wait, so a gateway admits only so many at once and
//! answers the next one 429 `too_many_requests`, naming the flag.

use super::error::ApiError;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use weir_shared::error_code::ErrorCode;

/// The open-read slots of one gateway.
pub struct LiveReads {
    sse: Arc<Semaphore>,
    long_polls: Arc<Semaphore>,
}

impl LiveReads {
    pub fn new(max_sse: usize, max_long_polls: usize) -> Self {
        LiveReads {
            sse: Arc::new(Semaphore::new(max_sse)),
            long_polls: Arc::new(Semaphore::new(max_long_polls)),
        }
    }

    /// A slot for one SSE subscription, held until it ends.
    pub fn subscription(&self) -> Result<LiveSlot, ApiError> {
        take(&self.sse, "sse", "--max-sse-subscribers")
    }

    /// A slot for one read that waits for records.
    pub fn long_poll(&self) -> Result<LiveSlot, ApiError> {
        take(&self.long_polls, "long_poll", "--max-long-polls")
    }
}

/// One open read's slot, counted in `weir_gatewayd_live_reads{kind}` while held.
pub struct LiveSlot {
    _permit: OwnedSemaphorePermit,
    open: prometheus::IntGauge,
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

fn take(slots: &Arc<Semaphore>, kind: &str, flag: &str) -> Result<LiveSlot, ApiError> {
    let permit = slots.clone().try_acquire_owned().map_err(|_| {
        crate::metrics::metrics()
            .live_reads_refused
            .with_label_values(&[kind])
            .inc();
        ApiError::new(
            ErrorCode::TooManyRequests,
            format!("this gateway has as many open {kind} reads as it admits ({flag}); retry later"),
        )
    })?;
    let open = crate::metrics::metrics().live_reads.with_label_values(&[kind]);
    open.inc();
    Ok(LiveSlot { _permit: permit, open })
}
