//! Kafka transactions over real processes (issue 23, design 0005): the coordinator on
//! the owner of a transaction-state stream decides transactions, writes their markers
//! into every partition (its own and other nodes'), resumes decided transactions after
//! it dies, and aborts transactions left open past their timeout. Requests go to the
//! coordinator's `Txn` call as Kafka bodies, as the gateway will send them (step 4);
//! a partition's owner admits a producer's first transactional write only once the
//! coordinator confirms the partition is in its transaction (KIP-890).
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use bytes::BytesMut;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use std::time::Duration;
use weir_meta::model::names::{offsets_stream, txn_state_stream, OFFSETS_PARTITIONS, TXN_STATE_PARTITIONS};
use weir_proto::streamd::{AppendRequest, GroupRequest, ReadReply, ReadRequest, TxnRequest};
use weir_tests::batches::{batch, idempotent, transactional};
use weir_tests::streamd::{Backend, Stack};
use weir_tests::wait_for;

const TEST_TIMEOUT: Duration = Duration::from_secs(180);
const VERSION: i16 = 3;

async fn with_timeout(f: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(TEST_TIMEOUT, f).await.expect("test timed out");
}

/// Two nodes over mTLS, streams placed by the tests; the state stream on node 0,
/// topic `out`'s partitions on nodes 0 and 1.
async fn stack() -> Stack {
    stack_with_env(&[]).await
}

/// As [`stack`], each node with environment `env` (failpoints).
async fn stack_with_env(env: &[(&str, &str)]) -> Stack {
    let mut stack = Stack::secure(1, 0, Backend::FileWal, &[], &["--auto-place", "false"]).await;
    for id in ["streamd-1", "streamd-2"] {
        stack.add_node_with_env(id, Backend::FileWal, &["--upload-interval-ms", "100"], env);
    }
    for n in &stack.nodes {
        n.wait_ready().await;
    }
    stack
        .create_topic_on("__transaction_state", &[0; TXN_STATE_PARTITIONS as usize])
        .await;
    stack.create_topic_on("out", &[0, 1]).await;
    stack
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Sends one Kafka transaction request for transactional id `id` to the coordinator
/// on node `on`.
async fn call<R: Request>(
    stack: &Stack,
    on: usize,
    id: &str,
    request: R,
    fresh_producer_id: Option<i64>,
) -> R::Response {
    let mut body = BytesMut::new();
    request.encode(&mut body, VERSION).expect("encode");
    let reply = stack.nodes[on]
        .client()
        .await
        .txn(TxnRequest {
            stream: txn_state_stream(id),
            api_key: i32::from(R::KEY),
            api_version: i32::from(VERSION),
            body: body.freeze(),
            fresh_producer_id,
        })
        .await
        .expect("txn call")
        .into_inner();
    R::Response::decode(&mut reply.body.clone(), VERSION).expect("decode")
}

async fn init(stack: &Stack, on: usize, id: &str, timeout_ms: i32, fresh: i64) -> InitProducerIdResponse {
    let request = InitProducerIdRequest::default()
        .with_transactional_id(Some(s(id).into()))
        .with_transaction_timeout_ms(timeout_ms)
        .with_producer_id((-1).into())
        .with_producer_epoch(-1);
    call(stack, on, id, request, Some(fresh)).await
}

/// AddPartitionsToTxn for partitions of `out`; the error codes answered.
async fn add(stack: &Stack, on: usize, id: &str, pid: i64, epoch: i16, partitions: &[i32]) -> Vec<i16> {
    let request = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(s(id).into())
        .with_v3_and_below_producer_id(pid.into())
        .with_v3_and_below_producer_epoch(epoch)
        .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
            .with_name(s("out").into())
            .with_partitions(partitions.to_vec())]);
    let r = call(stack, on, id, request, None).await;
    r.results_by_topic_v3_and_below
        .iter()
        .flat_map(|t| t.results_by_partition.iter().map(|p| p.partition_error_code))
        .collect()
}

async fn end(stack: &Stack, on: usize, id: &str, pid: i64, epoch: i16, commit: bool) -> i16 {
    let request = EndTxnRequest::default()
        .with_transactional_id(s(id).into())
        .with_producer_id(pid.into())
        .with_producer_epoch(epoch)
        .with_committed(commit);
    call(stack, on, id, request, None).await.error_code
}

