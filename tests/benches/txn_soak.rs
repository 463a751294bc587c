//! Soak (issue 23): do transactions' costs stay flat with time? Producers (the rdkafka
//! crate) run transactions back to back through a gateway, each writing 20 records
//! across an 8-partition topic and committing a consumer group's offset
//! (TxnOffsetCommit); every tenth is aborted. Every minute it prints the transactions
//! per second, the records held by the transaction-state streams and by the offsets
//! streams (both are snapshotted and trimmed), the bytes of the range summaries in the
//! object index (which grow with aborts, not with transactions), and each streamd's
//! RSS, the lowest and highest of its anonymous RSS over the minute, and its block
//! cache (memory grows with the cache until `--cache-bytes`; set `WEIR_CACHE_BYTES` low
//! to see it level off within minutes). At the end the node coordinating `soak-0` is
//! SIGKILLed, and it prints how long a new producer with that id waited for
//! InitProducerId (failover plus the coordinator's load of its state stream) and what
//! the load replayed.
//!
//! `WEIR_TXN_SOAK_MODE=idempotent` is the baseline without transactions: the same
//! records from idempotent producers, flushed as often, and the same offset committed
//! with OffsetCommit, so what grows only under transactions stands out.
//!
//! Asserts nothing. Run on a release build:
//! `cargo bench -p weir-tests --bench txn_soak` (needs s3s-fs, see .ci/run).
//! `WEIR_TXN_SOAK_MINUTES` (default 5) and `WEIR_TXN_SOAK_PRODUCERS` (default 4).
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_meta::model::names::{
    txn_state_stream, OFFSETS_PARTITIONS, OFFSETS_TOPIC, TXN_STATE_PARTITIONS, TXN_STATE_TOPIC,
};
use weir_proto::streamd::StatusRequest;
use weir_tests::gateway::Gatewayd;
use weir_tests::streamd::{Backend, Stack};

const OUT: &str = "soak-out";
const OUT_PARTITIONS: i32 = 8;
const IN: &str = "soak-in";
const PER_TXN: i64 = 20;
const T: Duration = Duration::from_secs(60);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Default)]
struct Counts {
    committed: AtomicU64,
    aborted: AtomicU64,
}

/// One producer's loop until `stop`: transactions of `PER_TXN` records, each with the
/// group's offset of the (unread) input advanced by one, every tenth aborted; or, with
/// `transactional` false, the same records and offsets without a transaction.
fn producer_loop(base: ClientConfig, i: usize, transactional: bool, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let id = format!("soak-{i}");
    let mut config = base.clone();
    config.set("linger.ms", "5");
    if transactional {
        config.set("transactional.id", &id);
    } else {
        config.set("enable.idempotence", "true");
    }
    let p: BaseProducer = config.create().expect("producer");
    let group: BaseConsumer = base
        .clone()
        .set("group.id", format!("soak-g-{i}"))
        .create()
        .expect("consumer");
    let metadata = group.group_metadata().expect("group metadata");
    if transactional {
        p.init_transactions(T).expect("init_transactions");
    }
    let mut n: i64 = 0;
    while !stop.load(Ordering::Relaxed) {
        if transactional {
            p.begin_transaction().expect("begin");
        }
        for m in 0..PER_TXN {
            let partition = ((n * PER_TXN + m) % i64::from(OUT_PARTITIONS)) as i32;
            let mut record = BaseRecord::<(), _>::to(OUT)
                .partition(partition)
                .payload("soak-record-value");
            while let Err((_, back)) = p.send(record) {
                p.poll(Duration::from_millis(1));
                record = back;
            }
        }
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(IN, 0, Offset::Offset(n + 1))
            .expect("offset");
        if !transactional {
            p.flush(T).expect("flush");
            group.commit(&offsets, CommitMode::Sync).expect("commit offsets");
            counts.committed.fetch_add(1, Ordering::Relaxed);
            n += 1;
            continue;
        }
        p.send_offsets_to_transaction(&offsets, &metadata, T)
            .expect("send offsets");
        if n % 10 == 9 {
            p.flush(T).expect("flush");
            p.abort_transaction(T).expect("abort");
            counts.aborted.fetch_add(1, Ordering::Relaxed);
        } else {
            p.commit_transaction(T).expect("commit");
            counts.committed.fetch_add(1, Ordering::Relaxed);
        }
        n += 1;
    }
}

