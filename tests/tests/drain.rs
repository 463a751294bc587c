//! Cordon, drain and planned transfers (requirements §4.6, §4.7, seed 001) over real
//! processes: a stopping streamd drains itself through the metad leader, an operator
//! cordon survives a stop and a restart, a transfer's dry run names the first failing
//! check, a node that cannot reach the leader cordons nothing, and an unreachable
//! object store holds the drain without losing anything.
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use weir_tests::gateway::Gatewayd;
use weir_tests::proxy::{Mode, Proxy};
use weir_tests::streamd::{Backend, Stack, WAL_ONLY};
use weir_tests::{node_row, records, seconds_of_day, wait_for};

/// Short shutdown timing for tests.
const SHORT: &[&str] = &[
    "--drain-timeout-sec",
    "6",
    "--shutdown-deadline-sec",
    "10",
    "--shutdown-drain-sec",
    "0",
    "--shutdown-timeout-sec",
    "2",
];

fn phase_outcome(log: &str, phase: &str) -> String {
    let found = records(log, &format!("shutdown {phase} phase finished"));
    assert_eq!(found.len(), 1, "one {phase} record:\n{log}");
    found[0]["outcome"].as_str().unwrap_or_default().to_string()
}

/// Two streamd nodes with placement on, a gateway, and `streams` streams all opened on
/// node 0 (node 1 is cordoned while they are created).
async fn two_nodes_with_streams_on_the_first(streams: &[&str]) -> (Stack, Gatewayd) {
    let stack = Stack::start_with(2, Backend::FileWal, SHORT, &[]).await;
    with_streams_on_the_first(stack, streams).await
}

/// A gateway on `stack`, and `streams` opened on its node 0 (node 1 cordoned meanwhile).
async fn with_streams_on_the_first(stack: Stack, streams: &[&str]) -> (Stack, Gatewayd) {
    let gw = Gatewayd::start("gw-1", &stack.metad_addrs(), stack.dir.path(), SHORT);
    gw.wait_ready().await;
    let second = stack.nodes[1].id.clone();
    let (status, body) = gw
        .send(gw.request(Method::POST, &format!("/admin/nodes/{second}/cordon")))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["cordoned"], true);
    for s in streams {
        gw.create_stream(s).await;
        gw.wait_open(s).await;
        assert_eq!(owner_of(&gw, s).await.as_deref(), Some(stack.nodes[0].id.as_str()));
    }
    let (status, body) = gw
        .send(gw.request(Method::POST, &format!("/admin/nodes/{second}/uncordon")))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    (stack, gw)
}

/// As [`with_streams_on_the_first`] with stream `held`, where node 0 holds back its
/// answers to appends to it as failpoint action `action` says (its records are applied).
async fn holding_answers_on_the_first(action: &str) -> (Stack, Gatewayd) {
    let mut stack = Stack::start_with(0, Backend::FileWal, &[], &[]).await;
    stack.add_node_with_env(
        "streamd-1",
        Backend::FileWal,
        SHORT,
        &[("WEIR_FAILPOINT_APPEND_REPLY_HELD", action)],
    );
    stack.add_node("streamd-2", Backend::FileWal, SHORT);
    for n in &stack.nodes {
        n.wait_ready().await;
    }
    with_streams_on_the_first(stack, &["held"]).await
}

async fn owner_of(gw: &Gatewayd, stream: &str) -> Option<String> {
    let (_, d) = gw.send(gw.request(Method::GET, &format!("/v1/streams/{stream}"))).await;
    (d["state"] == "open").then(|| d["owner"]["node"].as_str().map(str::to_string))?
}

/// Appends to `stream` until `stop`, retrying what a client retries; the acked bodies.
fn append_until(
    gw: Arc<Gatewayd>,
    stream: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut acked = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            let body = format!("{stream}-{i}");
            gw.append(stream, &[&body]).await;
            acked.push(body);
            i += 1;
        }
        acked
    })
}

/// The applied log entries: (index, command type, command, proposer).
async fn log_entries(stack: &Stack) -> Vec<(u64, String, Value, Value)> {
    log_entries_of(&stack.metad.client()).await
}

/// As [`log_entries`], from the replicas `client` asks.
async fn log_entries_of(client: &weir_meta::client::MetadClient) -> Vec<(u64, String, Value, Value)> {
    let dump = client.admin("log", 0, 100_000).await.expect("log dump");
    weir_tests::flatten_batches(&dump)
        .iter()
        .filter(|e| e["outcome"].get("Ok").is_some())
        .filter_map(|e| {
            let p = &e["proposal"];
            Some((
                e["index"].as_u64()?,
                p["command"]["type"].as_str()?.to_string(),
                p["command"].clone(),
                p["proposer"].clone(),
            ))
        })
        .collect()
}

fn by_node(proposer: &Value, node: &str) -> bool {
    proposer["node"]["node"] == node
}

/// The log indexes of `node`'s `mark_terminating` and `fence_self`: the span of its
/// stop in which it drains.
fn stop_span(entries: &[(u64, String, Value, Value)], node: &str) -> (u64, u64) {
    let index_of = |kind: &str| {
        entries
            .iter()
            .find(|(_, k, _, p)| k == kind && by_node(p, node))
            .map(|(i, ..)| *i)
            .unwrap_or_else(|| panic!("no {kind} by {node}: {entries:?}"))
    };
    (index_of("mark_terminating"), index_of("fence_self"))
}

/// One streamd whose confirming pass (the drain's last step) is held by `confirm_pass`,
/// with `timing`, and a gateway.
async fn one_node_holding_its_confirming_pass(timing: &[&str], confirm_pass: &str) -> (Stack, Gatewayd) {
    let mut stack = Stack::start_with(0, Backend::FileWal, &[], &[]).await;
    stack.add_node_with_env(
        "streamd-1",
        Backend::FileWal,
        timing,
        &[("WEIR_FAILPOINT_CONFIRM_PASS", confirm_pass)],
    );
    stack.nodes[0].wait_ready().await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), SHORT);
    gw.wait_ready().await;
    (stack, gw)
}

// SD-DRN-8, SD-DRN-1, SD-DRN-2, SD-REL-1, SD-REL-5, SD-REL-12, SD-INT-10, INV-2: a
// stopping streamd with a live peer asks the metad leader for its own drain. The log
// shows the drain's cordon, then one planned transfer per stream in canonical order,
// each closed by the source and handed to the peer in that close, then the release of
// the cordon, and only then the self-fence; there is no takeover. Appends running
// through the stop are all read back, once, in order; drain-support is Completed.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_streamd_drains_itself_by_planned_transfer_and_releases_its_cordon() {
    let names = ["pt-a", "pt-b", "pt-c", "pt-d"];
    let (mut stack, gw) = two_nodes_with_streams_on_the_first(&names).await;
    let (a, b) = (stack.nodes[0].id.clone(), stack.nodes[1].id.clone());
    let gw = Arc::new(gw);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = append_until(gw.clone(), "pt-a", stop.clone());
    wait_for("appends flowing", Duration::from_secs(10), || async {
        (gw.read_all("pt-a").await.len() >= 5).then_some(())
    })
    .await;

    stack.nodes[0].term();
    let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    let log = stack.nodes[0].log_text();
    assert_eq!(code, Some(0), "{log}");
    stop.store(true, Ordering::Relaxed);
    let acked = writer.await.expect("writer");
    let drained = records(&log, "drained local node before graceful shutdown");
    assert_eq!(drained.len(), 1, "{log}");
    // OBS-10: the leader that acted and its account of each moved stream (in field
    // `account`: `message` is the record's text in our JSON logs).
    assert_eq!(drained[0]["leader"], "metad-1");
    let account: Value = serde_json::from_str(drained[0]["account"].as_str().expect("account")).expect("json");
    assert_eq!(
        account["streams"].as_array().map(Vec::len),
        Some(names.len()),
        "{account}"
    );
    assert_eq!(
        records(&log, "cleared shutdown drain cordon before graceful shutdown").len(),
        1,
        "{log}"
    );
    // SD-REL-12: having handed over every stream and released its cordon, the node reports
    // drain-support Completed.
    for phase in ["stop-requested", "drain-support", "terminal-teardown"] {
        assert_eq!(phase_outcome(&log, phase), "Completed", "{phase}");
    }

    let entries = log_entries(&stack).await;
    let index_of = |kind: &str, pred: &dyn Fn(&Value, &Value) -> bool| {
        entries
            .iter()
            .filter(|(_, k, c, p)| k == kind && pred(c, p))
            .map(|(i, ..)| *i)
            .collect::<Vec<_>>()
    };
    let cordon = index_of("cordon", &|c, p| {
        c["node"] == a.as_str() && c["by"] == "drain" && by_node(p, &a)
    });
    let transfers: Vec<(u64, Value)> = entries
        .iter()
        .filter(|(_, k, ..)| k == "begin_transfer")
        .map(|(i, _, c, _)| (*i, c.clone()))
        .collect();
    let uncordon = index_of("uncordon", &|c, p| {
        c["node"] == a.as_str() && c["by"] == "drain" && by_node(p, &a)
    });
    let fence = index_of("fence_self", &|_, p| by_node(p, &a));
    let closes = index_of("close_stream", &|_, p| by_node(p, &a));
    assert_eq!(cordon.len(), 1, "SD-REL-1: one drain cordon: {entries:?}");
    assert_eq!(transfers.len(), names.len(), "one planned transfer per stream");
    assert!(transfers.iter().all(|(_, c)| c["target"] == b.as_str()));
    assert_eq!(uncordon.len(), 1, "SD-REL-5: one release");
    assert_eq!(fence.len(), 1);
    assert!(cordon[0] < transfers[0].0, "cordon before the first transfer");
    assert_eq!(closes.len(), names.len(), "the source closed every stream itself");
    assert!(closes.iter().all(|c| *c < uncordon[0] && uncordon[0] < fence[0]));
    // SD-DRN-1: canonical order (these HTTP streams by name).
    let ids: Vec<u64> = transfers
        .iter()
        .map(|(_, c)| c["stream"].as_u64().expect("id"))
        .collect();
    let streams = stack.metad.client().admin("streams", 0, 0).await.expect("streams");
    let name_of = |id: u64| {
        streams["streams"]
            .as_object()
            .and_then(|m| m.values().find(|r| r["id"] == id))
            .and_then(|r| r["name"].as_str())
            .expect("stream row")
            .to_string()
    };
    let order: Vec<String> = ids.into_iter().map(name_of).collect();
    assert_eq!(order, names, "transfers in canonical order");
    assert!(
        !entries
            .iter()
            .any(|(_, k, c, _)| k == "begin_takeover" && c["node"] == a.as_str()),
        "SD-DRN-8: no takeover after a planned drain"
    );

    for s in names {
        assert_eq!(owner_of(&gw, s).await.as_deref(), Some(b.as_str()), "{s} on the peer");
    }
    // SD-INT-10, SD-DRN-2: each stream's intake closed before its final upload, and its ownership moved
    // only after its admitted appends were committed: an append admitted later, or one left behind, would
    // be acked yet missing here.
    // SD-ADM-14: appends raced the stop (503s retried); no acked or refused append is applied twice.
    assert_eq!(
        gw.bodies("pt-a").await,
        acked,
        "INV-2: every acked record, once, in order"
    );
    let nodes = stack.metad.replicas[0].http_json("/admin/nodes").await.expect("nodes");
    let row = node_row(&nodes, &a);
    assert_eq!(row["cordoned"], false, "SD-REL-1: the drain's cordon was cleared");
    assert_eq!(row["fenced"], true);
}

