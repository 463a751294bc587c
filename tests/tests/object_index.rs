//! Metadata that stays small (design 0002, issue 15, D-19) over real processes: the view
//! holds no ranges however much is ingested, every process restarts and is ready within
//! 5 s after an ingest whose ranges would have made the format-1 view three times the
//! old 4 MiB message limit, large views and Raft snapshots travel in chunks, GC decides
//! from the index even for a watcher of a lagging follower, and a format-1 data
//! directory (written by the previous release, stuck past the limit) comes back.
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use weir_meta::client::{Consistency, MetadClient};
use weir_proto::metad::watch_event::Kind;
use weir_shared::ids::{Offset, StreamId};
use weir_tests::gateway::Gatewayd;
use weir_tests::metad::Cluster;
use weir_tests::process::Proc;
use weir_tests::readback::check_every_record;
use weir_tests::streamd::{Backend, Stack};
use weir_tests::{bin_path, free_port, wait_for};

const MIB: usize = 1 << 20;
/// The message limit the format-1 view outgrew.
const OLD_LIMIT: usize = 4 * MIB;

/// Fails the test if `f` runs past `secs` seconds.
async fn within<F: std::future::Future<Output = ()>>(secs: u64, f: F) {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .unwrap_or_else(|_| panic!("test timed out after {secs} s"));
}

/// The ids of `topic`'s partitions, in order, from a replica's view.
async fn partitions(client: &MetadClient, topic: &str) -> Vec<StreamId> {
    let topics = client.admin("topics", 0, 0).await.expect("topics");
    topics["topics"][topic]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| StreamId(p.as_u64().expect("id")))
        .collect()
}

/// How many ranges the index holds for `streams`, and how many bytes they and their
/// objects would have added to the format-1 view (their JSON, as it held them).
async fn format1_view_bytes(client: &MetadClient, streams: &[StreamId]) -> (usize, usize) {
    let (mut ranges, mut bytes) = (0, 0);
    let mut objects = std::collections::BTreeSet::new();
    for stream in streams {
        let mut at = Offset(0);
        loop {
            let page = client
                .read_ranges(*stream, at, false, 1000, Consistency::Linearizable)
                .await
                .expect("read ranges");
            for r in &page.ranges {
                ranges += 1;
                bytes += serde_json::to_vec(r).expect("json").len();
                objects.insert(r.key.clone());
                at = r.end;
            }
            if !page.more {
                break;
            }
        }
    }
    let mut skip = 0;
    loop {
        let page = client.admin("objects", skip, 1000).await.expect("objects");
        let rows = page["objects"].as_array().cloned().unwrap_or_default();
        for row in &rows {
            bytes += row.to_string().len();
        }
        if rows.len() < 1000 {
            break;
        }
        skip += 1000;
    }
    (ranges, bytes)
}