/// Records a stream holds (end − start), asked of whichever node owns it.
async fn held(stack: &Stack, stream: &str) -> u64 {
    for node in &stack.nodes {
        let mut c = node.client().await;
        if let Ok(r) = c.status(StatusRequest { stream: stream.into() }).await {
            let r = r.into_inner();
            return r.end_offset - r.start_offset;
        }
    }
    0
}

/// Over `OUT`'s partitions: (ranges in the index, ranges with a summary, summary bytes
/// as stored, aborts listed).
async fn summaries(stack: &Stack) -> (usize, usize, usize, usize) {
    let client = stack.metad.client();
    let (mut ranges, mut with, mut bytes, mut aborts) = (0, 0, 0, 0);
    for p in 0..OUT_PARTITIONS {
        let id = stack.stream_id(&format!("{OUT}/{p}")).await;
        let mut from = 0;
        loop {
            let page = client
                .read_ranges(
                    id,
                    weir_shared::ids::Offset(from),
                    false,
                    1000,
                    weir_meta::client::Consistency::Linearizable,
                )
                .await
                .expect("ranges");
            for r in &page.ranges {
                ranges += 1;
                if r.txns.lso_at_end.is_some() || !r.txns.aborted.is_empty() {
                    with += 1;
                    bytes += serde_json::to_vec(&r.txns).map_or(0, |b| b.len());
                    aborts += r.txns.aborted.len();
                }
                from = r.end.0;
            }
            if !page.more || page.ranges.is_empty() {
                break;
            }
        }
    }
    (ranges, with, bytes, aborts)
}

