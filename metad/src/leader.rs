//! Finding the Raft leader's address and forwarding calls to it, so any replica
//! can serve the client API.

use crate::raft_types::Raft;
use std::collections::HashMap;
use std::sync::Mutex;
use weir_shared::grpc::channel;
use weir_shared::grpc::Channel;

/// gRPC metadata key marking a call already forwarded once; a forwarded call is never
/// forwarded again, so a stale leader hint cannot make calls bounce.
pub const FORWARDED: &str = "x-weir-forwarded";

/// Channels to the replicas, by address.
#[derive(Default)]
pub struct PeerChannels {
    channels: Mutex<HashMap<String, Channel>>,
}

impl PeerChannels {
    pub fn get(&self, addr: &str) -> Result<Channel, tonic::Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let c = channel(addr).map_err(|e| tonic::Status::unavailable(format!("bad leader address '{addr}': {e}")))?;
        channels.insert(addr.to_string(), c.clone());
        Ok(c)
    }
}

/// The current leader's id and address, as this replica knows them.
pub fn current_leader(raft: &Raft) -> Option<(u64, String)> {
    let metrics = raft.metrics().borrow().clone();
    let leader = metrics.current_leader?;
    let addr = metrics
        .membership_config
        .membership()
        .get_node(&leader)
        .map(|n| n.addr.clone())?;
    Some((leader, addr))
}

/// Whether this call was already forwarded once by another replica.
pub fn forwarded<T>(req: &tonic::Request<T>) -> bool {
    req.metadata().contains_key(FORWARDED)
}

/// `inner` as a call forwarded to the leader, bounded by `timeout` when given.
pub fn mark_forwarded<T>(inner: T, timeout: Option<std::time::Duration>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(inner);
    req.metadata_mut()
        .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    if let Some(t) = timeout {
        req.set_timeout(t);
    }
    req
}

/// A channel to the leader for forwarding, unless the call was already forwarded (a
/// stale leader hint must not make calls bounce) or no leader is known.
pub fn leader_channel(raft: &Raft, peers: &PeerChannels, forwarded: bool) -> Result<Channel, tonic::Status> {
    if forwarded {
        return Err(tonic::Status::unavailable(
            "metadata leader changed while forwarding; retry",
        ));
    }
    let (_, addr) =
        current_leader(raft).ok_or_else(|| tonic::Status::unavailable("no metadata leader is known; retry"))?;
    peers.get(&addr)
}
