//! The data lifecycle over real processes (issue 16): HTTP trim, retention by bytes and
//! by age, Kafka DeleteRecords through real clients, and topic configs
//! (`max.message.bytes`, `retention.*`, `cleanup.policy`) through CreateTopics,
//! DescribeConfigs and AlterConfigs. Trimmed data leaves the index, and its objects
//! leave the bucket once nothing references them: counted before and after.
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use futures::TryStreamExt;
use object_store::ObjectStore;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;
use weir_tests::gateway::Gatewayd;
use weir_tests::streamd::{Backend, Stack};
use weir_tests::wait_for;

const T: Duration = Duration::from_secs(30);
const MIB: usize = 1 << 20;

/// Uploads every 50 ms, retention checked every 200 ms, GC of objects older than 1 s
/// and unreferenced for 1 s.
const LIFECYCLE: &[&str] = &[
    "--upload-interval-ms",
    "50",
    "--retention-check-interval-ms",
    "200",
    "--gc-delay-sec",
    "1",
    "--gc-grace-sec",
    "1",
];

/// Fails the test if `f` runs past `secs` seconds.
async fn within<F: std::future::Future<Output = ()>>(secs: u64, f: F) {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .unwrap_or_else(|_| panic!("test did not finish within {secs} s"));
}

async fn stack(gateway_extra: &[&str]) -> (Stack, Gatewayd) {
    let stack = Stack::start_with(1, Backend::FileWal, LIFECYCLE, &[]).await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), gateway_extra);
    gw.wait_ready().await;
    (stack, gw)
}

/// Data objects in the bucket.
async fn objects_in_bucket(stack: &Stack) -> usize {
    let listed: Vec<_> = stack
        .s3
        .store()
        .list(Some(&object_store::path::Path::from("data")))
        .try_collect()
        .await
        .expect("list the bucket");
    listed.len()
}

async fn describe(gw: &Gatewayd, stream: &str) -> Value {
    let (status, body) = gw.send(gw.request(Method::GET, &format!("/v1/streams/{stream}"))).await;
    assert_eq!(status, StatusCode::OK, "describe {stream}: {body}");
    body
}

/// Appends one record at a time, each waiting until it is committed, so each lands in
/// a data object of its own.
async fn append_in_separate_objects(gw: &Gatewayd, stream: &str, count: u64) {
    for i in 0..count {
        let (_, end) = gw.append(stream, &[&format!("record-{i}")]).await;
        wait_for(&format!("{stream} committed through {end}"), T, || async {
            (describe(gw, stream).await["committed_seq_num"].as_u64() >= Some(end)).then_some(())
        })
        .await;
    }
}

async fn trim(gw: &Gatewayd, stream: &str, body: Value) -> (StatusCode, Value) {
    gw.send(
        gw.request(Method::POST, &format!("/v1/streams/{stream}/trim"))
            .json(&body),
    )
    .await
}