// SD-REL-2, SD-CRD-1, SD-CRD-2, SD-CRD-3, SD-TRM-7: an operator cordon set through the
// gateway survives a graceful stop (which says it preserves it) and a restart; the
// restarted incarnation is not terminating. Uncordon clears it, twice harmlessly.
#[tokio::test(flavor = "multi_thread")]
async fn an_operator_cordon_survives_a_graceful_stop_and_a_restart() {
    let (mut stack, gw) = two_nodes_with_streams_on_the_first(&["oc-a"]).await;
    let a = stack.nodes[0].id.clone();
    let (status, body) = gw
        .send(gw.request(Method::POST, &format!("/admin/nodes/{a}/cordon")))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Placement has run since the cordon once a stream created now is placed: on the
    // other node, and by then anything the cordon moved would have moved.
    gw.create_stream("oc-new").await;
    gw.wait_open("oc-new").await;
    assert_eq!(
        owner_of(&gw, "oc-new").await.as_deref(),
        Some(stack.nodes[1].id.as_str()),
        "a cordoned node takes no new stream"
    );
    assert_eq!(
        owner_of(&gw, "oc-a").await.as_deref(),
        Some(a.as_str()),
        "SD-CRD-1: nothing moves"
    );
    let metad = &stack.metad.replicas[0];
    let row = |nodes: &Value| node_row(nodes, &a).clone();

    stack.nodes[0].term();
    assert_eq!(stack.nodes[0].wait_exit(Duration::from_secs(30)).await, Some(0));
    let log = stack.nodes[0].log_text();
    // SD-REL-2: the stop found the operator's cordon and says it keeps it; it clears none (below).
    assert_eq!(
        records(&log, "preserving operator cordon across graceful shutdown").len(),
        1,
        "{log}"
    );
    assert!(records(&log, "cleared shutdown drain cordon before graceful shutdown").is_empty());
    let stopped = row(&metad.http_json("/admin/nodes").await.expect("nodes"));
    assert_eq!(stopped["cordoned"], true, "{stopped}");
    assert_eq!(stopped["cordoned_by"], "operator");
    // SD-TRM-2: the stop published `terminating: true` for this epoch in /admin/nodes.
    assert_eq!(stopped["terminating"], true, "SD-TRM-7: both states");
    // SD-CRD-4: the gateway's view says the same.
    let (_, via_gw) = gw.send(gw.request(Method::GET, "/admin/nodes")).await;
    assert_eq!(node_row(&via_gw, &a)["cordoned"], true);

    stack.nodes[0].start();
    stack.nodes[0].wait_ready().await;
    let restarted = wait_for("the new incarnation registered", Duration::from_secs(20), || async {
        let r = row(&metad.http_json("/admin/nodes").await?);
        (r["epoch"] != stopped["epoch"]).then_some(r)
    })
    .await;
    // INV-16: the operator cordon survives the stop and the restart, seen in /admin/nodes.
    assert_eq!(restarted["cordoned"], true, "SD-CRD-2: {restarted}");
    // SD-TRM-3: the old epoch was terminating (above); the restarted epoch is not.
    assert_eq!(restarted["terminating"], false, "SD-TRM-3: not inherited");
    for _ in 0..2 {
        let (status, body) = gw
            .send(gw.request(Method::POST, &format!("/admin/nodes/{a}/uncordon")))
            .await;
        assert_eq!(status, StatusCode::OK, "SD-CRD-3: {body}");
    }
    let cleared = row(&metad.http_json("/admin/nodes").await.expect("nodes"));
    assert_eq!(cleared["cordoned"], false);
}

