//! The data-plane gRPC service gatewayd calls.

use crate::coordinators::groups::{Client, Groups};
use crate::coordinators::txn::coordinator::Txns;
use crate::node::{Isolation, Node};
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};
use weir_proto::streamd::streamd_server::Streamd;
use weir_proto::streamd::*;
use weir_shared::peer::Role;

/// Longest wait a read may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

pub struct DataPlane {
    node: Arc<Node>,
    groups: Arc<Groups>,
    txns: Arc<Txns>,
}

impl DataPlane {
    pub fn new(node: Arc<Node>, txns: Arc<Txns>) -> Self {
        let groups = Groups::new(crate::node::core_api::CoreApi::new(node.clone()));
        let markers: std::sync::Weak<Groups> = Arc::downgrade(&groups);
        node.coordination.register_markers(markers);
        Self { node, groups, txns }
    }
}

/// Who may call the data plane on an mTLS cluster (D-21): gateways route clients'
/// requests here, and metad's leader closes streams for transfers and drains; nothing
/// else, and only metad may close a stream. Only a streamd (a transaction's
/// coordinator) writes transaction markers.
const CLIENTS: &[Role] = &[Role::Gatewayd, Role::Metad];
const METAD: &[Role] = &[Role::Metad];
/// Transaction markers come from the coordinator of the transaction, a streamd.
const COORDINATORS: &[Role] = &[Role::Streamd];

#[tonic::async_trait]
impl Streamd for DataPlane {
    async fn append(&self, req: Request<AppendRequest>) -> Result<Response<AppendReply>, Status> {
        weir_shared::peer::require(&req, CLIENTS, "Append")?;
        let req = req.into_inner();
        let started = std::time::Instant::now();
        let result = match self
            .node
            .admit_client_append(
                &req.stream,
                &req.batches,
                req.match_next_offset,
                req.transactional_id.as_deref(),
            )
            .await
        {
            Ok(admitted) => self.node.complete(admitted).await,
            Err(e) => Err(e),
        };
        crate::metrics::observe_append(&result, req.batches.len(), started);
        // Failpoint: the answer to an append to this stream is held back after it was
        // applied (a test moves the stream meanwhile).
        weir_shared::failpoint::pause(&format!("append_reply_{}", req.stream)).await;
        let a = result?;
        Ok(Response::new(AppendReply {
            base_offset: a.base_offset,
            end_offset: a.end_offset,
            stream_epoch: a.stream_epoch,
            batch_base_offsets: a.batch_base_offsets,
        }))
    }

    type AppendStreamStream = crate::append_stream::Replies;

    async fn append_stream(
        &self,
        req: Request<tonic::Streaming<AppendStreamRequest>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        weir_shared::peer::require(&req, CLIENTS, "AppendStream")?;
        Ok(Response::new(crate::append_stream::serve(
            self.node.clone(),
            req.into_inner(),
        )))
    }