/// Appends one transactional record of `pid` (transactional id "tx") to
/// `out/partition` on node `on`.
async fn append(stack: &Stack, on: usize, partition: i32, pid: i64, epoch: i16, seq: i32, value: &str) -> u64 {
    try_append(stack, on, partition, Some("tx"), pid, epoch, seq, value)
        .await
        .expect("transactional append")
}

#[allow(clippy::too_many_arguments)]
async fn try_append(
    stack: &Stack,
    on: usize,
    partition: i32,
    id: Option<&str>,
    pid: i64,
    epoch: i16,
    seq: i32,
    value: &str,
) -> Result<u64, tonic::Status> {
    let reply = stack.nodes[on]
        .client()
        .await
        .append(AppendRequest {
            stream: format!("out/{partition}"),
            batches: transactional(idempotent(batch(value.as_bytes()), pid, epoch, seq)).into(),
            match_next_offset: None,
            transactional_id: id.map(str::to_string),
        })
        .await?;
    Ok(reply.into_inner().base_offset)
}

fn code_of(status: &tonic::Status) -> Option<&'static str> {
    weir_shared::error_code::ErrorCode::of_status(status).map(|c| c.as_str())
}

async fn read_committed(stack: &Stack, on: usize, partition: i32) -> ReadReply {
    stack.nodes[on]
        .client()
        .await
        .read(ReadRequest {
            stream: format!("out/{partition}"),
            offset: 0,
            max_bytes: 1 << 20,
            wait_ms: 0,
            exact_max_bytes: false,
            read_committed: true,
        })
        .await
        .expect("read")
        .into_inner()
}

/// Waits until `out/partition` on node `on` has no open transaction (its LSO is its
/// end) and holds `markers` markers; its last answer.
async fn settled(stack: &Stack, on: usize, partition: i32, markers: usize) -> ReadReply {
    wait_for(
        &format!("out/{partition} settled with {markers} markers"),
        Duration::from_secs(60),
        || async {
            let r = read_committed(stack, on, partition).await;
            let control = weir_shared::batch::split_batches(&r.batches)
                .ok()?
                .iter()
                .filter(|(h, _)| h.is_control())
                .count();
            (r.last_stable_offset == r.end_offset && control == markers).then_some(r)
        },
    )
    .await
}

/// Waits until a retried EndTxn of `id`'s last transaction is answered as done.
async fn completed(stack: &Stack, on: usize, id: &str, pid: i64, commit: bool) {
    wait_for(&format!("{id} completed"), Duration::from_secs(30), || async {
        match end(stack, on, id, pid, 0, commit).await {
            0 => Some(()),
            51 => None, // CONCURRENT_TRANSACTIONS: markers still being written
            other => panic!("EndTxn retry answered {other}"),
        }
    })
    .await;
}

// Issue 23, KIP-890: a partition's owner admits a producer's first transactional
// write only once the coordinator (on this node or another) confirms the partition is
// in the producer's ongoing transaction at its epoch; so a late write after the
// transaction ended cannot open a transaction no coordinator knows about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_write_is_admitted_only_inside_its_producers_transaction() {
    with_timeout(async {
        let stack = stack().await;
        let r = init(&stack, 0, "tx", 60_000, 500).await;
        assert_eq!((r.error_code, r.producer_id.0), (0, 500), "{r:?}");
        let refused = |r: Result<u64, tonic::Status>, why: &str| {
            let e = r.expect_err(why);
            assert_eq!(code_of(&e), Some("invalid_txn_state"), "{why}: {e:?}");
        };
        refused(
            try_append(&stack, 1, 1, None, 500, 0, 0, "x").await,
            "no transactional id",
        );
        // Not added yet: asked of the coordinator on node 0, from node 1 and locally.
        refused(
            try_append(&stack, 1, 1, Some("tx"), 500, 0, 0, "x").await,
            "not in the transaction",
        );
        refused(
            try_append(&stack, 0, 0, Some("tx"), 500, 0, 0, "x").await,
            "not in the transaction",
        );
        assert_eq!(add(&stack, 0, "tx", 500, 0, &[1]).await, vec![0]);
        assert_eq!(
            try_append(&stack, 1, 1, Some("tx"), 500, 0, 0, "in")
                .await
                .expect("in the transaction"),
            0
        );
        refused(
            try_append(&stack, 0, 0, Some("tx"), 500, 0, 0, "x").await,
            "partition 0 still not added",
        );
        assert_eq!(end(&stack, 0, "tx", 500, 0, true).await, 0);
        settled(&stack, 1, 1, 1).await;
        // After the commit: the producer's late write at the same epoch is refused.
        refused(
            try_append(&stack, 1, 1, Some("tx"), 500, 0, 1, "late").await,
            "the transaction ended",
        );
        let r = read_committed(&stack, 1, 1).await;
        assert_eq!(
            (r.last_stable_offset, r.end_offset),
            (2, 2),
            "nothing opened by the late write"
        );
    })
    .await;
}