// SD-TRM-6, OBS-14, SD-DRN-2: a transfer's dry run checks the destination in order and
// names the first failing check; a transfer under appends moves the stream to the
// chosen node at a higher epoch, and every acked record reads back in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_transfer_dry_run_names_the_first_failing_check_and_a_transfer_moves_the_stream() {
    let (stack, gw) = two_nodes_with_streams_on_the_first(&["tr-a"]).await;
    let gw = Arc::new(gw);
    let b = stack.nodes[1].id.clone();
    let transfer = |to: &str, dry_run: bool| {
        gw.request(Method::POST, "/v1/admin/streams/tr-a/transfer")
            .json(&json!({"to": to, "dry_run": dry_run}))
    };
    let (status, body) = gw.send(transfer("ghost", true)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["message"], "node 'ghost' is not registered");
    gw.send(gw.request(Method::POST, &format!("/admin/nodes/{b}/cordon")))
        .await;
    let (status, body) = gw.send(transfer(&b, true)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    // OBS-14: the exact client-facing string for a cordoned destination.
    assert_eq!(body["error"]["message"], format!("node '{b}' is cordoned"));
    gw.send(gw.request(Method::POST, &format!("/admin/nodes/{b}/uncordon")))
        .await;
    let (status, body) = gw.send(transfer(&b, true)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["moved"], false, "a dry run moves nothing");
    assert_eq!(owner_of(&gw, "tr-a").await.as_deref(), Some(stack.nodes[0].id.as_str()));

    let (_, before) = gw.send(gw.request(Method::GET, "/v1/streams/tr-a")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = append_until(gw.clone(), "tr-a", stop.clone());
    wait_for("appends flowing", Duration::from_secs(10), || async {
        (gw.read_all("tr-a").await.len() >= 5).then_some(())
    })
    .await;
    let (status, body) = gw.send(transfer(&b, false)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["moved"], true, "{body}");
    assert_eq!(body["to"], b.as_str());
    // Appends go on at the new owner.
    let moved_at = gw.read_all("tr-a").await.len();
    wait_for("appends at the new owner", Duration::from_secs(10), || async {
        (gw.read_all("tr-a").await.len() >= moved_at + 5).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let acked = writer.await.expect("writer");
    let (_, after) = gw.send(gw.request(Method::GET, "/v1/streams/tr-a")).await;
    assert_eq!(after["owner"]["node"], b.as_str());
    assert!(
        after["stream_epoch"].as_u64() > before["stream_epoch"].as_u64(),
        "INV-6: {before} → {after}"
    );
    // SD-DRN-2: under appends, the source committed what it had admitted before the ownership moved:
    // every acked record reads back, once, in order.
    assert_eq!(gw.bodies("tr-a").await, acked, "INV-2");
}

// Issue 61: a transfer while a raw client appends straight to the old owner's data
// plane, as a client with a stale route would. Once the old owner has let the stream
// go it refuses every direct append, retryably, and never acknowledges one again; the
// stream holds each acknowledged payload once, in order, and none that was refused.
#[tokio::test(flavor = "multi_thread")]
async fn fo_fen_9_a_moved_streams_old_owner_refuses_every_direct_append() {
    use weir_shared::error_code::ErrorCode;
    let (stack, gw) = two_nodes_with_streams_on_the_first(&["direct"]).await;
    let mut a = stack.nodes[0].client().await;
    let moved = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    // Each attempt: its payload, whether it began after the transfer returned, and the
    // answer (the offset, or the error).
    let tried_after = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let raw = {
        let (moved, stop, tried_after) = (moved.clone(), stop.clone(), tried_after.clone());
        tokio::spawn(async move {
            let mut attempts: Vec<(String, bool, Result<u64, tonic::Status>)> = Vec::new();
            for i in 0.. {
                let after_move = moved.load(Ordering::SeqCst);
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let payload = format!("direct-{i}");
                let answer = a
                    .append(weir_proto::streamd::AppendRequest {
                        stream: "direct".into(),
                        batches: weir_tests::batches::batch(payload.as_bytes()).into(),
                        match_next_offset: None,
                        transactional_id: None,
                    })
                    .await
                    .map(|r| r.into_inner().base_offset);
                attempts.push((payload, after_move, answer));
                if after_move {
                    tried_after.fetch_add(1, Ordering::SeqCst);
                }
            }
            attempts
        })
    };
    wait_for("direct appends acknowledged", Duration::from_secs(10), || async {
        (gw.read_all("direct").await.len() >= 5).then_some(())
    })
    .await;
    let b = stack.nodes[1].id.clone();
    let (status, body) = gw
        .send(
            gw.request(Method::POST, "/v1/admin/streams/direct/transfer")
                .json(&json!({"to": b})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["moved"], true, "{body}");
    moved.store(true, Ordering::SeqCst);
    // A client that keeps using its stale route for a while.
    wait_for("direct appends after the move", Duration::from_secs(10), || async {
        (tried_after.load(Ordering::SeqCst) >= 10).then_some(())
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let attempts = raw.await.expect("raw appender");
    let first_refused = attempts
        .iter()
        .position(|(_, _, r)| r.is_err())
        .expect("the old owner refused nothing");
    let acked: Vec<String> = attempts[..first_refused].iter().map(|(p, _, _)| p.clone()).collect();
    assert!(acked.len() >= 5, "{} acknowledged before the move", acked.len());
    let after_move = attempts.iter().filter(|(_, after, _)| *after).count();
    assert!(after_move >= 10, "only {after_move} direct appends after the move");
    for (payload, after, answer) in &attempts[first_refused..] {
        // FO-FEN-9: once refused, never acknowledged again, and always retryably.
        let err = answer
            .as_ref()
            .expect_err(&format!("{payload} acknowledged after a refusal"));
        let code = ErrorCode::of_status(err);
        assert!(
            code.is_some_and(ErrorCode::is_retryable),
            "{payload} refused with {code:?}: {err}"
        );
        if *after {
            // After the view moved the stream: not its owner.
            assert_eq!(code, Some(ErrorCode::NotOwner), "{payload}: {err}");
        }
    }
    assert_eq!(owner_of(&gw, "direct").await.as_deref(), Some(b.as_str()));
    // INV-2: every acknowledged payload once, in order, and no refused one.
    assert_eq!(gw.bodies("direct").await, acked);
}

// FO-TKO-11/12, INV-2: a planned transfer leaves the old owner alive, and it answers
// what it applied before letting the stream go. An unkeyed append whose answer is still
// on its way when the gateway's view moves the stream waits for that answer: it is
// acknowledged, not reported as "outcome unknown" (a failpoint holds the old owner's
// answer back for 3 s while the transfer runs). Before the gateway told a moved stream
// from a replaced owner, this answered 503.
#[tokio::test(flavor = "multi_thread")]
async fn an_append_in_flight_across_a_transfer_gets_the_old_owners_answer() {
    let (stack, gw) = holding_answers_on_the_first("sleep(3000)").await;
    let gw = Arc::new(gw);
    let appending = {
        let gw = gw.clone();
        tokio::spawn(async move {
            gw.send(
                gw.request(Method::POST, "/v1/streams/held/records")
                    .json(&json!({"records": [{"body": "in flight"}]})),
            )
            .await
        })
    };
    // The record is applied (readable) while its answer is held back; then it moves.
    wait_for("the append applied", Duration::from_secs(10), || async {
        (!gw.read_all("held").await.is_empty()).then_some(())
    })
    .await;
    let b = stack.nodes[1].id.clone();
    let (status, body) = gw
        .send(
            gw.request(Method::POST, "/v1/admin/streams/held/transfer")
                .json(&json!({"to": b})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        !appending.is_finished(),
        "the transfer ran while the answer was held back"
    );
    let (status, body) = appending.await.expect("append");
    assert_eq!(status, StatusCode::OK, "acknowledged, not outcome unknown: {body}");
    assert_eq!(body["start_seq_num"], 0, "{body}");
    assert_eq!(owner_of(&gw, "held").await.as_deref(), Some(b.as_str()));
    assert_eq!(gw.bodies("held").await, ["in flight"], "INV-2");
}

// SD-REL-3, FO-MDO-6: with every metad paused, a stopping streamd never observes a
// leader: it says so, cordons nothing, still exits within its deadline, and after the
// metadata returns it is not cordoned and its stream is recovered by failover.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_node_that_cannot_reach_the_leader_cordons_nothing() {
    let (mut stack, gw) = two_nodes_with_streams_on_the_first(&["nl-a"]).await;
    gw.append("nl-a", &["before"]).await;
    let a = stack.nodes[0].id.clone();
    stack.metad.replicas[0].pause();
    stack.nodes[0].term();
    let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    let log = stack.nodes[0].log_text();
    stack.metad.replicas[0].resume();
    // SD-TRM-2, FO-MDO-6: with metad paused (no terminating mark, no self-fence) the stop
    // still completes, exit 0: the self-fence that cannot land leaves teardown its time.
    weir_tests::assert_graceful_exit(code, &log);
    // SD-REL-3: it never observed a leader, so it requested no drain, and says so.
    assert_eq!(
        records(
            &log,
            "timed out reaching the leader before requesting a graceful shutdown drain"
        )
        .len(),
        1,
        "{log}"
    );
    // FO-MDO-6: stopped during the metadata outage, it completed what it could and reports
    // drain-support Abandoned.
    assert_eq!(phase_outcome(&log, "drain-support"), "Abandoned");
    assert!(records(&log, "cleared shutdown drain cordon before graceful shutdown").is_empty());
    // FO-MDO-6: once metad is back the node counts as crashed: its stream reopens on the peer through
    // failover, with its record.
    gw.wait_open("nl-a").await;
    assert_eq!(gw.bodies("nl-a").await, ["before"], "failover recovered the record");
    // SD-REL-3: it cordoned nothing, so with metad back it is not cordoned.
    let nodes = stack.metad.replicas[0].http_json("/admin/nodes").await.expect("nodes");
    assert_eq!(node_row(&nodes, &a)["cordoned"], false);
}

/// SIGTERMs node 0, whose drain request the leader never answers: it exits 0 and says
/// so once. Its log.
async fn stop_unanswered(stack: &mut Stack) -> String {
    stack.nodes[0].term();
    let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    let log = stack.nodes[0].log_text();
    assert_eq!(code, Some(0), "{log}");
    let unanswered = records(
        &log,
        "the leader did not answer the graceful shutdown drain of the local node",
    );
    assert_eq!(unanswered.len(), 1, "{log}");
    log
}

// SD-REL-4, SD-DRN-9, SD-REL-12, SD-REL-6: the leader moves everything but never
// answers the drain request (failpoint `drain_reply=drop`). The stopping node counts
// the request as made: it reports the drain as failed (drain-support Abandoned), still
// closes in place what is left, and still releases the cordon the request set, within
// the 1 s grace it keeps when the drain used its whole budget.
#[tokio::test(flavor = "multi_thread")]
async fn an_unanswered_drain_request_still_releases_its_cordon() {
    let (mut stack, gw) = two_nodes_with_streams_on_the_first(&["dr-a", "dr-b"]).await;
    let (a, b) = (stack.nodes[0].id.clone(), stack.nodes[1].id.clone());
    gw.append("dr-a", &["before"]).await;
    let metad = &mut stack.metad.replicas[0];
    metad.kill();
    metad.start_with_env(&[("WEIR_FAILPOINT_DRAIN_REPLY", "drop")]);
    wait_for("metad back", Duration::from_secs(20), || {
        metad.http_json("/admin/nodes")
    })
    .await;

    let log = stop_unanswered(&mut stack).await;
    // SD-DL-9, SD-REL-6: the drain used its whole budget, yet the cordon's release landed in its 1 s grace.
    assert_eq!(
        records(&log, "cleared shutdown drain cordon before graceful shutdown").len(),
        1,
        "{log}"
    );
    // SD-DRN-9: a drain request that went unanswered is reported as drain-support Abandoned.
    // SD-DL-5: the drain timeout alone ended drain-support (Abandoned), leaving teardown its
    // time: the exit above is 0, inside the 10 s deadline.
    assert_eq!(phase_outcome(&log, "drain-support"), "Abandoned");
    let nodes = stack.metad.replicas[0].http_json("/admin/nodes").await.expect("nodes");
    assert_eq!(node_row(&nodes, &a)["cordoned"], false, "SD-REL-4");
    for s in ["dr-a", "dr-b"] {
        gw.wait_open(s).await;
        assert_eq!(owner_of(&gw, s).await.as_deref(), Some(b.as_str()), "{s}");
    }
    assert_eq!(gw.bodies("dr-a").await, ["before"]);
}

// SD-ADM-1: part 1 of a stopping node's drain fails (the leader's move of its stream
// hangs before its close, failpoint `transfer_prepare=hang`, and the drain request is
// never answered, `drain_reply=drop`), and part 2 still runs: the stopping node closes
// the stream in place, committing what it buffered, and exits 0. The other node then
// serves every acknowledged record.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_drain_still_closes_what_it_left_in_place() {
    let env = [
        ("WEIR_FAILPOINT_TRANSFER_PREPARE", "hang"),
        ("WEIR_FAILPOINT_DRAIN_REPLY", "drop"),
    ];
    let flags = [SHORT, WAL_ONLY].concat();
    let stack = Stack::start_replicas_with_env(1, 2, Backend::FileWal, &flags, &[], &env).await;
    let (mut stack, gw) = with_streams_on_the_first(stack, &["left"]).await;
    let acked: Vec<String> = (0..10).map(|i| format!("r-{i}")).collect();
    for body in &acked {
        gw.append("left", &[body]).await;
    }
    let log = stop_unanswered(&mut stack).await;
    // SD-ADM-1: part 1 failed (its move hung, its request went unanswered), and part 2 still closed
    // the stream in place.
    let closed = records(&log, "closed stream for shutdown");
    assert_eq!(closed.len(), 1, "part 2 closed the stream: {log}");
    assert_eq!(closed[0]["stream"], "left");
    assert_eq!(closed[0]["offset"], 10, "with every acknowledged record committed");
    gw.wait_open("left").await;
    assert_eq!(owner_of(&gw, "left").await.as_deref(), Some(stack.nodes[1].id.as_str()));
    assert_eq!(gw.bodies("left").await, acked);
}

// SD-REL-8: the release of the drain cordon runs alongside the closes in place, both
// within what is left of the drain timeout (2 s here, once part 1 spent its share).
// Each takes 1 s here (failpoints `release=sleep(1000)` on metad and
// `close_stream_slow=sleep(1000)` on the stopping node): one after the other they
// would not both fit. Both finish, every acknowledged record is committed, and the
// stream is placed on the other node, never back on the terminating one.
#[tokio::test(flavor = "multi_thread")]
async fn the_release_runs_alongside_the_closes_in_place() {
    let metad_env = [
        ("WEIR_FAILPOINT_TRANSFER_PREPARE", "hang"),
        ("WEIR_FAILPOINT_DRAIN_REPLY", "drop"),
        ("WEIR_FAILPOINT_RELEASE", "sleep(1000)"),
    ];
    // An 8 s drain timeout: part 2 keeps the whole 2 s share.
    let timing = [
        "--drain-timeout-sec",
        "8",
        "--shutdown-deadline-sec",
        "12",
        "--shutdown-drain-sec",
        "0",
        "--shutdown-timeout-sec",
        "2",
    ];
    let flags = [&timing[..], WAL_ONLY].concat();
    let mut stack = Stack::start_replicas_with_env(1, 0, Backend::FileWal, &flags, &[], &metad_env).await;
    stack.add_node_with_env(
        "streamd-1",
        Backend::FileWal,
        &flags,
        &[("WEIR_FAILPOINT_CLOSE_STREAM_SLOW", "sleep(1000)")],
    );
    stack.add_node("streamd-2", Backend::FileWal, &flags);
    for n in &stack.nodes {
        n.wait_ready().await;
    }
    let (mut stack, gw) = with_streams_on_the_first(stack, &["slow"]).await;
    let acked: Vec<String> = (0..10).map(|i| format!("r-{i}")).collect();
    for body in &acked {
        gw.append("slow", &[body]).await;
    }
    let log = stop_unanswered(&mut stack).await;
    assert_eq!(records(&log, "failpoint: slow close").len(), 1, "{log}");
    // SD-REL-8: the 1 s release and the 1 s close both finish in the 2 s left to part 2, which they do
    // only side by side: the release committed ...
    assert_eq!(
        records(&log, "cleared shutdown drain cordon before graceful shutdown").len(),
        1,
        "the slow release committed: {log}"
    );
    // SD-REL-8: ... and the close, with every record, in the same time.
    let closed = records(&log, "closed stream for shutdown");
    assert_eq!(closed.len(), 1, "the slow close finished: {log}");
    assert_eq!(closed[0]["offset"], 10, "with every acknowledged record committed");
    gw.wait_open("slow").await;
    assert_eq!(owner_of(&gw, "slow").await.as_deref(), Some(stack.nodes[1].id.as_str()));
    assert_eq!(gw.bodies("slow").await, acked);
}

// SD-ADM-8, SD-ADM-9, SD-ADM-12, SD-DRN-13: the object store goes silent (a blackholed
// link) while the last streamd stops with buffered records. The drain holds until its
// timeout, names the uploader that did not drain and counts what is outstanding, and
// the stop still ends. Once the store is back, a new node's takeover uploads every
// acknowledged record.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_object_store_holds_the_drain_and_loses_nothing() {
    let mut stack = Stack::start_with(0, Backend::FileWal, &[], &[]).await;
    let s3 = Proxy::start(stack.s3.endpoint.trim_start_matches("http://")).await;
    let endpoint = format!("http://{}", s3.addr);
    let timing = [
        "--drain-timeout-sec",
        "3",
        "--shutdown-deadline-sec",
        "8",
        "--shutdown-drain-sec",
        "0",
    ];
    let flags = [&timing[..], WAL_ONLY].concat();
    stack.add_node_with_env("streamd-1", Backend::FileWal, &flags, &[("AWS_ENDPOINT", &endpoint)]);
    stack.nodes[0].wait_ready().await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), SHORT);
    gw.wait_ready().await;
    gw.create_stream("bh").await;
    gw.wait_open("bh").await;
    let acked: Vec<String> = (0..10).map(|i| format!("r-{i}")).collect();
    for body in &acked {
        gw.append("bh", &[body]).await;
    }
    s3.set(Mode::Blackhole);
    stack.nodes[0].term();
    let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    let log = stack.nodes[0].log_text();
    weir_tests::assert_graceful_exit(code, &log);
    // SD-ADM-7: the drain that hit its timeout reports Abandoned and the stop goes on (acked records recovered below).
    assert_eq!(phase_outcome(&log, "drain-support"), "Abandoned");
    // SD-ADM-9: the uploader that could not finish held the drain to its timeout and is named.
    assert_eq!(
        records(
            &log,
            "uploader for stream 'bh' did not drain before its configured deadline"
        )
        .len(),
        1,
        "{log}"
    );
    let outstanding = records(&log, "local graph drain timed out with admitted work outstanding");
    assert_eq!(outstanding.len(), 1, "{log}");
    let streams: Value = serde_json::from_str(outstanding[0]["streams"].as_str().expect("streams")).expect("json");
    assert_eq!(streams[0]["stream"], "bh");
    // SD-ADM-12: out of time with work outstanding: that record, with the stream's buffered count.
    assert_eq!(streams[0]["buffered_records"], 10, "{streams}");
    // SD-CS-8: the drain ran out, yet the node fenced itself (metad was reachable): its
    // row is fenced, and its still-open stream goes through WAL takeover below.
    let nodes = stack.metad.replicas[0].http_json("/admin/nodes").await.expect("nodes");
    assert_eq!(node_row(&nodes, "streamd-1")["fenced"], true, "{nodes}");

    s3.set(Mode::Pass);
    stack.add_node("streamd-2", Backend::FileWal, &[]);
    gw.wait_open("bh").await;
    // SD-ADM-8: the store's outage held the drain to its timeout (above) and lost nothing: the
    // takeover uploaded every acknowledged record.
    assert_eq!(gw.bodies("bh").await, acked, "INV-2 after takeover");
}

// SD-ADM-12, OBS-11: the other way a drain runs out of time. Every stream closed with
// nothing outstanding, but the confirming pass (held by failpoint `confirm_pass`) did not
// finish within what was left of the drain timeout: the second record, not the first,
// and drain-support is Abandoned. Nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_confirming_pass_that_runs_out_of_time_is_told_apart_from_outstanding_work() {
    let timing = [
        "--drain-timeout-sec",
        "2",
        "--shutdown-deadline-sec",
        "8",
        "--shutdown-drain-sec",
        "0",
    ];
    let (mut stack, gw) = one_node_holding_its_confirming_pass(&timing, "sleep(10000)").await;
    gw.create_stream("cp").await;
    gw.wait_open("cp").await;
    gw.append("cp", &["kept"]).await;
    stack.nodes[0].term();
    let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    let log = stack.nodes[0].log_text();
    weir_tests::assert_graceful_exit(code, &log);
    assert_eq!(phase_outcome(&log, "drain-support"), "Abandoned");
    // The premise: its one stream closed in place, every record committed.
    assert!(
        records(&log, "closed stream for shutdown")
            .iter()
            .any(|r| r["stream"] == "cp"),
        "{log}"
    );
    // SD-ADM-12, OBS-11: the work finished but the confirming pass did not: the second record, exactly
    // as quoted.
    let unconfirmed = records(
        &log,
        "local graph drain timed out before confirming that no admitted work is still moving",
    );
    assert_eq!(unconfirmed.len(), 1, "{log}");
    assert!(
        records(&log, "local graph drain timed out with admitted work outstanding").is_empty(),
        "nothing was outstanding: {log}"
    );
    stack.add_node("streamd-2", Backend::FileWal, &[]);
    gw.wait_open("cp").await;
    assert_eq!(gw.bodies("cp").await, ["kept"], "INV-2");
}

// FO-LIV-15, SD-ADM-3: a stopping node keeps heartbeating through stop-requested and
// drain-support until it fences itself, and what its admitted work needs stays alive
// meanwhile. Its drain is held well past the node timeout (3 s) by failpoint
// `confirm_pass=sleep(6000)`: the log shows its heartbeats applied between its
// `mark_terminating` and its `fence_self`, no fence but its own, and its stream closed
// with every record committed (the uploader and metadata client alive through the
// drain). Were the heartbeat stopped at the stop request, the failover loop would fence
// the node 3 s into its drain and take its WAL over.
#[tokio::test(flavor = "multi_thread")]
async fn a_drain_longer_than_the_node_timeout_keeps_heartbeating_until_the_self_fence() {
    let timing = [
        "--drain-timeout-sec",
        "15",
        "--shutdown-deadline-sec",
        "25",
        "--shutdown-drain-sec",
        "0",
    ];
    let (mut stack, gw) = one_node_holding_its_confirming_pass(&timing, "sleep(6000)").await;
    let node = stack.nodes[0].id.clone();
    gw.create_stream("hb").await;
    gw.wait_open("hb").await;
    gw.append("hb", &["kept"]).await;
    stack.nodes[0].term();
    let code = stack.nodes[0].wait_exit(Duration::from_secs(40)).await;
    let log = stack.nodes[0].log_text();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(phase_outcome(&log, "drain-support"), "Completed", "{log}");
    let entries = log_entries(&stack).await;
    let (terminating, fenced) = stop_span(&entries, &node);
    let beats = entries
        .iter()
        .filter(|(i, k, _, p)| k == "heartbeat" && by_node(p, &node) && (terminating..fenced).contains(i))
        .count();
    // FO-LIV-15, SD-ADM-3: its heartbeats kept landing from the stop request to the self-fence,
    // through a drain twice the node timeout.
    assert!(
        beats >= 3,
        "{beats} heartbeats between the stop request and the self-fence, 6 s or more apart"
    );
    // FO-LIV-15: no holder fenced it while it drained; its only fence is its own.
    assert!(
        !entries
            .iter()
            .any(|(_, k, c, _)| k == "fence_node" && c["node"] == node.as_str()),
        "fenced by nobody but itself: {entries:?}"
    );
    assert!(
        !entries.iter().any(|(_, k, ..)| k == "begin_takeover"),
        "no takeover of its WAL"
    );
    assert!(
        records(&log, "closed stream for shutdown")
            .iter()
            .any(|r| r["stream"] == "hb"),
        "{log}"
    );
    stack.add_node("streamd-2", Backend::FileWal, &[]);
    gw.wait_open("hb").await;
    assert_eq!(gw.bodies("hb").await, ["kept"], "INV-2");
}

// SD-DRN-11, SD-DRN-12: with three metad replicas and each transfer slowed (failpoint
// `transfer_prepare=sleep(1500)`), the leader is SIGKILLed in the middle of a stopping
// node's drain. The node asks the next leader within the same budget; that leader moves
// only what is still there, so every stream is closed by its owner exactly once and
// ends on the peer, and the stop still completes its hand-off.
#[tokio::test(flavor = "multi_thread")]
async fn a_drain_continues_with_the_next_leader_when_the_leader_dies() {
    let timing = [
        "--drain-timeout-sec",
        "25",
        "--shutdown-deadline-sec",
        "30",
        "--shutdown-drain-sec",
        "0",
    ];
    let stack = Stack::start_replicas_with_env(
        3,
        2,
        Backend::FileWal,
        &timing,
        &[],
        &[("WEIR_FAILPOINT_TRANSFER_PREPARE", "sleep(1500)")],
    )
    .await;
    let names = ["ld-a", "ld-b", "ld-c", "ld-d"];
    let (mut stack, gw) = with_streams_on_the_first(stack, &names).await;
    let (a, b) = (stack.nodes[0].id.clone(), stack.nodes[1].id.clone());
    for s in names {
        gw.append(s, &["before"]).await;
    }
    stack.nodes[0].term();
    wait_for("the first transfer begun", Duration::from_secs(20), || async {
        let entries = log_entries(&stack).await;
        entries.iter().any(|(_, k, ..)| k == "begin_transfer").then_some(())
    })
    .await;
    let leader = stack.metad.wait_leader(&[]).await;
    stack.metad.replicas[leader].kill();
    let code = stack.nodes[0].wait_exit(Duration::from_secs(40)).await;
    let log = stack.nodes[0].log_text();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(
        records(&log, "drained local node before graceful shutdown").len(),
        1,
        "{log}"
    );
    // SD-DRN-11: the leader's death mid-drain is logged, and the node asks the next leader.
    assert!(
        !records(
            &log,
            "stopping-node drain lost leadership; remaining work needs the next leader"
        )
        .is_empty(),
        "{log}"
    );
    let entries = log_entries(&stack).await;
    let closes: Vec<u64> = entries
        .iter()
        .filter(|(_, k, _, p)| k == "close_stream" && by_node(p, &a))
        .map(|(_, _, c, _)| c["stream"].as_u64().expect("id"))
        .collect();
    let mut unique = closes.clone();
    unique.sort_unstable();
    unique.dedup();
    // SD-DRN-11: the next leader moved only what the node still owned: no stream closed twice.
    assert_eq!(unique.len(), closes.len(), "no stream closed twice: {closes:?}");
    assert_eq!(closes.len(), names.len(), "every stream handed over by its owner");
    for s in names {
        assert_eq!(owner_of(&gw, s).await.as_deref(), Some(b.as_str()), "{s}");
        assert_eq!(gw.bodies(s).await, ["before"], "{s}");
    }
}

// SD-REL-10, SD-REL-12, OBS-9, SD-REL-11: each way the release of the drain cordon can
// fail on the leader (failpoints `release=hang`, `release=return(err)`,
// `release_reply=drop`) is logged with its own string, and drain-support is Abandoned
// even though every stream was handed over. A release that never committed leaves the
// node cordoned, across a restart, taking no placement until an operator uncordons it;
// one whose reply was dropped had committed.
#[tokio::test(flavor = "multi_thread")]
async fn each_failed_release_of_the_drain_cordon_is_reported() {
    let cases = [
        (
            "WEIR_FAILPOINT_RELEASE",
            "hang",
            "timed out clearing shutdown drain cordon",
            true,
        ),
        (
            "WEIR_FAILPOINT_RELEASE",
            "return(err)",
            "failed to clear shutdown drain cordon before graceful shutdown",
            true,
        ),
        (
            "WEIR_FAILPOINT_RELEASE_REPLY",
            "drop",
            "the leader did not answer the release of the shutdown drain cordon",
            false,
        ),
    ];
    for (var, action, message, stays_cordoned) in cases {
        let stack = Stack::start_replicas_with_env(1, 2, Backend::FileWal, SHORT, &[], &[(var, action)]).await;
        let (mut stack, gw) = with_streams_on_the_first(stack, &["rl-a"]).await;
        let a = stack.nodes[0].id.clone();
        stack.nodes[0].term();
        let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
        let log = stack.nodes[0].log_text();
        assert_eq!(code, Some(0), "{action}: {log}");
        // SD-REL-10, OBS-9: each way the release fails is logged once, with its exact string.
        assert_eq!(records(&log, message).len(), 1, "{action}: {log}");
        assert_eq!(
            records(&log, "drained local node before graceful shutdown").len(),
            1,
            "{action}"
        );
        // SD-REL-10, SD-REL-12: every stream was handed over (the drained record), yet the failed release
        // makes drain-support Abandoned.
        assert_eq!(phase_outcome(&log, "drain-support"), "Abandoned", "{action}");
        let nodes = stack.metad.replicas[0].http_json("/admin/nodes").await.expect("nodes");
        // INV-16: /admin/nodes shows the drain cordon exactly when its release never committed.
        assert_eq!(node_row(&nodes, &a)["cordoned"], stays_cordoned, "{action}");

        // SD-REL-11: restarted, the node is still cordoned exactly when the release never
        // committed, and then takes no placement until an operator uncordons it. It holds
        // no stream, so without the cordon placement would pick it (least loaded).
        stack.nodes[0].start();
        stack.nodes[0].wait_ready().await;
        let nodes = stack.metad.replicas[0].http_json("/admin/nodes").await.expect("nodes");
        assert_eq!(
            node_row(&nodes, &a)["cordoned"],
            stays_cordoned,
            "{action}: after the restart"
        );
        let b = stack.nodes[1].id.clone();
        gw.create_stream("rl-after-restart").await;
        gw.wait_open("rl-after-restart").await;
        let placed = owner_of(&gw, "rl-after-restart").await;
        let expected = if stays_cordoned { &b } else { &a };
        assert_eq!(
            placed.as_deref(),
            Some(expected.as_str()),
            "{action}: placed after the restart"
        );
        if stays_cordoned {
            let (status, body) = gw
                .send(gw.request(Method::POST, &format!("/admin/nodes/{a}/uncordon")))
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            gw.create_stream("rl-after-uncordon").await;
            gw.wait_open("rl-after-uncordon").await;
            assert_eq!(
                owner_of(&gw, "rl-after-uncordon").await.as_deref(),
                Some(a.as_str()),
                "{action}: placed after the uncordon"
            );
        }
    }
}

// SD-DRN-7, SD-DRN-1, SD-TRG-5: an operator drain where one stream cannot be prepared
// (its owner's close fails: failpoint `close_stream_df_b`) moves the others, reports
// the failed one with its reason, exits 1, and the failed stream keeps taking appends
// at its owner, whose intake reopened.
#[tokio::test(flavor = "multi_thread")]
async fn a_drain_moves_what_it_can_and_reports_the_stream_that_failed() {
    let mut stack = Stack::start_with(0, Backend::FileWal, &[], &[]).await;
    stack.add_node_with_env(
        "streamd-1",
        Backend::FileWal,
        SHORT,
        &[("WEIR_FAILPOINT_CLOSE_STREAM_DF_B", "return(err)")],
    );
    stack.add_node("streamd-2", Backend::FileWal, SHORT);
    for n in &stack.nodes {
        n.wait_ready().await;
    }
    let names = ["df_a", "df_b", "df_c"];
    let (mut stack, gw) = with_streams_on_the_first(stack, &names).await;
    let a = stack.nodes[0].id.clone();
    let out = tokio::process::Command::new(weir_tests::bin_path("weir"))
        .args(["--metad", &stack.metad.replicas[0].grpc, "--json", "nodes", "drain", &a])
        .output()
        .await
        .expect("weir runs");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not fully drained"));
    let report: Value = serde_json::from_slice(&out.stdout).expect("json report");
    let streams = report["streams"].as_array().expect("streams");
    let tried: Vec<&str> = streams.iter().map(|m| m["stream"].as_str().expect("name")).collect();
    // SD-DRN-1: the operator's drain tried every stream of the node, in canonical (name) order.
    assert_eq!(tried, names, "every stream tried, in order: {report}");
    // SD-DRN-7: the stream that could not be prepared is reported failed, with its reason; the others
    // moved.
    for m in streams {
        let failed = m["stream"] == "df_b";
        assert_eq!(m["moved"], !failed, "{report}");
        if failed {
            let why = m["error"].as_str().expect("reason");
            assert!(why.contains("did not close"), "{why}");
        }
    }
    assert_eq!(report["finished"], false);
    // SD-DRN-7: the failed stream stayed with its owner, whose intake reopened.
    assert_eq!(owner_of(&gw, "df_b").await.as_deref(), Some(a.as_str()));
    gw.append("df_b", &["after the failed move"]).await;
    assert_eq!(gw.bodies("df_b").await, ["after the failed move"]);

    // OBS-8: the same failure in the node's own drain at shutdown is logged as such; the
    // stream that will not close is recovered by failover after the self-fence.
    stack.nodes[0].term();
    let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    let log = stack.nodes[0].log_text();
    weir_tests::assert_graceful_exit(code, &log);
    assert_eq!(
        records(&log, "failed to drain local node before graceful shutdown").len(),
        1,
        "{log}"
    );
    assert_eq!(phase_outcome(&log, "drain-support"), "Abandoned");
    gw.wait_open("df_b").await;
    assert_eq!(gw.bodies("df_b").await, ["after the failed move"]);
}

// OBS-8: a stopping node whose own drain outlasts its budget logs that it timed out
// moving its work, closes what is left in place, and loses nothing. Each transfer's
// prepare is held 2.5 s (failpoint `transfer_prepare`) and each later unit gets a
// shrinking share of what is left, so with twelve streams the 6 s drain timeout runs
// out before the last are tried.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_nodes_drain_that_outlasts_its_budget_is_logged_as_timed_out() {
    // A unit per stream, so the budget runs out between units.
    let stack = Stack::start_replicas_with_env(
        1,
        2,
        Backend::FileWal,
        SHORT,
        &["--drain-batch-streams", "1"],
        &[("WEIR_FAILPOINT_TRANSFER_PREPARE", "sleep(2500)")],
    )
    .await;
    let names = [
        "slow_a", "slow_b", "slow_c", "slow_d", "slow_e", "slow_f", "slow_g", "slow_h", "slow_i", "slow_j", "slow_k",
        "slow_l",
    ];
    let (mut stack, gw) = with_streams_on_the_first(stack, &names).await;
    for s in names {
        gw.append(s, &["kept"]).await;
    }
    stack.nodes[0].term();
    let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    let log = stack.nodes[0].log_text();
    weir_tests::assert_graceful_exit(code, &log);
    // OBS-8: the drain that outlasted its budget is logged with its exact string.
    assert_eq!(
        records(
            &log,
            "timed out moving scheduled work off the local node before graceful shutdown"
        )
        .len(),
        1,
        "{log}"
    );
    assert_eq!(phase_outcome(&log, "drain-support"), "Abandoned");
    for s in names {
        gw.wait_open(s).await;
        assert_eq!(gw.bodies(s).await, ["kept"], "{s}");
    }
}

