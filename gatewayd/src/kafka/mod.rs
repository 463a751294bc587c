//! The Kafka wire protocol: gateways are the cluster's brokers. Every request is decoded
//! and encoded by the `kafka-protocol` crate; partitions are streams named
//! `topic/partition`, routed to their owners like HTTP requests; consumer groups are run
//! by the owner of the group's offsets stream (`groups/`), and transactions by the
//! owner of the transactional id's state stream (`transactions.rs`).

pub mod acls;
pub mod admin;
pub mod brokers;
pub mod caller;
pub mod client_quotas;
pub mod configs;
pub mod conn;
pub mod delete_records;
pub mod errors;
pub mod fetch;
pub mod fetch_sessions;
pub mod frame;
pub mod groups;
pub mod introspection;
pub mod leader_epochs;
mod owner;
pub mod principals;
pub mod produce;
pub mod recompress;
pub mod response_frame;
pub mod sasl;
pub mod scopes;
pub mod scram;
pub mod scram_users;
pub mod throttle;
pub mod transactions;
pub mod versions;

use crate::api::Gateway;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_shared::listener::Listener;

/// What every Kafka connection shares.
pub struct Kafka {
    pub gw: Arc<Gateway>,
    /// This gateway's broker id and advertised address.
    pub me: brokers::Broker,
    pub max_frame_bytes: usize,
    /// The frame limit until a connection has authenticated (with `--auth`).
    pub max_unauthenticated_frame_bytes: usize,
    pub max_message_bytes: usize,
    /// The most one Fetch response holds (Kafka's broker `fetch.max.bytes`).
    pub fetch_max_bytes: usize,
    /// Incremental fetch sessions (KIP-227), soft state of this gateway.
    pub fetch_sessions: fetch_sessions::FetchSessions,
    pub auto_create_topics: bool,
    /// Authenticated connections per token.
    pub principals: principals::Principals,
    /// A request frame must arrive whole within this of its first byte.
    pub header_read_timeout: std::time::Duration,
    pub default_partitions: u32,
    /// The listener's TLS (`SSL`, or `SASL_SSL` with `--auth`); plaintext without it.
    pub tls: Option<weir_shared::tls::ServerTls>,
    /// SASL/PLAIN is accepted on a plaintext connection.
    pub allow_plaintext_sasl: bool,
}

/// Accepts Kafka connections until `stop`; each runs on its own task, tracked by `tasks`.
/// An error return means the listener failed (the caller then stops the process).
pub async fn serve(
    listener: Listener,
    kafka: Arc<Kafka>,
    tasks: TaskTracker,
    stop: CancellationToken,
) -> std::io::Result<()> {
    // Failpoint for SD-TRG-2 tests: the listener fails at its first accept.
    let fail_accept =
        weir_shared::failpoint::action("listener_kafka_accept") == Some(weir_shared::failpoint::Action::Error);
    loop {
        let (socket, peer) = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            accepted = listener.accept() => accepted,
        };
        if fail_accept {
            return Err(std::io::Error::other("failpoint listener_kafka_accept"));
        }
        let (kafka, stop, lanes) = (kafka.clone(), stop.clone(), tasks.clone());
        tasks.spawn(async move {
            let within = kafka.header_read_timeout;
            let socket = match weir_shared::tls::start(kafka.tls.as_ref(), socket, within, "kafka").await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "kafka connection closed before its TLS handshake finished");
                    return;
                }
            };
            if let Err(e) = conn::run(socket, peer, kafka, lanes, stop).await {
                tracing::debug!(%peer, error = %e, "kafka connection closed");
            }
        });
    }
}
