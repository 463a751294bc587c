//! Issue 60: a full disk degrades a node; it does not stop it. The WAL is on a real
//! small volume, a loop-mounted ext4 image (which needs root: a test that cannot mount
//! it fails saying so).

use super::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use weir_tests::disk::LoopDisk;
use weir_tests::kafka_wire::{connect, produce_at, NoAnswer};
use weir_tests::proxy::{Mode, Proxy};

const KAFKA_STORAGE_ERROR: i16 = 56;
const MIB: u64 = 1 << 20;

/// One streamd whose WAL is on `wal`, reaching S3 through a proxy the test can cut.
async fn stack_on(wal: &Path, marks: &[&str]) -> (Stack, Proxy, Gatewayd) {
    stack_with(Backend::FileWal, wal, marks).await
}

async fn stack_with(backend: Backend, wal: &Path, marks: &[&str]) -> (Stack, Proxy, Gatewayd) {
    let mut stack = Stack::start_with(0, backend, &[], &[]).await;
    let s3 = Proxy::start(stack.s3.endpoint.trim_start_matches("http://")).await;
    let endpoint = format!("http://{}", s3.addr);
    let wal = wal.display().to_string();
    let mut flags = vec!["--wal-dir", wal.as_str(), "--disk-check-interval-ms", "100"];
    flags.extend_from_slice(marks);
    stack.add_node_with_env("streamd-1", backend, &flags, &[("AWS_ENDPOINT", &endpoint)]);
    stack.nodes[0].wait_ready().await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), &[]);
    gw.wait_ready().await;
    (stack, s3, gw)
}

/// A distinct value for record `i` of a topic, `len` bytes long.
fn value(topic: &str, i: usize, len: usize) -> Vec<u8> {
    let mut v = format!("{topic}-{i}-").into_bytes();
    v.resize(len, b'.');
    v
}

/// Produces records to `topic` over one raw connection, one at a time, until one is
/// refused with `KAFKA_STORAGE_ERROR` or `most` were sent. What was acknowledged, by
/// offset. An answer that does not come, or `REQUEST_TIMED_OUT`, is an unknown outcome
/// (a write waiting for space): not counted, and the next goes on a new connection.
fn produce_until_refused(kafka: &str, topic: &str, len: usize, most: usize) -> (BTreeMap<i64, Vec<u8>>, bool) {
    let mut s = connect(kafka);
    let mut acked = BTreeMap::new();
    for i in 0..most {
        let v = value(topic, i, len);
        match produce_at(&mut s, topic, &v) {
            Ok((0, offset)) => {
                assert!(acked.insert(offset, v).is_none(), "offset {offset} acknowledged twice");
            }
            Ok((KAFKA_STORAGE_ERROR, _)) => return (acked, true),
            Ok((7, _)) | Err(NoAnswer::TimedOut) => s = connect(kafka),
            Ok((code, _)) => panic!("produce {i} to {topic} answered error {code}"),
            Err(e) => panic!("produce {i} to {topic}: {e:?}"),
        }
    }
    (acked, false)
}

/// [`produce_until_refused`] off the runtime's workers (it blocks on its socket).
async fn produce(kafka: &str, topic: &str, len: usize, most: usize) -> (BTreeMap<i64, Vec<u8>>, bool) {
    let (kafka, topic) = (kafka.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || produce_until_refused(&kafka, &topic, len, most))
        .await
        .expect("producer")
}

/// Reads `topic`'s partition 0 and checks every acknowledged record is there, at its
/// offset, once; records not acknowledged (an unknown outcome) may be there too.
async fn check_acked_read_back(gw: &Gatewayd, topic: &str, acked: &BTreeMap<i64, Vec<u8>>) {
    let end = acked.keys().last().map_or(0, |o| o + 1) as usize;
    let read = read_all(gw, topic, 1, end).await;
    let mut seen = BTreeMap::new();
    for m in &read {
        assert!(
            seen.insert(m.offset(), m.payload().unwrap_or_default().to_vec())
                .is_none(),
            "offset {} of {topic} read twice",
            m.offset()
        );
    }
    for (offset, v) in acked {
        let got = seen
            .get(offset)
            .unwrap_or_else(|| panic!("acknowledged offset {offset} of {topic} not read back"));
        assert!(got == v, "offset {offset} of {topic} reads back other bytes");
    }
}