// SD-DRN-12: the leader runs a drain in a task of its own, so a requester that stops
// waiting (here after 1 s, with each transfer slowed to 1 s) does not stop it: every
// stream still moves, and no transfer mark is left behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_drain_goes_on_after_its_requester_stops_waiting() {
    let stack = Stack::start_replicas_with_env(
        1,
        2,
        Backend::FileWal,
        SHORT,
        &[],
        &[("WEIR_FAILPOINT_TRANSFER_PREPARE", "sleep(1000)")],
    )
    .await;
    let names = ["gw_a", "gw_b", "gw_c"];
    let (stack, gw) = with_streams_on_the_first(stack, &names).await;
    let (a, b) = (stack.nodes[0].id.clone(), stack.nodes[1].id.clone());
    let request = weir_proto::metad::DrainRequest {
        node: a.clone(),
        budget_ms: 60_000,
        requester: Vec::new(),
        principal: String::new(),
    };
    let gave_up = stack.metad.client().drain(request, Duration::from_secs(1)).await;
    assert!(gave_up.is_err(), "the requester stopped waiting: {gave_up:?}");
    // SD-DRN-12: the requester stopped waiting, yet the drain ran on in its own task and moved every
    // stream ...
    for s in names {
        wait_for(&format!("{s} moved"), Duration::from_secs(20), || async {
            (owner_of(&gw, s).await.as_deref() == Some(b.as_str())).then_some(())
        })
        .await;
    }
    // SD-DRN-12: ... and released what it held: no transfer mark is left.
    let streams = stack.metad.client().admin("streams", 0, 0).await.expect("streams");
    let marked: Vec<&Value> = streams["streams"]
        .as_object()
        .expect("streams")
        .values()
        .filter(|r| !r["transfer_target"].is_null())
        .collect();
    assert!(marked.is_empty(), "no transfer mark left: {marked:?}");
}

