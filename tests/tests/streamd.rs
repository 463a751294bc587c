//! streamd over real processes and a real S3-protocol server (s3s-fs): appends,
//! uploads and commits, reads from the tail and from objects, WAL replay after
//! SIGKILL, WAL fencing, and corruption detection.
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};
use weir_proto::streamd::{AppendRequest, CloseStreamRequest, ReadRequest, StatusRequest, WriteTxnMarkerRequest};
use weir_shared::ids::{Epoch, NodeId};
use weir_tests::batches::{batch, idempotent, transactional, values};
use weir_tests::streamd::{Backend, Stack};
use weir_tests::wait_for;

const TEST_TIMEOUT: Duration = Duration::from_secs(180);

async fn with_timeout(f: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(TEST_TIMEOUT, f).await.expect("test timed out");
}

/// One metad replica, S3 and `nodes` streamd nodes over mTLS, streams placed by the
/// tests (issue 18): the tests' proposals carry an operator certificate and their
/// data-plane calls a gateway's, rather than identities a plaintext cluster believes.
async fn secure_stack(nodes: usize, backend: Backend, extra: &[&str]) -> Stack {
    secure_stack_with(nodes, backend, extra, &["--auto-place", "false"]).await
}

/// As [`secure_stack`], metad with `metad_extra` flags.
async fn secure_stack_with(nodes: usize, backend: Backend, extra: &[&str], metad_extra: &[&str]) -> Stack {
    Stack::secure(1, nodes, backend, extra, metad_extra).await
}

/// Reads every record of `stream` from `offset` on through node `on`.
async fn read_all(stack: &Stack, on: usize, stream: &str, from: u64, until: u64) -> Vec<(u64, Vec<u8>)> {
    let mut client = stack.nodes[on].client().await;
    let mut out = Vec::new();
    let mut offset = from;
    while offset < until {
        let r = client
            .read(ReadRequest {
                stream: stream.into(),
                offset,
                max_bytes: 64 * 1024,
                wait_ms: 0,
                exact_max_bytes: false,
                read_committed: false,
            })
            .await
            .expect("read")
            .into_inner();
        assert!(r.next_offset > offset, "read made no progress at {offset}");
        out.extend(values(&r.batches));
        offset = r.next_offset;
    }
    out
}

