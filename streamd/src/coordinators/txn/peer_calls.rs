//! Calls to other nodes for transactions: a coordinator writing a decided
//! transaction's markers into its partitions, and a partition's owner asking a
//! coordinator to verify a transactional write (KIP-890). Markers (design 0005, "Who
//! writes them"): the coordinator calls each partition's owner, found in the view, and
//! retries until the stream has a live owner that takes the marker; a partition this
//! node owns is written directly. The gateway is not on this path, so a gateway that
//! dies mid-commit cannot leave a transaction half written.

use crate::error::StreamdError;
use crate::node::core_api::CoreApi;
use crate::partition::marker::Marker;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use weir_proto::streamd::streamd_client::StreamdClient;
use weir_proto::streamd::{VerifyTxnPartitionRequest, WriteTxnMarkerRequest};
use weir_shared::error_code::ErrorCode;
use weir_shared::grpc::Channel;

/// Longest one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait between two attempts at one partition.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How long a marker may go unwritten before its retries are logged as warnings: a
/// stuck marker holds its transaction prepared, and the producer's next requests wait.
const STALL_WARNING: Duration = Duration::from_secs(10);

/// How a marker's write ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// Written, or found written before.
    Written,
    /// Never to be written: the stream is gone, or its producer has moved on to a
    /// newer epoch there (the marker is obsolete, as Kafka treats it).
    Obsolete(String),
}

/// Channels to other streamd nodes, by address, for a node's transaction calls.
#[derive(Default)]
pub struct PeerCalls {
    channels: Mutex<HashMap<String, Channel>>,
}

impl PeerCalls {
    /// Writes `marker` into `stream`, retrying until it is written, obsolete, or
    /// `stop` is cancelled (the coordinator lost its state stream: its successor
    /// resumes the markers); `None` then.
    pub async fn send(&self, core: &CoreApi, stream: &str, marker: Marker, stop: &CancellationToken) -> Option<Sent> {
        let mut backoff = Duration::from_millis(20);
        let started = tokio::time::Instant::now();
        let mut warned = started;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            // Bounded: a hung owner must not hold the marker up until it is fenced.
            let attempt = tokio::select! {
                r = tokio::time::timeout(ATTEMPT_TIMEOUT, self.attempt(core, stream, marker)) => r.unwrap_or_else(|_| {
                    Err(Failure::Local(StreamdError::Unavailable(format!("no answer from the owner of '{stream}' within {ATTEMPT_TIMEOUT:?}"))))
                }),
                _ = stop.cancelled() => return None,
            };
            match attempt {
                Ok(()) => return Some(Sent::Written),
                Err(e) if matches!(e.code(), Some(ErrorCode::NotFound | ErrorCode::InvalidProducerEpoch)) => {
                    return Some(Sent::Obsolete(e.to_string()))
                }
                Err(e) if warned.elapsed() >= STALL_WARNING => {
                    warned = tokio::time::Instant::now();
                    tracing::warn!(
                        stream,
                        producer_id = marker.producer_id,
                        epoch = marker.epoch,
                        attempts,
                        waited_ms = started.elapsed().as_millis() as u64,
                        error = %e,
                        "transaction marker still not written; retrying"
                    );
                }
                Err(e) => {
                    tracing::debug!(stream, error = %e, "transaction marker not written yet; retrying");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.cancelled() => return None,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn attempt(&self, core: &CoreApi, stream: &str, marker: Marker) -> Result<(), Failure> {
        let owner = core.view().with(|s| {
            let row = s.stream_by_name(stream)?;
            let owner = row.owner.as_ref()?;
            let n = s
                .nodes
                .get(&owner.node)
                .filter(|n| n.epoch == owner.epoch && !n.fenced)?;
            Some((owner.clone(), n.addrs.grpc.clone()))
        });
        let exists = core.view().with(|s| s.stream_by_name(stream).is_some());
        let Some((owner, addr)) = owner else {
            return Err(if exists {
                Failure::Local(StreamdError::Unavailable(format!(
                    "stream '{stream}' has no live owner"
                )))
            } else {
                Failure::Local(StreamdError::NotFound(format!("stream '{stream}'")))
            });
        };
        if owner == *core.me() {
            return core
                .write_marker(stream, &marker)
                .await
                .map(|_| ())
                .map_err(Failure::Local);
        }
        let channel = self.channel(&addr).map_err(Failure::Local)?;
        let request = WriteTxnMarkerRequest {
            stream: stream.to_string(),
            producer_id: marker.producer_id,
            producer_epoch: i32::from(marker.epoch),
            commit: marker.commit,
            coordinator_epoch: marker.coordinator_epoch,
        };
        StreamdClient::new(channel)
            .write_txn_marker(request)
            .await
            .map(|_| ())
            .map_err(Failure::Remote)
    }

    /// Asks the owner of transaction-state stream `state` (another node) whether
    /// `partition` is in the ongoing transaction of `id`'s producer; its Kafka answer.
    pub async fn verify_remote(
        &self,
        core: &CoreApi,
        state: &str,
        id: &str,
        partition: &str,
        pid: i64,
        epoch: i16,
    ) -> Result<i16, StreamdError> {
        let addr = core
            .view()
            .with(|s| {
                let owner = s.stream_by_name(state)?.owner.clone()?;
                let n = s
                    .nodes
                    .get(&owner.node)
                    .filter(|n| n.epoch == owner.epoch && !n.fenced)?;
                Some(n.addrs.grpc.clone())
            })
            .ok_or_else(|| StreamdError::Unavailable(format!("stream '{state}' has no live owner")))?;
        let request = VerifyTxnPartitionRequest {
            transactional_id: id.to_string(),
            producer_id: pid,
            producer_epoch: i32::from(epoch),
            stream: partition.to_string(),
        };
        let mut client = StreamdClient::new(self.channel(&addr)?);
        let reply = tokio::time::timeout(ATTEMPT_TIMEOUT, client.verify_txn_partition(request))
            .await
            .map_err(|_| StreamdError::Unavailable(format!("no answer from the coordinator at {addr}")))?
            .map_err(|s| StreamdError::Unavailable(format!("the coordinator at {addr}: {}", s.message())))?;
        i16::try_from(reply.into_inner().error_code)
            .map_err(|_| StreamdError::Internal("the coordinator answered an error code out of range".into()))
    }

    fn channel(&self, addr: &str) -> Result<Channel, StreamdError> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let c = weir_shared::grpc::channel(addr)
            .map_err(|e| StreamdError::Unavailable(format!("cannot reach streamd at {addr}: {e}")))?;
        channels.insert(addr.to_string(), c.clone());
        Ok(c)
    }
}

/// Why one attempt failed.
#[derive(Debug)]
enum Failure {
    Local(StreamdError),
    Remote(tonic::Status),
}

impl Failure {
    fn code(&self) -> Option<ErrorCode> {
        match self {
            Failure::Local(e) => Some(e.code()),
            Failure::Remote(s) => ErrorCode::of_status(s),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Local(e) => write!(f, "{e}"),
            Failure::Remote(s) => write!(f, "{}: {}", s.code(), s.message()),
        }
    }
}