/// A node's block cache, as charged against `--cache-bytes`, in MiB: RSS grows with it
/// until the budget, so RSS less this is what must stay flat.
async fn cache_mib(node: &weir_tests::streamd::Streamd) -> String {
    let metrics = weir_tests::get_text(&format!("http://{}/metrics", node.http)).await;
    let bytes = weir_tests::metric_value(&metrics, "weir_streamd_cache_bytes").unwrap_or(0.0);
    format!("{:.0}", bytes / (1 << 20) as f64)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Each process's anonymous RSS, lowest and highest since the last `take`, sampled
/// every second: a compaction window's buffers come and go within a minute, so the
/// lowest is what a node keeps and the highest what it needed at once.
#[derive(Default)]
struct AnonRange(std::sync::Mutex<Vec<(u64, u64)>>);

impl AnonRange {
    fn sample(&self, pids: &[u32]) {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.resize(pids.len(), (u64::MAX, 0));
        for (s, pid) in seen.iter_mut().zip(pids) {
            let anon = weir_tests::rss_anon_bytes(*pid);
            *s = (s.0.min(anon), s.1.max(anon));
        }
    }

    /// "low–high" MiB per process, and a fresh start.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
            .into_iter()
            .map(|(low, high)| format!("{:.0}–{:.0}", mib(low), mib(high)))
            .collect()
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let minutes = env_or("WEIR_TXN_SOAK_MINUTES", 5);
    let producers = env_or("WEIR_TXN_SOAK_PRODUCERS", 4) as usize;
    let transactional = std::env::var("WEIR_TXN_SOAK_MODE").as_deref() != Ok("idempotent");
    let mut stack = Stack::start_with(2, Backend::FileWal, &[], &[]).await;
    let gw = Gatewayd::start("gw-1", &stack.metad_addrs(), stack.dir.path(), &[]);
    gw.wait_ready().await;
    stack.metad.create_topic(OUT, OUT_PARTITIONS as u32).await;
    stack.metad.create_topic(IN, 1).await;
    for p in 0..OUT_PARTITIONS {
        gw.wait_open(&format!("{OUT}/{p}")).await;
    }
    gw.wait_open(&format!("{IN}/0")).await;
    let mut base = ClientConfig::new();
    base.set("bootstrap.servers", &gw.kafka)
        .set("broker.address.family", "v4");

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let workers: Vec<_> = (0..producers)
        .map(|i| {
            let (base, stop, counts) = (base.clone(), stop.clone(), counts.clone());
            tokio::task::spawn_blocking(move || producer_loop(base, i, transactional, stop, counts))
        })
        .collect();
    if transactional {
        println!(
            "txn_soak: {producers} producers, {PER_TXN} records per transaction, every tenth aborted, {minutes} min"
        );
    } else {
        println!("txn_soak baseline: {producers} idempotent producers, {PER_TXN} records per flush and OffsetCommit, {minutes} min");
    }
    println!("minute | txn/s | committed | aborted | state-stream records | offsets-stream records | index ranges (with summary) | summary bytes | aborts listed | streamd RSS MiB | anonymous RSS MiB, lowest–highest | block cache MiB");
    let anon = Arc::new(AnonRange::default());
    let pids: Vec<u32> = stack.nodes.iter().map(|n| n.pid()).collect();
    let sampler = {
        let anon = anon.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            loop {
                every.tick().await;
                anon.sample(&pids);
            }
        })
    };
    let started = Instant::now();
    let mut last = 0;
    for minute in 1..=minutes {
        tokio::time::sleep_until((started + Duration::from_secs(60 * minute)).into()).await;
        let (c, a) = (
            counts.committed.load(Ordering::Relaxed),
            counts.aborted.load(Ordering::Relaxed),
        );
        let mut state = 0;
        for p in 0..TXN_STATE_PARTITIONS {
            state += held(&stack, &format!("{TXN_STATE_TOPIC}/{p}")).await;
        }
        let mut offsets = 0;
        for p in 0..OFFSETS_PARTITIONS {
            offsets += held(&stack, &format!("{OFFSETS_TOPIC}/{p}")).await;
        }
        let (ranges, with, bytes, aborts) = summaries(&stack).await;
        let rss: Vec<String> = stack
            .nodes
            .iter()
            .map(|n| format!("{:.0}", mib(weir_tests::rss_bytes(n.pid()))))
            .collect();
        let mut cache = Vec::new();
        for node in &stack.nodes {
            cache.push(cache_mib(node).await);
        }
        println!(
            "{minute} | {:.0} | {c} | {a} | {state} | {offsets} | {ranges} ({with}) | {bytes} | {aborts} | {} | {} | {}",
            (c + a - last) as f64 / 60.0,
            rss.join(", "),
            anon.take().join(", "),
            cache.join(", ")
        );
        last = c + a;
    }
    sampler.abort();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("producer");
    }
    if !transactional {
        return;
    }

    // The coordinator of `soak-0` dies; a new producer with that id waits for its
    // successor (failover, then the load of the state stream).
    let stream = txn_state_stream("soak-0");
    let mut owner = None;
    for (i, node) in stack.nodes.iter().enumerate() {
        if node
            .client()
            .await
            .status(StatusRequest { stream: stream.clone() })
            .await
            .is_ok()
        {
            owner = Some(i);
        }
    }
    let owner = owner.expect("an owner of the state stream");
    stack.nodes[owner].kill();
    let killed = Instant::now();
    let waited = tokio::task::spawn_blocking(move || {
        let p: BaseProducer = base
            .clone()
            .set("transactional.id", "soak-0")
            .create()
            .expect("producer");
        let init = p.init_transactions(Duration::from_secs(120));
        (init, killed.elapsed())
    })
    .await
    .expect("init");
    println!(
        "coordinator failover: InitProducerId for soak-0 answered {:?} {:.1} s after SIGKILL of its coordinator",
        waited.0.map(|_| "ok"),
        waited.1.as_secs_f64()
    );
    for (i, node) in stack.nodes.iter().enumerate() {
        if i == owner {
            continue;
        }
        for line in node.log_text().lines() {
            if line.contains("transaction coordinator loaded its state stream") && line.contains(&stream) {
                println!("survivor's load: {line}");
            }
        }
    }
}
