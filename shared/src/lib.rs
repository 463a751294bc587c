//! What every Weir binary shares: configuration habits, ids, the error-code table,
//! gRPC channels, the service entry point and shutdown sequence, tracing and metrics.

pub mod backoff;
pub mod batch;
pub mod cluster_tls;
pub mod config;
pub mod disk_space;
pub mod durable_dir;
pub mod error_code;
pub mod failpoint;
pub mod grpc;
pub mod held_body;
pub mod http_server;
pub mod ids;
pub mod in_process;
pub mod inflate;
pub mod listener;
pub mod metrics;
pub mod outgoing_calls;
pub mod peer;
pub mod service;
pub mod shutdown;
pub mod task_kinds;
pub mod telemetry;
pub mod tls;