/// Waits until `url` answers 200; how long that took from `since`.
async fn ready_after(url: &str, since: Instant) -> Duration {
    wait_for(url, Duration::from_secs(30), || async {
        let r = weir_tests::http_get(url).await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    since.elapsed()
}

// D-19, issue 15: an ingest whose committed ranges would have made the format-1 view
// three times the old 4 MiB limit (counted through the index API) leaves the view small;
// metad, streamd and gatewayd each restart and are ready within 5 s; every acknowledged
// record reads back; and a gateway started afterwards is ready within 5 s.
#[tokio::test(flavor = "multi_thread")]
async fn after_an_ingest_past_three_times_the_old_limit_every_process_restarts_ready_within_5_s() {
    within(900, async {
        // Compaction off: this test needs the index to hold one range per upload.
        let mut stack = Stack::start_with(
            1,
            Backend::FileWal,
            &["--upload-interval-ms", "5", "--compaction-interval-ms", "86400000"],
            &["--snapshot-logs", "2000", "--snapshot-rows-percent", "0"],
        )
        .await;
        let partitions_n = 300u32;
        stack.metad.create_topic("big", partitions_n).await;
        let mut gw = Gatewayd::start("gw-1", &stack.metad_addrs(), stack.dir.path(), &[]);
        gw.wait_ready().await;
        let client = stack.metad.client();
        let ids = partitions(&client, "big").await;
        for p in 0..partitions_n {
            gw.wait_open(&format!("big/{p}")).await;
        }
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &gw.kafka)
            .set("broker.address.family", "v4")
            .set("acks", "all")
            .set("linger.ms", "1")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "60000")
            .create()
            .expect("producer");
        let mut acked: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let target = 3 * OLD_LIMIT;
        let mut round = 0u64;
        let ingest_started = Instant::now();
        let (ranges, would_be) = loop {
            // Each round gives every partition a record, so each upload commits a range
            // for most of them.
            let sends: Vec<_> = (0..partitions_n)
                .map(|p| {
                    let value = format!("big{p}-{round}");
                    let producer = producer.clone();
                    async move {
                        let record = FutureRecord::<(), String>::to("big").partition(p as i32).payload(&value);
                        let sent = producer.send(record, Duration::from_secs(60)).await;
                        (p, value, sent.is_ok())
                    }
                })
                .collect();
            for (p, value, ok) in futures::future::join_all(sends).await {
                if ok {
                    acked.entry(format!("big/{p}")).or_default().push(value);
                }
            }
            round += 1;
            if !round.is_multiple_of(20) {
                continue;
            }
            let index = client.admin("index", 0, 0).await.expect("index");
            println!("round {round} at {:?}: {index}", ingest_started.elapsed());
            let estimate = index["ranges"].as_u64().unwrap_or(0) as usize * 160;
            if estimate < target {
                continue;
            }
            let (ranges, bytes) = format1_view_bytes(&client, &ids).await;
            if bytes >= target {
                break (ranges, bytes);
            }
        };
        // The view as every node watches it stays small.
        let view = client.admin("state", 0, 0).await.expect("state");
        let view_bytes = view.to_string().len();
        println!(
            "ingested {round} rounds: {ranges} ranges, {would_be} bytes of format-1 view ({:.1}x the old limit); the view is {view_bytes} bytes",
            would_be as f64 / OLD_LIMIT as f64
        );
        assert!(would_be >= 3 * OLD_LIMIT);
        assert!(view_bytes < 200 * 1024, "the view holds no ranges: {view_bytes} bytes");

        // Every process stops cleanly, then starts and is ready within 5 s.
        gw.proc().term();
        assert_eq!(gw.proc().wait_exit(Duration::from_secs(60)).await, Some(0));
        stack.nodes[0].term();
        assert_eq!(stack.nodes[0].wait_exit(Duration::from_secs(60)).await, Some(0));
        stack.metad.replicas[0].signal(nix::sys::signal::Signal::SIGTERM);
        assert_eq!(stack.metad.replicas[0].wait_exit(Duration::from_secs(60)).await, Some(0));
        let started = Instant::now();
        stack.metad.replicas[0].start();
        let metad_ready = ready_after(&format!("http://{}/readyz", stack.metad.replicas[0].http), started).await;
        let started = Instant::now();
        stack.nodes[0].start();
        let streamd_ready = ready_after(&format!("http://{}/readyz", stack.nodes[0].http), started).await;
        let started = Instant::now();
        gw.spawn();
        let gateway_ready = ready_after(&gw.url("/readyz"), started).await;
        println!("ready after restart: metad {metad_ready:?}, streamd {streamd_ready:?}, gatewayd {gateway_ready:?}");
        for (what, took) in [("metad", metad_ready), ("streamd", streamd_ready), ("gatewayd", gateway_ready)] {
            assert!(took < Duration::from_secs(5), "{what} ready after {took:?}");
        }
        // A new gateway catches up within 5 s too.
        let started = Instant::now();
        let gw2 = Gatewayd::start("gw-2", &stack.metad_addrs(), stack.dir.path(), &[]);
        let new_gateway = ready_after(&gw2.url("/readyz"), started).await;
        println!("a new gateway is ready after {new_gateway:?}");
        assert!(new_gateway < Duration::from_secs(5), "new gateway ready after {new_gateway:?}");
        for p in 0..partitions_n {
            gw2.wait_open(&format!("big/{p}")).await;
        }
        check_every_record(&gw2.http, &acked).await;
    })
    .await;
}