/// The metadata row of the stream named `name`.
async fn stream_row(stack: &Stack, name: &str) -> serde_json::Value {
    let streams = stack.metad.client().admin("streams", 0, 0).await.expect("streams");
    streams["streams"]
        .as_object()
        .and_then(|m| m.values().find(|s| s["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("no stream row named {name}"))
}

fn expect_sequence(got: &[(u64, Vec<u8>)], n: usize, prefix: &str) {
    assert_eq!(got.len(), n, "record count");
    for (i, (offset, value)) in got.iter().enumerate() {
        assert_eq!(*offset, i as u64, "offset of record {i}");
        assert_eq!(value, format!("{prefix}-{i}").as_bytes(), "value at {i}");
    }
}

/// RR-WAL-2, RR-WAL-4: acknowledged appends read back from the tail, are uploaded to S3
/// and committed; after a close and a move, the new owner serves them by ranged GETs.
async fn append_upload_and_read_back(backend: Backend) {
    let stack = secure_stack(2, backend, &["--upload-interval-ms", "100"]).await;
    stack.create_stream("orders", 0).await;
    let mut a = stack.nodes[0].client().await;
    for i in 0..200 {
        let reply = a
            .append(AppendRequest {
                stream: "orders".into(),
                batches: batch(format!("r-{i}").as_bytes()).into(),
                match_next_offset: None,
                transactional_id: None,
            })
            .await
            .expect("append")
            .into_inner();
        assert_eq!(reply.base_offset, i);
        assert_eq!(reply.end_offset, i + 1);
    }
    expect_sequence(&read_all(&stack, 0, "orders", 0, 200).await, 200, "r");
    // The uploader commits everything within a few intervals.
    stack.wait_committed(0, "orders", 200).await;
    let metrics = weir_tests::get_text(&format!("http://{}/metrics", stack.nodes[0].http)).await;
    assert!(
        metrics.contains("weir_streamd_appends_total{result=\"ok\"} 200"),
        "{metrics}"
    );
    assert!(metrics.contains("weir_streamd_objects_committed_total"), "{metrics}");
    let objects: Vec<_> = weir_tests::files_under(&stack.s3.dir.path().join(weir_tests::s3::BUCKET).join("data"));
    assert!(!objects.is_empty(), "no data object in S3");
    // Close on A and move to B: B reads everything from objects (range GETs).
    let end = a
        .close_stream(CloseStreamRequest {
            stream: "orders".into(),
            timeout_ms: 0,
        })
        .await
        .expect("close")
        .into_inner()
        .end_offset;
    assert_eq!(end, 200);
    let id = stream_row(&stack, "orders").await["id"].as_u64().expect("stream id");
    // FO-FEN-9: the former owner refuses the stream at once, naming no stale epoch.
    let err = a
        .append(AppendRequest {
            stream: "orders".into(),
            batches: batch(b"late").into(),
            match_next_offset: None,
            transactional_id: None,
        })
        .await
        .expect_err("closed stream accepted an append");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(
        weir_shared::error_code::ErrorCode::of_status(&err).map(|c| c.as_str()),
        Some("not_owner")
    );
    stack.place(weir_shared::ids::StreamId(id), 1).await;
    stack.wait_serving("orders", 1).await;
    expect_sequence(&read_all(&stack, 1, "orders", 0, 200).await, 200, "r");
    // Range reads from the middle of an object.
    let mid = read_all(&stack, 1, "orders", 137, 200).await;
    assert_eq!(mid.first().map(|(o, _)| *o), Some(137));
    // New appends on B continue the offsets.
    let mut b = stack.nodes[1].client().await;
    let r = b
        .append(AppendRequest {
            stream: "orders".into(),
            batches: batch(b"r-200").into(),
            match_next_offset: Some(200),
            transactional_id: None,
        })
        .await
        .expect("append on B")
        .into_inner();
    assert_eq!(r.base_offset, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_wal_appends_upload_to_s3_and_read_back_after_a_move() {
    with_timeout(append_upload_and_read_back(Backend::FileWal)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_wal_appends_upload_to_s3_and_read_back_after_a_move() {
    with_timeout(append_upload_and_read_back(Backend::ObjectWal)).await;
}

/// A long poll wakes on an append; a read past the end is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_waits_for_new_data_and_refuses_offsets_past_the_end() {
    with_timeout(async {
        let stack = secure_stack(1, Backend::FileWal, &[]).await;
        stack.create_stream("tail", 0).await;
        let mut reader = stack.nodes[0].client().await;
        let waiting = tokio::spawn(async move {
            let started = Instant::now();
            let r = reader
                .read(ReadRequest {
                    stream: "tail".into(),
                    offset: 0,
                    max_bytes: 0,
                    wait_ms: 10_000,
                    exact_max_bytes: false,
                    read_committed: false,
                })
                .await
                .expect("long poll")
                .into_inner();
            (r, started.elapsed())
        });
        // Give the read time to park at the tail; it must still be waiting then.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "the read returned before any append");
        let mut writer = stack.nodes[0].client().await;
        writer
            .append(AppendRequest {
                stream: "tail".into(),
                batches: batch(b"woke").into(),
                match_next_offset: None,
                transactional_id: None,
            })
            .await
            .expect("append");
        let (r, took) = waiting.await.expect("reader");
        assert_eq!(values(&r.batches), vec![(0, b"woke".to_vec())]);
        assert!(took < Duration::from_secs(5), "long poll did not wake: {took:?}");
        let mut c = stack.nodes[0].client().await;
        let err = c
            .read(ReadRequest {
                stream: "tail".into(),
                offset: 5,
                max_bytes: 0,
                wait_ms: 0,
                exact_max_bytes: false,
                read_committed: false,
            })
            .await
            .expect_err("past the end");
        assert_eq!(err.code(), tonic::Code::OutOfRange);
        let err = c
            .append(AppendRequest {
                stream: "tail".into(),
                batches: bytes::Bytes::from_static(b"not a batch"),
                match_next_offset: None,
                transactional_id: None,
            })
            .await
            .expect_err("garbage");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        let err = c
            .append(AppendRequest {
                stream: "tail".into(),
                batches: batch(b"x").into(),
                match_next_offset: Some(0),
                transactional_id: None,
            })
            .await
            .expect_err("stale match");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    })
    .await;
}

/// RR-WAL-2: SIGKILL right after acknowledgements: replaying the WAL yields every
/// acknowledged record, in order, exactly once (both backends).
async fn check_replay_after_sigkill(backend: Backend) {
    // A long upload interval keeps records in the WAL only.
    let mut stack = secure_stack(
        1,
        backend,
        &["--upload-interval-ms", "600000", "--upload-bytes", "1000000000"],
    )
    .await;
    let id = stack.create_stream("acks", 0).await;
    let mut client = stack.nodes[0].client().await;
    let mut acked = Vec::new();
    for i in 0..300u64 {
        let r = client
            .append(AppendRequest {
                stream: "acks".into(),
                batches: batch(format!("k-{i}").as_bytes()).into(),
                match_next_offset: None,
                transactional_id: None,
            })
            .await
            .expect("append")
            .into_inner();
        acked.push(r.base_offset);
    }
    let epoch = Epoch(1);
    stack.nodes[0].kill();
    let node = NodeId::new("streamd-1");
    let records = match backend {
        Backend::FileWal => weir_streamd::wal::file::take_over(&stack.wal_root, &node, epoch, "test").expect("replay"),
        Backend::ObjectWal => {
            let store = s3_store(&stack);
            weir_streamd::wal::object::take_over(store, &node, epoch, "test")
                .await
                .expect("replay")
        }
    }
    .records;
    let mut replayed = Vec::new();
    for r in records.iter().filter(|r| r.stream == id) {
        replayed.extend(values(&r.batches));
    }
    assert_eq!(replayed.len(), 300, "every acknowledged record once");
    for (i, (offset, value)) in replayed.iter().enumerate() {
        assert_eq!(*offset, acked[i]);
        assert_eq!(value, format!("k-{i}").as_bytes());
    }
    // RR-FEN-5: the catch-up boundary is logged with the index it admitted at.
    assert!(stack.nodes[0]
        .log_text()
        .contains("runtime execution admitted after linearizable consensus catch-up"));
    assert!(stack.nodes[0].log_text().contains("committed_log_index"));
    // RR-FEN-6, INV-12: the restarted node is a new incarnation that owns nothing from before.
    stack.nodes[0].start();
    stack.nodes[0].wait_ready().await;
    let mut client = stack.nodes[0].client().await;
    let err = client
        .status(StatusRequest { stream: "acks".into() })
        .await
        .expect_err("restarted node serves the stream");
    assert_eq!(
        weir_shared::error_code::ErrorCode::of_status(&err).map(|c| c.as_str()),
        Some("not_owner")
    );
    let nodes = stack.metad.client().admin("nodes", 0, 0).await.expect("nodes");
    // SD-TRM-1: the restart is a new incarnation, epoch 1 → 2, under the same node ID.
    assert_eq!(weir_tests::node_row(&nodes, "streamd-1")["epoch"], 2);
    // FO-LIV-1: the new incarnation heartbeats every second.
    let first = weir_tests::node_row(&nodes, "streamd-1")["heartbeats"]
        .as_u64()
        .expect("count");
    wait_for("heartbeats land", Duration::from_secs(10), || async {
        let v = stack.metad.client().admin("nodes", 0, 0).await.ok()?;
        (weir_tests::node_row(&v, "streamd-1")["heartbeats"].as_u64()? >= first + 2).then_some(())
    })
    .await;
}

fn s3_store(stack: &Stack) -> std::sync::Arc<dyn object_store::ObjectStore> {
    let s3 = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(&stack.s3.endpoint)
        .with_bucket_name(weir_tests::s3::BUCKET)
        .with_access_key_id(weir_tests::s3::ACCESS_KEY)
        .with_secret_access_key(weir_tests::s3::SECRET_KEY)
        .with_region("us-east-1")
        .with_allow_http(true)
        .build()
        .expect("s3 client");
    std::sync::Arc::new(s3)
}

// RR-FEN-5: the catch-up boundary in the log. A streamd registers; its catch-up (held
// 2 s by failpoint `catch_up_start`) then finds metad unreachable through its cut link
// for several read attempts. It warns exactly once that it waits, however many reads
// fail, and once the link is back logs its admission at info, exactly once, with a
// committed_log_index at or past the index of its own registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catch_up_boundary_is_logged_once_each_way() {
    use weir_tests::proxy::{Mode, Proxy};
    with_timeout(async {
        // A node timeout well past the cut, so the node is not fenced meanwhile.
        let timing = ["--heartbeat-interval-sec", "1", "--node-timeout-sec", "30"];
        let metad_flags = [&["--auto-place", "false"][..], &timing[..]].concat();
        let mut stack = secure_stack_with(0, Backend::FileWal, &[], &metad_flags).await;
        let link = Proxy::start(&stack.metad.replicas[0].grpc).await;
        let flags = [&["--metad", link.addr.as_str()][..], &timing[..]].concat();
        stack.add_node_with_env(
            "streamd-1",
            Backend::FileWal,
            &flags,
            &[("WEIR_FAILPOINT_CATCH_UP_START", "sleep(2000)")],
        );
        let registered = wait_for("the node registered", Duration::from_secs(30), || async {
            weir_tests::records(&stack.nodes[0].log_text(), "registered")
                .first()
                .cloned()
        })
        .await;
        link.set(Mode::Cut);
        let waiting = "runtime execution is waiting for linearizable consensus catch-up";
        wait_for("the catch-up waits", Duration::from_secs(30), || async {
            (!weir_tests::records(&stack.nodes[0].log_text(), waiting).is_empty()).then_some(())
        })
        .await;
        // Reads are retried every 0.5 s: several more fail while the link stays cut.
        tokio::time::sleep(Duration::from_secs(3)).await;
        // RR-FEN-1: registered but not caught up, the node is not ready and serves nothing.
        let ready = weir_tests::http_builder()
            .build()
            .expect("client")
            .get(format!("http://{}/readyz", stack.nodes[0].http))
            .send()
            .await
            .expect("readyz");
        assert_eq!(ready.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
        link.set(Mode::Pass);
        stack.nodes[0].wait_ready().await;
        let log = stack.nodes[0].log_text();
        // OBS-13: both catch-up records, exactly as quoted, at their levels.
        let warned = weir_tests::records(&log, waiting);
        assert_eq!(warned.len(), 1, "warned once: {warned:?}");
        assert_eq!(warned[0]["level"], "WARN");
        let admitted = weir_tests::records(&log, "runtime execution admitted after linearizable consensus catch-up");
        assert_eq!(admitted.len(), 1, "{admitted:?}");
        assert_eq!(admitted[0]["level"], "INFO");
        // RR-FEN-5: the wait was warned once however many reads failed, and the admission
        // logged once with a committed_log_index at or past the node's own registration.
        let at = admitted[0]["committed_log_index"].as_u64().expect("index");
        let registered_at = registered["log_index"].as_u64().expect("registration index");
        assert!(at >= registered_at, "admitted at {at}, registered at {registered_at}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_wal_replay_after_sigkill_returns_every_acknowledged_record_once() {
    // RR-FEN-5, RR-FEN-6, INV-12, SD-TRM-1, FO-LIV-1: the helper checks the replay holds
    // every acknowledged record once, the admission log line, and that the restarted
    // node is epoch 2, owns nothing from before and heartbeats.
    with_timeout(check_replay_after_sigkill(Backend::FileWal)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_wal_replay_after_sigkill_returns_every_acknowledged_record_once() {
    // RR-FEN-5, RR-FEN-6, INV-12, SD-TRM-1, FO-LIV-1: the helper checks the replay holds
    // every acknowledged record once, the admission log line, and that the restarted
    // node is epoch 2, owns nothing from before and heartbeats.
    with_timeout(check_replay_after_sigkill(Backend::ObjectWal)).await;
}

/// Issue 61: SIGKILL keeps the page cache, so the replay test above passes with the
/// WAL's fdatasync deleted. What power loss would reveal, an acknowledgement given
/// before its record was synced, shows in the order of the owner's system calls:
/// within every append's window a WAL write returned and then a sync of it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_wal_acknowledges_an_append_only_after_syncing_its_write() {
    with_timeout(async {
        let stack = secure_stack(1, Backend::FileWal, &["--upload-interval-ms", "600000"]).await;
        stack.create_stream("synced", 0).await;
        let mut client = stack.nodes[0].client().await;
        let append = |i: u64| AppendRequest {
            stream: "synced".into(),
            batches: batch(format!("s-{i}").as_bytes()).into(),
            match_next_offset: None,
            transactional_id: None,
        };
        // The first append opens the segment; the windows checked are the later ones.
        client.append(append(0)).await.expect("append");
        let trace = weir_tests::syscalls::SyscallTrace::attach(stack.nodes[0].pid(), stack.dir.path()).await;
        let mut windows = Vec::new();
        for i in 1..=40u64 {
            let sent = weir_tests::syscalls::now();
            client.append(append(i)).await.expect("append");
            windows.push((sent, weir_tests::syscalls::now()));
        }
        let calls = trace.finish();
        let wal_root = stack.wal_root.display().to_string();
        let in_wal = |p: &str| p.starts_with(&wal_root);
        assert!(
            calls.iter().any(|c| in_wal(&c.path) && !c.is_sync()),
            "no WAL write traced under {wal_root}: {:?}",
            &calls[..calls.len().min(20)]
        );
        for (i, (sent, acked)) in windows.iter().enumerate() {
            // RR-WAL-2: the acknowledgement came after a WAL write and its fdatasync.
            assert!(
                weir_tests::syscalls::synced_writes(&calls, in_wal, *sent, *acked) >= 1,
                "append {} was acknowledged without a synced WAL write in its window: {:?}",
                i + 1,
                calls
                    .iter()
                    .filter(|c| in_wal(&c.path) && c.start >= *sent && c.start <= *acked)
                    .collect::<Vec<_>>()
            );
        }
    })
    .await;
}

/// INV-7, FO-FEN-8: a takeover (racing the writer's appends where the store's
/// conditional put is atomic) fences the writer: it acknowledges nothing afterwards,
/// exits 75, and every record it acknowledged is in the replay. s3s-fs's put-if-absent
/// is check-then-write, so against it the object WAL is fenced between appends.
async fn check_takeover_fences_racing_appends(backend: Backend) {
    let racing = backend == Backend::FileWal;
    let mut stack = secure_stack(
        1,
        backend,
        &["--upload-interval-ms", "600000", "--upload-bytes", "1000000000"],
    )
    .await;
    let id = stack.create_stream("race", 0).await;
    let (pause_tx, mut pause_rx) = tokio::sync::watch::channel(false);
    let writer = {
        let mut client = stack.nodes[0].client().await;
        tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..100_000u64 {
                if i == 50 && !racing {
                    // Wait for the takeover, then try once more.
                    let _ = pause_rx.wait_for(|p| *p).await;
                }
                let req = AppendRequest {
                    stream: "race".into(),
                    batches: batch(format!("x-{i}").as_bytes()).into(),
                    match_next_offset: None,
                    transactional_id: None,
                };
                match client.append(req).await {
                    Ok(r) => acked.push((r.into_inner().base_offset, i)),
                    Err(_) => break,
                }
            }
            acked
        })
    };
    // Take over once the writer is well under way.
    let status_client = stack.nodes[0].client().await;
    wait_for("50 appends acknowledged", Duration::from_secs(20), || {
        let mut c = status_client.clone();
        async move {
            let s = c
                .status(StatusRequest { stream: "race".into() })
                .await
                .ok()?
                .into_inner();
            (s.end_offset >= 50).then_some(())
        }
    })
    .await;
    let node = NodeId::new("streamd-1");
    let records = match backend {
        Backend::FileWal => {
            weir_streamd::wal::file::take_over(&stack.wal_root, &node, Epoch(1), "test").expect("takeover")
        }
        Backend::ObjectWal => weir_streamd::wal::object::take_over(s3_store(&stack), &node, Epoch(1), "test")
            .await
            .expect("takeover"),
    }
    .records;
    pause_tx.send_replace(true);
    let acked = writer.await.expect("writer");
    if !racing {
        assert_eq!(acked.len(), 50, "an append after the takeover was acknowledged");
    }
    assert!(!acked.is_empty(), "the writer acknowledged nothing before the takeover");
    let code = stack.nodes[0].wait_exit(Duration::from_secs(20)).await;
    assert_eq!(code, Some(75), "a taken-over writer exits 75");
    let replayed: std::collections::HashMap<u64, Vec<u8>> = records
        .iter()
        .filter(|r| r.stream == id)
        .flat_map(|r| values(&r.batches))
        .collect();
    for (offset, i) in &acked {
        assert_eq!(
            replayed.get(offset).map(Vec::as_slice),
            Some(format!("x-{i}").as_bytes()),
            "acknowledged offset {offset} lost"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_wal_takeover_racing_appends_fences_the_writer_and_loses_no_ack() {
    // INV-7: the helper checks the taken-over writer exits 75 and that every record it
    // acknowledged is in the takeover's replay.
    with_timeout(check_takeover_fences_racing_appends(Backend::FileWal)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_wal_takeover_fences_the_writer_and_loses_no_ack() {
    // INV-7: the helper checks the taken-over writer exits 75 and that every record it
    // acknowledged is in the takeover's replay.
    with_timeout(check_takeover_fences_racing_appends(Backend::ObjectWal)).await;
}

/// INV-7 (issue 20, defect 1; issue 58): reclaim keeps the object carrying the highest
/// durable floor (an idle writer's object without records), so after every record is
/// committed and reclaimed a takeover still fences above the writer, and the writer's
/// next append is refused. With every object deleted the takeover would list nothing,
/// fence key 1, and the writer's next put would succeed: acknowledged, and replayed by
/// no one.
async fn check_reclaimed_object_wal_still_fences_the_writer(store: std::sync::Arc<dyn object_store::ObjectStore>) {
    use futures::TryStreamExt;
    use weir_shared::ids::{StreamEpoch, StreamId};
    use weir_streamd::wal::object::{incarnation_prefix, take_over, ObjectSink, Pipelining};
    use weir_streamd::wal::{Sink, WalError, WalRecord, WalWriter};

    let (tasks, stop) = (
        tokio_util::task::TaskTracker::new(),
        tokio_util::sync::CancellationToken::new(),
    );
    let (node, epoch, stream) = (NodeId::new("streamd-9"), Epoch(3), StreamId(7));
    let sink = Sink::Object(ObjectSink::create(store.clone(), &node, epoch, Pipelining::default()));
    let wal = WalWriter::start(sink, u64::MAX, &tasks, stop.clone()).expect("writer");
    let record = |i: u64| WalRecord {
        stream,
        stream_epoch: StreamEpoch(1),
        base_offset: i,
        offset_count: 1,
        batches: batch(format!("r-{i}").as_bytes()).into(),
    };
    for i in 0..3 {
        wal.append(&record(i)).await.expect("append");
    }
    // Every record is committed in a data object: reclaim what it may.
    wal.reclaim([(stream, 3)]);
    let prefix = incarnation_prefix(&node, epoch);
    wait_for("the WAL objects reclaimed", Duration::from_secs(20), || {
        let (store, prefix) = (store.clone(), prefix.clone());
        async move {
            let objects: Vec<_> = store.list(Some(&prefix)).try_collect().await.ok()?;
            (objects.len() <= 1).then_some(())
        }
    })
    .await;
    let replayed = take_over(store.clone(), &node, epoch, "test")
        .await
        .expect("takeover")
        .records;
    assert!(
        replayed.iter().all(|r| r.stream == stream && r.end_offset() <= 3),
        "the replay holds only records the writer wrote"
    );
    assert_eq!(
        wal.append(&record(3)).await,
        Err(WalError::Fenced),
        "the old writer appended after a takeover of its fully reclaimed WAL"
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaimed_object_wal_still_fences_the_writer_in_memory() {
    // INV-7: the helper checks the old writer's next append is refused as fenced.
    with_timeout(check_reclaimed_object_wal_still_fences_the_writer(std::sync::Arc::new(
        object_store::memory::InMemory::new(),
    )))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaimed_object_wal_still_fences_the_writer_on_s3() {
    with_timeout(async {
        let s3 = weir_tests::s3::S3Server::start().await;
        // INV-7: as above, on an S3 server's conditional puts.
        check_reclaimed_object_wal_still_fences_the_writer(std::sync::Arc::new(s3.store())).await;
    })
    .await;
}

/// Issue 58 (RR-WAL-1, RR-WAL-2, INV-7): SIGKILL while several WAL objects are in flight
/// to an S3 whose every request a proxy delays 25–55 ms. The takeover's replay holds
/// every acknowledged record once, in order, and no stream's replay has a hole: nothing
/// put after a PUT that never landed is read as part of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_wal_sigkill_with_puts_in_flight_at_s3_latency_loses_no_ack() {
    use std::sync::{Arc, Mutex};
    use weir_tests::proxy::Proxy;
    with_timeout(async {
        let mut stack = Stack::start(0, Backend::ObjectWal, &[]).await;
        let proxy = Proxy::start(stack.s3.endpoint.trim_start_matches("http://")).await;
        proxy.delay_requests(Duration::from_millis(25), Duration::from_millis(55));
        let endpoint = format!("http://{}", proxy.addr);
        let wal_only = ["--upload-interval-ms", "600000", "--upload-bytes", "1000000000"];
        stack.add_node_with_env(
            "streamd-1",
            Backend::ObjectWal,
            &wal_only,
            &[("AWS_ENDPOINT", &endpoint)],
        );
        stack.nodes[0].wait_ready().await;
        const STREAMS: usize = 8;
        let mut ids = Vec::new();
        for s in 0..STREAMS {
            ids.push(stack.create_stream(&format!("lat-{s}"), 0).await);
        }
        // Per stream, (offset, value) of each acknowledged append.
        type Acked = Vec<Vec<(u64, String)>>;
        let acked: Arc<Mutex<Acked>> = Arc::new(Mutex::new(vec![Vec::new(); STREAMS]));
        let mut writers = Vec::new();
        for s in 0..STREAMS {
            let (mut client, acked) = (stack.nodes[0].client().await, acked.clone());
            writers.push(tokio::spawn(async move {
                for i in 0u64.. {
                    // Writers that wait for each answer move in lockstep: their appends
                    // all land in one WAL object, and the next ones in the next. A pause
                    // that differs by writer and append spreads them over a PUT's latency,
                    // so several WAL objects are in flight at once whatever the machine.
                    tokio::time::sleep(Duration::from_millis((i * 7 + s as u64 * 5) % 23)).await;
                    let value = format!("v-{s}-{i}");
                    let req = AppendRequest {
                        stream: format!("lat-{s}"),
                        batches: batch(value.as_bytes()).into(),
                        match_next_offset: None,
                        transactional_id: None,
                    };
                    match client.append(req).await {
                        Ok(r) => acked.lock().expect("lock")[s].push((r.into_inner().base_offset, value)),
                        Err(_) => return,
                    }
                }
            }));
        }
        let metrics = format!("http://{}/metrics", stack.nodes[0].http);
        wait_for("several WAL PUTs in flight at once", Duration::from_secs(60), || {
            let metrics = metrics.clone();
            async move {
                let text = weir_tests::get_text(&metrics).await;
                (weir_tests::metric_value(&text, "weir_streamd_wal_puts_inflight")? >= 3.0).then_some(())
            }
        })
        .await;
        wait_for(
            "20 acknowledged appends on every stream",
            Duration::from_secs(60),
            || async { acked.lock().expect("lock").iter().all(|a| a.len() >= 20).then_some(()) },
        )
        .await;
        stack.nodes[0].kill();
        for w in writers {
            w.await.expect("writer");
        }
        let replay =
            weir_streamd::wal::object::take_over(s3_store(&stack), &NodeId::new("streamd-1"), Epoch(1), "test")
                .await
                .expect("takeover");
        assert!(replay.damage.is_empty(), "{:?}", replay.damage);
        let acked = acked.lock().expect("lock").clone();
        for (s, id) in ids.iter().enumerate() {
            let replayed: Vec<(u64, Vec<u8>)> = replay
                .records
                .iter()
                .filter(|r| r.stream == *id)
                .flat_map(|r| values(&r.batches))
                .collect();
            let offsets: Vec<u64> = replayed.iter().map(|(o, _)| *o).collect();
            assert_eq!(
                offsets,
                (0..replayed.len() as u64).collect::<Vec<_>>(),
                "stream lat-{s}: a hole or a repeat"
            );
            // RR-WAL-2: an append was acknowledged only once its WAL object landed, so each
            // acknowledged record survives the SIGKILL with PUTs still in flight.
            assert!(
                replayed.len() >= acked[s].len(),
                "stream lat-{s}: acknowledged records missing"
            );
            for (offset, value) in &acked[s] {
                // RR-WAL-2: at the offset it was acknowledged with.
                assert_eq!(
                    replayed[*offset as usize].1,
                    value.as_bytes(),
                    "stream lat-{s} offset {offset}"
                );
            }
        }
    })
    .await;
}

/// A torn WAL tail is cut, and a corrupted data object is reported, never served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_wal_tail_is_cut_and_corrupt_object_is_refused() {
    with_timeout(async {
        let mut stack = secure_stack(2, Backend::FileWal, &["--upload-interval-ms", "100"]).await;
        let id = stack.create_stream("c", 0).await;
        let mut a = stack.nodes[0].client().await;
        for i in 0..10 {
            a.append(AppendRequest {
                stream: "c".into(),
                batches: batch(format!("c-{i}").as_bytes()).into(),
                match_next_offset: None,
                transactional_id: None,
            })
            .await
            .expect("append");
        }
        a.close_stream(CloseStreamRequest {
            stream: "c".into(),
            timeout_ms: 0,
        })
        .await
        .expect("close");
        // Corrupt the one data object on the S3 server's disk.
        let objects = weir_tests::files_under(&stack.s3.dir.path().join(weir_tests::s3::BUCKET).join("data"));
        for path in objects.iter().filter(|p| p.extension().is_some_and(|e| e == "wdo")) {
            let mut data = std::fs::read(path).expect("object");
            data[20] ^= 0xff;
            std::fs::write(path, data).expect("rewrite");
        }
        stack.place(id, 1).await;
        stack.wait_serving("c", 1).await;
        let mut b = stack.nodes[1].client().await;
        let err = b
            .read(ReadRequest {
                stream: "c".into(),
                offset: 0,
                max_bytes: 0,
                wait_ms: 0,
                exact_max_bytes: false,
                read_committed: false,
            })
            .await
            .expect_err("corrupt data served");
        assert_eq!(err.code(), tonic::Code::DataLoss);
        assert!(err.message().contains("checksum"), "{}", err.message());
        // A torn tail: kill A's successor writes, then append garbage to its last segment.
        stack.nodes[0].kill();
        let dir = weir_streamd::wal::file::incarnation_dir(&stack.wal_root, &NodeId::new("streamd-1"), Epoch(1));
        let mut segments: Vec<_> = std::fs::read_dir(&dir)
            .expect("wal dir")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "wal"))
            .collect();
        segments.sort();
        let last = segments.last().expect("a segment").clone();
        // Segments are preallocated: the records end before the file does, and the cut
        // leaves exactly them.
        let (written, _) =
            weir_streamd::wal::record::decode_segment(&std::fs::read(&last).expect("segment")).expect("decodes");
        let clean_len = (weir_streamd::wal::record::SEGMENT_HEADER_LEN
            + written.iter().map(|r| r.encode().len()).sum::<usize>()) as u64;
        let mut f = std::fs::OpenOptions::new().append(true).open(&last).expect("segment");
        std::io::Write::write_all(&mut f, &[0, 0, 1, 0, 0xde, 0xad]).expect("tear");
        drop(f);
        let replay = weir_streamd::wal::file::take_over(&stack.wal_root, &NodeId::new("streamd-1"), Epoch(1), "test")
            .expect("replay");
        assert!(
            replay.damage.is_empty(),
            "a torn tail is not damage: {:?}",
            replay.damage
        );
        let records = replay.records;
        assert_eq!(
            records
                .iter()
                .filter(|r| r.stream == id)
                .flat_map(|r| values(&r.batches))
                .count(),
            10
        );
        let taken = dir
            .with_extension("taken-by-test")
            .join(last.file_name().expect("name"));
        assert_eq!(
            std::fs::metadata(taken).expect("segment").len(),
            clean_len,
            "torn tail not cut"
        );
    })
    .await;
}

/// Issue 20, defect 2: a flipped bit in the middle of a dead streamd's last file-WAL
/// segment is damage, not a torn tail, and nothing is cut. The takeover recovers every
/// stream the damage did not touch whole, and the one it cut up to the damage; that one
/// is marked damaged and stays closed (reopening would hand out acknowledged offsets
/// again) until the operator trims past it, after which it goes on from there.
/// INV-2 for every record the damage did not touch; FO-TKO-6 (the stream is placed only
/// after its takeover and close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mid_segment_wal_damage_marks_only_the_stream_it_cut() {
    use weir_streamd::wal::record::{decode_segment, SEGMENT_HEADER_LEN};
    with_timeout(async {
        let mut stack = secure_stack(
            2,
            Backend::FileWal,
            &["--upload-interval-ms", "600000", "--upload-bytes", "1000000000"],
        )
        .await;
        let hurt = stack.create_stream("hurt", 0).await;
        let whole = stack.create_stream("whole", 0).await;
        let mut a = stack.nodes[0].client().await;
        for i in 0..20 {
            for name in ["hurt", "whole"] {
                a.append(AppendRequest {
                    stream: name.into(),
                    batches: batch(format!("{name}-{i}").as_bytes()).into(),
                    match_next_offset: None,
                    transactional_id: None,
                })
                .await
                .expect("append");
            }
        }
        stack.nodes[0].kill();
        // Flip a bit in the body of "hurt"'s 8th record, well inside the segment.
        let dir = weir_streamd::wal::file::incarnation_dir(&stack.wal_root, &NodeId::new("streamd-1"), Epoch(1));
        let mut segments: Vec<_> = weir_tests::files_under(&dir)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "wal"))
            .collect();
        segments.sort();
        let last = segments.last().expect("a segment").clone();
        let mut data = std::fs::read(&last).expect("segment");
        let (records, _) = decode_segment(&data).expect("decodes");
        let mut pos = SEGMENT_HEADER_LEN;
        let mut target = None;
        for r in &records {
            if r.stream == hurt && r.base_offset == 7 {
                target = Some(pos + r.encode().len() - 2);
            }
            pos += r.encode().len();
        }
        let target = target.expect("hurt's 8th record is in the last segment");
        data[target] ^= 0x10;
        std::fs::write(&last, &data).expect("damage");

        // The failover loop fences streamd-1 and streamd-2 takes its WAL over.
        stack.place_once_closed(whole, 1).await;
        stack.wait_serving("whole", 1).await;
        let got = read_all(&stack, 1, "whole", 0, 20).await;
        // INV-2: every acknowledged record of the stream the damage missed is read back.
        // FO-TKO-6: metad refused the placement until the takeover had recovered and closed
        // "whole"; placed before, streamd-2 would serve it from committed_end 0 without these.
        expect_sequence(&got, 20, "whole");
        assert_eq!(
            std::fs::metadata(
                dir.with_extension("taken-by-streamd-2-1")
                    .join(last.file_name().expect("name"))
            )
            .map(|m| m.len() as usize)
            .ok(),
            Some(data.len()),
            "the damaged segment was cut"
        );
        let metad = stack.metad.client();
        let damage = wait_for("hurt marked damaged", Duration::from_secs(30), || async {
            let v = metad.admin("streams", 0, 0).await.ok()?;
            let row = weir_tests::stream_named(&v, "hurt")?;
            (!row["damage"].is_null()).then_some(row)
        })
        .await;
        assert_eq!(damage["committed_end"], 7, "recovered up to the damage: {damage}");
        assert_eq!(damage["damage"]["from"], 7, "{damage}");
        assert_eq!(damage["damage"]["until"], 20, "{damage}");
        assert!(
            damage["damage"]["what"].as_str().is_some_and(|w| w.contains("CRC")),
            "{damage}"
        );
        // It stays closed: an open would hand offsets 7..20 out again.
        stack.place_once_closed(hurt, 1).await;
        let mut b = stack.nodes[1].client().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        b.status(StatusRequest { stream: "hurt".into() })
            .await
            .expect_err("a stream that lost acknowledged records reopened");
        // The operator trims past the loss: it reopens at 20, and appends go on from there.
        let operator = stack.cluster_flags("operator", "test");
        let out = std::process::Command::new(weir_tests::bin_path("weir"))
            .args(&operator)
            .args([
                "--metad",
                &stack.metad.replicas[0].grpc,
                "streams",
                "repair",
                "hurt",
                "--trim-past",
            ])
            .output()
            .expect("weir");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        stack.wait_serving("hurt", 1).await;
        let r = b
            .append(AppendRequest {
                stream: "hurt".into(),
                batches: batch(b"after").into(),
                match_next_offset: None,
                transactional_id: None,
            })
            .await
            .expect("append after the repair")
            .into_inner();
        assert_eq!(r.base_offset, 20, "no acknowledged offset is handed out twice");
    })
    .await;
}

/// SD-TRG-3, FO-FEN-8: a node whose row is fenced, or replaced by a newer registration,
/// stops at once and exits 75.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_or_replaced_node_exits_75() {
    use weir_meta::model::{Command, NodeAddrs, NodeKind, Proposer};
    with_timeout(async {
        let mut stack = secure_stack(2, Backend::FileWal, &[]).await;
        let client = stack.metad.client();
        let op = Proposer::Operator {
            principal: "test".into(),
        };
        // Fence streamd-1 with the exact (epoch, heartbeats) CAS; retry while it heartbeats.
        wait_for("FenceNode to apply", Duration::from_secs(20), || async {
            let nodes = client.admin("nodes", 0, 0).await.ok()?;
            let row = nodes["nodes"]
                .as_array()?
                .iter()
                .find(|n| n["node_id"] == "streamd-1")?
                .clone();
            let cmd = Command::FenceNode {
                node: NodeId::new("streamd-1"),
                epoch: Epoch(row["epoch"].as_u64()?),
                seen_heartbeats: row["heartbeats"].as_u64()?,
            };
            client.propose(&op, cmd).await.ok()?.1.ok().map(|_| ())
        })
        .await;
        // FO-FEN-8, SD-TRG-3: the fenced node sees its fence in its view, stops, and exits 75.
        assert_eq!(stack.nodes[0].wait_exit(Duration::from_secs(10)).await, Some(75));
        // Replace streamd-2 by registering the same id again.
        let register = Command::RegisterNode {
            node: NodeId::new("streamd-2"),
            kind: NodeKind::Streamd,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        client
            .propose(&op, register)
            .await
            .expect("register")
            .1
            .expect("registered");
        // SD-TRG-3: a node replaced by a newer registration stops and exits 75 too.
        assert_eq!(stack.nodes[1].wait_exit(Duration::from_secs(10)).await, Some(75));
        assert!(
            stack.nodes[1].log_text().contains("newer registration"),
            "no log line naming the cause"
        );
    })
    .await;
}

/// FO-LIV-14: a streamd whose heartbeat timing differs from the cluster's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamd_with_another_heartbeat_timing_is_refused() {
    with_timeout(async {
        let mut stack = secure_stack(0, Backend::FileWal, &[]).await;
        stack.add_node(
            "odd",
            Backend::FileWal,
            &["--heartbeat-interval-sec", "2", "--node-timeout-sec", "10"],
        );
        let code = stack.nodes[0].wait_exit(Duration::from_secs(20)).await;
        // FO-LIV-14: the registration is refused and the node exits non-zero.
        assert_eq!(code, Some(1));
        let log = stack.nodes[0].log_text();
        // FO-LIV-14: its error names both its own interval and the cluster's.
        assert!(
            log.contains("--heartbeat-interval-sec 2") && log.contains("--heartbeat-interval-sec 1"),
            "{log}"
        );
    })
    .await;
}

async fn ready_json(stack: &Stack, on: usize) -> Option<serde_json::Value> {
    weir_tests::http_get(format!("http://{}/ready", stack.nodes[on].http))
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// FO-MDO-7: past `--wal-max-bytes`, appends get a retryable `wal_full` error, and
/// committed uploads reclaim whole segments so appends are accepted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_growth_is_bounded_and_reclaimed_after_commits() {
    with_timeout(async {
        let flags = [
            "--wal-max-bytes",
            "65536",
            "--wal-segment-bytes",
            "8192",
            "--upload-interval-ms",
            "600000",
            "--upload-bytes",
            "1000000000",
        ];
        let stack = secure_stack(1, Backend::FileWal, &flags).await;
        stack.create_stream("full", 0).await;
        let mut c = stack.nodes[0].client().await;
        let value = vec![b'f'; 1000];
        let mut acked = 0u64;
        let err = loop {
            match c
                .append(AppendRequest {
                    stream: "full".into(),
                    batches: batch(&value).into(),
                    match_next_offset: None,
                    transactional_id: None,
                })
                .await
            {
                Ok(_) => acked += 1,
                Err(e) => break e,
            }
            assert!(acked < 1000, "the WAL never filled up");
        };
        // FO-MDO-7: at the limit an append is refused with the retryable wal_full, not acknowledged.
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            weir_shared::error_code::ErrorCode::of_status(&err).map(|c| c.as_str()),
            Some("wal_full")
        );
        // Closing uploads and commits everything; the committed segments are reclaimed.
        let end = c
            .close_stream(CloseStreamRequest {
                stream: "full".into(),
                timeout_ms: 0,
            })
            .await
            .expect("close")
            .into_inner()
            .end_offset;
        assert_eq!(end, acked);
        for _ in 0..100 {
            let wal = ready_json(&stack, 0).await.and_then(|v| v["wal_bytes"].as_u64());
            if wal.is_some_and(|w| w <= 8192 + 2048) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("WAL segments not reclaimed; node log:\n{}", stack.nodes[0].log_text());
    })
    .await;
}

/// FO-MDO-1, FO-MDO-2, FO-MDO-5: while the metadata log is down, the owner stays ready,
/// keeps acknowledging appends (durable in its WAL) and retries its commits, which land
/// once metad is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_continue_through_a_metadata_outage_and_commits_land_after_it() {
    with_timeout(async {
        let mut stack = secure_stack(1, Backend::FileWal, &["--upload-interval-ms", "100"]).await;
        stack.create_stream("outage", 0).await;
        let mut c = stack.nodes[0].client().await;
        stack.metad.replicas[0].kill();
        for i in 0..50 {
            c.append(AppendRequest {
                stream: "outage".into(),
                batches: batch(format!("o-{i}").as_bytes()).into(),
                match_next_offset: None,
                transactional_id: None,
            })
            .await
            .expect("append during the outage");
        }
        let s = c
            .status(StatusRequest {
                stream: "outage".into(),
            })
            .await
            .expect("status")
            .into_inner();
        // FO-MDO-1: the owner acknowledged all 50 appends with metad down.
        assert_eq!(s.end_offset, 50);
        assert!(s.committed_end < 50, "a commit landed without metad");
        let readyz = weir_tests::http_get(format!("http://{}/readyz", stack.nodes[0].http))
            .await
            .expect("readyz");
        // FO-MDO-5: readiness does not fail because metad is unreachable.
        assert_eq!(readyz.status().as_u16(), 200, "readiness failed because metad is down");
        // FO-MDO-1: reads serve the new records during the outage too.
        expect_sequence(&read_all(&stack, 0, "outage", 0, 50).await, 50, "o");
        stack.metad.replicas[0].start();
        // FO-MDO-2: the commits that failed meanwhile are retried and land once metad is back.
        stack.wait_committed(0, "outage", 50).await;
    })
    .await;
}

/// RR-WAL-4, INV-17: an uploaded but uncommitted object is never read and is
/// collected after the safety delay; committed objects stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncommitted_objects_are_collected_after_the_safety_delay() {
    use object_store::{ObjectStoreExt, PutPayload};
    with_timeout(async {
        let stack = secure_stack(
            1,
            Backend::FileWal,
            &[
                "--upload-interval-ms",
                "100",
                "--gc-delay-sec",
                "6",
                "--gc-grace-sec",
                "1",
            ],
        )
        .await;
        stack.create_stream("gc", 0).await;
        let mut c = stack.nodes[0].client().await;
        c.append(AppendRequest {
            stream: "gc".into(),
            batches: batch(b"kept").into(),
            match_next_offset: None,
            transactional_id: None,
        })
        .await
        .expect("append");
        let store = s3_store(&stack);
        let orphan = object_store::path::Path::from("data/streamd-9/00000000000000000001/orphan.wdo");
        let put_at = std::time::Instant::now();
        store
            .put(&orphan, PutPayload::from_static(b"never committed"))
            .await
            .expect("put orphan");
        wait_for("orphan collected", Duration::from_secs(30), || {
            let store = store.clone();
            let orphan = orphan.clone();
            async move { store.head(&orphan).await.is_err().then_some(()) }
        })
        .await;
        // RR-WAL-4: not before the safety delay (6 s; GC passes run every second, so
        // without the delay it would go within about 2 s, after the 1 s grace).
        assert!(
            put_at.elapsed() >= Duration::from_secs(6),
            "the orphan was collected {:?} after its upload, before the 6 s delay",
            put_at.elapsed()
        );
        // The committed object outlives GC passes run after it became older than the delay.
        stack.wait_committed(0, "gc", 1).await;
        let metrics_url = format!("http://{}/metrics", stack.nodes[0].http);
        let passes = |m: &str| weir_tests::metric_value(m, "weir_streamd_gc_passes_total").unwrap_or(0.0);
        let before = passes(&weir_tests::get_text(&metrics_url).await);
        wait_for("three more GC passes", Duration::from_secs(30), || {
            let url = metrics_url.clone();
            async move { (passes(&weir_tests::get_text(&url).await) >= before + 3.0).then_some(()) }
        })
        .await;
        let committed = weir_tests::files_under(&stack.s3.dir.path().join(weir_tests::s3::BUCKET).join("data"));
        assert!(
            committed.iter().any(|p| p.extension().is_some_and(|e| e == "wdo")),
            "a committed object was collected"
        );
        assert_eq!(read_all(&stack, 0, "gc", 0, 1).await, vec![(0, b"kept".to_vec())]);
    })
    .await;
}

/// RR-WAL-5: an upload cut off by a forced ending leaves no partial version and no
/// staging artifact. Weir uploads a data object as one PUT of the whole object (no
/// multipart upload, no staging prefix) under `data/<node>/<incarnation>/`, so a node
/// killed between its PUT and its commit leaves a whole object no commit names, and GC
/// removes it once it is older than the safety delay. Object keys never carry a user's
/// name, so a stream named `.x` (the seed's staging prefix) cannot collide with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rr_wal_5_an_upload_cut_off_by_sigkill_leaves_nothing_once_gc_has_run() {
    with_timeout(async {
        // streamd-1's commits fail while this file exists: its uploads land, uncommitted.
        let failing = tempfile::NamedTempFile::new().expect("failing file");
        let commit = format!("return(err) while exists({})", failing.path().display());
        let gc = [
            "--upload-interval-ms",
            "100",
            "--gc-delay-sec",
            "4",
            "--gc-grace-sec",
            "1",
        ];
        let mut stack = Stack::secure(1, 0, Backend::FileWal, &[], &[]).await;
        stack.add_node_with_env(
            "streamd-1",
            Backend::FileWal,
            &gc,
            &[("WEIR_FAILPOINT_COMMIT_OBJECTS", commit.as_str())],
        );
        stack.add_node("streamd-2", Backend::FileWal, &gc);
        for n in &stack.nodes {
            n.wait_ready().await;
        }
        stack.create_stream(".x", 0).await;
        let mut c = stack.nodes[0].client().await;
        for value in ["a", "b", "c"] {
            c.append(AppendRequest {
                stream: ".x".into(),
                batches: batch(value.as_bytes()).into(),
                match_next_offset: None,
                transactional_id: None,
            })
            .await
            .expect("append");
        }
        let bucket = stack.s3.dir.path().join(weir_tests::s3::BUCKET);
        let uploaded = |node: &str| {
            weir_tests::files_under(&bucket.join("data").join(node))
                .into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "wdo"))
                .collect::<Vec<_>>()
        };
        let orphans = wait_for("streamd-1's upload, uncommitted", Duration::from_secs(30), || {
            let found = uploaded("streamd-1");
            async move { (!found.is_empty()).then_some(found) }
        })
        .await;
        // Cut off between its PUT and its commit.
        stack.nodes[0].kill();
        // streamd-2 takes over the dead incarnation's WAL and commits its records in
        // objects of its own; the killed node's upload is never read.
        stack.wait_serving(".x", 1).await;
        stack.wait_committed(1, ".x", 3).await;
        assert_eq!(
            read_all(&stack, 1, ".x", 0, 3).await,
            vec![(0, b"a".to_vec()), (1, b"b".to_vec()), (2, b"c".to_vec())]
        );
        // RR-WAL-5: GC removes what the cut-off upload left.
        wait_for("the cut-off upload collected", Duration::from_secs(60), || {
            let left: Vec<_> = orphans.iter().filter(|p| p.exists()).collect();
            async move { left.is_empty().then_some(()) }
        })
        .await;
        assert!(!uploaded("streamd-2").is_empty(), "the takeover's own objects stay");
        let everything = weir_tests::files_under(stack.s3.dir.path());
        // RR-WAL-5: no multipart upload and no partial object is left behind (s3s-fs keeps
        // those as `.upload*` and `.tmp.*` files at its root).
        let staged: Vec<_> = everything
            .iter()
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(".upload") || n.starts_with(".tmp."))
            })
            .collect();
        assert!(staged.is_empty(), "staging artifacts left: {staged:?}");
        // RR-WAL-5: no key is named after the stream.
        let named: Vec<_> = everything
            .iter()
            .filter(|p| p.components().any(|c| c.as_os_str() == ".x"))
            .collect();
        assert!(named.is_empty(), "object keys carry the stream's name: {named:?}");
    })
    .await;
}