// RR-INT-5: a destination that restarts between a transfer's start and the hand-off
// invalidates the transfer. The leader's prepare is slowed (failpoint
// `transfer_prepare=sleep(10000)`) and the target is killed and restarted meanwhile: the
// transfer fails with the seed's report, the stream stays open on its owner, and a later
// transfer onto the restarted node succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn a_destination_restarted_mid_transfer_invalidates_it() {
    let stack = Stack::start_replicas_with_env(
        1,
        2,
        Backend::FileWal,
        SHORT,
        &[],
        &[("WEIR_FAILPOINT_TRANSFER_PREPARE", "sleep(10000)")],
    )
    .await;
    let (mut stack, gw) = with_streams_on_the_first(stack, &["ri"]).await;
    gw.append("ri", &["before"]).await;
    let (a, b) = (stack.nodes[0].id.clone(), stack.nodes[1].id.clone());
    let transfer = {
        let r = gw
            .request(Method::POST, "/v1/admin/streams/ri/transfer")
            .json(&json!({"to": b}));
        tokio::spawn(async move { r.send().await })
    };
    wait_for("the transfer begun", Duration::from_secs(20), || async {
        let entries = log_entries(&stack).await;
        entries.iter().any(|(_, k, ..)| k == "begin_transfer").then_some(())
    })
    .await;
    stack.nodes[1].kill();
    stack.nodes[1].start();
    stack.nodes[1].wait_ready().await;
    // The premise: the target registered again while the prepare was held, before any
    // close of the stream.
    let entries = log_entries(&stack).await;
    let registered = entries
        .iter()
        .rposition(|(_, k, c, _)| k == "register_node" && c["node"] == b.as_str());
    let closed = entries.iter().position(|(_, k, ..)| k == "close_stream");
    assert!(
        registered.is_some() && closed.is_none_or(|c| Some(c) > registered),
        "the restart came too late for the test: {entries:?}"
    );
    let response = transfer.await.expect("task").expect("answer");
    let body: Value = response.json().await.expect("json");
    // RR-INT-5: the destination's restart invalidated the transfer, with the exact report, and the
    // ownership is unchanged.
    assert_eq!(body["moved"], false, "{body}");
    assert_eq!(
        body["error"],
        format!("destination node '{b}' changed process incarnation during ownership handoff"),
        "{body}"
    );
    assert_eq!(
        owner_of(&gw, "ri").await.as_deref(),
        Some(a.as_str()),
        "ownership unchanged"
    );
    // The restarted node takes a transfer normally.
    let (status, body) = gw
        .send(
            gw.request(Method::POST, "/v1/admin/streams/ri/transfer")
                .json(&json!({"to": b})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["moved"], true, "{body}");
    gw.wait_open("ri").await;
    assert_eq!(owner_of(&gw, "ri").await.as_deref(), Some(b.as_str()));
    assert_eq!(gw.bodies("ri").await, ["before"]);
}

// RR-INT-4, RR-INT-3: a transfer's preparation (its mark in the log, naming the
// destination incarnation before the owner is asked to close) outlives the coordinator
// that wrote it. The leader's prepare is held (failpoint `transfer_prepare=sleep(30000)`)
// and the leader is SIGKILLed: the next leader, after its barrier, discards exactly that
// mark by its operation id (the `BeginTransfer`'s log index) and says why, and the stream
// stays open and writable on its owner.
#[tokio::test(flavor = "multi_thread")]
async fn rr_int_4_a_dead_coordinators_transfer_mark_is_discarded_by_the_next_leader() {
    let (mut stack, gw, leader, transfer) = transfer_held_by_the_leader("rc", 30_000).await;
    let (a, b) = (stack.nodes[0].id.clone(), stack.nodes[1].id.clone());
    let (op, begin) = wait_for("the transfer begun", Duration::from_secs(20), || async {
        let entries = log_entries(&stack).await;
        entries
            .into_iter()
            .find(|(_, k, ..)| k == "begin_transfer")
            .map(|(index, _, command, _)| (index, command))
    })
    .await;
    // RR-INT-3: the participants are recorded before any side effect: the destination
    // in the entry, the source as the stream's owner at that epoch.
    assert_eq!(begin["target"], b.as_str(), "{begin}");
    let row = stream_row(&stack, "rc").await;
    assert_eq!(row["transfer_op"], op, "{row}");
    assert_eq!(row["owner"]["node"], a.as_str(), "{row}");
    stack.metad.replicas[leader].kill();
    transfer.abort();
    // RR-INT-4: with its coordinator gone, the next leader discards the uncommitted mark durably, by
    // its exact operation id.
    let discard = wait_for("the mark discarded", Duration::from_secs(30), || async {
        let entries = log_entries(&stack).await;
        entries
            .into_iter()
            .find(|(_, k, c, _)| k == "discard_transfer" && c["op"] == op)
    })
    .await;
    assert!(discard.0 > op, "{discard:?}");
    assert_eq!(discard.2["reason"], "its coordinator is gone", "{discard:?}");
    let next = stack.metad.wait_leader(&[leader]).await;
    let log = stack.metad.replicas[next].log_text();
    let said = records(&log, "discarded a transfer preparation no coordinator holds");
    assert!(said.iter().any(|r| r["op"] == op && r["stream"] == "rc"), "{log}");
    let row = stream_row(&stack, "rc").await;
    assert!(
        row["transfer_target"].is_null() && row["transfer_op"].is_null(),
        "{row}"
    );
    let entries = log_entries(&stack).await;
    assert!(
        !entries.iter().any(|(i, k, ..)| k == "close_stream" && *i < discard.0),
        "the owner never closed the stream: {entries:?}"
    );
    assert_eq!(
        owner_of(&gw, "rc").await.as_deref(),
        Some(a.as_str()),
        "ownership unchanged"
    );
    gw.append("rc", &["after"]).await;
    assert_eq!(gw.bodies("rc").await, ["before", "after"]);
}

// RR-INT-4: a coordinator deposed mid-transfer sends no close. The leader's prepare is
// held 4 s (failpoint `transfer_prepare=sleep(4000)`) and the leader is paused
// (SIGSTOP) past it while the others elect a leader, which discards the mark. Resumed,
// the old leader's prepare goes on with a stale view, but it asks the owner to close
// only after a quorum confirms it still leads, which none does: the stream is never
// closed and stays writable on its owner.
#[tokio::test(flavor = "multi_thread")]
async fn rr_int_4_a_deposed_coordinator_asks_no_owner_to_close() {
    let (stack, gw, leader, transfer) = transfer_held_by_the_leader("dp", 4_000).await;
    let a = stack.nodes[0].id.clone();
    // Asked of a replica that stays up: a client trying the paused one first would wait.
    let other = stack.metad.replicas[(leader + 1) % 3].client();
    let op = wait_for("the transfer begun", Duration::from_secs(20), || async {
        let entries = log_entries_of(&other).await;
        entries
            .into_iter()
            .find(|(_, k, ..)| k == "begin_transfer")
            .map(|(i, ..)| i)
    })
    .await;
    stack.metad.replicas[leader].pause();
    // RR-INT-4: the next leader discards the mark of the coordinator it replaced.
    wait_for(
        "the mark discarded by the next leader",
        Duration::from_secs(30),
        || async {
            let entries = log_entries_of(&other).await;
            entries
                .iter()
                .any(|(_, k, c, _)| k == "discard_transfer" && c["op"] == op)
                .then_some(())
        },
    )
    .await;
    // Past the held prepare, so the old leader goes on at once when resumed.
    tokio::time::sleep(Duration::from_secs(4)).await;
    stack.metad.replicas[leader].resume();
    let said = wait_for(
        "the old leader gives the transfer up",
        Duration::from_secs(30),
        || async {
            let log = stack.metad.replicas[leader].log_text();
            records(&log, "stream not transferred").into_iter().next()
        },
    )
    .await;
    assert!(
        said["error"]
            .as_str()
            .is_some_and(|e| e.contains("metadata leadership")),
        "{said}"
    );
    let entries = log_entries_of(&other).await;
    assert!(
        !entries.iter().any(|(_, k, ..)| k == "close_stream"),
        "the owner was asked to close: {entries:?}"
    );
    assert_eq!(
        owner_of(&gw, "dp").await.as_deref(),
        Some(a.as_str()),
        "ownership unchanged"
    );
    gw.append("dp", &["after"]).await;
    assert_eq!(gw.bodies("dp").await, ["before", "after"]);
    transfer.abort();
}

