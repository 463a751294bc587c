//! Issue 22: KIP-848's consumer group protocol (`group.protocol=consumer`) with
//! librdkafka 2.12: the coordinator assigns, members reconcile through
//! ConsumerGroupHeartbeat, and offsets commit with member epochs (OffsetCommit and
//! OffsetFetch v9).

use super::*;
use kafka_protocol::messages::{ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, GroupId};
use kafka_protocol::protocol::StrBytes;
use weir_tests::kafka_wire::{connect, exchange};

const TOPIC: &str = "kip848";
const GROUP: &str = "g848";

fn member(gw: &Gatewayd) -> StreamConsumer {
    let c: StreamConsumer = config(gw)
        .set("group.id", GROUP)
        .set("group.protocol", "consumer")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "200")
        .create()
        .expect("consumer");
    c.subscribe(&[TOPIC]).expect("subscribe");
    c
}

fn assigned(c: &StreamConsumer) -> BTreeSet<i32> {
    c.assignment()
        .map(|tpl| tpl.elements().iter().map(|e| e.partition()).collect())
        .unwrap_or_default()
}

/// Each consumer's records, as (partition, offset), in the order it got them.
#[derive(Default)]
struct Seen(std::sync::Mutex<Vec<Vec<(i32, i64)>>>);

impl Seen {
    fn total(&self) -> usize {
        self.by_consumer().iter().map(Vec::len).sum()
    }

    fn by_consumer(&self) -> Vec<Vec<(i32, i64)>> {
        self.0.lock().expect("seen").clone()
    }
}

/// Serves every consumer for a moment, committing each record it gets at once
/// (synchronously), so a partition that moves resumes right after it.
async fn drive(cs: &[&StreamConsumer], seen: &Seen) {
    for (i, c) in cs.iter().enumerate() {
        if let Ok(m) = tokio::time::timeout(Duration::from_millis(100), c.recv()).await {
            let m = m.expect("consume");
            {
                let mut all = seen.0.lock().expect("seen");
                let n = all.len().max(i + 1);
                all.resize(n, vec![]);
                all[i].push((m.partition(), m.offset()));
            }
            c.commit_message(&m, CommitMode::Sync).expect("commit");
        }
    }
}

async fn produce_round(gw: &Gatewayd, round: usize) {
    let p = producer(gw, &[]);
    for part in 0..4 {
        for i in 0..10 {
            let value = format!("r{round}-p{part}-{i}");
            p.send(FutureRecord::<(), _>::to(TOPIC).partition(part).payload(&value), T)
                .await
                .expect("produce");
        }
    }
}

fn describe(gw: &Gatewayd) -> ConsumerGroupDescribeResponse {
    let mut s = connect(&gw.kafka);
    let request =
        ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(StrBytes::from_static_str(GROUP))]);
    exchange(&mut s, ApiKey::ConsumerGroupDescribe, 0, &request).expect("describe")
}

async fn requests(gw: &Gatewayd, api: &str) -> f64 {
    gw.metric(&format!("weir_gatewayd_kafka_requests_total{{api=\"{api}\"}}"))
        .await
}

/// A stack of `nodes` streamd (heartbeats every second, and `extra` flags), a topic of
/// four partitions with round 1 in it, and one member that has read all of it.
async fn one_member_read_round_1(nodes: usize, extra: &[&str]) -> (Stack, Gatewayd, StreamConsumer, Seen) {
    let flags = [extra, &["--consumer-heartbeat-interval-ms", "1000"]].concat();
    let stack = Stack::start_with(nodes, Backend::FileWal, &flags, &[]).await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), &[]);
    gw.wait_ready().await;
    create_topic(&gw, TOPIC, 4).await;
    produce_round(&gw, 1).await;
    let seen = Seen::default();
    let a = member(&gw);
    wait_for("one member holds all four partitions and reads round 1", T, || async {
        drive(&[&a], &seen).await;
        (assigned(&a).len() == 4 && seen.total() == 40).then_some(())
    })
    .await;
    (stack, gw, a, seen)
}

