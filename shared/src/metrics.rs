//! The process-wide Prometheus registry and its text rendering for `/metrics`.

use prometheus::{Encoder, Registry, TextEncoder};
use std::sync::OnceLock;

/// The registry every subsystem registers its metrics in.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry::new_custom(Some("weir".into()), None).expect("static prefix is valid"))
}

/// Registers a collector once; a second registration of the same metric is ignored
/// (tests start several services in one process).
pub fn register<C: prometheus::core::Collector + Clone + 'static>(collector: C) -> C {
    let _ = registry().register(Box::new(collector.clone()));
    collector
}

/// The registry in Prometheus text exposition format.
pub fn render() -> String {
    let mut buf = Vec::new();
    let encoder = TextEncoder::new();
    if let Err(e) = encoder.encode(&registry().gather(), &mut buf) {
        tracing::warn!(error = %e, "metrics encoding failed");
    }
    String::from_utf8(buf).unwrap_or_default()
}

/// An axum handler serving [`render`] with the Prometheus content type.
pub async fn metrics_handler() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render(),
    )
}