/// Three metad replicas whose transfer prepares are held `held_ms` (failpoint
/// `transfer_prepare`), two streamd nodes and `stream` on the first with one record,
/// and a transfer of it to the second asked of the leader alone (a client that tried
/// the next replica after the leader went away would begin a second transfer there):
/// the stack, the gateway, the leader's index and the transfer's task.
async fn transfer_held_by_the_leader(
    stream: &str,
    held_ms: u64,
) -> (
    Stack,
    Gatewayd,
    usize,
    tokio::task::JoinHandle<Result<Value, weir_meta::client::ClientError>>,
) {
    let held = format!("sleep({held_ms})");
    let stack = Stack::start_replicas_with_env(
        3,
        2,
        Backend::FileWal,
        SHORT,
        &[],
        &[("WEIR_FAILPOINT_TRANSFER_PREPARE", held.as_str())],
    )
    .await;
    let (stack, gw) = with_streams_on_the_first(stack, &[stream]).await;
    gw.append(stream, &["before"]).await;
    let leader = stack.metad.wait_leader(&[]).await;
    let client = stack.metad.replicas[leader].client();
    let request = weir_proto::metad::TransferRequest {
        stream: stream.into(),
        target: stack.nodes[1].id.clone(),
        budget_ms: 60_000,
        ..Default::default()
    };
    let transfer = tokio::spawn(async move { client.transfer(request, Duration::from_secs(60)).await });
    (stack, gw, leader, transfer)
}

/// The stream row named `name` from a metad's state.
async fn stream_row(stack: &Stack, name: &str) -> Value {
    let state = stack.metad.client().admin("streams", 0, 0).await.expect("streams");
    state["streams"]
        .as_object()
        .expect("streams")
        .values()
        .find(|r| r["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no stream '{name}' in {state}"))
}

// FO-TKO-16: an owner's crash is not a hand-off, and failover waits for no transfer
// under way. A transfer of stream Y off A is held in its prepare for 30 s (failpoint
// `transfer_prepare=sleep(30000)`) when A is SIGKILLed: A's other streams are recovered
// and open on B within the node timeout (3 s) plus recovery, long before that transfer
// could end, and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread")]
async fn fo_tko_16_failover_does_not_wait_for_a_transfer_under_way() {
    let stack = Stack::start_replicas_with_env(
        1,
        2,
        Backend::FileWal,
        SHORT,
        &[],
        &[("WEIR_FAILPOINT_TRANSFER_PREPARE", "sleep(30000)")],
    )
    .await;
    let names = ["tk-y", "tk-x1", "tk-x2"];
    let (mut stack, gw) = with_streams_on_the_first(stack, &names).await;
    let b = stack.nodes[1].id.clone();
    for s in names {
        gw.append(s, &["before"]).await;
    }
    let transfer = {
        let r = gw
            .request(Method::POST, "/v1/admin/streams/tk-y/transfer")
            .json(&json!({"to": b, "budget_sec": 60}));
        tokio::spawn(async move { r.send().await })
    };
    wait_for("the transfer begun", Duration::from_secs(20), || async {
        let entries = log_entries(&stack).await;
        entries.iter().any(|(_, k, ..)| k == "begin_transfer").then_some(())
    })
    .await;
    stack.nodes[0].kill();
    let killed = std::time::Instant::now();
    for s in ["tk-x1", "tk-x2"] {
        gw.wait_open(s).await;
        assert_eq!(owner_of(&gw, s).await.as_deref(), Some(b.as_str()), "{s}");
    }
    let took = killed.elapsed();
    // FO-TKO-16: the crash is no hand-off: A's other streams were placed long before the held
    // transfer's 30 s could end.
    assert!(
        took < Duration::from_secs(20),
        "A's other streams were placed {took:?} after the crash: failover waited for the transfer"
    );
    for s in names {
        gw.wait_open(s).await;
        assert_eq!(gw.bodies(s).await, ["before"], "{s}");
    }
    transfer.abort();
}

// RR-WAL-7: a new owner that cannot open a stream (the read of its producer-state tail
// fails, as with an unreachable object store: failpoint `open_read` while a file
// exists) logs a warn on each attempt, the attempts spaced by a backoff that starts at
// 0.25 s and doubles; meanwhile the stream takes no appends (503). Once the fault is
// lifted the stream opens and serves what it held.
#[tokio::test(flavor = "multi_thread")]
async fn rr_wal_7_a_failed_open_is_retried_on_a_doubling_backoff() {
    let mut stack = Stack::start_with(1, Backend::FileWal, SHORT, &[]).await;
    let gw = Gatewayd::start("gw-1", &stack.metad_addrs(), stack.dir.path(), SHORT);
    gw.wait_ready().await;
    gw.create_stream("ro").await;
    gw.wait_open("ro").await;
    gw.append("ro", &["before"]).await;
    let fault = stack.dir.path().join("open-read-fault");
    std::fs::write(&fault, b"").expect("fault file");
    let failpoint = format!("return(err) while exists({})", fault.display());
    stack.add_node_with_env(
        "streamd-2",
        Backend::FileWal,
        SHORT,
        &[("WEIR_FAILPOINT_OPEN_READ", failpoint.as_str())],
    );
    stack.nodes[1].wait_ready().await;
    let b = stack.nodes[1].id.clone();
    // The transfer hands the stream over; the destination cannot open it.
    gw.send(
        gw.request(Method::POST, "/v1/admin/streams/ro/transfer")
            .json(&json!({"to": b, "budget_sec": 2})),
    )
    .await;
    let warned = |log: String| {
        records(&log, "cannot open stream yet; will retry")
            .into_iter()
            .filter(|r| r["stream"] == "ro")
            .collect::<Vec<_>>()
    };
    let attempts = wait_for("five failed opens", Duration::from_secs(30), || async {
        let found = warned(stack.nodes[1].log_text());
        (found.len() >= 5).then_some(found)
    })
    .await;
    let waits: Vec<&str> = attempts[..5]
        .iter()
        .map(|r| r["retry_in"].as_str().unwrap_or(""))
        .collect();
    // RR-WAL-7: a warn per failed open, retried after 0.25 s, doubling.
    assert_eq!(waits, ["250ms", "500ms", "1s", "2s", "4s"], "{attempts:?}");
    // The attempts are spaced by those waits, not by whatever else changes the view.
    let at: Vec<f64> = attempts[..5].iter().map(seconds_of_day).collect();
    for (i, pair) in at.windows(2).enumerate() {
        let gap = (pair[1] - pair[0]).rem_euclid(86_400.0);
        let wait = 0.25 * f64::from(1u32 << i);
        assert!(
            gap >= wait * 0.9,
            "attempt {} came {gap:.3} s after the one before, not {wait} s: {attempts:?}",
            i + 1
        );
    }
    // RR-WAL-7: until the open succeeds, the stream takes no appends.
    let (status, body) = gw
        .send(
            gw.request(Method::POST, "/v1/streams/ro/records")
                .json(&json!({"records": [{"body": "refused"}]})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "no appends before the open: {body}"
    );
    std::fs::remove_file(&fault).expect("lift the fault");
    gw.wait_open("ro").await;
    assert_eq!(owner_of(&gw, "ro").await.as_deref(), Some(b.as_str()));
    gw.append("ro", &["after"]).await;
    assert_eq!(gw.bodies("ro").await, ["before", "after"]);
}

// SD-TRM-8: a drain's plan belongs to the source's incarnation. The source is killed and
// restarted while the leader prepares its first transfer (failpoint
// `transfer_prepare=sleep(2000)`): the drain drops the rest of its plan and says why,
// and the old incarnation closes nothing after the restart; its streams come back
// through the takeover, every record intact.
#[tokio::test(flavor = "multi_thread")]
async fn a_source_restarted_mid_drain_invalidates_the_plan() {
    // A unit per stream, so the restart falls between units.
    let stack = Stack::start_replicas_with_env(
        1,
        2,
        Backend::FileWal,
        SHORT,
        &["--drain-batch-streams", "1"],
        &[("WEIR_FAILPOINT_TRANSFER_PREPARE", "sleep(2000)")],
    )
    .await;
    let names = ["rs_a", "rs_b"];
    let (mut stack, gw) = with_streams_on_the_first(stack, &names).await;
    for s in names {
        gw.append(s, &["before"]).await;
    }
    let a = stack.nodes[0].id.clone();
    let client = stack.metad.client();
    let request = weir_proto::metad::DrainRequest {
        node: a.clone(),
        budget_ms: 60_000,
        requester: Vec::new(),
        principal: String::new(),
    };
    let drain = tokio::spawn(async move { client.drain(request, Duration::from_secs(70)).await });
    wait_for("the first transfer begun", Duration::from_secs(20), || async {
        let entries = log_entries(&stack).await;
        entries.iter().any(|(_, k, ..)| k == "begin_transfer").then_some(())
    })
    .await;
    let killed_at = log_entries(&stack).await.last().map(|e| e.0).expect("entries");
    let nodes = stack.metad.replicas[0].http_json("/admin/nodes").await.expect("nodes");
    let old_epoch = node_row(&nodes, &a)["epoch"].clone();
    stack.nodes[0].kill();
    stack.nodes[0].start();
    let report = drain.await.expect("task").expect("report");
    assert_eq!(report["finished"], false, "{report}");
    // SD-TRM-8: the source's restart (a new epoch) invalidated the rest of the plan, and the drain says why.
    let why = report["error"].as_str().unwrap_or_default();
    assert!(why.contains("restarted or was fenced"), "{report}");
    // The unit in flight either failed or completed to its target through the old
    // incarnation's takeover (a pending transfer completes to its target); the rest of
    // the plan was never tried.
    assert_eq!(report["streams"].as_array().map(Vec::len), Some(1), "{report}");
    let entries = log_entries(&stack).await;
    let old_epoch_closes = entries
        .iter()
        .filter(|(i, k, _, p)| {
            *i > killed_at && k == "close_stream" && by_node(p, &a) && p["node"]["epoch"] == old_epoch
        })
        .count();
    // SD-TRM-8: no move was committed against the old incarnation after its restart.
    assert_eq!(old_epoch_closes, 0, "no move committed at the old epoch");
    for s in names {
        gw.wait_open(s).await;
        assert_eq!(gw.bodies(s).await, ["before"], "{s}");
    }
}

// SD-DRN-12, SD-TD-5: a metad asked to stop while it runs a drain finishes the drain
// before it stops Raft (the drain proposes through it). Transfers are slowed to 1 s
// each and metad is stopped with no drain window of its own, right after the first
// transfer begins: every stream still moves, the drain's last transfer lands before
// "metad stopping: shutting down raft", and metad exits 0.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_metad_finishes_the_drain_it_runs_before_stopping_raft() {
    let stack = Stack::start_replicas_with_env(
        1,
        2,
        Backend::FileWal,
        SHORT,
        &["--shutdown-drain-sec", "0", "--shutdown-deadline-sec", "30"],
        &[("WEIR_FAILPOINT_TRANSFER_PREPARE", "sleep(1000)")],
    )
    .await;
    let names = ["md_a", "md_b", "md_c"];
    let (mut stack, gw) = with_streams_on_the_first(stack, &names).await;
    for s in names {
        gw.append(s, &["before"]).await;
    }
    let (a, b) = (stack.nodes[0].id.clone(), stack.nodes[1].id.clone());
    let client = stack.metad.client();
    let request = weir_proto::metad::DrainRequest {
        node: a.clone(),
        budget_ms: 60_000,
        requester: Vec::new(),
        principal: String::new(),
    };
    let drain = tokio::spawn(async move { client.drain(request, Duration::from_secs(70)).await });
    wait_for("the first transfer begun", Duration::from_secs(20), || async {
        let entries = log_entries(&stack).await;
        entries.iter().any(|(_, k, ..)| k == "begin_transfer").then_some(())
    })
    .await;
    let metad = &mut stack.metad.replicas[0];
    metad.signal(nix::sys::signal::Signal::SIGTERM);
    let code = metad.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "metad exits cleanly:\n{}", metad.log_text());
    let log = metad.log_text();
    let stopping_raft = log
        .find("metad stopping: shutting down raft")
        .expect("raft stop logged");
    let finished = log
        .find("drain finished")
        .unwrap_or_else(|| panic!("the drain finished:\n{log}"));
    assert!(finished < stopping_raft, "the drain ends before Raft stops:\n{log}");
    let transferred = records(&log, "stream transferred");
    assert_eq!(transferred.len(), names.len(), "every stream moved:\n{log}");
    // The requester may or may not have had its answer before the replica stopped.
    let _ = drain.await;
    metad.start();
    for s in names {
        gw.wait_open(s).await;
        assert_eq!(owner_of(&gw, s).await.as_deref(), Some(b.as_str()), "{s} moved off {a}");
        assert_eq!(gw.bodies(s).await, ["before"], "{s}");
    }
}