/// INV-17: a well-formed data object uploaded for a stream, holding a record for the
/// offset after its committed tail, is never read while the metadata log does not
/// commit it: a read at the tail finds nothing, the next append takes that offset with
/// its own record, and reads (from the WAL, then from the committed object) show that
/// record, never the uploaded one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inv_17_an_uploaded_object_the_log_never_committed_is_never_read() {
    use object_store::ObjectStoreExt;
    use weir_streamd::object::format::{read_index, ObjectBuilder};
    with_timeout(async {
        let stack = secure_stack(1, Backend::FileWal, &["--upload-interval-ms", "100"]).await;
        stack.create_stream("inv17", 0).await;
        let mut c = stack.nodes[0].client().await;
        let append = |value: &'static [u8]| AppendRequest {
            stream: "inv17".into(),
            batches: batch(value).into(),
            match_next_offset: None,
            transactional_id: None,
        };
        c.append(append(b"kept")).await.expect("append");
        stack.wait_committed(0, "inv17", 1).await;
        // The committed object names the stream and its epoch; a ghost beside it claims
        // offset 1 for the same stream and epoch, and no commit names it.
        let bucket = stack.s3.dir.path().join(weir_tests::s3::BUCKET);
        let committed = weir_tests::files_under(&bucket.join("data"))
            .into_iter()
            .find(|p| p.extension().is_some_and(|e| e == "wdo"))
            .expect("the committed object");
        let chunk = read_index(&std::fs::read(&committed).expect("read the object"))
            .expect("a data object")
            .into_iter()
            .next()
            .expect("its chunk");
        let mut ghost = ObjectBuilder::new();
        ghost.add(chunk.stream, chunk.stream_epoch, 1, 2, &[batch(b"ghost").into()]);
        let (ghost, _) = ghost.finish();
        let dir = committed
            .parent()
            .and_then(|d| d.strip_prefix(&bucket).ok())
            .expect("under the bucket")
            .to_string_lossy()
            .into_owned();
        s3_store(&stack)
            .put(&object_store::path::Path::from(format!("{dir}/ghost.wdo")), ghost)
            .await
            .expect("put the ghost");
        let at_tail = c
            .read(ReadRequest {
                stream: "inv17".into(),
                offset: 1,
                max_bytes: 64 * 1024,
                wait_ms: 0,
                exact_max_bytes: false,
                read_committed: false,
            })
            .await;
        // INV-17: the uncommitted object's record is not visible at the tail.
        if let Ok(r) = &at_tail {
            assert!(
                values(&r.get_ref().batches).is_empty(),
                "a read at the tail found {:?}",
                values(&r.get_ref().batches)
            );
        }
        c.append(append(b"next")).await.expect("append");
        let want = vec![(0, b"kept".to_vec()), (1, b"next".to_vec())];
        // INV-17: offset 1 is the append's record, never the uploaded one, from the WAL ...
        assert_eq!(read_all(&stack, 0, "inv17", 0, 2).await, want);
        stack.wait_committed(0, "inv17", 2).await;
        // INV-17: ... and from the committed objects.
        assert_eq!(read_all(&stack, 0, "inv17", 0, 2).await, want);
    })
    .await;
}

