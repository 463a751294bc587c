//! Issue 22: the consumer side as Kafka answers it, with real clients: static group
//! membership (KIP-345) and the edge cases librdkafka and kafka-python users meet.

use super::{create_topic, kafka_stack, T};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::TopicPartitionList;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir_tests::gateway::Gatewayd;
use weir_tests::wait_for;

/// Counts the rebalances that took partitions from a consumer.
#[derive(Clone, Default)]
struct Revocations(Arc<Mutex<usize>>);

impl Revocations {
    fn count(&self) -> usize {
        *self.0.lock().expect("count")
    }
}

impl ClientContext for Revocations {}

impl ConsumerContext for Revocations {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if matches!(rebalance, Rebalance::Revoke(tpl) if tpl.count() > 0) {
            *self.0.lock().expect("count") += 1;
        }
    }
}

type Member = StreamConsumer<Revocations>;

fn static_member(gw: &Gatewayd, instance: &str) -> (Member, Revocations) {
    let events = Revocations::default();
    let c: Member = super::config(gw)
        .set("group.id", "statics")
        .set("group.instance.id", instance)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "30000")
        .set("heartbeat.interval.ms", "500")
        .set("fetch.wait.max.ms", "200")
        .create_with_context(events.clone())
        .expect("consumer");
    c.subscribe(&["statics"]).expect("subscribe");
    (c, events)
}

fn assigned(c: &Member) -> BTreeSet<i32> {
    c.assignment()
        .map(|tpl| tpl.elements().iter().map(|e| e.partition()).collect())
        .unwrap_or_default()
}

/// Serves each consumer's group protocol for a moment; a fatal error is returned.
async fn drive(cs: &[&Member]) -> Option<KafkaError> {
    for c in cs {
        match tokio::time::timeout(Duration::from_millis(100), c.recv()).await {
            Ok(Err(e @ KafkaError::MessageConsumptionFatal(_))) => return Some(e),
            Ok(Err(e)) => panic!("consume: {e}"),
            _ => {}
        }
    }
    None
}

// Issue 22 (KIP-345) with librdkafka: a static member that restarts within its session
// gets its partitions back without a rebalance, and a second process with the same
// group.instance.id fences the first with FENCED_INSTANCE_ID.
#[tokio::test(flavor = "multi_thread")]
async fn a_static_member_restarts_without_a_rebalance_and_a_duplicate_is_fenced() {
    let (_stack, gw) = kafka_stack(1, &[]).await;
    create_topic(&gw, "statics", 4).await;
    let (a, _) = static_member(&gw, "inst-a");
    let (b, b_events) = static_member(&gw, "inst-b");
    wait_for("two static members split the partitions", T, || async {
        drive(&[&a, &b]).await;
        let (pa, pb) = (assigned(&a), assigned(&b));
        (pa.len() == 2 && pb.len() == 2 && pa.is_disjoint(&pb)).then_some(())
    })
    .await;
    let a_parts = assigned(&a);
    let b_revocations = b_events.count();
    // librdkafka's static members send no LeaveGroup when they close.
    drop(a);

    let (a2, _) = static_member(&gw, "inst-a");
    wait_for("the restarted member gets its partitions back", T, || async {
        drive(&[&a2, &b]).await;
        (assigned(&a2) == a_parts).then_some(())
    })
    .await;
    // A rebalance would reach b through its heartbeats (every 0.5 s) within a few.
    for _ in 0..15 {
        drive(&[&a2, &b]).await;
    }
    assert_eq!(b_events.count(), b_revocations, "the other member saw no rebalance");
    assert_eq!(assigned(&b).len(), 2);

    let (a3, _) = static_member(&gw, "inst-a");
    let fenced = wait_for("the replaced process is fenced", T, || async {
        if let Some(e) = drive(&[&a2]).await {
            return Some(e);
        }
        drive(&[&a3, &b]).await;
        a2.client()
            .fatal_error()
            .map(|(code, _)| KafkaError::MessageConsumptionFatal(code))
    })
    .await;
    let (code, reason) = a2.client().fatal_error().expect("a fatal error");
    assert_eq!(code, RDKafkaErrorCode::FencedInstanceId, "{fenced}: {reason}");
    wait_for("the new process holds the instance's partitions", T, || async {
        drive(&[&a3, &b]).await;
        (assigned(&a3) == a_parts).then_some(())
    })
    .await;
    assert_eq!(
        b_events.count(),
        b_revocations,
        "still no rebalance for the other member"
    );
}

