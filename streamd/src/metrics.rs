//! streamd's Prometheus metrics, served at `/metrics` on its HTTP port.

use prometheus::{Counter, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts};
use std::sync::OnceLock;

pub struct StreamdMetrics {
    /// Appends answered, by result (`ok` or the error code).
    pub appends: IntCounterVec,
    pub appended_bytes: IntCounter,
    /// Seconds from receiving an append to acknowledging it.
    pub append_latency: Histogram,
    pub wal_bytes: IntGauge,
    /// Object WAL: WAL objects being written now.
    pub wal_puts_inflight: IntGauge,
    /// Data objects committed, and commits refused.
    pub objects_committed: IntCounter,
    pub objects_refused: IntCounter,
    pub uploaded_bytes: IntCounter,
    pub streams_served: IntGauge,
    pub gc_deleted: IntCounter,
    /// Garbage-collection passes run.
    pub gc_passes: IntCounter,
    /// Requests GC made, by kind (`released`, `committed`, `forget`, `list`, `delete`):
    /// a pass's cost, which follows what was released, not the bucket's size.
    pub gc_requests: IntCounterVec,
    /// Start offsets advanced, by reason (`request` or `retention`).
    pub trims: IntCounterVec,
    /// Ranges compaction replaced, and bytes it wrote.
    pub compacted_ranges: IntCounter,
    pub compacted_bytes: IntCounter,
    /// Source objects compaction read (one GET each), and the ranges those reads held.
    pub compaction_source_reads: IntCounter,
    pub compaction_source_ranges: IntCounter,
    /// `CompactStreams` entries compaction proposed, and objects it wrote for them.
    pub compaction_commands: IntCounter,
    pub compaction_objects: IntCounter,
    /// Seconds one compaction pass over every served stream took.
    pub compaction_pass_seconds: Histogram,
    /// Compaction's rate for its current pass, and the seconds it waited on it.
    pub compaction_rate: IntGauge,
    pub compaction_paced_seconds: Counter,
    /// Bytes read by partial reads of a range's tail (producer-state rebuilds).
    pub tail_bytes_read: IntCounter,
    /// Ranged GETs of committed ranges for reads, by who asked first (`reader`, or
    /// `read_ahead` for a sequential reader's next range).
    pub range_gets: IntCounterVec,
    /// Bytes of record batches returned by reads (HTTP reads, Kafka Fetch, SSE).
    pub read_bytes: IntCounter,
    /// Bytes the block cache charges against `--cache-bytes` (data and bookkeeping).
    pub cache_bytes: IntGauge,
    /// Damaged committed ranges this node found (each reported to the metadata log).
    pub damage_found: IntCounter,
    /// Streams this node serves that are marked damaged.
    pub damaged_streams: IntGauge,
    /// JoinGroups refused at `--max-group-members`.
    pub group_members_refused: IntCounter,
    /// Object-store requests, by operation (`put`, `get`, `list`, `delete`, `copy`,
    /// `multipart`) and by what the key holds (`wal`, `data`, `other`).
    pub object_requests: IntCounterVec,
    /// Bytes of each PUT, by what the key holds.
    pub object_put_bytes: prometheus::HistogramVec,
}

/// Counts one answered append (unary or in an append stream).
pub fn observe_append<T>(result: &Result<T, crate::error::StreamdError>, bytes: usize, started: std::time::Instant) {
    let m = metrics();
    match result {
        Ok(_) => {
            m.appends.with_label_values(&["ok"]).inc();
            m.appended_bytes.inc_by(bytes as u64);
            m.append_latency.observe(started.elapsed().as_secs_f64());
        }
        // OBS-15: refusals while draining under the same metric, as their own outcome.
        Err(crate::error::StreamdError::Draining) => m.appends.with_label_values(&["draining"]).inc(),
        Err(e) => m.appends.with_label_values(&[e.code().as_str()]).inc(),
    }
}

