//! The server side of the Raft transport: hands peers' RPCs to the local Raft.

use crate::raft_types::Raft;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};
use weir_proto::raft::raft_server::Raft as RaftRpc;
use weir_proto::raft::{RaftReply, RaftRequest};

/// Serves Raft RPCs from peers.
pub struct RaftService {
    raft: Raft,
}

impl RaftService {
    pub fn new(raft: Raft) -> Self {
        Self { raft }
    }
}

fn decode<T: DeserializeOwned>(req: Request<RaftRequest>) -> Result<T, Status> {
    serde_json::from_slice(&req.into_inner().payload)
        .map_err(|e| Status::invalid_argument(format!("malformed raft message: {e}")))
}

/// Raft is accepted only from metad peers' certificates (D-21).
fn metad_only<T>(req: &Request<T>) -> Result<(), Status> {
    weir_shared::peer::require(req, &[weir_shared::peer::Role::Metad], "Raft").map(|_| ())
}

fn reply<T: Serialize>(result: &T) -> Result<Response<RaftReply>, Status> {
    let payload = serde_json::to_vec(result).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftReply { payload }))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        metad_only(&req)?;
        let result = self.raft.append_entries(decode(req)?).await;
        reply(&result)
    }

    async fn install_snapshot(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        metad_only(&req)?;
        crate::metrics::metrics()
            .snapshot_chunks
            .with_label_values(&["received"])
            .inc();
        let result = self.raft.install_snapshot(decode(req)?).await;
        reply(&result)
    }

    async fn vote(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        metad_only(&req)?;
        let result = self.raft.vote(decode(req)?).await;
        reply(&result)
    }
}