/// F "Clean shutdown" steps 5–6 (FO-FEN-3): on SIGTERM a node closes its streams,
/// uploading every buffered record first, fences itself, and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_streams_with_every_record_committed_then_fences_itself() {
    with_timeout(async {
        let mut stack = secure_stack(
            1,
            Backend::FileWal,
            &["--upload-interval-ms", "600000", "--upload-bytes", "1000000000"],
        )
        .await;
        stack.create_stream("bye", 0).await;
        let mut c = stack.nodes[0].client().await;
        for i in 0..25 {
            c.append(AppendRequest {
                stream: "bye".into(),
                batches: batch(format!("b-{i}").as_bytes()).into(),
                match_next_offset: None,
                transactional_id: None,
            })
            .await
            .expect("append");
        }
        stack.nodes[0].term();
        assert_eq!(stack.nodes[0].wait_exit(Duration::from_secs(30)).await, Some(0));
        let client = stack.metad.client();
        let row = stream_row(&stack, "bye").await;
        // SD-ADM-2: the in-place close committed all 25 buffered records despite 600 s / 1 GB thresholds.
        assert_eq!(row["state"], "closed");
        assert_eq!(row["committed_end"], 25);
        let nodes = client.admin("nodes", 0, 0).await.expect("nodes");
        // FO-FEN-3: the node fenced itself on its way out (checked right after its exit, before
        // the 3 s node timeout would let the failover loop fence it instead).
        assert_eq!(weir_tests::node_row(&nodes, "streamd-1")["fenced"], true);
    })
    .await;
}