// Issue 23: a decided transaction whose completion could not be stored is taken up
// again by the coordinator's tick (no client request, no move needed), so it never
// stays decided-but-incomplete, answering CONCURRENT_TRANSACTIONS for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_could_not_be_stored_is_taken_up_again() {
    with_timeout(async {
        let blocked = tempfile::NamedTempFile::new().expect("temp file");
        let failpoint = format!("return(err) while exists({})", blocked.path().display());
        let stack = stack_with_env(&[("WEIR_FAILPOINT_TXN_COMPLETION", &failpoint)]).await;
        assert_eq!(init(&stack, 0, "tx", 60_000, 9).await.error_code, 0);
        assert_eq!(add(&stack, 0, "tx", 9, 0, &[0]).await, vec![0]);
        assert_eq!(append(&stack, 0, 0, 9, 0, 0, "c").await, 0);
        assert_eq!(end(&stack, 0, "tx", 9, 0, true).await, 0);
        settled(&stack, 0, 0, 1).await;
        wait_for("the completion refused", Duration::from_secs(30), || async {
            stack.nodes[0]
                .log_text()
                .contains("transaction completion not stored")
                .then_some(())
        })
        .await;
        assert_eq!(end(&stack, 0, "tx", 9, 0, true).await, 51, "CONCURRENT_TRANSACTIONS");
        drop(blocked);
        completed(&stack, 0, "tx", 9, true).await;
        let r = read_committed(&stack, 0, 0).await;
        assert_eq!(r.last_stable_offset, r.end_offset);
    })
    .await;
}

fn aborts(r: &ReadReply) -> Vec<(i64, u64, u64)> {
    r.aborted
        .iter()
        .map(|a| (a.producer_id, a.first_offset, a.last_offset))
        .collect()
}