// Issue 22 (KIP-345) with kafka-python 3 (`tests/clients/static_members.py`): the same
// restart without a rebalance, and the replaced instance's commit is refused with
// FENCED_INSTANCE_ID.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_python_static_members_restart_without_a_rebalance() {
    let (_stack, gw) = kafka_stack(1, &[]).await;
    create_topic(&gw, "py-statics", 4).await;
    let out = python(&gw, "static_members.py", &[&gw.kafka, "py-statics", "4"], "3").await;
    assert!(out.contains("kafka-python 3.") && out.contains("OK"), "{out}");
}

// Issue 22: an OffsetCommit for a topic or partition that does not exist is refused
// with UNKNOWN_TOPIC_OR_PARTITION, as Kafka refuses it, and nothing is stored for it;
// the existing partition in the same request is committed.
#[tokio::test(flavor = "multi_thread")]
async fn an_offset_commit_for_a_missing_topic_or_partition_is_refused() {
    let (_stack, gw) = kafka_stack(1, &[]).await;
    create_topic(&gw, "real", 1).await;
    let c: StreamConsumer = super::config(&gw)
        .set("group.id", "typos")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let list = |parts: &[(&str, i32)]| {
        let mut tpl = TopicPartitionList::new();
        for (topic, partition) in parts {
            tpl.add_partition_offset(topic, *partition, rdkafka::Offset::Offset(7))
                .expect("tpl");
        }
        tpl
    };
    let commit = |parts: &[(&str, i32)]| {
        c.commit(&list(parts), rdkafka::consumer::CommitMode::Sync)
            .map_err(|e| e.rdkafka_error_code())
    };
    let unknown = Err(Some(RDKafkaErrorCode::UnknownTopicOrPartition));
    assert_eq!(commit(&[("nope", 0)]), unknown, "a topic that does not exist");
    assert_eq!(commit(&[("real", 5)]), unknown, "a partition that does not exist");
    // librdkafka reports the first partition error of a commit.
    assert_eq!(commit(&[("real", 0), ("nope", 0), ("real", 5)]), unknown);
    let all = list(&[("real", 0), ("nope", 0), ("real", 5)]);
    let committed = c.committed_offsets(all, T).expect("committed offsets");
    let offset = |t: &str, p: i32| committed.find_partition(t, p).map(|e| e.offset());
    assert_eq!(
        offset("real", 0),
        Some(rdkafka::Offset::Offset(7)),
        "the existing partition is committed"
    );
    assert_eq!(
        offset("nope", 0),
        Some(rdkafka::Offset::Invalid),
        "nothing stored for a missing topic"
    );
    assert_eq!(
        offset("real", 5),
        Some(rdkafka::Offset::Invalid),
        "nor for a missing partition"
    );
    assert_eq!(commit(&[("real", 0)]), Ok(()));
}

// Issue 22: librdkafka's admin API with an operation timeout of 0 (its default in
// confluent-kafka: "do not wait for the operation") creates topics as Kafka does.
#[tokio::test(flavor = "multi_thread")]
async fn create_topics_with_an_operation_timeout_of_zero_succeeds() {
    let (_stack, gw) = kafka_stack(1, &[]).await;
    let results = super::admin(&gw)
        .create_topics(
            &[rdkafka::admin::NewTopic::new(
                "no-wait",
                2,
                rdkafka::admin::TopicReplication::Fixed(1),
            )],
            &rdkafka::admin::AdminOptions::new().operation_timeout(Some(Duration::ZERO)),
        )
        .await
        .expect("an answer");
    assert_eq!(results, vec![Ok("no-wait".to_string())]);
    for p in 0..2 {
        gw.wait_open(&format!("no-wait/{p}")).await;
    }
}

