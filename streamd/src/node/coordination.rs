//! What the storage core asks of the coordinators above it (issue 63). The core
//! never names a coordinator: each registers itself here at startup as a trait
//! object, held weakly, since the coordinators hold the node.

use crate::error::StreamdError;
use futures::future::BoxFuture;
use std::sync::{Arc, OnceLock, Weak};

/// Verifies a transactional write with its transaction's coordinator (KIP-890).
pub trait TxnVerifier: Send + Sync {
    /// Whether `partition` may take a write in the open transaction of transactional
    /// id `id`'s producer `pid` at `epoch`.
    fn verify_write<'a>(
        self: Arc<Self>,
        id: &'a str,
        partition: &'a str,
        pid: i64,
        epoch: i16,
    ) -> BoxFuture<'a, Result<(), StreamdError>>;
}

/// Told of each transaction marker written into a stream before the marker counts as
/// written (a transaction's offsets are settled by its marker).
pub trait MarkerListener: Send + Sync {
    /// Producer `producer_id`'s transaction in `stream` ended (`commit` or abort) with
    /// a marker at `offset`, or at an offset below it.
    fn marker_written<'a>(
        self: Arc<Self>,
        stream: &'a str,
        producer_id: i64,
        commit: bool,
        offset: u64,
    ) -> BoxFuture<'a, ()>;
}

/// The coordinators registered with this node.
#[derive(Default)]
pub struct Coordination {
    txns: OnceLock<Weak<dyn TxnVerifier>>,
    markers: OnceLock<Weak<dyn MarkerListener>>,
}

impl Coordination {
    /// Registers the transaction coordinators; once, at startup.
    pub fn register_txns(&self, txns: Weak<dyn TxnVerifier>) {
        let _ = self.txns.set(txns);
    }

    /// Registers the listener for transaction markers; once, at startup.
    pub fn register_markers(&self, markers: Weak<dyn MarkerListener>) {
        let _ = self.markers.set(markers);
    }

    /// The transaction coordinators, unless none were registered or they are gone.
    pub fn txns(&self) -> Option<Arc<dyn TxnVerifier>> {
        self.txns.get().and_then(Weak::upgrade)
    }

    pub fn markers(&self) -> Option<Arc<dyn MarkerListener>> {
        self.markers.get().and_then(Weak::upgrade)
    }
}