// RR-INT-6 (a lagging replica installs a snapshot and then holds the leader's state),
// design 0002's bounded messages: a view over 4 MiB (20,000 streams) reaches a new
// gateway as a watch snapshot in chunks, and a replica that missed the log behind a
// purge installs a Raft snapshot over 4 MiB, sent in chunks, and then holds the same
// view as the leader.
#[tokio::test(flavor = "multi_thread")]
async fn a_watch_snapshot_and_a_raft_snapshot_over_4_mib_travel_in_chunks() {
    within(300, async {
        let mut cluster = Cluster::start(
            3,
            &[
                "--snapshot-logs",
                "20",
                "--snapshot-rows-percent",
                "0",
                "--auto-place",
                "false",
            ],
        )
        .await;
        let leader = cluster.wait_leader(&[]).await;
        let lagging = (leader + 1) % 3;
        cluster.replicas[lagging].kill();
        for t in 0..2 {
            cluster.create_topic(&format!("wide{t}"), 10_000).await;
        }
        // Enough entries after the topics for the leader to snapshot and purge them.
        let client = cluster.client();
        for i in 0..60 {
            cluster.create_topic(&format!("pad{i}"), 1).await;
        }
        wait_for("a leader snapshot past the topics", Duration::from_secs(60), || async {
            let s = cluster.replicas[leader].http_json("/admin/status").await?;
            (s["purged"].as_u64()? > 20).then_some(())
        })
        .await;
        // The watch snapshot arrives in chunks of at most 1 MiB of rows.
        let mut watch = client.watch(None).await.expect("watch");
        let (mut chunks, mut largest, mut view_bytes) = (0, 0, 0);
        loop {
            let event = watch.message().await.expect("event").expect("open stream");
            match event.kind {
                Some(Kind::SnapshotBegin(_)) => {}
                Some(Kind::SnapshotRows(rows)) => {
                    chunks += 1;
                    largest = largest.max(rows.len());
                    view_bytes += rows.len();
                }
                Some(Kind::SnapshotEnd(_)) => break,
                other => panic!("unexpected event in a snapshot: {other:?}"),
            }
        }
        assert!(view_bytes > OLD_LIMIT, "the view is {view_bytes} bytes");
        println!("a {view_bytes}-byte view came in {chunks} chunks, the largest {largest} bytes");
        assert!(chunks >= 4 && largest <= MIB, "{chunks} chunks, largest {largest}");
        // A gateway's view arrives that way too, and it is ready.
        let dir = tempfile::tempdir().expect("dir");
        let addrs = cluster.replicas[leader].grpc.clone();
        let gw = Gatewayd::start("gw-wide", &addrs, dir.path(), &[]);
        gw.wait_ready().await;
        let (_, ready) = gw.send(gw.request(reqwest::Method::GET, "/ready")).await;
        assert_eq!(ready["view_error"], Value::Null);
        let (_, stream) = gw
            .send(gw.request(reqwest::Method::GET, "/v1/streams/wide1%2F9999"))
            .await;
        assert_eq!(stream["name"], "wide1/9999", "{stream}");
        // The Raft snapshot: the replica that was down installs one over 4 MiB.
        cluster.replicas[lagging].start();
        wait_for("the snapshot installed", Duration::from_secs(120), || async {
            let log = cluster.replicas[lagging].log_text();
            log.contains("installed metadata snapshot").then_some(())
        })
        .await;
        let built = cluster.replicas[leader].log_text();
        let bytes = built
            .lines()
            .filter(|l| l.contains("built metadata snapshot"))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok()?["bytes"].as_u64())
            .max()
            .expect("a snapshot was built");
        assert!(bytes as usize > OLD_LIMIT, "snapshot of {bytes} bytes");
        // It travelled in 1 MiB chunks.
        let metrics = weir_tests::get_text(&format!("http://{}/metrics", cluster.replicas[lagging].http)).await;
        let received = weir_tests::metric_value(
            &metrics,
            "weir_metad_raft_snapshot_chunks_total{direction=\"received\"}",
        )
        .unwrap_or(0.0);
        println!("a {bytes}-byte Raft snapshot arrived in {received} chunks");
        assert!(
            received as u64 >= bytes / (1 << 20),
            "{received} chunks for {bytes} bytes"
        );
        wait_for(
            "the replica's view equals the leader's",
            Duration::from_secs(60),
            || async {
                let mine = cluster.data_state_of(lagging).await?;
                let theirs = cluster.data_state_of(leader).await?;
                (mine["streams"] == theirs["streams"] && mine["topics"] == theirs["topics"]).then_some(())
            },
        )
        .await;
    })
    .await;
}