/// Produces one record to `topic` until it is acknowledged, for up to 60 s; on timeout
/// fails with what the node said.
async fn resumed_within(
    stack: &Stack,
    disk: Option<&LoopDisk>,
    kafka: &str,
    topic: &str,
    when: &str,
) -> BTreeMap<i64, Vec<u8>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (acked, _) = produce(kafka, topic, 1024, 1).await;
        if !acked.is_empty() {
            return acked;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "appends did not resume {when} within 60 s: {:?} bytes free, /ready {}\n{}",
                disk.map(LoopDisk::free_bytes),
                streamd_ready(stack).await,
                stack.nodes[0]
                    .log_text()
                    .lines()
                    .filter(|l| !l.contains("object_store::client::retry"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn streamd_ready(stack: &Stack) -> serde_json::Value {
    let text = weir_tests::get_text(&format!("http://{}/ready", stack.nodes[0].http)).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("/ready is not JSON ({e}): {text}"))
}

// Issue 60: the WAL's volume fills through Kafka while the object store is cut off (so
// nothing is uploaded and no WAL segment can be reclaimed). Under the refuse mark,
// produce is refused with KAFKA_STORAGE_ERROR and HTTP appends with 507
// `insufficient_storage`, before the WAL ever meets a full disk; reads go on; streamd
// says so in its log and `/ready` and stays ready. Deleting the topic that filled it
// frees its WAL segments, and appends resume with no restart; once the store is back
// every acknowledged record of the topic kept reads back, in order, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_wal_volume_refuses_appends_serves_reads_and_resumes_after_a_topic_delete() {
    let tmp = tempfile::tempdir().expect("tmp");
    let disk = LoopDisk::mount(&tmp.path().join("wal"), 160);
    let marks = [
        "--disk-refuse-free-bytes",
        "50331648",
        "--disk-refuse-free-percent",
        "100",
        "--disk-alert-free-bytes",
        "100663296",
        "--disk-alert-free-percent",
        "100",
    ];
    let (stack, s3, gw) = stack_on(&disk.at, &marks).await;
    create_topic(&gw, "keep", 1).await;
    create_topic(&gw, "fill", 1).await;
    gw.create_stream("h").await;
    gw.wait_open("h").await;
    let kafka = gw.kafka.clone();
    let (mut kept, _) = produce(&kafka, "keep", 1024, 20).await;
    assert_eq!(kept.len(), 20);
    stack.wait_committed(0, "keep/0", 20).await;

    s3.set(Mode::Cut);
    let (filled, refused) = produce(&kafka, "fill", 256 << 10, 4000).await;
    assert!(
        refused,
        "the volume never reached its refuse mark ({} records)",
        filled.len()
    );
    assert!(filled.len() > 100, "refused early: {} records", filled.len());
    assert!(
        disk.free_bytes() > 16 * MIB,
        "the mark acted before the volume was full: {} bytes free",
        disk.free_bytes()
    );
    // Every client append is refused, on any stream of the node, in both APIs.
    let (_, again) = produce(&kafka, "keep", 1024, 1).await;
    assert!(again, "a produce to another topic is refused too");
    let (status, body) = gw
        .send(
            gw.request(Method::POST, "/v1/streams/h/records")
                .json(&json!({"records": [{"body": "x"}]})),
        )
        .await;
    assert_eq!(status.as_u16(), 507, "{body}");
    assert_eq!(body["error"]["code"], "insufficient_storage", "{body}");
    let ready = streamd_ready(&stack).await;
    assert_eq!(ready["ready"], true, "still ready: reads go on: {ready}");
    assert_eq!(ready["fenced"], false, "{ready}");
    assert_eq!(ready["disk"][0]["name"], "wal", "{ready}");
    assert_eq!(ready["disk"][0]["level"], "refuse", "{ready}");
    assert!(
        ready["appends_refused"]
            .as_str()
            .is_some_and(|w| w.contains("under its refuse mark")),
        "{ready}"
    );
    let log = stack.nodes[0].log_text();
    assert!(log.contains("volume is under its alert mark"), "the alert was logged");
    assert!(
        log.contains("volume is under its refuse mark"),
        "the refusal was logged"
    );

    // Reads go on, from what the node holds.
    check_acked_read_back(&gw, "fill", &filled).await;
    check_acked_read_back(&gw, "keep", &kept).await;

    // Deleting the topic that filled the volume gives its WAL segments back.
    let deleted = admin(&gw)
        .delete_topics(&["fill"], &AdminOptions::new().operation_timeout(Some(T)))
        .await
        .expect("delete");
    assert_eq!(deleted, vec![Ok("fill".to_string())]);
    let resumed = resumed_within(&stack, Some(&disk), &kafka, "keep", "after the delete").await;
    kept.extend(resumed);
    s3.set(Mode::Pass);
    let (more, refused) = produce(&kafka, "keep", 1024, 5).await;
    assert!(!refused && more.len() == 5, "appends go on once space returned");
    kept.extend(more);
    check_acked_read_back(&gw, "keep", &kept).await;
    let ready = streamd_ready(&stack).await;
    assert_eq!(ready["appends_refused"], serde_json::Value::Null, "{ready}");
    assert!(
        !stack.nodes[0].log_text().contains("write-ahead log failed"),
        "the node never fenced itself"
    );
}

// Issue 60: another process fills the WAL's volume (no refuse mark here, so the WAL
// itself meets ENOSPC when it needs its next segment). The node does not fence: the
// write waits for space, new appends are refused with KAFKA_STORAGE_ERROR, and once the
// file is removed the waiting write goes through and appends resume. Every
// acknowledged record reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enospc_from_another_process_does_not_fence_the_node() {
    let tmp = tempfile::tempdir().expect("tmp");
    let disk = LoopDisk::mount(&tmp.path().join("wal"), 96);
    let marks = ["--disk-refuse-free-bytes", "0", "--disk-alert-free-bytes", "0"];
    let (stack, _s3, gw) = stack_on(&disk.at, &marks).await;
    create_topic(&gw, "out", 1).await;
    let kafka = gw.kafka.clone();
    // Room for what is written now, not for the next 4 MiB segment.
    disk.fill_leaving(2 * MIB);
    let (mut acked, refused) = produce(&kafka, "out", 128 << 10, 400).await;
    assert!(
        refused,
        "the full volume never refused an append ({} acknowledged)",
        acked.len()
    );
    let ready = streamd_ready(&stack).await;
    assert_eq!(ready["fenced"], false, "ENOSPC does not fence: {ready}");
    assert_eq!(ready["ready"], true, "{ready}");
    assert!(
        ready["appends_refused"]
            .as_str()
            .is_some_and(|w| w.contains("volume is full")),
        "{ready}"
    );
    assert!(stack.nodes[0].log_text().contains("write-ahead log volume is full"));
    check_acked_read_back(&gw, "out", &acked).await;

    disk.free_filler();
    let resumed = resumed_within(&stack, Some(&disk), &kafka, "out", "once the file is gone").await;
    acked.extend(resumed);
    check_acked_read_back(&gw, "out", &acked).await;
    assert!(stack.nodes[0]
        .log_text()
        .contains("write-ahead log volume has space again"));
    assert!(!stack.nodes[0].log_text().contains("write-ahead log failed"));
}