/// Issue 19: `--max-append-bytes` over the WAL's record limit is refused at startup,
/// naming both, since such an append could be acknowledged but never replayed.
#[test]
fn max_append_bytes_over_the_wal_record_limit_is_refused_at_startup() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(weir_tests::bin_path("streamd"))
        .args([
            "--id",
            "streamd-1",
            "--metad",
            "127.0.0.1:1",
            "--max-append-bytes",
            "300000000",
        ])
        .arg("--object-store")
        .arg(format!("file://{}", dir.path().join("objects").display()))
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .expect("run streamd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--max-append-bytes 300000000") && stderr.contains("record limit"),
        "{stderr}"
    );
}

// Issue 17 ("no append waits on the uploader or a lock held across work"): an upload
// round copies and checksums a stream's batches into the object after it let go of the
// stream's lock. A failpoint makes that copy take 3 s, in a round every 100 ms, while
// appends go on for 4 s: none waits for the copy. When the copy was made under the
// lock, appends waited up to its whole length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_do_not_wait_on_an_uploads_copy_of_their_stream() {
    with_timeout(async {
        let mut stack = secure_stack_with(0, Backend::FileWal, &[], &[]).await;
        stack.add_node_with_env(
            "streamd-1",
            Backend::FileWal,
            &["--upload-interval-ms", "100"],
            &[("WEIR_FAILPOINT_UPLOAD_COPY", "sleep(3000)")],
        );
        stack.nodes[0].wait_ready().await;
        let gw = stack.gateway("gw-1", &[]).await;
        gw.create_stream("copied").await;
        gw.wait_open("copied").await;
        let started = Instant::now();
        let (mut slowest, mut sent) = (Duration::ZERO, Vec::new());
        while started.elapsed() < Duration::from_secs(4) {
            let body = format!("r{}", sent.len());
            let t = Instant::now();
            gw.append("copied", &[body.as_str()]).await;
            slowest = slowest.max(t.elapsed());
            sent.push(body);
        }
        assert!(
            slowest < Duration::from_millis(1500),
            "an append waited {slowest:?} while an upload copied its stream"
        );
        assert_eq!(gw.bodies("copied").await, sent, "INV-2");
    })
    .await;
}

