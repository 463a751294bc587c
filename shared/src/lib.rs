//! What every Weir binary shares: configuration habits, ids, tracing and metrics.

pub mod batch;
pub mod config;
pub mod failpoint;
pub mod ids;
pub mod metrics;
pub mod shutdown;
pub mod telemetry;
