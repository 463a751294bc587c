//! Issue 23: Kafka transactions with real clients through the gateway. A
//! consume-transform-produce pipeline with confluent-kafka (`tests/clients/
//! txn_pipeline.py`) and with the rdkafka crate, aborting every other transaction: a
//! read_committed consumer sees exactly the committed output, once, in order; a
//! read_uncommitted one sees both; the group's offsets are those of the committed
//! transactions. Then the same under SIGKILL of the transaction coordinator's node, of
//! a data partition's owner between AddPartitionsToTxn and EndTxn, and of the producer.

use super::{config, create_topic, kafka_stack, producer, T};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, FutureRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use weir_meta::model::names::{offsets_stream, txn_state_stream, OFFSETS_PARTITIONS, TXN_STATE_PARTITIONS};
use weir_tests::gateway::Gatewayd;
use weir_tests::streamd::{Backend, Stack};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/txn_pipeline.py");
const PIPELINE_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs `txn_pipeline.py` with `args`, handing each line it prints to `on_line`;
/// panics, with the output and the gateway's log, unless it succeeds in time.
async fn run_script(gw: &Gatewayd, args: &[&str], on_line: impl FnMut(&str)) {
    if let Err(e) = try_script(gw, args, on_line).await {
        panic!("{e}");
    }
}

/// [`run_script`], answering why it failed instead of panicking.
async fn try_script(gw: &Gatewayd, args: &[&str], mut on_line: impl FnMut(&str)) -> Result<(), String> {
    let mut child = tokio::process::Command::new("python3")
        .arg(SCRIPT)
        .arg(&gw.kafka)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut out = String::new();
    let run = async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            out.push_str(&line);
            out.push('\n');
            on_line(&line);
        }
        child.wait_with_output().await.expect("python3 exits")
    };
    let result = tokio::time::timeout(PIPELINE_TIMEOUT, run).await;
    let Ok(done) = result else {
        return Err(format!(
            "{args:?} did not finish in time; gateway log:\n{}",
            gw.log_text()
        ));
    };
    if done.status.success() {
        return Ok(());
    }
    Err(format!(
        "{args:?} failed\nstdout:\n{out}\nstderr:\n{}\ngateway log:\n{}",
        String::from_utf8_lossy(&done.stderr),
        gw.log_text()
    ))
}

/// Every node's log, for a failed fault test.
fn node_logs(stack: &Stack) -> String {
    stack
        .nodes
        .iter()
        .map(|n| n.log_text())
        .collect::<Vec<_>>()
        .join("\n----\n")
}

// Issue 23: confluent-kafka's consume-transform-produce pipeline, every other
// transaction aborted (the checks are the script's; see its docstring).
#[tokio::test(flavor = "multi_thread")]
async fn confluent_pipeline_reads_exactly_the_committed_output() {
    let (_stack, gw) = kafka_stack(2, &[]).await;
    create_topic(&gw, "pipe-in", 2).await;
    create_topic(&gw, "pipe-out", 2).await;
    run_script(&gw, &["pipe-in", "pipe-out", "600"], |_| {}).await;
}

/// The rdkafka crate's pipeline: reads `input` in group `group` with read_committed,
/// and runs each batch twice through a transaction, aborting the first; the number of
/// transactions committed.
fn rdkafka_pipeline(base: ClientConfig, input: &str, output: &str, n: usize) -> usize {
    let consumer: BaseConsumer = base
        .clone()
        .set("group.id", "rd-pipeline")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let producer: BaseProducer = base
        .clone()
        .set("transactional.id", "rd-pipeline-1")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    producer.init_transactions(T).expect("init_transactions");
    consumer.subscribe(&[input]).expect("subscribe");
    let (mut done, mut committed) = (0, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while done < n {
        assert!(std::time::Instant::now() < deadline, "pipeline processed {done} of {n}");
        let mut batch = vec![];
        while batch.len() < 50 {
            match consumer.poll(Duration::from_millis(300)) {
                Some(Ok(m)) => batch.push((
                    m.partition(),
                    m.key().unwrap_or_default().to_vec(),
                    String::from_utf8_lossy(m.payload().unwrap_or_default()).replace("in-", "out-"),
                )),
                Some(Err(e)) => panic!("consume error {e}"),
                None => break,
            }
        }
        if batch.is_empty() {
            continue;
        }
        let positions = consumer.position().expect("positions");
        for commit in [false, true] {
            producer.begin_transaction().expect("begin");
            for (p, k, v) in &batch {
                let mut record = BaseRecord::to(output).partition(*p).key(k).payload(v);
                while let Err((e, back)) = producer.send(record) {
                    assert!(
                        matches!(
                            e,
                            rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull)
                        ),
                        "send: {e}"
                    );
                    producer.poll(Duration::from_millis(10));
                    record = back;
                }
            }
            let group = consumer.group_metadata().expect("group metadata");
            producer
                .send_offsets_to_transaction(&positions, &group, T)
                .expect("send offsets");
            if commit {
                producer.commit_transaction(T).expect("commit");
                committed += 1;
            } else {
                // Written before the abort (which purges what the client still holds),
                // so read_uncommitted sees the aborted copy.
                producer.flush(T).expect("flush");
                producer.abort_transaction(T).expect("abort");
            }
        }
        done += batch.len();
    }
    committed
}