// Issue 17: an upload round holds at most the compaction target (one batch more when a
// single batch is larger). A round used to take everything durable, so after a burst
// one range could outgrow the read cache (541 MB was seen) and every read of it fetched
// the whole range again. A burst larger than the target is uploaded as several objects,
// and every record is read back.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_is_uploaded_in_objects_of_at_most_the_target() {
    with_timeout(async {
        const TARGET: u64 = 64 * 1024;
        let stack = secure_stack_with(
            1,
            Backend::FileWal,
            &[
                "--upload-interval-ms",
                "1500",
                "--upload-bytes",
                "67108864",
                "--compaction-target-bytes",
                "65536",
                "--compaction-interval-ms",
                "600000",
            ],
            &[],
        )
        .await;
        let gw = stack.gateway("gw-1", &[]).await;
        gw.create_stream("burst").await;
        gw.wait_open("burst").await;
        let filler = "x".repeat(8 * 1024);
        let sent: Vec<String> = (0..48).map(|i| format!("{i}-{filler}")).collect();
        for body in &sent {
            gw.append("burst", &[body.as_str()]).await;
        }
        wait_for("the burst committed", Duration::from_secs(30), || async {
            let (_, s) = gw.send(gw.request(reqwest::Method::GET, "/v1/streams/burst")).await;
            (s["committed_seq_num"] == 48).then_some(())
        })
        .await;
        let objects = stack.metad.client().admin("objects", 0, 1000).await.expect("objects");
        let sizes: Vec<u64> = objects["objects"]
            .as_array()
            .expect("objects")
            .iter()
            .map(|o| o["size"].as_u64().expect("size"))
            .collect();
        // 384 KiB of records: at least six objects, none over the target by more than one
        // record's batch and the object's own framing.
        assert!(sizes.len() >= 6, "{sizes:?}");
        assert!(sizes.iter().all(|&s| s <= TARGET + 9 * 1024), "{sizes:?}");
        assert_eq!(gw.bodies("burst").await, sent, "INV-2");
    })
    .await;
}