// Issue 22: a consumer whose fetch.max.bytes and max.partition.fetch.bytes are smaller
// than the batches stored still gets one whole batch per fetch and makes progress, as
// Kafka guarantees.
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_with_limits_below_the_batch_size_reads_everything() {
    let (_stack, gw) = kafka_stack(1, &[]).await;
    create_topic(&gw, "big", 2).await;
    let p = super::producer(&gw, &[("linger.ms", "0")]);
    let payload = vec![b'x'; 64 << 10];
    for i in 0..20 {
        p.send(
            rdkafka::producer::FutureRecord::to("big")
                .key(&format!("k{i}"))
                .payload(&payload),
            T,
        )
        .await
        .map_err(|(e, _)| e)
        .expect("acknowledged");
    }
    let c: StreamConsumer = super::config(&gw)
        .set("group.id", "small-fetches")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.max.bytes", "10000")
        .set("message.max.bytes", "10000")
        .set("max.partition.fetch.bytes", "5000")
        .set("fetch.wait.max.ms", "200")
        .create()
        .expect("consumer");
    c.subscribe(&["big"]).expect("subscribe");
    let mut got = BTreeSet::new();
    while got.len() < 20 {
        let m = tokio::time::timeout(T, c.recv())
            .await
            .unwrap_or_else(|_| panic!("read {} of 20 in time", got.len()))
            .expect("consume");
        assert_eq!(rdkafka::Message::payload(&m).map(<[u8]>::len), Some(64 << 10));
        got.insert(rdkafka::Message::key(&m).map(<[u8]>::to_vec));
    }
}

/// Runs a script of `tests/clients/` with kafka-python `version` ("3" for the newest
/// beside the pinned one, "pinned" for the pinned one), failing with its output.
async fn python(gw: &Gatewayd, script: &str, args: &[&str], version: &str) -> String {
    let tools = std::env::var("WEIR_TOOLS_DIR").unwrap_or_else(|_| "/var/cache/weir/tools".into());
    let path = format!("{}/clients/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut cmd = tokio::process::Command::new("python3");
    if version == "3" {
        cmd.env("PYTHONPATH", format!("{tools}/py/kafka-python-3"));
    }
    let out = tokio::time::timeout(Duration::from_secs(240), cmd.arg(&path).args(args).output())
        .await
        .expect("the script finishes in time")
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}\ngateway log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        gw.log_text()
    );
    stdout
}

async fn fetches(gw: &Gatewayd, session: &str) -> f64 {
    gw.metric(&format!("weir_gatewayd_kafka_fetches_total{{session=\"{session}\"}}"))
        .await
}

// Issue 22 (KIP-227): kafka-python (pinned 2.2, and 3) fetches through incremental
// sessions; on a gateway that keeps one session, a second consumer's (larger) evicts
// the first's once that is older than the eviction time, which is answered FETCH_SESSION_ID_NOT_FOUND and recovers, and both read
// every record once. (librdkafka does not implement KIP-227: it always fetches whole.)
#[tokio::test(flavor = "multi_thread")]
async fn kafka_python_fetches_incrementally_and_recovers_an_evicted_session() {
    for version in ["pinned", "3"] {
        // A gateway of its own per client: sessions left by one would hold the room.
        let flags = [
            "--kafka-fetch-sessions",
            "1",
            "--kafka-fetch-session-eviction-ms",
            "1000",
        ];
        let (_stack, gw) = kafka_stack(1, &flags).await;
        create_topic(&gw, "sess", 3).await;
        // One batch per record (each partition's sends one at a time), so reading them
        // with small fetches takes many round trips.
        let p = super::producer(&gw, &[("linger.ms", "0")]);
        let sends = (0..3).map(|part| {
            let p = &p;
            async move {
                for i in 0..200 {
                    let v = format!("{part}-{i:0>100}");
                    p.send(
                        rdkafka::producer::FutureRecord::<(), _>::to("sess")
                            .partition(part)
                            .payload(&v),
                        T,
                    )
                    .await
                    .map_err(|(e, _)| e)
                    .expect("acknowledged");
                }
            }
        });
        futures::future::join_all(sends).await;
        let out = python(&gw, "fetch_sessions.py", &[&gw.kafka, "sess", "3", "200", "1"], version).await;
        assert!(out.contains("OK"), "{out}");
        let counts = futures::future::join_all(
            [
                "sessionless",
                "full",
                "incremental",
                "session_not_found",
                "invalid_epoch",
            ]
            .map(|k| {
                let gw = &gw;
                async move { (k, fetches(gw, k).await) }
            }),
        )
        .await;
        assert!(
            fetches(&gw, "incremental").await > 10.0,
            "kafka-python {version} fetched incrementally: {counts:?}"
        );
        assert!(
            fetches(&gw, "session_not_found").await >= 1.0,
            "kafka-python {version}'s evicted session was refused, and it recovered"
        );
    }
}