async fn create_with_config(gw: &Gatewayd, stream: &str, config: Value) {
    let (status, body) = gw
        .send(
            gw.request(Method::POST, "/v1/streams")
                .json(&json!({ "stream": stream, "config": config })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "create {stream}: {body}");
    gw.wait_open(stream).await;
}

async fn start_seq_num(gw: &Gatewayd, stream: &str) -> u64 {
    let (status, body) = gw
        .send(gw.request(Method::GET, &format!("/v1/streams/{stream}/records/tail")))
        .await;
    assert_eq!(status, StatusCode::OK, "tail of {stream}: {body}");
    body["start_seq_num"].as_u64().expect("start_seq_num")
}

// Issue 16: an HTTP trim advances the start (reads, the tail and the row follow it),
// never goes back, refuses a trim past the tail with 416, and the objects that held only
// trimmed records leave the bucket.
#[tokio::test(flavor = "multi_thread")]
async fn an_http_trim_advances_the_start_and_the_trimmed_objects_leave_the_bucket() {
    within(180, async {
        let (stack, gw) = stack(&[]).await;
        gw.create_stream("trimmed").await;
        gw.wait_open("trimmed").await;
        append_in_separate_objects(&gw, "trimmed", 10).await;
        let before = objects_in_bucket(&stack).await;
        assert!(before >= 10, "one object per committed append, found {before}");

        let (status, body) = trim(&gw, "trimmed", json!({ "seq_num": 6 })).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["start_seq_num"], 6);
        assert_eq!(start_seq_num(&gw, "trimmed").await, 6);
        let records = gw.read_all("trimmed").await;
        let seqs: Vec<u64> = records.iter().filter_map(|r| r["seq_num"].as_u64()).collect();
        assert_eq!(seqs, vec![6, 7, 8, 9], "a read from 0 starts at the new start");
        assert_eq!(records[0]["body"], "record-6");

        // Never back; past the tail is 416; bad input is 400 with a JSON body; no stream is 404.
        let (status, body) = trim(&gw, "trimmed", json!({ "seq_num": 2 })).await;
        assert_eq!((status, body["start_seq_num"].as_u64()), (StatusCode::OK, Some(6)));
        let (status, body) = trim(&gw, "trimmed", json!({ "seq_num": 11 })).await;
        assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{body}");
        assert_eq!(body["error"]["code"], "invalid_argument", "{body}");
        let (status, body) = trim(&gw, "trimmed", json!({ "seq_num": -1 })).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body["error"]["message"].is_string());
        let (status, _) = trim(&gw, "nothing-here", json!({ "seq_num": 1 })).await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        // The six objects that held only offsets 0..6 are deleted by GC.
        wait_for(
            "the trimmed objects leave the bucket",
            Duration::from_secs(60),
            || async {
                let now = objects_in_bucket(&stack).await;
                (now == before - 6).then_some(())
            },
        )
        .await;
        // A trim up to the tail includes records not yet committed: they are uploaded first.
        let (_, end) = gw.append("trimmed", &["last"]).await;
        let (status, body) = trim(&gw, "trimmed", json!({ "seq_num": end })).await;
        assert_eq!(
            (status, body["start_seq_num"].as_u64()),
            (StatusCode::OK, Some(end)),
            "{body}"
        );
        let (status, body) = gw
            .send(gw.request(Method::GET, "/v1/streams/trimmed/records?seq_num=0"))
            .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["records"], json!([]));
        assert_eq!(body["tail"], end);
    })
    .await;
}

// Issue 16: the owner enforces retention.bytes and retention.ms by logged trims, and the
// objects it lets go leave the bucket; new appends after it are served as usual.
#[tokio::test(flavor = "multi_thread")]
async fn retention_by_bytes_and_by_age_trims_the_oldest_data() {
    within(180, async {
        let (stack, gw) = stack(&[]).await;
        // retention_bytes 1: every range but the newest may go.
        create_with_config(&gw, "by-bytes", json!({ "retention_bytes": 1 })).await;
        append_in_separate_objects(&gw, "by-bytes", 8).await;
        wait_for("retention.bytes trims all but the newest range", T, || async {
            (start_seq_num(&gw, "by-bytes").await == 7).then_some(())
        })
        .await;
        let row = describe(&gw, "by-bytes").await;
        assert_eq!(row["config"]["retention_bytes"], 1);
        // Only the newest range's object is left (no other stream has data yet).
        wait_for(
            "the objects retention let go leave the bucket",
            Duration::from_secs(60),
            || async { (objects_in_bucket(&stack).await == 1).then_some(()) },
        )
        .await;

        // retention_ms 1000: records whose timestamps are older than a second go.
        create_with_config(&gw, "by-age", json!({ "retention_ms": 1000 })).await;
        append_in_separate_objects(&gw, "by-age", 3).await;
        wait_for("retention.ms trims the expired records", T, || async {
            (start_seq_num(&gw, "by-age").await == 3).then_some(())
        })
        .await;
        let (_, end) = gw.append("by-age", &["fresh"]).await;
        assert_eq!(end, 4);
        let records = gw.read_all("by-age").await;
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0]["body"], "fresh");
    })
    .await;
}