// Issue 17: a sequential reader finds each next committed range fetched ahead into the
// cache while it reads the one before, so only its first read waits on a GET of its
// own. The cache holds three of the eight ranges, so the uploads' write-through copies
// of the first ones are gone when the reader starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_reader_finds_each_next_range_fetched_ahead() {
    with_timeout(async {
        let stack = secure_stack(
            1,
            Backend::FileWal,
            &[
                "--upload-interval-ms",
                "100",
                "--cache-bytes",
                "33000",
                "--compaction-interval-ms",
                "600000",
            ],
        )
        .await;
        stack.create_stream("ahead", 0).await;
        let mut client = stack.nodes[0].client().await;
        let filler = "x".repeat(10 * 1024);
        for i in 0..8u64 {
            client
                .append(AppendRequest {
                    stream: "ahead".into(),
                    batches: batch(format!("r-{i}-{filler}").as_bytes()).into(),
                    match_next_offset: None,
                    transactional_id: None,
                })
                .await
                .expect("append");
            // One upload, so one range, per record.
            stack.wait_committed(0, "ahead", i + 1).await;
        }
        // One batch per read, so each read stays inside one range.
        let mut got = Vec::new();
        while (got.len() as u64) < 8 {
            let r = client
                .read(ReadRequest {
                    stream: "ahead".into(),
                    offset: got.len() as u64,
                    max_bytes: 1,
                    wait_ms: 0,
                    exact_max_bytes: false,
                    read_committed: false,
                })
                .await
                .expect("read")
                .into_inner();
            assert_eq!(r.next_offset, got.len() as u64 + 1, "one record per read");
            got.extend(values(&r.batches));
        }
        for (i, (offset, value)) in got.iter().enumerate() {
            assert_eq!(
                (*offset, value.as_slice()),
                (i as u64, format!("r-{i}-{filler}").as_bytes())
            );
        }
        let metrics = weir_tests::get_text(&format!("http://{}/metrics", stack.nodes[0].http)).await;
        let gets = |by: &str| {
            weir_tests::metric_value(&metrics, &format!("weir_streamd_range_gets_total{{by=\"{by}\"}}")).unwrap_or(0.0)
        };
        assert_eq!(
            gets("reader"),
            1.0,
            "only the first range waits on its reader's GET:\n{metrics}"
        );
        assert!(gets("read_ahead") >= 5.0, "the ranges after it come ahead:\n{metrics}");
    })
    .await;
}

/// Issue 23 (design 0005, "Markers fence"): a transaction marker from a transaction's
/// coordinator (a streamd certificate) fences its producer's older epochs in the
/// stream; a retried marker is not written again; a marker older than the producer's
/// epoch is refused; and the fence survives a move, the new owner replaying the marker
/// from the stored tail. No other certificate may write a marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_marker_fences_its_producer_and_the_fence_survives_a_move() {
    with_timeout(async {
        let stack = secure_stack(2, Backend::FileWal, &["--upload-interval-ms", "100"]).await;
        let id = stack.create_stream("fenced", 0).await;
        let append = |epoch: i16, seq: i32, value: &str| AppendRequest {
            stream: "fenced".into(),
            batches: idempotent(batch(value.as_bytes()), 42, epoch, seq).into(),
            match_next_offset: None,
            transactional_id: None,
        };
        let marker = |epoch: i32| WriteTxnMarkerRequest {
            stream: "fenced".into(),
            producer_id: 42,
            producer_epoch: epoch,
            commit: false,
            coordinator_epoch: 1,
        };
        let mut a = stack.nodes[0].client().await;
        a.append(append(0, 0, "p-0")).await.expect("append at epoch 0");

        // The tests' own certificate is metad's: not a coordinator.
        let err = a.write_txn_marker(marker(1)).await.expect_err("metad wrote a marker");
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
        let coordinator = |on: usize| {
            let tls = stack.metad.certs.as_ref().expect("mTLS").tls("streamd", "streamd-2");
            let ch = weir_shared::grpc::channel_with(&stack.nodes[on].grpc, Some(tls.client())).expect("channel");
            weir_proto::streamd::streamd_client::StreamdClient::new(ch)
        };
        let mut c = coordinator(0);
        let written = c.write_txn_marker(marker(1)).await.expect("marker").into_inner();
        assert_eq!(written.offset, Some(1), "{written:?}");
        assert_eq!(written.end_offset, 2);
        // A retry is answered without a second marker.
        let again = c
            .write_txn_marker(marker(1))
            .await
            .expect("retried marker")
            .into_inner();
        assert_eq!(again.offset, None, "{again:?}");
        assert_eq!(again.end_offset, 2);
        // The zombie at epoch 0 is fenced; an older marker is refused.
        let fenced = a
            .append(append(0, 1, "zombie"))
            .await
            .expect_err("a fenced epoch appended");
        assert_code(&fenced, "invalid_producer_epoch");
        let stale = c
            .write_txn_marker(marker(0))
            .await
            .expect_err("an older marker was written");
        assert_code(&stale, "invalid_producer_epoch");
        // The marker is stored as a control batch between the data.
        let r = a
            .read(ReadRequest {
                stream: "fenced".into(),
                offset: 0,
                max_bytes: 64 * 1024,
                wait_ms: 0,
                exact_max_bytes: false,
                read_committed: false,
            })
            .await
            .expect("read")
            .into_inner();
        let parsed = weir_shared::batch::split_batches(&r.batches).expect("batches");
        let control: Vec<bool> = parsed.iter().map(|(h, _)| h.is_control()).collect();
        assert_eq!(control, vec![false, true], "{parsed:?}");

        // Moved to node 2, which rebuilds the producer's state from the stored tail.
        stack.wait_committed(0, "fenced", 2).await;
        a.close_stream(CloseStreamRequest {
            stream: "fenced".into(),
            timeout_ms: 0,
        })
        .await
        .expect("close");
        stack.place(id, 1).await;
        stack.wait_serving("fenced", 1).await;
        let mut b = stack.nodes[1].client().await;
        let fenced = b
            .append(append(0, 1, "zombie"))
            .await
            .expect_err("the fence was lost in the move");
        assert_code(&fenced, "invalid_producer_epoch");
        let again = coordinator(1)
            .write_txn_marker(marker(1))
            .await
            .expect("retried marker on the new owner")
            .into_inner();
        assert_eq!(again.offset, None, "{again:?}");
        // The producer's next epoch starts at sequence 0 and is taken.
        let ok = b
            .append(append(2, 0, "p-2"))
            .await
            .expect("the next epoch")
            .into_inner();
        assert_eq!(ok.base_offset, 2);
    })
    .await;
}

