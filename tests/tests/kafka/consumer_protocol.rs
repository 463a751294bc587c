//! Issue 22: KIP-848's consumer group protocol (`group.protocol=consumer`) with
//! librdkafka 2.12: the coordinator assigns, members reconcile through
//! ConsumerGroupHeartbeat, and offsets commit with member epochs (OffsetCommit and
//! OffsetFetch v9).

use super::*;
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse, GroupId, OffsetFetchRequest, OffsetFetchResponse, TopicName,
};
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
    // The new coordinator started with no members: the one it shows joined it.
    let survivor = 1 - victim;
    assert_eq!(
        super::owner_index(&stack, &gw, &coordinator).await,
        Some(survivor),
        "the coordinator moved to the other node"
    );
    // librdkafka's close after a coordinator move is slow in the rdkafka crate (see
    // `a_killed_owner_loses_no_acknowledged_message_and_the_group_resumes`).
    std::thread::spawn(move || drop(a));
}

fn join_request(group: &str, member: &str, names: &[&str], regex: &str) -> ConsumerGroupHeartbeatRequest {
    ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
        .with_member_id(StrBytes::from_string(member.to_string()))
        .with_member_epoch(0)
        .with_rebalance_timeout_ms(30_000)
        .with_subscribed_topic_names(Some(
            names
                .iter()
                .map(|n| TopicName(StrBytes::from_string(n.to_string())))
                .collect(),
        ))
        .with_subscribed_topic_regex(Some(StrBytes::from_string(regex.to_string())))
        .with_topic_partitions(Some(vec![]))
}

fn heartbeat(s: &mut std::net::TcpStream, r: &ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResponse {
    exchange(s, ApiKey::ConsumerGroupHeartbeat, 1, r).expect("heartbeat")
}

// Issue 22 (KIP-848) with issue 18's scopes, on the wire: a token subscribes a
// consumer-protocol member only to topics it reads (by regex only when it reads every
// topic), ConsumerGroupDescribe hides a group naming a topic the token cannot read, and
// a batched OffsetFetch (v9) answers each group and topic by the token's scopes, a
// refused group with no topics.
#[tokio::test(flavor = "multi_thread")]
async fn kip848_requests_answer_by_the_tokens_scopes() {
    let (stack, mut gw) = kafka_stack(1, &["--auth", "--kafka-allow-plaintext-sasl"]).await;
    stack.metad.issue_token("root", "weir_root-secret", &["admin"]).await;
    gw.token = Some("weir_root-secret".into());
    stack
        .metad
        .issue_token("app", "weir_app-secret", &["read:orders"])
        .await;
    let root: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> = config(&gw)
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", "PLAIN")
        .set("sasl.username", "root")
        .set("sasl.password", "weir_root-secret")
        .create()
        .expect("admin");
    let created = root
        .create_topics(
            &[
                NewTopic::new("orders", 2, TopicReplication::Fixed(1)),
                NewTopic::new("payments", 1, TopicReplication::Fixed(1)),
            ],
            &AdminOptions::new().operation_timeout(Some(T)),
        )
        .await
        .expect("create topics");
    assert!(created.iter().all(|r| r.is_ok()), "{created:?}");
    for s in ["orders/0", "orders/1", "payments/0"] {
        gw.wait_open(s).await;
    }
    let mut app = weir_tests::kafka_wire::sasl_v0(&gw.kafka, "app", "weir_app-secret").expect("app connects");
    let mut admin = weir_tests::kafka_wire::sasl_v0(&gw.kafka, "root", "weir_root-secret").expect("root connects");
    const DENIED: i16 = 29; // TOPIC_AUTHORIZATION_FAILED
    let group = "orders-g";

    let refused = heartbeat(&mut app, &join_request(group, "m-app", &["payments"], ""));
    assert_eq!(refused.error_code, DENIED, "{:?}", refused.error_message);
    let refused = heartbeat(&mut app, &join_request(group, "m-app", &[], "orders.*"));
    assert_eq!(refused.error_code, DENIED, "a regex needs read on every topic");
    // As clients do, the member looks its coordinator up first (which creates the
    // offsets topic), and joins once that is placed.
    let find = kafka_protocol::messages::FindCoordinatorRequest::default()
        .with_key_type(0)
        .with_coordinator_keys(vec![StrBytes::from_static_str(group)]);
    let _: kafka_protocol::messages::FindCoordinatorResponse =
        exchange(&mut app, ApiKey::FindCoordinator, 4, &find).expect("find coordinator");
    let joined = wait_for("the member joins its coordinator", T, || {
        let answer = heartbeat(&mut app, &join_request(group, "m-app", &["orders"], ""));
        async move { (answer.error_code != 15).then_some(answer) }
    })
    .await;
    assert_eq!(
        (joined.error_code, joined.member_epoch),
        (0, 1),
        "{:?}",
        joined.error_message
    );
    let parts: usize = joined
        .assignment
        .expect("an assignment")
        .topic_partitions
        .iter()
        .map(|t| t.partitions.len())
        .sum();
    assert_eq!(parts, 2);
    // An admin's member subscribes the same group to `payments` as well.
    let other = heartbeat(&mut admin, &join_request(group, "m-root", &["payments"], ""));
    assert_eq!(other.error_code, 0, "{:?}", other.error_message);

    let request =
        ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(StrBytes::from_static_str(group))]);
    let seen: ConsumerGroupDescribeResponse =
        exchange(&mut app, ApiKey::ConsumerGroupDescribe, 1, &request).expect("describe");
    assert_eq!(seen.groups[0].error_code, DENIED, "the group names payments");
    assert!(seen.groups[0].members.is_empty());
    let whole: ConsumerGroupDescribeResponse =
        exchange(&mut admin, ApiKey::ConsumerGroupDescribe, 1, &request).expect("describe");
    assert_eq!(whole.groups[0].error_code, 0);
    assert_eq!(whole.groups[0].members.len(), 2);
    assert!(whole.groups[0].members.iter().all(|m| m.member_type == 1));

    use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequestGroup, OffsetFetchRequestTopics};
    let ask = |g: &str| {
        OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_string(g.to_string())))
            .with_member_epoch(-1)
            .with_topics(Some(
                ["orders", "payments"]
                    .iter()
                    .map(|t| {
                        OffsetFetchRequestTopics::default()
                            .with_name(TopicName(StrBytes::from_static_str(t)))
                            .with_partition_indexes(vec![0])
                    })
                    .collect(),
            ))
    };
    let request = OffsetFetchRequest::default().with_groups(vec![ask(group), ask("billing")]);
    let answer: OffsetFetchResponse = exchange(&mut app, ApiKey::OffsetFetch, 9, &request).expect("offset fetch");
    assert_eq!(answer.groups.len(), 2);
    let mine = &answer.groups[0];
    assert_eq!(mine.error_code, 0);
    let by_topic: BTreeMap<&str, i16> = mine
        .topics
        .iter()
        .map(|t| (t.name.0.as_str(), t.partitions[0].error_code))
        .collect();
    assert_eq!(by_topic, BTreeMap::from([("orders", 0), ("payments", DENIED)]));
    let billing = &answer.groups[1];
    assert_eq!(billing.error_code, 30, "GROUP_AUTHORIZATION_FAILED");
    assert!(billing.topics.is_empty(), "a refused group carries no topics");
}
