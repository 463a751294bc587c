//! Leader epochs (issue 22): a partition's advertised epoch grows with every move,
//! a client holding an older one is fenced, the owner stamps its epoch into the
//! batches it appends, OffsetForLeaderEpoch answers from the history of moves, and a
//! librdkafka consumer that validates its position after each move reads everything
//! once, in order.

use super::*;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, MetadataRequest,
    MetadataResponse, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use std::net::TcpStream;
use weir_tests::kafka_wire::{connect, exchange};

const FENCED_LEADER_EPOCH: i16 = 74;
const UNKNOWN_LEADER_EPOCH: i16 = 75;

fn name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

fn leader_epoch(s: &mut TcpStream, topic: &str) -> i32 {
    let request = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(name(topic)))]))
        .with_allow_auto_topic_creation(false);
    let answer: MetadataResponse = exchange(s, ApiKey::Metadata, 12, &request).expect("metadata");
    answer.topics[0].partitions[0].leader_epoch
}

/// A sessionless Fetch v12 of partition 0 from `offset`: its error code and each
/// returned batch's (base offset, partition leader epoch).
fn fetch(s: &mut TcpStream, topic: &str, offset: i64, current: i32) -> (i16, Vec<(i64, i32)>) {
    let partition = FetchPartition::default()
        .with_partition(0)
        .with_current_leader_epoch(current)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(1 << 20);
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(0)
        .with_max_bytes(1 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![partition])]);
    let answer: FetchResponse = exchange(s, ApiKey::Fetch, 12, &request).expect("fetch");
    let p = &answer.responses[0].partitions[0];
    let mut batches = vec![];
    let mut rest: &[u8] = p.records.as_deref().unwrap_or_default();
    while rest.len() >= 16 {
        let base = i64::from_be_bytes(rest[0..8].try_into().expect("8 bytes"));
        let len = i32::from_be_bytes(rest[8..12].try_into().expect("4 bytes")) as usize;
        let epoch = i32::from_be_bytes(rest[12..16].try_into().expect("4 bytes"));
        batches.push((base, epoch));
        rest = &rest[(12 + len).min(rest.len())..];
    }
    (p.error_code, batches)
}

/// ListOffsets v6 for partition 0's latest offset: (error, offset, its epoch).
fn list_latest(s: &mut TcpStream, topic: &str, current: i32) -> (i16, i64, i32) {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_current_leader_epoch(current)
                .with_timestamp(-1)])]);
    let answer: ListOffsetsResponse = exchange(s, ApiKey::ListOffsets, 6, &request).expect("list offsets");
    let p = &answer.topics[0].partitions[0];
    (p.error_code, p.offset, p.leader_epoch)
}

/// OffsetForLeaderEpoch v4 for partition 0: (error, epoch, end offset).
fn epoch_end(s: &mut TcpStream, topic: &str, current: i32, requested: i32) -> (i16, i32, i64) {
    let request = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(0)
                .with_current_leader_epoch(current)
                .with_leader_epoch(requested)])]);
    let answer: OffsetForLeaderEpochResponse =
        exchange(s, ApiKey::OffsetForLeaderEpoch, 4, &request).expect("offset for leader epoch");
    let p = &answer.topics[0].partitions[0];
    (p.error_code, p.leader_epoch, p.end_offset)
}

async fn produce(gw: &Gatewayd, topic: &str, from: usize, count: usize) {
    let p = producer(gw, &[("enable.idempotence", "true")]);
    for i in from..from + count {
        let value = format!("m-{i}");
        p.send(FutureRecord::<(), _>::to(topic).partition(0).payload(&value), T)
            .await
            .expect("produced");
    }
}

async fn owner(gw: &Gatewayd, stream: &str) -> String {
    let (_, d) = gw
        .send(gw.request(Method::GET, &format!("/v1/streams/{}", stream.replace('/', "%2F"))))
        .await;
    d["owner"]["node"].as_str().expect("an owner").to_string()
}

/// Moves `stream` by planned transfer to the node that does not own it.
async fn move_stream(stack: &Stack, gw: &Gatewayd, stream: &str) {
    let from = owner(gw, stream).await;
    let to = stack.nodes.iter().find(|n| n.id != from).expect("two nodes").id.clone();
    let path = format!("/v1/admin/streams/{}/transfer", stream.replace('/', "%2F"));
    let (status, body) = gw.send(gw.request(Method::POST, &path).json(&json!({"to": to}))).await;
    assert!(status.is_success(), "transfer: {status} {body}");
    wait_for(&format!("{stream} on {to}"), T, || async {
        (owner(gw, stream).await == to).then_some(())
    })
    .await;
    gw.wait_open(stream).await;
}