// Issue 23: a commit and an abort are decided by the coordinator and their markers
// written into both partitions (one on the coordinator's node, one on the other);
// then a commit decided just before the coordinator is SIGKILLed (the other partition's
// owner stopped, so its marker could not be written) is completed by the coordinator's
// successor, which replays the state stream: no marker is lost or written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_of_decided_transactions_reach_every_partition_even_when_the_coordinator_dies() {
    with_timeout(async {
        let mut stack = stack().await;
        let r = init(&stack, 0, "tx", 60_000, 1000).await;
        assert_eq!((r.error_code, r.producer_id.0, r.producer_epoch), (0, 1000, 0), "{r:?}");
        // An unknown producer id is refused.
        assert_eq!(
            add(&stack, 0, "tx", 999, 0, &[0]).await,
            vec![49],
            "INVALID_PRODUCER_ID_MAPPING"
        );

        // Committed in both partitions.
        assert_eq!(add(&stack, 0, "tx", 1000, 0, &[0, 1]).await, vec![0, 0]);
        assert_eq!(append(&stack, 0, 0, 1000, 0, 0, "c-0").await, 0);
        assert_eq!(append(&stack, 1, 1, 1000, 0, 0, "c-1").await, 0);
        assert!(
            read_committed(&stack, 1, 1).await.last_stable_offset == 0,
            "open: nothing stable"
        );
        assert_eq!(end(&stack, 0, "tx", 1000, 0, true).await, 0);
        let r0 = settled(&stack, 0, 0, 1).await;
        let r1 = settled(&stack, 1, 1, 1).await;
        assert!(aborts(&r0).is_empty() && aborts(&r1).is_empty());

        // Aborted in partition 0.
        assert_eq!(add(&stack, 0, "tx", 1000, 0, &[0]).await, vec![0]);
        assert_eq!(append(&stack, 0, 0, 1000, 0, 1, "a-0").await, 2);
        assert_eq!(end(&stack, 0, "tx", 1000, 0, false).await, 0);
        let r0 = settled(&stack, 0, 0, 2).await;
        assert_eq!(aborts(&r0), vec![(1000, 2, 3)]);
        // The retried EndTxn is answered as done once completed (until then it is
        // CONCURRENT_TRANSACTIONS); the opposite outcome is refused.
        completed(&stack, 0, "tx", 1000, false).await;
        assert_eq!(end(&stack, 0, "tx", 1000, 0, true).await, 48, "INVALID_TXN_STATE");

        // Decided, then the coordinator dies before partition 1's owner can take the
        // marker.
        assert_eq!(add(&stack, 0, "tx", 1000, 0, &[0, 1]).await, vec![0, 0]);
        assert_eq!(append(&stack, 0, 0, 1000, 0, 2, "c-2").await, 4);
        assert_eq!(append(&stack, 1, 1, 1000, 0, 1, "c-3").await, 2);
        stack.nodes[1].pause();
        assert_eq!(end(&stack, 0, "tx", 1000, 0, true).await, 0);
        stack.nodes[0].kill();
        stack.nodes[1].resume();
        // Node 1 takes over node 0's WAL; the state stream and partition 0 are placed
        // on it once the failover closed them.
        for stream in [txn_state_stream("tx"), "out/0".into()] {
            stack.place_once_closed(stack.stream_id(&stream).await, 1).await;
            stack.wait_serving(&stream, 1).await;
        }
        let r0 = settled(&stack, 1, 0, 3).await;
        let r1 = settled(&stack, 1, 1, 2).await;
        assert_eq!(aborts(&r0), vec![(1000, 2, 3)], "only the abort");
        assert!(aborts(&r1).is_empty());
        let log = stack.nodes[1].log_text();
        assert!(
            log.contains("transaction coordinator loaded its state stream"),
            "the successor loaded the state stream"
        );
        // The successor resumed the decided transaction and completed it.
        completed(&stack, 1, "tx", 1000, true).await;
        assert!(
            stack.nodes[1].log_text().contains("transaction completed"),
            "the successor completed the transaction"
        );
        // The producer goes on at its epoch with the new coordinator.
        assert_eq!(add(&stack, 1, "tx", 1000, 0, &[1]).await, vec![0]);
    })
    .await;
}

// Issue 23: a transaction left open past its timeout is aborted by its coordinator
// under a bumped epoch: the abort marker reaches the partition, the LSO moves on, and
// the producer that began it is fenced at the coordinator and in the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_left_open_past_its_timeout_is_aborted_and_its_producer_fenced() {
    with_timeout(async {
        let stack = stack().await;
        let r = init(&stack, 0, "slow", 1_000, 77).await;
        assert_eq!((r.error_code, r.producer_epoch), (0, 0), "{r:?}");
        // Beyond the coordinator's maximum (15 minutes by default).
        let too_long = init(&stack, 0, "other", 3_600_000, 78).await;
        assert_eq!(too_long.error_code, 50, "INVALID_TRANSACTION_TIMEOUT");

        assert_eq!(add(&stack, 0, "slow", 77, 0, &[1]).await, vec![0]);
        let at = try_append(&stack, 1, 1, Some("slow"), 77, 0, 0, "left-open").await;
        assert_eq!(at.expect("in the transaction"), 0);
        let r = settled(&stack, 1, 1, 1).await;
        assert_eq!(aborts(&r), vec![(77, 0, 1)], "aborted by the timeout");
        assert_eq!(r.last_stable_offset, 2);
        // Fenced: at the coordinator, and in the partition.
        assert_eq!(add(&stack, 0, "slow", 77, 0, &[1]).await, vec![90], "PRODUCER_FENCED");
        let zombie = try_append(&stack, 1, 1, Some("slow"), 77, 0, 1, "zombie")
            .await
            .expect_err("the fenced producer appended");
        assert_eq!(code_of(&zombie), Some("invalid_producer_epoch"), "{zombie:?}");
        // A new InitProducerId gets the next epoch.
        let again = init(&stack, 0, "slow", 1_000, 79).await;
        assert_eq!(
            (again.error_code, again.producer_id.0, again.producer_epoch),
            (0, 77, 2)
        );
    })
    .await;
}