// Design 0002, INV-17: GC decides from the index, not from a view. A streamd whose
// only metad is a follower that applies seconds late (its view lags every commit) runs
// GC with a 1 s delay while another node commits objects: every committed object stays
// and every acknowledged record reads back, while an object nobody committed is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn a_gc_following_a_lagging_follower_deletes_nothing_committed() {
    within(300, async {
        let mut stack = Stack::start_replicas(3, 1, Backend::FileWal, &["--upload-interval-ms", "50"], &[]).await;
        let leader = stack.metad.wait_leader(&[]).await;
        let follower = (leader + 1) % 3;
        // The follower applies every batch 3 s late.
        stack.metad.replicas[follower].kill();
        stack.metad.replicas[follower].start_with_env(&[("WEIR_FAILPOINT_STATE_MACHINE_APPLY", "sleep(3000)")]);
        let gw = Gatewayd::start("gw-gc", &stack.metad_addrs(), stack.dir.path(), &[]);
        gw.wait_ready().await;
        let names: Vec<String> = (0..4).map(|i| format!("gc{i}")).collect();
        for n in &names {
            gw.create_stream(n).await;
            gw.wait_open(n).await;
        }
        // An object nobody committed, old enough to collect.
        let orphan = "data/nobody/00000000000000000001/orphan.wdo";
        stack.s3.put(orphan, b"never committed").await;
        // The collector: a second streamd that follows only the lagging follower.
        let follower_addr = stack.metad.replicas[follower].grpc.clone();
        stack.add_node(
            "gc-node",
            Backend::FileWal,
            &["--metad", &follower_addr, "--gc-delay-sec", "1", "--gc-grace-sec", "1"],
        );
        let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let until = Instant::now() + Duration::from_secs(12);
        let mut i = 0;
        while Instant::now() < until {
            for n in &names {
                let body = format!("{n}-{i}");
                gw.append(n, &[&body]).await;
                expected.entry(n.clone()).or_default().push(body);
            }
            i += 1;
        }
        wait_for("the orphan collected", Duration::from_secs(60), || async {
            (!stack.s3.exists(orphan).await).then_some(())
        })
        .await;
        // Seconds more of GC passes over objects the follower has not applied yet.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let log = stack.nodes[1].log_text();
        let deleted: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("deleted uncommitted data object"))
            .collect();
        assert!(
            deleted.iter().all(|l| l.contains("orphan.wdo")),
            "only the orphan: {deleted:?}"
        );
        check_every_record(&gw.http, &expected).await;
    })
    .await;
}

