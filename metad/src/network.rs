//! The Raft transport: openraft RPCs sent to peers over tonic gRPC, with
//! openraft's own message types serialized as JSON inside the proto envelope.

use crate::raft_types::{NodeId, TypeConfig};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use weir_proto::raft::raft_client::RaftClient;
use weir_proto::raft::RaftRequest;
use weir_shared::grpc::channel;
use weir_shared::grpc::Channel;

/// Largest Raft message accepted (snapshot chunks, append batches).
pub const MAX_RAFT_MESSAGE: usize = 64 * 1024 * 1024;

/// Creates a [`PeerClient`] per target; openraft keeps one per replication stream.
#[derive(Clone, Default)]
pub struct GrpcNetwork;

impl RaftNetworkFactory<TypeConfig> for GrpcNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerClient {
            target,
            client: channel(&node.addr).ok().map(|c| {
                RaftClient::new(c)
                    .max_decoding_message_size(MAX_RAFT_MESSAGE)
                    .max_encoding_message_size(MAX_RAFT_MESSAGE)
            }),
            addr: node.addr.clone(),
        }
    }
}

/// One peer's Raft RPC client.
pub struct PeerClient {
    target: NodeId,
    addr: String,
    client: Option<RaftClient<Channel>>,
}

enum Rpc {
    Append,
    Snapshot,
    Vote,
}

impl PeerClient {
    async fn call<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let Some(client) = self.client.as_mut() else {
            let e = std::io::Error::other(format!("peer {} has an invalid address '{}'", self.target, self.addr));
            return Err(RPCError::Unreachable(Unreachable::new(&e)));
        };
        let payload = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let request = RaftRequest { payload };
        let ttl = option.hard_ttl();
        let action = match rpc {
            Rpc::Append => RPCTypes::AppendEntries,
            Rpc::Snapshot => RPCTypes::InstallSnapshot,
            Rpc::Vote => RPCTypes::Vote,
        };
        if matches!(rpc, Rpc::Snapshot) {
            crate::metrics::metrics()
                .snapshot_chunks
                .with_label_values(&["sent"])
                .inc();
        }
        let call = async {
            match rpc {
                Rpc::Append => client.append_entries(request).await,
                Rpc::Snapshot => client.install_snapshot(request).await,
                Rpc::Vote => client.vote(request).await,
            }
        };
        let reply = match tokio::time::timeout(ttl, call).await {
            Err(_) => {
                return Err(RPCError::Timeout(Timeout {
                    action,
                    id: 0,
                    target: self.target,
                    timeout: ttl,
                }))
            }
            Ok(Err(status)) => {
                return Err(match status.code() {
                    tonic::Code::Unavailable | tonic::Code::Unknown => RPCError::Unreachable(Unreachable::new(&status)),
                    _ => RPCError::Network(NetworkError::new(&status)),
                })
            }
            Ok(Ok(reply)) => reply.into_inner(),
        };
        let result: Result<Resp, E> =
            serde_json::from_slice(&reply.payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(Rpc::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.call(Rpc::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(Rpc::Vote, &rpc, &option).await
    }
}