/// Sends one Kafka group request for `group` to its coordinator on node `on`.
async fn group_call<R: Request>(stack: &Stack, on: usize, group: &str, request: R) -> R::Response {
    let mut body = BytesMut::new();
    request.encode(&mut body, VERSION).expect("encode");
    let reply = stack.nodes[on]
        .client()
        .await
        .group(GroupRequest {
            stream: offsets_stream(group),
            api_key: i32::from(R::KEY),
            api_version: i32::from(VERSION),
            body: body.freeze(),
            client_id: "test".into(),
            client_host: "127.0.0.1".into(),
        })
        .await
        .expect("group call")
        .into_inner();
    R::Response::decode(&mut reply.body.clone(), VERSION).expect("decode")
}

/// TxnOffsetCommit of `out/0` at `offset` for `group` in `pid`'s transaction; the code.
async fn txn_offset_commit(stack: &Stack, on: usize, group: &str, pid: i64, epoch: i16, offset: i64) -> i16 {
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    let request = TxnOffsetCommitRequest::default()
        .with_transactional_id(s("tx").into())
        .with_group_id(s(group).into())
        .with_producer_id(pid.into())
        .with_producer_epoch(epoch)
        .with_generation_id(-1)
        .with_topics(vec![TxnOffsetCommitRequestTopic::default()
            .with_name(s("out").into())
            .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(offset)])]);
    let r = group_call(stack, on, group, request).await;
    r.topics[0].partitions[0].error_code
}

/// OffsetFetch (v7, with `require_stable`) of `out/0` for `group`: (offset, code).
async fn fetch_offset(stack: &Stack, on: usize, group: &str, require_stable: bool) -> (i64, i16) {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    let request = OffsetFetchRequest::default()
        .with_group_id(s(group).into())
        .with_require_stable(require_stable)
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(s("out").into())
            .with_partition_indexes(vec![0])]));
    let mut body = BytesMut::new();
    request.encode(&mut body, 7).expect("encode");
    let reply = stack.nodes[on]
        .client()
        .await
        .group(GroupRequest {
            stream: offsets_stream(group),
            api_key: i32::from(OffsetFetchRequest::KEY),
            api_version: 7,
            body: body.freeze(),
            client_id: "test".into(),
            client_host: "127.0.0.1".into(),
        })
        .await
        .expect("offset fetch")
        .into_inner();
    let r = OffsetFetchResponse::decode(&mut reply.body.clone(), 7).expect("decode");
    let p = &r.topics[0].partitions[0];
    (p.committed_offset, p.error_code)
}