// RR-WAL-6 (metad storage carries a format identifier, checked before decoding), issue
// 15's upgrade in place. The fixture is a `weir dev` data directory written by the
// previous release (format 1): a 200-partition topic `fx` and an HTTP stream `plain`,
// ingested until the view passed the 4 MiB message limit, after which no watcher could
// start. This release migrates it when metad opens it: every process is ready, the
// view is small, the ranges are in the index, and every record acknowledged before the
// upgrade (listed in the fixture's expected.json) reads back, once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_format1_weir_dev_directory_stuck_past_the_limit_comes_back_after_the_upgrade() {
    within(300, async {
        let dir = tempfile::tempdir().expect("dir");
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/format1-weir-dev.tar.xz");
        let untar = std::process::Command::new("tar")
            .arg("-xJf")
            .arg(&fixture)
            .arg("-C")
            .arg(dir.path())
            .status()
            .expect("tar runs");
        assert!(untar.success(), "extracting {}", fixture.display());
        let doc: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("expected.json")).expect("expected.json"))
                .expect("json");
        let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let bodies = |v: &Value| -> Vec<String> {
            v.as_array()
                .expect("records")
                .iter()
                .map(|b| b.as_str().expect("body").to_string())
                .collect()
        };
        for (p, records) in doc["fx"].as_object().expect("fx") {
            expected.insert(format!("fx/{p}"), bodies(records));
        }
        expected.insert("plain".into(), bodies(&doc["plain"]));
        let acked: usize = expected.values().map(Vec::len).sum();

        let http = format!("127.0.0.1:{}", free_port());
        let metad_http = format!("127.0.0.1:{}", free_port());
        let mut command = std::process::Command::new(bin_path("weir"));
        command
            .arg("dev")
            .args(["--data-dir", &dir.path().join("weir-data").display().to_string()]);
        for (flag, addr) in [
            ("--http-listen", http.clone()),
            ("--kafka-listen", format!("127.0.0.1:{}", free_port())),
            ("--metad-listen", format!("127.0.0.1:{}", free_port())),
            ("--metad-http-listen", metad_http.clone()),
            ("--streamd-listen", format!("127.0.0.1:{}", free_port())),
            ("--streamd-http-listen", format!("127.0.0.1:{}", free_port())),
        ] {
            command.args([flag, &addr]);
        }
        let mut dev = Proc::new("weir-dev", dir.path().join("dev.log"));
        dev.spawn(command);
        ready_after(&format!("http://{http}/readyz"), Instant::now()).await;
        let log = dev.log_text();
        // RR-WAL-6: metad read the directory's format identifier before decoding it, and
        // so migrated the format 1 store rather than decoding it as its own.
        assert!(
            log.contains("migrated the metadata store from format 1 to format 2"),
            "{log}"
        );
        let streams = weir_tests::get_text(&format!("http://{metad_http}/admin/state/streams")).await;
        let index: Value =
            serde_json::from_str(&weir_tests::get_text(&format!("http://{metad_http}/admin/index")).await)
                .expect("index json");
        println!(
            "migrated: the streams section is {} bytes; the index holds {index}",
            streams.len()
        );
        assert!(streams.len() < 200 * 1024, "streams section of {} bytes", streams.len());
        assert!(index["ranges"].as_u64().expect("ranges") > 30_000, "{index}");

        check_every_record(&http, &expected).await;
        println!("{acked} acknowledged records in {} streams read back", expected.len());
        dev.term();
        assert_eq!(
            dev.wait_exit(Duration::from_secs(60)).await,
            Some(0),
            "{}",
            dev.log_text()
        );
    })
    .await;
}

// Design 0002's bounded messages, the failure side: a watcher that receives a snapshot
// frame it cannot decode (here one marked with a format this build does not read, as a
// newer metad's would be) logs an error naming the cause, is not ready, and says why in
// `/ready`; once metad sends frames it reads, the same process becomes ready.
#[tokio::test(flavor = "multi_thread")]
async fn a_watcher_that_cannot_decode_its_snapshot_says_why_and_is_not_ready() {
    within(120, async {
        let mut cluster =
            Cluster::start_with_env(1, &[], &[("WEIR_FAILPOINT_WATCH_SNAPSHOT_ROWS", "return(err)")]).await;
        cluster.wait_leader(&[]).await;
        let dir = tempfile::tempdir().expect("dir");
        let gw = Gatewayd::start("gw-undecodable", &cluster.replicas[0].grpc, dir.path(), &[]);
        let why = wait_for("the watcher reports the cause", Duration::from_secs(30), || async {
            let r = weir_tests::http_get(gw.url("/ready")).await.ok()?;
            let status = r.status();
            let body: Value = r.json().await.ok()?;
            Some((status, body["view_error"].as_str()?.to_string()))
        })
        .await;
        assert_eq!(why.0, reqwest::StatusCode::SERVICE_UNAVAILABLE);
        assert!(why.1.contains("undecodable metadata snapshot rows"), "{}", why.1);
        let log = gw.log_text();
        assert!(
            log.lines().any(|l| l.contains("\"ERROR\"")
                && l.contains("cannot follow the metadata log")
                && l.contains("undecodable")),
            "{log}"
        );
        // metad restarted without the fault: the same gateway recovers by itself.
        cluster.replicas[0].kill();
        cluster.replicas[0].env.clear();
        cluster.replicas[0].start();
        gw.wait_ready().await;
        let (_, ready) = gw.send(gw.request(reqwest::Method::GET, "/ready")).await;
        assert_eq!(ready["view_error"], Value::Null, "{ready}");
    })
    .await;
}