/// Reads `topic`'s two partitions from the start with `isolation` until `want`
/// records came, then two more seconds: each partition's values in order.
fn read_output(base: &ClientConfig, topic: &str, isolation: &str, want: usize) -> [Vec<String>; 2] {
    let c: BaseConsumer = base
        .clone()
        .set("group.id", format!("rd-check-{isolation}"))
        .set("isolation.level", isolation)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..2 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition");
    }
    c.assign(&tpl).expect("assign");
    let mut got: [Vec<String>; 2] = Default::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut quiet_until = None;
    loop {
        let now = std::time::Instant::now();
        let count: usize = got.iter().map(Vec::len).sum();
        if count >= want && quiet_until.is_none() {
            quiet_until = Some(now + Duration::from_secs(2));
        }
        if now > deadline || quiet_until.is_some_and(|q| now > q) {
            return got;
        }
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            got[m.partition() as usize].push(v);
        }
    }
}

// Issue 23: the rdkafka crate's consume-transform-produce pipeline, every other
// transaction aborted: read_committed sees the committed output exactly once, in
// order; read_uncommitted sees both copies; the group's offsets are the input's end.
#[tokio::test(flavor = "multi_thread")]
async fn rdkafka_pipeline_reads_exactly_the_committed_output() {
    const N: usize = 400;
    let (_stack, gw) = kafka_stack(2, &[]).await;
    create_topic(&gw, "rd-in", 2).await;
    create_topic(&gw, "rd-out", 2).await;
    let feed = producer(&gw, &[("enable.idempotence", "true")]);
    for i in 0..N {
        let (k, v) = (i.to_string(), format!("in-{i}"));
        let record = FutureRecord::to("rd-in").partition((i % 2) as i32).key(&k).payload(&v);
        feed.send(record, T).await.expect("feed");
    }
    let base = config(&gw);
    let run = {
        let base = base.clone();
        tokio::task::spawn_blocking(move || {
            let committed = rdkafka_pipeline(base.clone(), "rd-in", "rd-out", N);
            let exact = read_output(&base, "rd-out", "read_committed", N);
            let both = read_output(&base, "rd-out", "read_uncommitted", 2 * N);
            (committed, exact, both)
        })
    };
    let (committed, exact, both) = tokio::time::timeout(PIPELINE_TIMEOUT, run)
        .await
        .expect("pipeline in time")
        .expect("pipeline ran");
    assert!(committed > 0);
    for p in 0..2 {
        let want: Vec<String> = (0..N).filter(|i| i % 2 == p).map(|i| format!("out-{i}")).collect();
        assert_eq!(exact[p], want, "read_committed partition {p}");
        let mut twice: Vec<String> = want.iter().chain(&want).cloned().collect();
        twice.sort();
        let mut seen = both[p].clone();
        seen.sort();
        assert_eq!(seen, twice, "read_uncommitted partition {p} sees both copies");
    }
    let c: BaseConsumer = base.clone().set("group.id", "rd-pipeline").create().expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..2 {
        tpl.add_partition("rd-in", p);
    }
    let offsets = c.committed_offsets(tpl, T).expect("committed offsets");
    for p in 0..2 {
        let (_, high) = c.fetch_watermarks("rd-in", p, T).expect("watermarks");
        let at = offsets.find_partition("rd-in", p).map(|e| e.offset());
        assert_eq!(at, Some(Offset::Offset(high)), "group offset of rd-in/{p}");
    }
}

/// Three nodes with streams placed by the test: the transaction-state and offsets
/// streams on node 0, the pipeline's input on node 1, its output on nodes 1 and 2.
async fn fault_stack() -> (Stack, Gatewayd) {
    let stack = Stack::start(3, Backend::FileWal, &["--upload-interval-ms", "200"]).await;
    stack
        .create_topic_on("__transaction_state", &[0; TXN_STATE_PARTITIONS as usize])
        .await;
    stack
        .create_topic_on("__consumer_offsets", &[0; OFFSETS_PARTITIONS as usize])
        .await;
    stack.create_topic_on("f-in", &[1, 1]).await;
    stack.create_topic_on("f-out", &[1, 2]).await;
    let gw = stack.gateway("gw-1", &[]).await;
    (stack, gw)
}

/// Kills node `victim` once the pipeline prints `at`, then places each of `streams`
/// (recovered by the failover) on node `to`, as an operator would on this stack
/// without automatic placement; `then` runs right after the kill.
async fn pipeline_with_kill(
    stack: &mut Stack,
    gw: &Gatewayd,
    args: &[&str],
    at: &str,
    (victim, to): (usize, usize),
    streams: &[String],
    then: impl Fn(),
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut told = false;
    // The closure, and with it the sender, ends with the script.
    let script = try_script(gw, args, move |line| {
        if line == at && !told {
            told = true;
            let _ = tx.send(());
        }
    });
    let nemesis = async {
        if rx.recv().await.is_none() {
            return false;
        }
        stack.nodes[victim].kill();
        then();
        for stream in streams {
            let id = stack.stream_id(stream).await;
            stack.place_once_closed(id, to).await;
        }
        true
    };
    let (ran, killed) = tokio::join!(script, nemesis);
    if let Err(e) = ran {
        panic!("{e}\nnode logs:\n{}", node_logs(stack));
    }
    assert!(killed, "node {victim} was killed mid-pipeline");
}