// Issue 23 (TxnOffsetCommit, design 0005 "Offsets in a transaction"): a transaction's
// offsets reach the group's coordinator (node 1) only once its offsets stream is in the
// transaction (AddOffsetsToTxn, verified as KIP-890 asks); they stay pending
// (UNSTABLE_OFFSET_COMMIT to a client asking for stable offsets, the old offset to
// others) until the coordinator's marker commits them, or its abort drops them; a
// coordinator reloaded from the stream finds the same. The producer's next request
// waits for the markers rather than bounce off them.
#[tokio::test(flavor = "multi_thread")]
async fn transactional_offsets_apply_at_the_commit_marker_and_vanish_at_an_abort() {
    with_timeout(async {
        let mut stack = stack().await;
        stack
            .create_topic_on("__consumer_offsets", &[1; OFFSETS_PARTITIONS as usize])
            .await;
        let group = "g";
        let pid = init(&stack, 0, "tx", 60_000, 300).await.producer_id.0;
        // Before AddOffsetsToTxn the offsets stream is not in the transaction.
        assert_eq!(
            txn_offset_commit(&stack, 1, group, pid, 0, 5).await,
            48,
            "INVALID_TXN_STATE"
        );
        let add_offsets = |epoch: i16| {
            AddOffsetsToTxnRequest::default()
                .with_transactional_id(s("tx").into())
                .with_producer_id(pid.into())
                .with_producer_epoch(epoch)
                .with_group_id(s(group).into())
        };
        assert_eq!(call(&stack, 0, "tx", add_offsets(0), None).await.error_code, 0);
        assert_eq!(txn_offset_commit(&stack, 1, group, pid, 0, 5).await, 0);
        assert_eq!(
            fetch_offset(&stack, 1, group, true).await,
            (-1, 88),
            "UNSTABLE_OFFSET_COMMIT"
        );
        assert_eq!(fetch_offset(&stack, 1, group, false).await, (-1, 0));
        assert_eq!(end(&stack, 0, "tx", pid, 0, true).await, 0);
        // The next transaction's first request waits for the markers (not answered
        // CONCURRENT_TRANSACTIONS), which include the offsets stream's.
        assert_eq!(call(&stack, 0, "tx", add_offsets(0), None).await.error_code, 0);
        assert_eq!(
            fetch_offset(&stack, 1, group, true).await,
            (5, 0),
            "committed by the marker"
        );

        // An aborted transaction's offsets are dropped.
        assert_eq!(txn_offset_commit(&stack, 1, group, pid, 0, 9).await, 0);
        assert_eq!(end(&stack, 0, "tx", pid, 0, false).await, 0);
        completed(&stack, 0, "tx", pid, false).await;
        assert_eq!(
            fetch_offset(&stack, 1, group, true).await,
            (5, 0),
            "the abort dropped 9"
        );

        // Pending offsets survive a reload of the group's coordinator, and its marker
        // still applies them: node 1 is killed mid-transaction and its new incarnation
        // serves the offsets stream again, loaded from the recovered records.
        assert_eq!(call(&stack, 0, "tx", add_offsets(0), None).await.error_code, 0);
        assert_eq!(txn_offset_commit(&stack, 1, group, pid, 0, 12).await, 0);
        stack.nodes[1].kill();
        stack.nodes[1].start();
        stack.nodes[1].wait_ready().await;
        // Recovered by the failover of the killed incarnation, then placed again.
        let id = stack.stream_id(&offsets_stream(group)).await;
        stack.place_once_closed(id, 1).await;
        stack.wait_serving(&offsets_stream(group), 1).await;
        wait_for(
            "the reloaded coordinator holds 12 pending",
            Duration::from_secs(60),
            || async { (fetch_offset(&stack, 1, group, true).await == (5, 88)).then_some(()) },
        )
        .await;
        assert_eq!(end(&stack, 0, "tx", pid, 0, true).await, 0);
        completed(&stack, 0, "tx", pid, true).await;
        assert_eq!(fetch_offset(&stack, 1, group, true).await, (12, 0));
    })
    .await;
}

// Issue 23: a producer's next transaction begins right after EndTxn is answered, while
// the last one's markers are still being written (here each takes 300 ms, a
// failpoint): its AddPartitionsToTxn waits for them at the coordinator instead of
// bouncing off with CONCURRENT_TRANSACTIONS, which would cost a client its retry
// backoff (100 ms in librdkafka) on every transaction.
#[tokio::test(flavor = "multi_thread")]
async fn the_next_transaction_waits_for_the_last_ones_markers() {
    with_timeout(async {
        let stack = stack_with_env(&[("WEIR_FAILPOINT_BEFORE_MARKER", "sleep(300)")]).await;
        let pid = init(&stack, 0, "tx", 60_000, 700).await.producer_id.0;
        assert_eq!(add(&stack, 0, "tx", pid, 0, &[0, 1]).await, vec![0, 0]);
        append(&stack, 0, 0, pid, 0, 0, "a").await;
        append(&stack, 1, 1, pid, 0, 0, "b").await;
        assert_eq!(end(&stack, 0, "tx", pid, 0, true).await, 0);
        let asked = std::time::Instant::now();
        assert_eq!(
            add(&stack, 0, "tx", pid, 0, &[0]).await,
            vec![0],
            "waited, not CONCURRENT_TRANSACTIONS"
        );
        assert!(
            asked.elapsed() >= Duration::from_millis(250),
            "the markers were still being written"
        );
        // Both partitions hold their commit marker by then.
        settled(&stack, 0, 0, 1).await;
        settled(&stack, 1, 1, 1).await;
    })
    .await;
}
