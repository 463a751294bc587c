//! gatewayd: Weir's stateless gateway. It follows the metadata view, and routes every
//! HTTP and Kafka request to the streamd that owns its stream.

pub mod api;
pub mod config;
pub mod kafka;
pub mod metrics;
pub mod ordered_appends;
pub mod quotas;
pub mod records;
pub mod route;
pub mod server;

pub use config::GatewaydArgs;
pub use server::run;
pub use weir_shared::service::Exit;
