//! gatewayd's Prometheus metrics, served at `/metrics`.

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
use std::sync::OnceLock;

pub struct GatewayMetrics {
    /// HTTP requests by matched route, method and status.
    pub http_requests: IntCounterVec,
    pub http_latency: HistogramVec,
    /// Appends routed, by result (`ok`, `error`).
    pub appends: IntCounterVec,
    pub appended_records: IntCounter,
    pub append_latency: Histogram,
    /// The metadata index this gateway's view has applied.
    pub applied_index: IntGauge,
    /// Kafka requests answered, by API.
    pub kafka_requests: IntCounterVec,
    pub kafka_latency: HistogramVec,
    /// Kafka connections closed for a bad frame (too large, malformed, unsupported), or
    /// for a request the gateway cannot yet answer (`catching_up`).
    pub kafka_refused_frames: IntCounterVec,
    pub kafka_connections: IntGauge,
    /// Fetches by session handling (`sessionless`, `full`, `incremental`,
    /// `session_not_found`, `invalid_epoch`).
    pub kafka_fetches: IntCounterVec,
    /// Incremental fetch sessions held now, and evicted for new ones.
    pub kafka_fetch_sessions: IntGauge,
    pub kafka_fetch_sessions_evicted: IntCounter,
    /// Live reads refused at a cap, by kind (`sse`, `long_poll`).
    pub live_reads_refused: IntCounterVec,
    /// Live reads open now, by kind.
    pub live_reads: IntGaugeVec,
    /// SD-INT-12: requests received in part (a Kafka frame, an HTTP body) and never admitted,
    /// discarded when the gateway stopped, by listener. Nothing of them was acknowledged.
    pub requests_dropped: IntCounterVec,
    /// Issue 59: throttles earned by requests over a client quota, in milliseconds, by
    /// listener (`kafka`: muted connections; `http`: 429 answers' wait).
    pub quota_throttle_ms: IntCounterVec,
    /// Calls to a stream's owner refused or reset by its shutdown (`reason="shutdown"`)
    /// or failed in transport otherwise (`reason="transport"`) (OBS-15, SD-TD-7).
    pub peer_call_failures: IntCounterVec,
    /// HTTP requests being served now, and those of them whose bodies are still arriving.
    pub http_in_flight: IntGauge,
    pub http_receiving: IntGauge,
}

const BUCKETS: [f64; 12] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

pub fn metrics() -> &'static GatewayMetrics {
    static METRICS: OnceLock<GatewayMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        use weir_shared::metrics::register;
        GatewayMetrics {
            http_requests: register(
                IntCounterVec::new(
                    Opts::new("gatewayd_http_requests_total", "HTTP requests answered"),
                    &["route", "method", "status"],
                )
                .expect("valid metric"),
            ),
            http_latency: register(
                HistogramVec::new(
                    HistogramOpts::new("gatewayd_http_request_seconds", "Time to answer an HTTP request")
                        .buckets(BUCKETS.to_vec()),
                    &["route", "method"],
                )
                .expect("valid metric"),
            ),
            appends: register(
                IntCounterVec::new(
                    Opts::new("gatewayd_appends_total", "Appends routed, by result"),
                    &["result"],
                )
                .expect("valid metric"),
            ),
            appended_records: register(
                IntCounter::new("gatewayd_appended_records_total", "Records acknowledged").expect("valid metric"),
            ),
            append_latency: register(
                Histogram::with_opts(
                    HistogramOpts::new("gatewayd_append_seconds", "Time from receiving an append to its answer")
                        .buckets(BUCKETS.to_vec()),
                )
                .expect("valid metric"),
            ),
            applied_index: register(
                IntGauge::new("gatewayd_view_applied_index", "Metadata log index the view has applied")
                    .expect("valid metric"),
            ),
            kafka_requests: register(
                IntCounterVec::new(
                    Opts::new("gatewayd_kafka_requests_total", "Kafka requests answered, by API"),
                    &["api"],
                )
                .expect("valid metric"),
            ),
            kafka_latency: register(
                HistogramVec::new(
                    HistogramOpts::new("gatewayd_kafka_request_seconds", "Time to answer a Kafka request")
                        .buckets(BUCKETS.to_vec()),
                    &["api"],
                )
                .expect("valid metric"),
            ),
            kafka_refused_frames: register(
                IntCounterVec::new(
                    Opts::new(
                        "gatewayd_kafka_refused_frames_total",
                        "Kafka connections closed for a refused request, by reason",
                    ),
                    &["reason"],
                )
                .expect("valid metric"),
            ),
            kafka_fetches: register(
                IntCounterVec::new(
                    Opts::new(
                        "gatewayd_kafka_fetches_total",
                        "Kafka fetches, by fetch session handling",
                    ),
                    &["session"],
                )
                .expect("valid metric"),
            ),
            kafka_fetch_sessions: register(
                IntGauge::new("gatewayd_kafka_fetch_sessions", "Incremental fetch sessions held")
                    .expect("valid metric"),
            ),
            kafka_fetch_sessions_evicted: register(
                IntCounter::new(
                    "gatewayd_kafka_fetch_sessions_evicted_total",
                    "Fetch sessions evicted to make room for new ones",
                )
                .expect("valid metric"),
            ),
            kafka_connections: register(
                IntGauge::new("gatewayd_kafka_connections", "Open Kafka connections").expect("valid metric"),
            ),
            live_reads: register(
                IntGaugeVec::new(
                    Opts::new(
                        "gatewayd_live_reads",
                        "SSE subscriptions and long polls open now, by kind",
                    ),
                    &["kind"],
                )
                .expect("valid metric"),
            ),
            peer_call_failures: register(
                IntCounterVec::new(
                    Opts::new(
                        "gatewayd_peer_call_failures_total",
                        "Calls to a stream's owner refused or reset by its shutdown (reason shutdown) or failed in transport (reason transport)",
                    ),
                    &["reason"],
                )
                .expect("valid metric"),
            ),
            requests_dropped: register(
                IntCounterVec::new(
                    Opts::new(
                        "gatewayd_requests_dropped_total",
                        "Requests received in part and never admitted, discarded at a stop, by listener",
                    ),
                    &["listener"],
                )
                .expect("valid metric"),
            ),
            quota_throttle_ms: register(
                IntCounterVec::new(
                    Opts::new(
                        "gatewayd_quota_throttle_milliseconds_total",
                        "Throttle time earned by requests over a client quota, by listener",
                    ),
                    &["listener"],
                )
                .expect("valid metric"),
            ),
            http_in_flight: register(
                IntGauge::new("gatewayd_http_requests_in_flight", "HTTP requests being served now")
                    .expect("valid metric"),
            ),
            http_receiving: register(
                IntGauge::new(
                    "gatewayd_http_requests_receiving",
                    "HTTP requests being served whose bodies are still arriving",
                )
                .expect("valid metric"),
            ),
            live_reads_refused: register(
                IntCounterVec::new(
                    Opts::new(
                        "gatewayd_live_reads_refused_total",
                        "SSE subscriptions and long polls refused at their cap, by kind",
                    ),
                    &["kind"],
                )
                .expect("valid metric"),
            ),
        }
    })
}