/// Issue 23, RR-WAL-2: a write whose caller goes away once the owner has queued it in
/// the WAL still becomes durable: the WAL writer advances the stream's durable end, not
/// the caller's request. The coordinator's marker call is cancelled while its WAL write
/// is held (failpoint `wal_persist`); its retry, answered once the marker is durable, and
/// a read then see the marker. Before, the durable end waited for a later write to the
/// stream, and a coordinator that died mid-call left its successor's retry of the
/// marker waiting on one for ever (a transaction stuck prepared).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_caller_went_away_still_becomes_durable() {
    with_timeout(async {
        let mut stack = Stack::secure(1, 0, Backend::FileWal, &[], &["--auto-place", "false"]).await;
        stack.add_node_with_env(
            "streamd-1",
            Backend::FileWal,
            &[],
            &[("WEIR_FAILPOINT_WAL_PERSIST", "sleep(1500)")],
        );
        stack.nodes[0].wait_ready().await;
        stack.create_stream("gone", 0).await;
        stack.wait_serving("gone", 0).await;
        let mut a = stack.nodes[0].client().await;
        a.append(AppendRequest {
            stream: "gone".into(),
            batches: idempotent(batch(b"p-0"), 42, 0, 0).into(),
            match_next_offset: None,
            transactional_id: None,
        })
        .await
        .expect("append at epoch 0");
        let marker = WriteTxnMarkerRequest {
            stream: "gone".into(),
            producer_id: 42,
            producer_epoch: 1,
            commit: false,
            coordinator_epoch: 1,
        };
        let tls = stack.metad.certs.as_ref().expect("mTLS").tls("streamd", "streamd-2");
        let ch = weir_shared::grpc::channel_with(&stack.nodes[0].grpc, Some(tls.client())).expect("channel");
        let coordinator = weir_proto::streamd::streamd_client::StreamdClient::new(ch);

        let held = || weir_tests::records(&stack.nodes[0].log_text(), "failpoint: sleeping").len();
        let before = held();
        let mut first = coordinator.clone();
        let first_marker = marker.clone();
        let call = tokio::spawn(async move { first.write_txn_marker(first_marker).await });
        wait_for("the marker's WAL write is held", Duration::from_secs(10), || async {
            (held() > before).then_some(())
        })
        .await;
        // The caller goes away (as a coordinator killed mid-call does): its request ends.
        call.abort();
        assert!(
            call.await.is_err_and(|e| e.is_cancelled()),
            "the first call was cancelled"
        );

        let again = tokio::time::timeout(Duration::from_secs(10), coordinator.clone().write_txn_marker(marker))
            .await
            .expect("the retried marker was answered once the first was durable")
            .expect("retried marker")
            .into_inner();
        assert_eq!((again.offset, again.end_offset), (None, 2), "{again:?}");
        // Read up to the marker's end (offset 2): the marker is durable and readable.
        let read = read_all(&stack, 0, "gone", 0, 2).await;
        let offsets: Vec<u64> = read.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, [0, 1], "the record and the marker");
    })
    .await;
}

/// Issue 23 (design 0005, "Durable with the data" and "Fetch"): a `read_committed` read
/// stops at the last stable offset and is told the aborted transactions with data in
/// what it returns, whether their markers are still in memory, in an upload's range
/// summary, or in a compacted range; a new owner whose producer-state tail starts after
/// the oldest open transaction finds it through the last range's LSO. Transactional
/// data is admitted unverified (failpoint) until the coordinator exists (step 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_stops_at_the_lso_and_finds_aborts_in_range_summaries_across_compaction_and_a_move() {
    with_timeout(async {
        let mut stack = Stack::secure(1, 0, Backend::FileWal, &[], &["--auto-place", "false"]).await;
        let unverified = [("WEIR_FAILPOINT_ADMIT_UNVERIFIED_TRANSACTIONS", "on")];
        // One range per step on the first node; the second compacts them into one.
        let common = ["--upload-interval-ms", "100", "--producer-state-bytes", "1"];
        let first: Vec<&str> = common
            .iter()
            .copied()
            .chain(["--compaction-interval-ms", "600000"])
            .collect();
        let second: Vec<&str> = common
            .iter()
            .copied()
            .chain(["--compaction-interval-ms", "300"])
            .collect();
        stack.add_node_with_env("streamd-1", Backend::FileWal, &first, &unverified);
        stack.add_node_with_env("streamd-2", Backend::FileWal, &second, &unverified);
        for n in &stack.nodes {
            n.wait_ready().await;
        }
        let id = stack.create_stream("txn", 0).await;
        let data = |pid: i64, seq: i32, txn: bool, value: &str| {
            let b = idempotent(batch(value.as_bytes()), pid, 0, seq);
            AppendRequest {
                stream: "txn".into(),
                batches: if txn { transactional(b) } else { b }.into(),
                match_next_offset: None,
                transactional_id: None,
            }
        };
        let marker = |pid: i64, commit: bool| WriteTxnMarkerRequest {
            stream: "txn".into(),
            producer_id: pid,
            producer_epoch: 0,
            commit,
            coordinator_epoch: 1,
        };
        let coordinator = |on: usize| {
            let tls = stack.metad.certs.as_ref().expect("mTLS").tls("streamd", "streamd-2");
            let ch = weir_shared::grpc::channel_with(&stack.nodes[on].grpc, Some(tls.client())).expect("channel");
            weir_proto::streamd::streamd_client::StreamdClient::new(ch)
        };
        let committed_read = |on: usize, offset: u64| {
            let stack = &stack;
            async move {
                stack.nodes[on]
                    .client()
                    .await
                    .read(ReadRequest {
                        stream: "txn".into(),
                        offset,
                        max_bytes: 1 << 20,
                        wait_ms: 0,
                        exact_max_bytes: false,
                        read_committed: true,
                    })
                    .await
                    .expect("read_committed")
                    .into_inner()
            }
        };
        let aborts = |r: &weir_proto::streamd::ReadReply| -> Vec<(i64, u64, u64)> {
            r.aborted
                .iter()
                .map(|a| (a.producer_id, a.first_offset, a.last_offset))
                .collect()
        };
        let mut a = stack.nodes[0].client().await;
        let mut c = coordinator(0);
        a.append(data(1, 0, false, "plain-0")).await.expect("offset 0");
        a.append(data(7, 0, true, "aborted-1"))
            .await
            .expect("offset 1: 7 opens");
        a.append(data(8, 0, true, "committed-2"))
            .await
            .expect("offset 2: 8 opens");
        let m = c
            .write_txn_marker(marker(7, false))
            .await
            .expect("7 aborts")
            .into_inner();
        assert_eq!(m.offset, Some(3));
        // 8 is open from 2: a committed read stops there, told of 7's abort (in memory).
        let r = committed_read(0, 0).await;
        assert_eq!((r.last_stable_offset, r.end_offset, r.next_offset), (2, 4, 2), "{r:?}");
        assert_eq!(values(&r.batches).len(), 2);
        assert_eq!(aborts(&r), vec![(7, 1, 3)]);
        let unread = committed_read(0, 2).await;
        assert!(unread.batches.is_empty() && unread.next_offset == 2, "{unread:?}");

        // Uploaded: 7's abort is now found in the range summary.
        stack.wait_committed(0, "txn", 4).await;
        a.append(data(8, 1, true, "committed-4")).await.expect("offset 4");
        c.write_txn_marker(marker(8, true)).await.expect("8 commits at 5");
        a.append(data(9, 0, true, "aborted-6"))
            .await
            .expect("offset 6: 9 opens");
        stack.wait_committed(0, "txn", 7).await;
        a.append(data(1, 1, false, "plain-7")).await.expect("offset 7");
        a.append(data(1, 2, false, "plain-8")).await.expect("offset 8");
        stack.wait_committed(0, "txn", 9).await;
        let r = committed_read(0, 0).await;
        assert_eq!((r.last_stable_offset, r.next_offset), (6, 6), "{r:?}");
        assert_eq!(aborts(&r), vec![(7, 1, 3)], "the abort from the range summary");
        assert!(
            aborts(&committed_read(0, 4).await).is_empty(),
            "7's abort ends before 4"
        );
        // The index holds the summaries: the LSO at each range's end, each abort once.
        let ranges = index_ranges(&stack, id).await.expect("ranges");
        assert_eq!(ranges.last().map(|r| r.txns.lso_at_end), Some(Some(6)), "{ranges:?}");
        let indexed: Vec<_> = ranges.iter().flat_map(|r| r.txns.aborted.clone()).collect();
        assert_eq!(indexed.len(), 1, "{ranges:?}");

        // Moved: the new owner's producer tail is the last range, [7, 9), after 9's
        // transaction began at 6; the LSO stays there.
        a.close_stream(CloseStreamRequest {
            stream: "txn".into(),
            timeout_ms: 0,
        })
        .await
        .expect("close");
        stack.place(id, 1).await;
        stack.wait_serving("txn", 1).await;
        let r = committed_read(1, 6).await;
        assert_eq!(
            (r.last_stable_offset, r.next_offset),
            (6, 6),
            "the open transaction was lost: {r:?}"
        );
        // The second node compacts the stream's ranges into one, summaries merged.
        wait_for(
            "the stream's ranges compacted into one",
            Duration::from_secs(60),
            || async {
                let ranges = index_ranges(&stack, id).await.ok()?;
                (ranges.len() == 1).then_some(ranges)
            },
        )
        .await;
        let m = coordinator(1)
            .write_txn_marker(marker(9, false))
            .await
            .expect("9 aborts")
            .into_inner();
        assert_eq!(m.offset, Some(9));
        let r = committed_read(1, 0).await;
        assert_eq!((r.last_stable_offset, r.next_offset), (10, 10), "{r:?}");
        assert_eq!(
            aborts(&r),
            vec![(7, 1, 3), (9, 6, 9)],
            "the compacted range kept 7's abort"
        );
        // Batches are returned as stored: the reader drops the aborted ones.
        let stored = weir_shared::batch::split_batches(&r.batches).expect("batches");
        let control: Vec<u64> = stored
            .iter()
            .filter(|(h, _)| h.is_control())
            .map(|(h, _)| h.base_offset as u64)
            .collect();
        assert_eq!((stored.len(), control), (10, vec![3, 5, 9]));
    })
    .await;
}

/// The first ranges of `stream` in the object index, read linearizably.
async fn index_ranges(
    stack: &Stack,
    stream: weir_shared::ids::StreamId,
) -> Result<Vec<weir_meta::model::ObjectRange>, weir_meta::client::ClientError> {
    let page = stack
        .metad
        .client()
        .read_ranges(
            stream,
            weir_shared::ids::Offset(0),
            false,
            100,
            weir_meta::client::Consistency::Linearizable,
        )
        .await?;
    Ok(page.ranges)
}

/// Asserts that `status` carries the stable error code `code` (`x-weir-error`).
fn assert_code(status: &tonic::Status, code: &str) {
    assert_eq!(
        weir_shared::error_code::ErrorCode::of_status(status).map(|c| c.as_str()),
        Some(code),
        "{status:?}"
    );
}