    async fn read(&self, req: Request<ReadRequest>) -> Result<Response<ReadReply>, Status> {
        weir_shared::peer::require(&req, CLIENTS, "Read")?;
        // SD-INT-6: once intake stops, reads are refused too, at once and retryably
        // (`x-weir-draining`); the gateway sends them on to the stream's next owner.
        if self.node.intake_closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(crate::error::StreamdError::Draining.into());
        }
        let req = req.into_inner();
        let wait = Duration::from_millis(u64::from(req.wait_ms)).min(MAX_WAIT);
        let max_bytes = if req.max_bytes == 0 {
            1024 * 1024
        } else {
            req.max_bytes as usize
        };
        let isolation = if req.read_committed {
            Isolation::ReadCommitted
        } else {
            Isolation::ReadUncommitted
        };
        let r = self
            .node
            .read(
                &req.stream,
                req.offset,
                max_bytes,
                !req.exact_max_bytes,
                wait,
                isolation,
            )
            .await?;
        crate::metrics::metrics().read_bytes.inc_by(r.batches.len() as u64);
        Ok(Response::new(ReadReply {
            batches: r.batches,
            next_offset: r.next_offset,
            start_offset: r.start_offset,
            end_offset: r.end_offset,
            last_stable_offset: r.last_stable_offset,
            aborted: r
                .aborted
                .into_iter()
                .map(|a| weir_proto::streamd::AbortedTxn {
                    producer_id: a.producer_id,
                    first_offset: a.first_offset,
                    last_offset: a.last_offset,
                })
                .collect(),
        }))
    }

    async fn status(&self, req: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        weir_shared::peer::require(&req, CLIENTS, "Status")?;
        let name = req.into_inner().stream;
        let h = self.node.stream(&name)?;
        // Its last stable offset needs the transactions open in the stream.
        self.node.tail_state(&h).await?;
        let inner = h.inner.lock().await;
        Ok(Response::new(StatusReply {
            stream: name,
            stream_id: h.id.0,
            stream_epoch: h.epoch.0,
            start_offset: inner.start_offset,
            end_offset: h.durable_end(),
            last_stable_offset: inner.txns.lso(h.durable_end()),
            committed_end: inner.committed_end,
            buffered_bytes: inner.buffered_bytes(),
            leader_epoch: (h.leader_epoch >= 0).then_some(h.leader_epoch),
        }))
    }

    async fn producers(&self, req: Request<ProducersRequest>) -> Result<Response<ProducersReply>, Status> {
        weir_shared::peer::require(&req, CLIENTS, "Producers")?;
        let name = req.into_inner().stream;
        let h = self.node.stream(&name)?;
        // The producers and open transactions of the stream's whole tail.
        self.node.tail_state(&h).await?;
        let inner = h.inner.lock().await;
        let producers = inner
            .producers
            .describe()
            .into_iter()
            .map(|(producer_id, epoch, last_sequence)| ProducerStatus {
                producer_id,
                producer_epoch: i32::from(epoch),
                last_sequence,
                current_txn_start_offset: inner
                    .txns
                    .open(producer_id)
                    .map_or(-1, |t| i64::try_from(t.first_offset).unwrap_or(i64::MAX)),
            })
            .collect();
        Ok(Response::new(ProducersReply { producers }))
    }

    async fn close_stream(&self, req: Request<CloseStreamRequest>) -> Result<Response<CloseStreamReply>, Status> {
        weir_shared::peer::require(&req, METAD, "CloseStream")?;
        let req = req.into_inner();
        let within = match req.timeout_ms {
            0 => crate::node::close::DEFAULT_CLOSE_TIMEOUT,
            ms => Duration::from_millis(ms),
        };
        // The close runs in a task of its own: a caller that stops waiting must not
        // cancel it midway (its own bound reopens intake if it cannot finish).
        let node = self.node.clone();
        let stream = Some(req.stream.clone());
        let end = self
            .node
            .tasks
            .spawn("close", "close for a transfer", stream, async move {
                node.close_stream(&req.stream, within).await
            })
            .await
            .map_err(|e| Status::internal(format!("close task failed: {e}")))??;
        Ok(Response::new(CloseStreamReply { end_offset: end }))
    }

    async fn close_streams(&self, req: Request<CloseStreamsRequest>) -> Result<Response<CloseStreamsReply>, Status> {
        weir_shared::peer::require(&req, METAD, "CloseStreams")?;
        let req = req.into_inner();
        if req.streams.len() > weir_meta::model::MAX_BATCH {
            return Err(Status::invalid_argument(format!(
                "at most {} streams per CloseStreams, not {}",
                weir_meta::model::MAX_BATCH,
                req.streams.len()
            )));
        }
        let within = match req.timeout_ms {
            0 => crate::node::close::DEFAULT_CLOSE_TIMEOUT,
            ms => Duration::from_millis(ms),
        };
        // In a task of its own, as one close is: a caller that stops waiting must not
        // cancel the closes midway.
        let node = self.node.clone();
        let names = req.streams.clone();
        let results = self
            .node
            .tasks
            .spawn("close", "closes for a transfer", None, async move {
                node.close_streams(&names, within).await
            })
            .await
            .map_err(|e| Status::internal(format!("close task failed: {e}")))?;
        let streams = req
            .streams
            .into_iter()
            .zip(results)
            .map(|(stream, result)| match result {
                Ok(end_offset) => ClosedStream {
                    stream,
                    end_offset,
                    error: String::new(),
                    code: String::new(),
                },
                Err(e) => ClosedStream {
                    stream,
                    end_offset: 0,
                    code: e.code().as_str().to_string(),
                    error: e.to_string(),
                },
            })
            .collect();
        Ok(Response::new(CloseStreamsReply { streams }))
    }

    async fn trim(&self, req: Request<TrimRequest>) -> Result<Response<TrimReply>, Status> {
        weir_shared::peer::require(&req, CLIENTS, "Trim")?;
        let req = req.into_inner();
        let start_offset = self.node.trim(&req.stream, req.offset).await?;
        Ok(Response::new(TrimReply { start_offset }))
    }

    async fn group(&self, req: Request<GroupRequest>) -> Result<Response<GroupReply>, Status> {
        weir_shared::peer::require(&req, CLIENTS, "Group")?;
        let req = req.into_inner();
        let version = i16::try_from(req.api_version)
            .map_err(|_| crate::error::StreamdError::InvalidArgument("api_version out of range".into()))?;
        let api_key = i16::try_from(req.api_key)
            .map_err(|_| crate::error::StreamdError::InvalidArgument("api_key out of range".into()))?;
        let client = Client {
            id: req.client_id,
            host: req.client_host,
        };
        let body = self
            .groups
            .handle(&req.stream, api_key, version, req.body, client)
            .await?;
        Ok(Response::new(GroupReply { body }))
    }

    async fn txn(&self, req: Request<TxnRequest>) -> Result<Response<TxnReply>, Status> {
        weir_shared::peer::require(&req, CLIENTS, "Txn")?;
        let req = req.into_inner();
        let version = i16::try_from(req.api_version)
            .map_err(|_| crate::error::StreamdError::InvalidArgument("api_version out of range".into()))?;
        let api_key = i16::try_from(req.api_key)
            .map_err(|_| crate::error::StreamdError::InvalidArgument("api_key out of range".into()))?;
        let body = self
            .txns
            .handle(&req.stream, api_key, version, req.body, req.fresh_producer_id)
            .await?;
        Ok(Response::new(TxnReply { body }))
    }

    async fn verify_txn_partition(
        &self,
        req: Request<VerifyTxnPartitionRequest>,
    ) -> Result<Response<VerifyTxnPartitionReply>, Status> {
        weir_shared::peer::require(&req, COORDINATORS, "VerifyTxnPartition")?;
        let req = req.into_inner();
        let epoch = i16::try_from(req.producer_epoch)
            .map_err(|_| crate::error::StreamdError::InvalidArgument("producer_epoch out of range".into()))?;
        let state = weir_meta::model::names::txn_state_stream(&req.transactional_id);
        let verified = self
            .txns
            .verify(&state, &req.transactional_id, req.producer_id, epoch, &[req.stream])
            .await;
        Ok(Response::new(VerifyTxnPartitionReply {
            error_code: i32::from(verified.err().unwrap_or(0)),
        }))
    }

    async fn write_txn_marker(
        &self,
        req: Request<WriteTxnMarkerRequest>,
    ) -> Result<Response<WriteTxnMarkerReply>, Status> {
        weir_shared::peer::require(&req, COORDINATORS, "WriteTxnMarker")?;
        let req = req.into_inner();
        let epoch = i16::try_from(req.producer_epoch)
            .ok()
            .filter(|e| *e >= 0)
            .ok_or_else(|| crate::error::StreamdError::InvalidArgument("producer_epoch out of range".into()))?;
        if req.producer_id < 0 {
            return Err(crate::error::StreamdError::InvalidArgument("producer_id must be at least 0".into()).into());
        }
        let marker = crate::partition::marker::Marker {
            producer_id: req.producer_id,
            epoch,
            commit: req.commit,
            coordinator_epoch: req.coordinator_epoch,
        };
        let written = self.node.write_marker(&req.stream, &marker).await?;
        Ok(Response::new(WriteTxnMarkerReply {
            offset: written.offset,
            end_offset: written.end_offset,
        }))
    }
}