// SD-INT-5, SD-ADM-3: work a request had admitted is not cancelled when the stop comes:
// an append whose WAL write the owner holds 3 s (failpoint `wal_persist`) when it is
// stopped still reaches the WAL and the stream, is acknowledged (200), and moves with
// its stream to the peer, stored once. What it depends on stays alive meanwhile: the
// WAL writer, and the uploader and metadata client, whose commit of it lands between
// the node's `mark_terminating` and its `fence_self`.
#[tokio::test(flavor = "multi_thread")]
async fn an_append_admitted_before_the_stop_is_acknowledged_and_moves_with_its_stream() {
    let mut stack = Stack::start_with(0, Backend::FileWal, &[], &[]).await;
    stack.add_node_with_env(
        "streamd-1",
        Backend::FileWal,
        SHORT,
        &[("WEIR_FAILPOINT_WAL_PERSIST", "sleep(3000)")],
    );
    stack.add_node("streamd-2", Backend::FileWal, SHORT);
    for n in &stack.nodes {
        n.wait_ready().await;
    }
    let (mut stack, gw) = with_streams_on_the_first(stack, &["adm"]).await;
    let appending = gw.append_held_at(&stack.nodes[0], "adm", "admitted").await;
    stack.nodes[0].term();
    let response = tokio::time::timeout(Duration::from_secs(30), appending)
        .await
        .expect("answered within the shutdown deadline")
        .expect("task")
        .expect("an HTTP answer");
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    // SD-INT-5: the append admitted before the stop was not cancelled: it is acknowledged.
    assert_eq!(status, StatusCode::OK, "acknowledged: {body}");
    let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    let log = stack.nodes[0].log_text();
    assert_eq!(code, Some(0), "{log}");
    let node = stack.nodes[0].id.clone();
    let entries = log_entries(&stack).await;
    let (terminating, fenced) = stop_span(&entries, &node);
    // SD-ADM-3: the uploader and metadata client stayed alive for it: its commit landed in the drain.
    assert!(
        entries
            .iter()
            .any(|(i, k, _, p)| k == "commit_objects" && by_node(p, &node) && (terminating..fenced).contains(i)),
        "the admitted append was committed during the drain: {entries:?}"
    );
    gw.wait_open("adm").await;
    assert_eq!(owner_of(&gw, "adm").await.as_deref(), Some(stack.nodes[1].id.as_str()));
    // SD-INT-5: it reached the WAL and the stream: stored once, it moved with its stream.
    assert_eq!(
        gw.bodies("adm").await,
        ["admitted"],
        "stored once, moved with its stream"
    );
}

/// A stack whose first node holds its records in the WAL until a close and fails its
/// data-object commits while `failing` exists (failpoint `commit_objects`), with
/// `timing`; the second is a plain peer. `streams` are opened on the first.
async fn failing_commits_on_the_first(
    failing: &std::path::Path,
    timing: &[&str],
    streams: &[&str],
) -> (Stack, Gatewayd) {
    let mut stack = Stack::start_with(0, Backend::FileWal, &[], &[]).await;
    let commit = format!("return(err) while exists({})", failing.display());
    let flags = [timing, WAL_ONLY].concat();
    stack.add_node_with_env(
        "streamd-1",
        Backend::FileWal,
        &flags,
        &[("WEIR_FAILPOINT_COMMIT_OBJECTS", commit.as_str())],
    );
    stack.add_node("streamd-2", Backend::FileWal, SHORT);
    for n in &stack.nodes {
        n.wait_ready().await;
    }
    with_streams_on_the_first(stack, streams).await
}

// SD-ADM-5: a data-object commit waiting on its backoff is outstanding work. The
// stopping owner's commits fail (failpoint `commit_objects`) until the test sees a
// retry logged; the drain waits for the retry, and the stream's close lands in the log
// only after the commit of its records. drain-support completes and nothing is lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_waiting_on_its_backoff_holds_the_close_until_it_lands() {
    let failing = tempfile::NamedTempFile::new().expect("failing file");
    let (mut stack, gw) = failing_commits_on_the_first(failing.path(), SHORT, &["bk"]).await;
    let acked: Vec<String> = (0..5).map(|i| format!("bk-{i}")).collect();
    for body in &acked {
        gw.append("bk", &[body]).await;
    }
    stack.nodes[0].term();
    wait_for("a commit retry", Duration::from_secs(10), || async {
        (!records(
            &stack.nodes[0].log_text(),
            "metadata log unavailable; commit will be retried",
        )
        .is_empty())
        .then_some(())
    })
    .await;
    std::fs::remove_file(failing.path()).expect("commits succeed again");
    let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    let log = stack.nodes[0].log_text();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(phase_outcome(&log, "drain-support"), "Completed", "{log}");
    let node = stack.nodes[0].id.clone();
    let entries = log_entries(&stack).await;
    let by_a = |kind: &str| {
        entries
            .iter()
            .filter(|(_, k, _, p)| k == kind && by_node(p, &node))
            .map(|(i, ..)| *i)
            .collect::<Vec<_>>()
    };
    let (commits, closes) = (by_a("commit_objects"), by_a("close_stream"));
    assert!(!commits.is_empty() && !closes.is_empty(), "{entries:?}");
    // SD-ADM-5: the commit waiting on its backoff was outstanding work: the close waited for it.
    assert!(
        commits.iter().max() < closes.iter().min(),
        "the close landed after the retried commit: {entries:?}"
    );
    gw.wait_open("bk").await;
    assert_eq!(gw.bodies("bk").await, acked, "INV-2");
}

// SD-ADM-6: a commit that keeps failing during the drain is retried on the uploader's
// backoff and reported as a commit retry; the drain budget (3 s) cuts it short, so
// drain-support is Abandoned, the node still fences itself (deadline 8 s), and the
// records stay in its WAL for the peer's takeover, which commits them: every
// acknowledged record is read back once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn commits_failing_through_the_drain_leave_the_records_to_takeover() {
    let failing = tempfile::NamedTempFile::new().expect("failing file");
    let timing = [
        "--drain-timeout-sec",
        "3",
        "--shutdown-deadline-sec",
        "8",
        "--shutdown-drain-sec",
        "0",
    ];
    let (mut stack, gw) = failing_commits_on_the_first(failing.path(), &timing, &["cf"]).await;
    let acked: Vec<String> = (0..5).map(|i| format!("cf-{i}")).collect();
    for body in &acked {
        gw.append("cf", &[body]).await;
    }
    stack.nodes[0].term();
    let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    let log = stack.nodes[0].log_text();
    weir_tests::assert_graceful_exit(code, &log);
    // SD-ADM-6: the drain budget cut the commit's retries short: drain-support Abandoned.
    assert_eq!(phase_outcome(&log, "drain-support"), "Abandoned", "{log}");
    // SD-ADM-6: the failed commit was retried on its backoff and reported as a commit retry.
    assert!(
        records(&log, "metadata log unavailable; commit will be retried").len() >= 2,
        "retried on its backoff: {log}"
    );
    assert!(!records(&log, "fenced self").is_empty(), "{log}");
    let node = stack.nodes[0].id.clone();
    let entries = log_entries(&stack).await;
    assert!(
        !entries
            .iter()
            .any(|(_, k, _, p)| k == "commit_objects" && by_node(p, &node)),
        "no commit of the stopping node landed: {entries:?}"
    );
    gw.wait_open("cf").await;
    assert_eq!(owner_of(&gw, "cf").await.as_deref(), Some(stack.nodes[1].id.as_str()));
    // SD-ADM-6: the records stayed in the WAL for the peer's takeover, which committed them.
    assert_eq!(gw.bodies("cf").await, acked, "INV-2: the takeover committed them");
    assert!(
        log_entries(&stack)
            .await
            .iter()
            .any(|(_, k, ..)| k == "complete_takeover"),
        "recovered by takeover"
    );
}

// SD-INT-9, D-7: an append the owner admitted and applied, whose answer is still held
// back when the owner is stopped, ends at teardown as "unknown outcome, cause
// interrupted": HTTP 504 with code `interrupted` and no Retry-After (a 503 would say it
// had no effect). It had: the drain moved the record with its stream.
#[tokio::test(flavor = "multi_thread")]
async fn an_append_unresolved_at_teardown_is_answered_504_interrupted() {
    let (mut stack, gw) = holding_answers_on_the_first("hang").await;
    let appending = {
        let r = gw
            .request(Method::POST, "/v1/streams/held/records")
            .json(&json!({"records": [{"body": "in flight"}]}));
        tokio::spawn(async move { r.send().await })
    };
    wait_for("the append applied", Duration::from_secs(10), || async {
        (!gw.read_all("held").await.is_empty()).then_some(())
    })
    .await;
    stack.nodes[0].term();
    let response = tokio::time::timeout(Duration::from_secs(30), appending)
        .await
        .expect("answered within the shutdown deadline")
        .expect("task")
        .expect("an HTTP answer, not a dropped connection");
    // SD-ADM-7: the append still unacknowledged at teardown ends as unknown outcome (504).
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(response.headers().get("retry-after").is_none(), "not a refusal");
    // SD-INT-9: the forwarded append still unresolved at teardown ends as unknown outcome, cause
    // `interrupted`.
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "interrupted", "{body}");
    stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    gw.wait_open("held").await;
    assert_eq!(
        gw.bodies("held").await,
        ["in flight"],
        "applied once, moved with its stream"
    );
}