// Issue 22 (DeleteTopics v6 edge cases, as Kafka answers them): an entry naming a topic
// by both name and id, or by neither, is INVALID_REQUEST and deletes nothing; an
// unknown id is UNKNOWN_TOPIC_ID and an unknown name UNKNOWN_TOPIC_OR_PARTITION; a
// topic named by its id alone is deleted and answered with its name.
#[tokio::test(flavor = "multi_thread")]
async fn delete_topics_by_id_answers_each_malformed_or_unknown_entry_as_kafka_does() {
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{
        ApiKey, DeleteTopicsRequest, DeleteTopicsResponse, MetadataRequest, MetadataResponse, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    use weir_tests::kafka_wire::{connect, exchange, metadata_errors};
    let (_stack, gw) = kafka_stack(1, &[]).await;
    create_topic(&gw, "del-a", 1).await;
    create_topic(&gw, "del-b", 1).await;
    let name = |n: &str| Some(TopicName(StrBytes::from_string(n.to_string())));
    let mut s = connect(&gw.kafka);
    let metadata = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(name("del-b"))]))
        .with_allow_auto_topic_creation(false);
    let described: MetadataResponse = exchange(&mut s, ApiKey::Metadata, 12, &metadata).expect("metadata");
    let id_b = described.topics[0].topic_id;
    assert!(!id_b.is_nil(), "Metadata v12 carries the topic id");
    let state = |n: Option<TopicName>, id: uuid::Uuid| DeleteTopicState::default().with_name(n).with_topic_id(id);
    let request = DeleteTopicsRequest::default().with_timeout_ms(30_000).with_topics(vec![
        state(name("del-a"), id_b),
        state(None, uuid::Uuid::nil()),
        state(None, uuid::Uuid::from_u128(7)),
        state(name("never-was"), uuid::Uuid::nil()),
        state(None, id_b),
    ]);
    let answer: DeleteTopicsResponse = exchange(&mut s, ApiKey::DeleteTopics, 6, &request).expect("delete topics");
    let codes: Vec<i16> = answer.responses.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, [42, 42, 100, 3, 0], "{answer:?}");
    assert_eq!(
        answer.responses[4].name,
        name("del-b"),
        "answered with the deleted topic's name"
    );
    assert_eq!(answer.responses[4].topic_id, id_b);
    wait_for("del-b gone, del-a kept", T, || async {
        let errors = metadata_errors(&mut connect(&gw.kafka), Some(&["del-a", "del-b"])).ok()?;
        (errors == [("del-a".to_string(), 0), ("del-b".to_string(), 3)]).then_some(())
    })
    .await;
}

// Issue 59: the introspection admin APIs through kafka-python 3
// (`tests/clients/admin_introspection.py`; confluent-kafka's Python binding has none of
// them): list_transactions and describe_transactions show an open transaction ongoing
// with its producer id, describe_producers shows that producer and the offset its
// transaction starts at, and delete_group_offsets (OffsetDelete) removes the committed
// offset of a group no member subscribes with.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_python_lists_transactions_describes_producers_and_deletes_group_offsets() {
    let (_stack, gw) = kafka_stack(1, &[]).await;
    python(&gw, "admin_introspection.py", &[&gw.kafka], "3").await;
}