fn client_config(gw: &Gatewayd) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &gw.kafka).set("broker.address.family", "v4");
    c
}

async fn topic_config(admin: &AdminClient<DefaultClientContext>, topic: &str, name: &str) -> (Option<String>, bool) {
    let described = admin
        .describe_configs(
            &[ResourceSpecifier::Topic(topic)],
            &AdminOptions::new().operation_timeout(Some(T)),
        )
        .await
        .expect("describe configs");
    let resource = described[0].as_ref().expect("topic described");
    let entry = resource.get(name).unwrap_or_else(|| panic!("{name} described"));
    (entry.value.clone(), entry.is_default)
}

// Issue 16: topic configs through a real client. max.message.bytes is enforced per
// topic, above the gateway default too; cleanup.policy=compact is refused with
// INVALID_CONFIG; AlterConfigs replaces the set, as Kafka's does.
#[tokio::test(flavor = "multi_thread")]
async fn max_message_bytes_and_retention_configs_work_through_a_real_client() {
    within(180, async {
        // The gateway's own default is 1 MiB; the topic raises it to 2 MiB.
        let (_stack, gw) = stack(&["--kafka-max-message-bytes", &MIB.to_string()]).await;
        let admin: AdminClient<DefaultClientContext> = client_config(&gw).create().expect("admin");
        let opts = AdminOptions::new().operation_timeout(Some(T));
        let big = NewTopic::new("big", 1, TopicReplication::Fixed(1))
            .set("max.message.bytes", "2097152")
            .set("retention.ms", "86400000")
            .set("segment.bytes", "1048576");
        assert_eq!(
            admin.create_topics(&[big], &opts).await.expect("create"),
            vec![Ok("big".to_string())]
        );
        let compacted = NewTopic::new("compacted", 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
        let refused = admin.create_topics(&[compacted], &opts).await.expect("create");
        assert_eq!(
            refused,
            vec![Err(("compacted".to_string(), RDKafkaErrorCode::InvalidConfig))]
        );
        gw.wait_open("big/0").await;

        assert_eq!(
            topic_config(&admin, "big", "max.message.bytes").await,
            (Some("2097152".into()), false)
        );
        assert_eq!(
            topic_config(&admin, "big", "retention.ms").await,
            (Some("86400000".into()), false)
        );
        assert_eq!(
            topic_config(&admin, "big", "segment.bytes").await,
            (Some("1048576".into()), false)
        );
        assert_eq!(
            topic_config(&admin, "big", "retention.bytes").await,
            (Some("-1".into()), true)
        );

        let producer: FutureProducer = client_config(&gw)
            .set("message.max.bytes", "10000000")
            .set("acks", "all")
            .set("message.timeout.ms", "30000")
            .create()
            .expect("producer");
        let one_mib = vec![b'x'; MIB];
        producer
            .send(FutureRecord::<(), _>::to("big").payload(&one_mib), T)
            .await
            .map_err(|(e, _)| e)
            .expect("a 1 MiB message under the topic's 2 MiB is accepted");
        let three_mib = vec![b'y'; 3 * MIB];
        let err = producer
            .send(FutureRecord::<(), _>::to("big").payload(&three_mib), T)
            .await
            .map_err(|(e, _)| e)
            .expect_err("a 3 MiB message is refused");
        assert_eq!(
            err.rdkafka_error_code(),
            Some(RDKafkaErrorCode::MessageSizeTooLarge),
            "{err}"
        );

        // AlterConfigs replaces the whole set: max.message.bytes returns to the gateway's default.
        let alter = AlterConfig::new(ResourceSpecifier::Topic("big")).set("retention.bytes", "123456");
        let altered = admin.alter_configs(&[alter], &opts).await.expect("alter configs");
        assert!(altered[0].is_ok(), "{altered:?}");
        assert_eq!(
            topic_config(&admin, "big", "retention.bytes").await,
            (Some("123456".into()), false)
        );
        assert_eq!(
            topic_config(&admin, "big", "max.message.bytes").await,
            (Some(MIB.to_string()), true)
        );
        let err = producer
            .send(FutureRecord::<(), _>::to("big").payload(&one_mib), T)
            .await
            .map_err(|(e, _)| e)
            .expect_err("1 MiB is over the default again");
        assert_eq!(
            err.rdkafka_error_code(),
            Some(RDKafkaErrorCode::MessageSizeTooLarge),
            "{err}"
        );
        // (The rdkafka crate drops AlterConfigs' per-resource errors, so refusals are
        // checked with confluent-kafka in tests/clients/lifecycle_clients.py.)
    })
    .await;
}

// Issue 16: retention.ms on a Kafka topic follows the records' own timestamps, and
// ListOffsets (the low watermark) follows the start offset.
#[tokio::test(flavor = "multi_thread")]
async fn retention_ms_follows_record_timestamps_and_the_low_watermark_follows_it() {
    within(180, async {
        let (_stack, gw) = stack(&[]).await;
        let admin: AdminClient<DefaultClientContext> = client_config(&gw).create().expect("admin");
        let opts = AdminOptions::new().operation_timeout(Some(T));
        let aging = NewTopic::new("aging", 1, TopicReplication::Fixed(1)).set("retention.ms", "3600000");
        assert_eq!(
            admin.create_topics(&[aging], &opts).await.expect("create"),
            vec![Ok("aging".to_string())]
        );
        gw.wait_open("aging/0").await;
        let producer: FutureProducer = client_config(&gw).set("acks", "all").create().expect("producer");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        // Five records stamped two hours ago, then one stamped now.
        for i in 0..5 {
            let value = format!("old-{i}");
            producer
                .send(
                    FutureRecord::<(), _>::to("aging")
                        .payload(&value)
                        .timestamp(now - 7_200_000),
                    T,
                )
                .await
                .map_err(|(e, _)| e)
                .expect("old record acknowledged");
        }
        let consumer: BaseConsumer = client_config(&gw).set("group.id", "unused").create().expect("consumer");
        wait_for("retention.ms trims the two-hour-old records", T, || async {
            let (low, high) = consumer.fetch_watermarks("aging", 0, Duration::from_secs(5)).ok()?;
            (low == 5 && high == 5).then_some(())
        })
        .await;
        producer
            .send(FutureRecord::<(), _>::to("aging").payload("new").timestamp(now), T)
            .await
            .map_err(|(e, _)| e)
            .expect("new record acknowledged");
        // A recent record stays: two more passes later the low watermark is still 5.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(consumer.fetch_watermarks("aging", 0, T).expect("watermarks"), (5, 6));
    })
    .await;
}

// Issue 16: Kafka DeleteRecords from confluent-kafka and kafka-python
// (tests/clients/lifecycle_clients.py): the low watermark, ListOffsets earliest and a
// consumer from the beginning follow it, and an offset past the high watermark is
// OFFSET_OUT_OF_RANGE; AlterConfigs and IncrementalAlterConfigs refuse what Weir does
// not do with INVALID_CONFIG.
#[tokio::test(flavor = "multi_thread")]
async fn delete_records_and_config_changes_from_real_python_clients() {
    within(240, async {
        let (_stack, gw) = stack(&[]).await;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/lifecycle_clients.py");
        let out = tokio::time::timeout(
            Duration::from_secs(180),
            tokio::process::Command::new("python3")
                .args([script, &gw.kafka])
                .output(),
        )
        .await
        .expect("python clients finish in time")
        .expect("python3 runs");
        assert!(
            out.status.success(),
            "stdout:\n{}\nstderr:\n{}\ngateway log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            gw.log_text()
        );
    })
    .await;
}
