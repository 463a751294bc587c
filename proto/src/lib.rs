//! gRPC messages and services of Weir, generated from `proto/`.

pub mod codec;

/// Raft replication between metad replicas.
pub mod raft {
    #![allow(clippy::all)]
    tonic::include_proto!("weir.raft.v1");
}

/// The metadata log's client and admin APIs.
pub mod metad {
    #![allow(clippy::all)]
    tonic::include_proto!("weir.metad.v1");
}

/// streamd's data plane.
pub mod streamd {
    #![allow(clippy::all)]
    tonic::include_proto!("weir.streamd.v1");
}