// Issue 23: SIGKILL of the transaction coordinator's node (which also runs the
// pipeline group's coordinator) in the middle of the pipeline: the transactions in
// flight complete or abort, never half, and the output is exact.
#[tokio::test(flavor = "multi_thread")]
async fn the_pipeline_survives_sigkill_of_the_transaction_coordinator() {
    let (mut stack, gw) = fault_stack().await;
    let streams: Vec<String> = (0..TXN_STATE_PARTITIONS)
        .map(|p| format!("__transaction_state/{p}"))
        .chain((0..OFFSETS_PARTITIONS).map(|p| format!("__consumer_offsets/{p}")))
        .collect();
    assert!(streams.contains(&txn_state_stream("pipeline-1")) && streams.contains(&offsets_stream("pipeline")));
    let args = ["f-in", "f-out", "1000"];
    pipeline_with_kill(&mut stack, &gw, &args, "progress 3", (0, 1), &streams, || {}).await;
}

// Issue 23: SIGKILL of a data partition's owner (node 2, `f-out/1`) after the
// transaction's records there were acknowledged and before EndTxn: the commit
// completes once the partition is recovered elsewhere, with its records.
#[tokio::test(flavor = "multi_thread")]
async fn the_pipeline_survives_sigkill_of_a_partition_owner_inside_a_transaction() {
    let (mut stack, gw) = fault_stack().await;
    let hold = stack.dir.path().join("go-on");
    let hold_arg = hold.to_string_lossy().into_owned();
    let args = ["f-in", "f-out", "600", hold_arg.as_str()];
    let go_on = || std::fs::write(&hold, b"").expect("hold file");
    pipeline_with_kill(&mut stack, &gw, &args, "holding", (2, 1), &["f-out/1".into()], go_on).await;
}

// Issue 23: SIGKILL of a transactional producer with a transaction open: its successor
// with the same transactional id fences it (its open transaction is aborted, the LSO
// moves on), and a fenced zombie still running has its late writes refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_producers_successor_fences_it_and_aborts_its_transaction() {
    let (_stack, gw) = kafka_stack(2, &[]).await;
    create_topic(&gw, "z-out", 2).await;
    let mut child = tokio::process::Command::new("python3")
        .args([SCRIPT, &gw.kafka, "zombie", "z-out"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let open = tokio::time::timeout(PIPELINE_TIMEOUT, async {
        while let Some(line) = lines.next_line().await.expect("read") {
            if line == "open" {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(open.ok(), Some(true), "the zombie opened its transaction");
    child.start_kill().expect("SIGKILL the producer");
    child.wait().await.expect("the producer exits");
    run_script(&gw, &["successor", "z-out"], |_| {}).await;
}

// Issue 23 (tokens): a `write` scope's prefix covers transactional ids. A token with
// `write:orders` runs a transaction as `orders-tx` into topic `orders`; as `payments-tx`
// it is refused TRANSACTIONAL_ID_AUTHORIZATION_FAILED, and nothing is written.
#[tokio::test(flavor = "multi_thread")]
async fn a_write_scope_covers_transactional_ids_by_its_prefix() {
    let (stack, mut gw) = kafka_stack(1, &["--auth", "--kafka-allow-plaintext-sasl"]).await;
    stack.metad.issue_token("root", "weir_root-secret", &["admin"]).await;
    gw.token = Some("weir_root-secret".into());
    stack.metad.create_topic("orders", 1).await;
    gw.wait_open("orders/0").await;
    stack
        .metad
        .issue_token("app", "weir_app-secret", &["read:orders", "write:orders"])
        .await;
    let mut base = config(&gw);
    base.set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", "PLAIN")
        .set("sasl.username", "app")
        .set("sasl.password", "weir_app-secret");
    let outcome = tokio::task::spawn_blocking(move || {
        let run = |id: &str| -> rdkafka::error::KafkaResult<()> {
            let p: BaseProducer = base.clone().set("transactional.id", id).create()?;
            p.init_transactions(T)?;
            p.begin_transaction()?;
            p.send(BaseRecord::<(), _>::to("orders").payload(id))
                .map_err(|(e, _)| e)?;
            p.commit_transaction(T)
        };
        (run("orders-tx"), run("payments-tx"))
    });
    let (allowed, refused) = tokio::time::timeout(PIPELINE_TIMEOUT, outcome)
        .await
        .expect("in time")
        .expect("ran");
    assert!(allowed.is_ok(), "orders-tx: {allowed:?}");
    let code = refused.expect_err("payments-tx was refused").rdkafka_error_code();
    assert_eq!(
        code,
        Some(rdkafka::types::RDKafkaErrorCode::TransactionalIdAuthorizationFailed)
    );
}