// Issue 22 (KIP-848): two librdkafka members of a consumer-protocol group split the
// partitions the coordinator assigns (the first revokes before the second takes any),
// read every record once, and when one leaves the other takes its partitions and
// resumes from its commits. Nothing goes through the classic JoinGroup.
#[tokio::test(flavor = "multi_thread")]
async fn a_kip848_group_splits_partitions_survives_a_leave_and_resumes_from_commits() {
    let (_stack, gw, a, seen) = one_member_read_round_1(1, &[]).await;

    let b = member(&gw);
    wait_for("two members split the partitions", T, || async {
        drive(&[&a, &b], &seen).await;
        let (pa, pb) = (assigned(&a), assigned(&b));
        (pa.len() == 2 && pb.len() == 2 && pa.is_disjoint(&pb)).then_some(())
    })
    .await;
    let described = describe(&gw);
    let group = &described.groups[0];
    assert_eq!(group.error_code, 0, "{:?}", group.error_message);
    assert_eq!(group.group_state.as_str(), "Stable");
    assert_eq!(group.assignor_name.as_str(), "uniform");
    assert_eq!(group.members.len(), 2);
    for m in &group.members {
        assert_eq!(m.member_epoch, group.group_epoch, "every member at the group epoch");
        let parts: usize = m.assignment.topic_partitions.iter().map(|t| t.partitions.len()).sum();
        assert_eq!(parts, 2);
        assert_eq!(m.assignment.topic_partitions[0].topic_name.0.as_str(), TOPIC);
    }

    let b_parts = assigned(&b);
    produce_round(&gw, 2).await;
    wait_for("both members read round 2", T, || async {
        drive(&[&a, &b], &seen).await;
        (seen.total() == 80).then_some(())
    })
    .await;
    let b_seen: BTreeSet<(i32, i64)> = seen.by_consumer()[1].iter().copied().collect();
    let want: BTreeSet<(i32, i64)> = b_parts.iter().flat_map(|&p| (10..20).map(move |o| (p, o))).collect();
    assert_eq!(b_seen, want, "b read its partitions' round 2 from a's commits on");

    // b leaves (librdkafka sends epoch -1 when it closes).
    drop(b);
    produce_round(&gw, 3).await;
    wait_for("a takes b's partitions back and reads round 3", T, || async {
        drive(&[&a], &seen).await;
        (assigned(&a).len() == 4 && seen.total() == 120).then_some(())
    })
    .await;
    let a_after: Vec<(i32, i64)> = seen.by_consumer()[0]
        .iter()
        .copied()
        .filter(|(p, o)| b_parts.contains(p) && *o >= 10)
        .collect();
    let want: Vec<i64> = (20..30).collect();
    for p in &b_parts {
        let got: Vec<i64> = a_after.iter().filter(|(q, _)| q == p).map(|(_, o)| *o).collect();
        assert_eq!(
            got, want,
            "partition {p} resumed at b's commit (20), nothing read twice"
        );
    }
    let all: BTreeSet<(i32, i64)> = seen.by_consumer().iter().flatten().copied().collect();
    assert_eq!(all.len(), 120, "every record read once");

    assert!(requests(&gw, "ConsumerGroupHeartbeat").await >= 4.0);
    assert_eq!(requests(&gw, "JoinGroup").await, 0.0, "no classic rebalance");
    let described = describe(&gw);
    assert_eq!(described.groups[0].members.len(), 1);
}

// Issue 22 (KIP-848) under a fault: the streamd running the group's coordinator is
// SIGKILLed. Its offsets partition fails over with the committed offsets; the member,
// unknown to the new coordinator, joins it again, gets its partitions back, and reads
// every record produced across the kill, resuming from its commits.
#[tokio::test(flavor = "multi_thread")]
async fn a_kip848_member_rejoins_a_failed_over_coordinator_and_resumes_from_commits() {
    let (mut stack, gw, a, _) = one_member_read_round_1(2, weir_tests::streamd::WAL_ONLY).await;
    let coordinator = format!("__consumer_offsets/{}", crc32c::crc32c(GROUP.as_bytes()) % 8);
    let victim = super::owner_index(&stack, &gw, &coordinator)
        .await
        .expect("the coordinator's partition is open");
    let epoch_before = describe(&gw).groups[0].group_epoch;
    stack.nodes[victim].kill();

    produce_round(&gw, 2).await;
    // Commits fail while the coordinator is away; each record's position is committed
    // again on the next pass, and a record read twice is one whose commit was lost.
    let after = std::sync::Mutex::new(Vec::<(i32, i64)>::new());
    wait_for(
        "the member reads round 2 from the new coordinator",
        Duration::from_secs(90),
        || async {
            if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(200), a.recv()).await {
                after.lock().expect("after").push((m.partition(), m.offset()));
            }
            let _ = a.commit_consumer_state(CommitMode::Sync);
            let distinct: BTreeSet<(i32, i64)> = after.lock().expect("after").iter().copied().collect();
            (distinct.len() == 40 && assigned(&a).len() == 4).then_some(())
        },
    )
    .await;
    let after = after.into_inner().expect("after");
    let want: BTreeSet<(i32, i64)> = (0..4).flat_map(|p| (10..20).map(move |o| (p, o))).collect();
    assert_eq!(
        after.iter().copied().collect::<BTreeSet<_>>(),
        want,
        "round 2 whole, and nothing of round 1 (committed before the kill) again"
    );
    wait_for("the group is stable on its new coordinator", T, || async {
        let _ = tokio::time::timeout(Duration::from_millis(200), a.recv()).await;
        let d = describe(&gw);
        let g = &d.groups[0];
        (g.error_code == 0 && g.group_state.as_str() == "Stable" && g.members.len() == 1).then_some(g.group_epoch)
    })
    .await;
    assert!(
        epoch_before >= 1 && super::owner_index(&stack, &gw, &coordinator).await != Some(victim),
        "the coordinator moved"
    );
    // librdkafka's close after a coordinator move is slow in the rdkafka crate (see
    // `a_killed_owner_loses_no_acknowledged_message_and_the_group_resumes`).
    std::thread::spawn(move || drop(a));
}
