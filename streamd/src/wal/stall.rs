//! Whether the WAL's writes wait for their store (a full volume, an object store
//! refusing PUTs), and why: set by the writer, read by every append (issue 60).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Why the WAL's writes wait for their store, shared by the writer and the handle.
/// Every append asks, so the answer "not stalled" is one atomic load.
#[derive(Clone, Default)]
pub(crate) struct Stall(Arc<StallState>);

#[derive(Default)]
struct StallState {
    stalled: AtomicBool,
    why: Mutex<Option<String>>,
}

impl Stall {
    /// Records why; true if it was not stalled before.
    pub(crate) fn set(&self, why: String) -> bool {
        let mut held = self.0.why.lock().unwrap_or_else(|p| p.into_inner());
        self.0.stalled.store(true, Ordering::Release);
        held.replace(why).is_none()
    }

    /// Clears it; true if it was stalled.
    pub(crate) fn clear(&self) -> bool {
        if !self.0.stalled.load(Ordering::Acquire) {
            return false;
        }
        let mut held = self.0.why.lock().unwrap_or_else(|p| p.into_inner());
        self.0.stalled.store(false, Ordering::Release);
        held.take().is_some()
    }

    pub(crate) fn reason(&self) -> Option<String> {
        if !self.0.stalled.load(Ordering::Acquire) {
            return None;
        }
        self.0.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