pub fn metrics() -> &'static StreamdMetrics {
    static METRICS: OnceLock<StreamdMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        use weir_shared::metrics::register;
        let counter = |name: &str, help: &str| register(IntCounter::new(name, help).expect("valid metric"));
        let m = StreamdMetrics {
            appends: register(
                IntCounterVec::new(
                    Opts::new("streamd_appends_total", "Appends answered, by result"),
                    &["result"],
                )
                .expect("valid metric"),
            ),
            appended_bytes: counter("streamd_appended_bytes_total", "Bytes of acknowledged appends"),
            append_latency: register(
                Histogram::with_opts(
                    HistogramOpts::new("streamd_append_seconds", "Time to acknowledge an append").buckets(vec![
                        0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    ]),
                )
                .expect("valid metric"),
            ),
            wal_bytes: register(
                IntGauge::new("streamd_wal_bytes", "Bytes held in live WAL segments").expect("valid metric"),
            ),
            wal_puts_inflight: register(
                IntGauge::new("streamd_wal_puts_inflight", "Object WAL: WAL objects being written now")
                    .expect("valid metric"),
            ),
            objects_committed: counter("streamd_objects_committed_total", "Data objects committed"),
            objects_refused: counter("streamd_objects_refused_total", "Data object commits refused"),
            uploaded_bytes: counter("streamd_uploaded_bytes_total", "Bytes of committed data objects"),
            streams_served: register(
                IntGauge::new("streamd_streams_served", "Streams this node serves").expect("valid metric"),
            ),
            gc_deleted: counter(
                "streamd_gc_deleted_objects_total",
                "Data objects deleted: uncommitted, or no longer referenced",
            ),
            gc_passes: counter("streamd_gc_passes_total", "Garbage-collection passes run"),
            gc_requests: register(
                IntCounterVec::new(
                    Opts::new("streamd_gc_requests_total", "Requests garbage collection made, by kind"),
                    &["kind"],
                )
                .expect("valid metric"),
            ),
            trims: register(
                IntCounterVec::new(
                    Opts::new("streamd_trims_total", "Stream start offsets advanced, by reason"),
                    &["reason"],
                )
                .expect("valid metric"),
            ),
            compacted_ranges: counter("streamd_compacted_ranges_total", "Ranges compaction replaced"),
            compacted_bytes: counter("streamd_compacted_bytes_total", "Bytes compaction wrote"),
            compaction_source_reads: counter(
                "streamd_compaction_source_reads_total",
                "Source objects compaction read, one ranged GET each",
            ),
            compaction_source_ranges: counter(
                "streamd_compaction_source_ranges_total",
                "Ranges compaction took from the source objects it read",
            ),
            compaction_commands: counter(
                "streamd_compaction_commands_total",
                "CompactStreams entries compaction proposed, each for many streams",
            ),
            compaction_objects: counter(
                "streamd_compaction_objects_total",
                "Objects compaction wrote (per-stream ones of the target size, and shared ones)",
            ),
            compaction_pass_seconds: register(
                Histogram::with_opts(
                    HistogramOpts::new(
                        "streamd_compaction_pass_seconds",
                        "Time one compaction pass over every served stream took",
                    )
                    .buckets(vec![0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]),
                )
                .expect("valid metric"),
            ),
            compaction_rate: register(
                IntGauge::new(
                    "streamd_compaction_rate_bytes",
                    "Bytes per second the current compaction pass reads and writes at most (0: no limit)",
                )
                .expect("valid metric"),
            ),
            compaction_paced_seconds: register(
                Counter::new(
                    "streamd_compaction_paced_seconds_total",
                    "Seconds compaction waited on its rate (--compaction-max-bytes-per-sec)",
                )
                .expect("valid metric"),
            ),
            tail_bytes_read: counter(
                "streamd_tail_read_bytes_total",
                "Bytes read by partial reads of a range's tail (producer-state rebuilds)",
            ),
            group_members_refused: counter(
                "streamd_group_members_refused_total",
                "JoinGroups refused at --max-group-members (GROUP_MAX_SIZE_REACHED)",
            ),
            range_gets: register(
                IntCounterVec::new(
                    Opts::new(
                        "streamd_range_gets_total",
                        "Ranged GETs of committed ranges for reads, by who asked first (reader or read_ahead)",
                    ),
                    &["by"],
                )
                .expect("valid metric"),
            ),
            read_bytes: counter("streamd_read_bytes_total", "Bytes of record batches returned by reads"),
            cache_bytes: register(
                IntGauge::new(
                    "streamd_cache_bytes",
                    "Bytes the block cache charges against --cache-bytes, its data and bookkeeping",
                )
                .expect("valid metric"),
            ),
            damage_found: counter(
                "streamd_damage_found_total",
                "Damaged committed ranges found (failing their checksum or not what the index says)",
            ),
            object_requests: register(
                IntCounterVec::new(
                    Opts::new(
                        "streamd_object_requests_total",
                        "Object-store requests, by operation and by what the key holds (wal, data, other); a delete counts each key, a list each call",
                    ),
                    &["op", "kind"],
                )
                .expect("valid metric"),
            ),
            object_put_bytes: register(
                prometheus::HistogramVec::new(
                    HistogramOpts::new("streamd_object_put_bytes", "Bytes of each object-store PUT").buckets(vec![
                        1024.0,
                        16384.0,
                        65536.0,
                        262144.0,
                        1048576.0,
                        4194304.0,
                        16777216.0,
                        67108864.0,
                    ]),
                    &["kind"],
                )
                .expect("valid metric"),
            ),
            damaged_streams: register(
                IntGauge::new(
                    "streamd_damaged_streams",
                    "Served streams marked damaged until an operator acts",
                )
                .expect("valid metric"),
            ),
        };
        // Every series the object-store meters can take exists from the start, at 0, so
        // no family appears later (OBS-1).
        for kind in ["wal", "data", "other"] {
            for op in ["put", "get", "list", "delete", "copy", "multipart"] {
                m.object_requests.with_label_values(&[op, kind]);
            }
            m.object_put_bytes.with_label_values(&[kind]);
        }
        m
    })
}