// INV-2: an owner reopens a stream's intake after a failed close only once
// the log says the close did not land. Here the close lands but its answer is lost
// (`reply_close_streams=1*drop`), so the owner's next attempt is refused: the stream is
// already closed and handed on. Node 0's view is held back (`view_apply`), as a view
// following a lagging replica is, so only the log can tell it. Before, it reopened
// intake at the refusal and acknowledged an append on a stream no owner would serve.
#[tokio::test(flavor = "multi_thread")]
async fn a_close_refused_after_its_lost_answer_landed_acknowledges_nothing_more() {
    let lag = tempfile::NamedTempFile::new().expect("lag file");
    let lag_path = lag.path().to_path_buf();
    let view_apply = format!("return(err) while exists({})", lag_path.display());
    let mut stack = Stack::start_replicas_with_env(
        1,
        0,
        Backend::FileWal,
        &[],
        &[],
        &[("WEIR_FAILPOINT_REPLY_CLOSE_STREAMS", "1*drop")],
    )
    .await;
    std::fs::remove_file(&lag_path).expect("no lag yet");
    stack.add_node_with_env(
        "streamd-1",
        Backend::FileWal,
        SHORT,
        &[("WEIR_FAILPOINT_VIEW_APPLY", view_apply.as_str())],
    );
    stack.add_node("streamd-2", Backend::FileWal, SHORT);
    for n in &stack.nodes {
        n.wait_ready().await;
    }
    let (stack, gw) = with_streams_on_the_first(stack, &["lc"]).await;
    let mut acked = Vec::new();
    for i in 0..20 {
        let body = format!("lc-{i}");
        gw.append("lc", &[&body]).await;
        acked.push(body);
    }
    stack.wait_committed(0, "lc", 20).await;
    let mut a = stack.nodes[0].client().await;
    std::fs::write(&lag_path, b"").expect("lag node 0's view");
    let b = stack.nodes[1].id.clone();
    let (status, body) = gw
        .send(
            gw.request(Method::POST, "/v1/admin/streams/lc/transfer")
                .json(&json!({"to": b})),
        )
        .await;
    println!("transfer answered {status}: {body}");
    let row = stream_row(&stack, "lc").await;
    assert_ne!(row["owner"]["node"], "streamd-1", "the close landed in the log: {row}");
    let late = a
        .append(weir_proto::streamd::AppendRequest {
            stream: "lc".into(),
            batches: weir_tests::batches::batch(b"late").into(),
            match_next_offset: None,
            transactional_id: None,
        })
        .await;
    println!("an append to node 0 after its close landed: {late:?}");
    if late.is_ok() {
        acked.push("late".into());
    }
    wait_for(
        "node 0 keeps its close unconfirmed",
        Duration::from_secs(30),
        || async {
            stack.nodes[0]
                .log_text()
                .contains("close not confirmed by the metadata log")
                .then_some(())
        },
    )
    .await;
    std::fs::remove_file(&lag_path).expect("lift the lag");
    wait_for("node 0 settles its close", Duration::from_secs(30), || async {
        stack.nodes[0]
            .log_text()
            .contains("unconfirmed close settled")
            .then_some(())
    })
    .await;
    let log = stack.nodes[0].log_text();
    let settled = records(&log, "unconfirmed close settled");
    assert!(
        settled[0]["outcome"].as_str().is_some_and(|o| o.starts_with("Closed")),
        "{settled:?}"
    );
    gw.wait_open("lc").await;
    assert_eq!(owner_of(&gw, "lc").await.as_deref(), Some(b.as_str()));
    assert_eq!(
        gw.bodies("lc").await,
        acked,
        "INV-2: every acknowledged record reads back"
    );
}

/// Data objects the node `node` uploaded that are in the bucket.
async fn objects_of(stack: &Stack, node: &str) -> Vec<String> {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let prefix = object_store::path::Path::from(format!("data/{node}"));
    let listed: Vec<_> = stack
        .s3
        .store()
        .list(Some(&prefix))
        .try_collect()
        .await
        .expect("list the bucket");
    listed.into_iter().map(|m| m.location.to_string()).collect()
}

// SD-ADM-10: the drain retries an upload whose earlier attempt went unanswered with the
// same object key and the same bytes, so a PUT that did land adds no second copy. The
// stopping node holds 10 acknowledged records in its WAL only; its link to the store
// delivers requests and drops every reply (proxy mode DropReplies), with a 2 s request
// timeout (AWS_TIMEOUT). The drain's upload lands in the bucket unanswered, and is
// retried on a new connection; then the link heals. The retry succeeds, the stream is
// committed and moves to the other node, the bucket holds exactly one object of the
// stopping node, and every record reads back once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn sd_adm_10_an_unanswered_upload_is_retried_with_the_same_key_and_bytes() {
    let mut stack = Stack::start_with(0, Backend::FileWal, &[], &[]).await;
    let s3 = Proxy::start(stack.s3.endpoint.trim_start_matches("http://")).await;
    let endpoint = format!("http://{}", s3.addr);
    let timing = [
        "--drain-timeout-sec",
        "30",
        "--shutdown-deadline-sec",
        "40",
        "--shutdown-drain-sec",
        "0",
    ];
    let flags = [&timing[..], WAL_ONLY].concat();
    stack.add_node_with_env(
        "streamd-1",
        Backend::FileWal,
        &flags,
        &[("AWS_ENDPOINT", &endpoint), ("AWS_TIMEOUT", "2s")],
    );
    stack.add_node("streamd-2", Backend::FileWal, &flags);
    for n in &stack.nodes {
        n.wait_ready().await;
    }
    let (mut stack, gw) = with_streams_on_the_first(stack, &["lost"]).await;
    let acked: Vec<String> = (0..10).map(|i| format!("r-{i}")).collect();
    for body in &acked {
        gw.append("lost", &[body]).await;
    }
    assert!(objects_of(&stack, "streamd-1").await.is_empty(), "nothing uploaded yet");
    s3.set(Mode::DropReplies);
    stack.nodes[0].term();
    let landed = wait_for(
        "the drain's upload lands unanswered",
        Duration::from_secs(20),
        || async {
            let objects = objects_of(&stack, "streamd-1").await;
            (!objects.is_empty()).then_some(objects)
        },
    )
    .await;
    let seen = s3.connections();
    wait_for(
        "the upload is retried on a new connection",
        Duration::from_secs(20),
        || async { (s3.connections() > seen).then_some(()) },
    )
    .await;
    s3.set(Mode::Pass);
    let code = stack.nodes[0].wait_exit(Duration::from_secs(60)).await;
    let log = stack.nodes[0].log_text();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(phase_outcome(&log, "drain-support"), "Completed");
    assert_eq!(
        objects_of(&stack, "streamd-1").await,
        landed,
        "SD-ADM-10: the retry rewrote the same object; no second copy"
    );
    gw.wait_open("lost").await;
    assert_eq!(owner_of(&gw, "lost").await.as_deref(), Some(stack.nodes[1].id.as_str()));
    assert_eq!(gw.bodies("lost").await, acked, "every record, once, in order");
}

// SD-REL-9: the release outlives a change of metad leader. Three metad replicas each
// hold a drain-cordon release 1.5 s where it arrives (failpoint `release=sleep(1500)`).
// A streamd moves its stream to the other node and releases its cordon; once the
// release has reached a replica, the leader is killed. Whether the release was at the
// dead leader or at a follower that must forward to it, the stopping node asks the next
// replica within the same bound: the release lands (an uncordon by the node is in the
// log, and its row is not cordoned on the new leader; a second clearing would be
// harmless), the node logs the clearance once, and its stop completes with status 0.
#[tokio::test(flavor = "multi_thread")]
async fn sd_rel_9_the_release_lands_through_the_next_leader_when_the_leader_dies() {
    let metad_env = [("WEIR_FAILPOINT_RELEASE", "sleep(1500)")];
    let timing = [
        "--drain-timeout-sec",
        "20",
        "--shutdown-deadline-sec",
        "30",
        "--shutdown-drain-sec",
        "0",
    ];
    let stack = Stack::start_replicas_with_env(3, 2, Backend::FileWal, &timing, &[], &metad_env).await;
    let (mut stack, gw) = with_streams_on_the_first(stack, &["rel"]).await;
    let a = stack.nodes[0].id.clone();
    gw.append("rel", &["before"]).await;
    stack.nodes[0].term();
    wait_for("the release reaches a replica", Duration::from_secs(20), || async {
        stack
            .metad
            .replicas
            .iter()
            .any(|r| {
                records(&r.log_text(), "failpoint: sleeping")
                    .iter()
                    .any(|f| f["failpoint"] == "release")
            })
            .then_some(())
    })
    .await;
    let leader = stack.metad.wait_leader(&[]).await;
    stack.metad.replicas[leader].kill();
    let code = stack.nodes[0].wait_exit(Duration::from_secs(60)).await;
    let log = stack.nodes[0].log_text();
    assert_eq!(code, Some(0), "{log}");
    // SD-REL-9: the leader died mid-release; the node asked the next one within the same bound, and the
    // release landed.
    assert_eq!(
        records(&log, "cleared shutdown drain cordon before graceful shutdown").len(),
        1,
        "{log}"
    );
    for phase in ["stop-requested", "drain-support", "terminal-teardown"] {
        assert_eq!(phase_outcome(&log, phase), "Completed", "{phase}");
    }
    let next = stack.metad.wait_leader(&[leader]).await;
    let entries = log_entries_of(&stack.metad.replicas[next].client()).await;
    let released = entries
        .iter()
        .filter(|(_, k, c, p)| k == "uncordon" && c["node"] == a.as_str() && c["by"] == "drain" && by_node(p, &a))
        .count();
    // SD-REL-9: the uncordon is in the new leader's log (a second one would be harmless).
    assert!(released >= 1, "the release is in the log: {entries:?}");
    let nodes = stack.metad.replicas[next]
        .http_json("/admin/nodes")
        .await
        .expect("nodes");
    assert_eq!(node_row(&nodes, &a)["cordoned"], false);
    gw.wait_open("rel").await;
    assert_eq!(gw.bodies("rel").await, ["before"]);
}

// SD-INT-6: once a stopping node's intake stops on a stream (as its move begins) the
// node refuses appends and reads of it sent straight to it, at once and retryably
// (`x-weir-draining`), while the close that moves the stream still runs (it sleeps
// 2 s: failpoint `close_stream_held=sleep(2000)`). An
// append through the gateway meanwhile is rerouted and lands on the new owner after the
// hand-off, and every acknowledged record reads back.
#[tokio::test(flavor = "multi_thread")]
async fn sd_int_6_a_draining_node_refuses_appends_and_reads_sent_straight_to_it() {
    let timing = [
        "--drain-timeout-sec",
        "10",
        "--shutdown-deadline-sec",
        "20",
        "--shutdown-drain-sec",
        "0",
    ];
    let flags = [&timing[..], WAL_ONLY].concat();
    let mut stack = Stack::start_with(0, Backend::FileWal, &flags, &[]).await;
    stack.add_node_with_env(
        "streamd-1",
        Backend::FileWal,
        &flags,
        &[("WEIR_FAILPOINT_CLOSE_STREAM_HELD", "sleep(2000)")],
    );
    stack.add_node("streamd-2", Backend::FileWal, &flags);
    for n in &stack.nodes {
        n.wait_ready().await;
    }
    let (mut stack, gw) = with_streams_on_the_first(stack, &["held"]).await;
    gw.append("held", &["before"]).await;
    let mut direct = stack.nodes[0].client().await;
    stack.nodes[0].term();
    // Its intake stops as its move begins: the close that moves it is under way.
    wait_for("the stream's move under way", Duration::from_secs(10), || async {
        (!records(&stack.nodes[0].log_text(), "failpoint: slow close").is_empty()).then_some(())
    })
    .await;
    let appended = direct
        .append(weir_proto::streamd::AppendRequest {
            stream: "held".into(),
            batches: weir_tests::batches::batch(b"direct").into(),
            match_next_offset: None,
            transactional_id: None,
        })
        .await
        .expect_err("an append sent straight to a draining node is refused");
    let read = direct
        .read(weir_proto::streamd::ReadRequest {
            stream: "held".into(),
            offset: 0,
            ..Default::default()
        })
        .await
        .expect_err("a read sent straight to a draining node is refused");
    let log = stack.nodes[0].log_text();
    assert!(
        records(&log, "closed stream for shutdown").is_empty(),
        "refused while the stream's close still ran: {log}"
    );
    // SD-INT-6: both were refused at once and retryably, as draining, so the sender re-routes.
    for (what, status) in [("append", &appended), ("read", &read)] {
        assert_eq!(status.code(), tonic::Code::Unavailable, "{what}: {status:?}");
        assert!(weir_shared::error_code::is_draining(status), "{what}: {status:?}");
    }
    gw.append("held", &["after"]).await;
    let code = stack.nodes[0].wait_exit(Duration::from_secs(30)).await;
    let log = stack.nodes[0].log_text();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(records(&log, "failpoint: slow close").len(), 1, "{log}");
    gw.wait_open("held").await;
    assert_eq!(owner_of(&gw, "held").await.as_deref(), Some(stack.nodes[1].id.as_str()));
    assert_eq!(gw.bodies("held").await, ["before", "after"]);
}