/// Produces distinct records to `topic` one at a time until `stop`: what was
/// acknowledged, by offset, and how many were refused with `KAFKA_STORAGE_ERROR`. An
/// answer that does not come, or `REQUEST_TIMED_OUT`, is an unknown outcome.
fn produce_until_stopped(
    kafka: &str,
    topic: &str,
    stop: &std::sync::atomic::AtomicBool,
) -> (BTreeMap<i64, Vec<u8>>, usize) {
    let mut s = connect(kafka);
    let (mut acked, mut refused) = (BTreeMap::new(), 0);
    for i in 0.. {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        let v = value(topic, i, 512);
        match produce_at(&mut s, topic, &v) {
            Ok((0, offset)) => {
                assert!(acked.insert(offset, v).is_none(), "offset {offset} acknowledged twice");
            }
            Ok((KAFKA_STORAGE_ERROR, _)) => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok((7, _)) | Err(NoAnswer::TimedOut) => s = connect(kafka),
            Ok((code, _)) => panic!("produce {i} to {topic} answered error {code}"),
            Err(e) => panic!("produce {i} to {topic}: {e:?}"),
        }
    }
    (acked, refused)
}

// Issue 60: the object store answers every request with 503 SlowDown for 30 s while a
// producer writes to a diskless node (object WAL). The S3 client's retries give up
// within that time; the WAL tries its object again on the same key, refuses new
// appends with KAFKA_STORAGE_ERROR meanwhile, and the node never fences. Once the store
// answers again, appends resume, and every acknowledged record reads back in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_store_answering_slow_down_for_30_s_loses_nothing_and_appends_resume() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (stack, s3, gw) = stack_with(Backend::ObjectWal, tmp.path(), &[]).await;
    create_topic(&gw, "slow", 1).await;
    let before = produce(&gw.kafka, "slow", 512, 20).await.0;
    assert_eq!(before.len(), 20);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let (kafka, stop) = (gw.kafka.clone(), stop.clone());
        tokio::task::spawn_blocking(move || produce_until_stopped(&kafka, "slow", &stop))
    };
    s3.set(Mode::SlowDown);
    // The fault's length is what is tested: the S3 client's own retries end before it.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let refused_while_slow = streamd_ready(&stack).await;
    s3.set(Mode::Pass);
    let resumed = resumed_within(&stack, None, &gw.kafka, "slow", "after the store answered again").await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut acked, refused) = producer.await.expect("producer");
    acked.extend(resumed);
    acked.extend(before);
    assert!(s3.slowed_down() > 0, "the proxy answered no request with SlowDown");
    assert!(refused > 0, "no append was refused while the store refused PUTs");
    assert!(
        refused_while_slow["appends_refused"]
            .as_str()
            .is_some_and(|w| w.contains("refuses write-ahead log objects")),
        "{refused_while_slow}"
    );
    check_acked_read_back(&gw, "slow", &acked).await;
    let ready = streamd_ready(&stack).await;
    assert_eq!(ready["fenced"], false, "{ready}");
    assert_eq!(ready["appends_refused"], serde_json::Value::Null, "{ready}");
    let log = stack.nodes[0].log_text();
    assert!(log.contains("WAL object PUT failed; refusing new appends and trying the same key again"));
    assert!(log.contains("the object store takes write-ahead log objects again"));
}