// Issue 22: after each move the advertised epoch is higher; Metadata, Fetch (in each
// batch) and ListOffsets carry it; a Fetch or ListOffsets at an older epoch is FENCED_LEADER_EPOCH and at a newer one UNKNOWN_LEADER_EPOCH; each
// batch carries the epoch its owner appended it under; and OffsetForLeaderEpoch answers
// across two moves: an epoch ends where the next one starts, the last at the log end,
// and one not recorded at the log end too (never UNDEFINED or earlier, which clients
// take for a truncation). A gateway joining raises the epoch once.
#[tokio::test(flavor = "multi_thread")]
async fn epochs_grow_with_each_move_fence_stale_clients_and_answer_offset_for_leader_epoch() {
    let (stack, gw) = kafka_stack(2, &[]).await;
    create_topic(&gw, "epochs", 1).await;
    let mut s = connect(&gw.kafka);
    let first = leader_epoch(&mut s, "epochs");
    produce(&gw, "epochs", 0, 3).await;
    move_stream(&stack, &gw, "epochs/0").await;
    let second = leader_epoch(&mut s, "epochs");
    assert!(second > first, "a move raises the epoch: {first} -> {second}");
    produce(&gw, "epochs", 3, 2).await;

    assert_eq!(fetch(&mut s, "epochs", 0, first).0, FENCED_LEADER_EPOCH);
    assert_eq!(fetch(&mut s, "epochs", 0, second + 1).0, UNKNOWN_LEADER_EPOCH);
    assert_eq!(list_latest(&mut s, "epochs", first).0, FENCED_LEADER_EPOCH);
    assert_eq!(
        list_latest(&mut s, "epochs", second),
        (0, 5, second),
        "the latest offset with its owner's epoch"
    );
    let (code, batches) = fetch(&mut s, "epochs", 0, second);
    assert_eq!(code, 0);
    let stamped: Vec<i32> = batches.iter().map(|(_, e)| *e).collect();
    assert_eq!(
        stamped,
        [first, first, first, second, second],
        "each batch carries its owner's epoch: {batches:?}"
    );
    assert_eq!(fetch(&mut s, "epochs", 0, -1).0, 0, "-1 skips the check");

    move_stream(&stack, &gw, "epochs/0").await;
    let third = leader_epoch(&mut s, "epochs");
    assert!(third > second, "{second} -> {third}");
    produce(&gw, "epochs", 5, 1).await;
    assert_eq!(epoch_end(&mut s, "epochs", third, first), (0, first, 3));
    assert_eq!(epoch_end(&mut s, "epochs", third, second), (0, second, 5));
    assert_eq!(epoch_end(&mut s, "epochs", third, third), (0, third, 6));
    assert_eq!(epoch_end(&mut s, "epochs", -1, -1), (0, -1, -1), "-1 is undefined");
    // An epoch not recorded (a producer's own 0, one above the current) ends at the log
    // end: Weir never truncates, so no answer may say it did.
    assert_eq!(epoch_end(&mut s, "epochs", -1, 0), (0, 0, 6));
    assert_eq!(epoch_end(&mut s, "epochs", -1, third + 1), (0, third + 1, 6));
    assert_eq!(epoch_end(&mut s, "epochs", second, second).0, FENCED_LEADER_EPOCH);
    let (code, ..) = epoch_end(&mut s, "nope", -1, 1);
    assert_eq!(code, 3, "an unknown topic is UNKNOWN_TOPIC_OR_PARTITION");

    // A gateway joining changes the brokers: the epoch rises once more, the old one is
    // fenced, and the new one (begun by no open) ends at the log end.
    let gw2 = Gatewayd::start("gw-2", &stack.metad.replicas[0].grpc, stack.dir.path(), &[]);
    gw2.wait_ready().await;
    let fourth = wait_for("the epoch after gw-2 joined", T, || async {
        let epoch = leader_epoch(&mut connect(&gw.kafka), "epochs");
        (epoch > third).then_some(epoch)
    })
    .await;
    assert_eq!(fourth, third + 1, "one join, one step");
    assert_eq!(fetch(&mut s, "epochs", 0, third).0, FENCED_LEADER_EPOCH);
    assert_eq!(epoch_end(&mut s, "epochs", fourth, fourth), (0, fourth, 6));
    assert_eq!(epoch_end(&mut s, "epochs", fourth, second), (0, second, 5));
}

async fn read_to(c: &StreamConsumer, seen: &mut Vec<String>, want: usize) {
    while seen.len() < want {
        let m = tokio::time::timeout(T, c.recv())
            .await
            .unwrap_or_else(|_| panic!("read {} of {want} in time", seen.len()))
            .expect("consume");
        seen.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string());
    }
}

// Issue 22: a librdkafka consumer reading while its partition moves twice sees the
// epoch rise, validates its position with OffsetForLeaderEpoch each time, and reads
// every record once, in order: no move is taken for a truncation. Its fetches at the
// old epoch are fenced after each move, so it must refresh and validate before it
// reads the next round.
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_validating_its_position_across_moves_reads_everything_once() {
    let (stack, gw) = kafka_stack(2, &[]).await;
    create_topic(&gw, "validated", 1).await;
    let c: StreamConsumer = config(&gw)
        .set("group.id", "validated")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("validated", 0, Offset::Beginning)
        .expect("partition");
    c.assign(&tpl).expect("assign");
    let mut seen = vec![];
    let mut s = connect(&gw.kafka);
    let mut epochs = vec![leader_epoch(&mut s, "validated")];
    for round in 0..3 {
        produce(&gw, "validated", round * 4, 4).await;
        read_to(&c, &mut seen, (round + 1) * 4).await;
        if round < 2 {
            move_stream(&stack, &gw, "validated/0").await;
            epochs.push(leader_epoch(&mut s, "validated"));
        }
    }
    let want: Vec<String> = (0..12).map(|i| format!("m-{i}")).collect();
    assert_eq!(seen, want, "every record once, in order (epochs {epochs:?})");
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "{epochs:?}");
    // The client did validate: a wrong end offset here makes it read records again.
    let metrics = reqwest::get(gw.url("/metrics")).await.expect("metrics");
    let metrics = metrics.text().await.expect("metrics text");
    let validations = weir_tests::metric_value(
        &metrics,
        "weir_gatewayd_kafka_requests_total{api=\"OffsetForLeaderEpoch\"}",
    );
    assert!(
        validations.is_some_and(|n| n >= 2.0),
        "one validation per move at least: {validations:?} in {}",
        metrics
            .lines()
            .filter(|l| l.contains("kafka_requests_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