// Issue 60: a node restarted on a WAL volume with not one block free comes up: its new
// incarnation's WAL directory is the spare its predecessor made (a rename, no block
// needed). It takes over its own old WAL and serves every acknowledged record. Filled
// again (the taken-over WAL's space comes back once uploaded), it refuses appends with
// KAFKA_STORAGE_ERROR, and takes them again once space returns, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_on_a_full_wal_volume_serves_reads_and_resumes_when_space_returns() {
    let tmp = tempfile::tempdir().expect("tmp");
    let disk = LoopDisk::mount(&tmp.path().join("wal"), 64);
    let marks = ["--disk-refuse-free-bytes", "0", "--disk-alert-free-bytes", "0"];
    let (mut stack, _s3, gw) = stack_on(&disk.at, &marks).await;
    create_topic(&gw, "full", 1).await;
    let (mut acked, _) = produce(&gw.kafka, "full", 1024, 20).await;
    assert_eq!(acked.len(), 20);
    disk.fill_up();
    stack.nodes[0].kill();
    stack.nodes[0].start();
    // Without the spare, the start ends with "cannot create WAL directory".
    let url = format!("http://{}/readyz", stack.nodes[0].http);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(code) = stack.nodes[0].wait_exit_if_exited(Duration::from_millis(200)).await {
            panic!(
                "streamd exited {code} on a full volume: {}",
                weir_tests::tail_of(&stack.nodes[0].run_log_text(), 3000)
            );
        }
        let answer = weir_tests::http().get(&url).send().await;
        if answer.is_ok_and(|a| a.status().is_success()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready within 60 s on a full volume"
        );
    }
    check_acked_read_back(&gw, "full", &acked).await;
    // The takeover of its old WAL gives that WAL's space back once uploaded; take it too.
    disk.fill_up();
    let (refused_acks, refused) = produce(&gw.kafka, "full", 1024, 50).await;
    assert!(
        refused,
        "appends were not refused on a full volume ({} acknowledged)",
        refused_acks.len()
    );
    acked.extend(refused_acks);
    disk.free_filler();
    let resumed = resumed_within(&stack, Some(&disk), &gw.kafka, "full", "once the filler is gone").await;
    acked.extend(resumed);
    check_acked_read_back(&gw, "full", &acked).await;
    assert!(!stack.nodes[0].log_text().contains("write-ahead log failed"));
}
