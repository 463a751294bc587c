//! Black-box tests of gatewayd's HTTP API over real processes: metad, S3, streamd
//! nodes and a gateway on loopback.
// Test tasks end with the test process; the services spawn only on trackers (clippy.toml).
#![allow(clippy::disallowed_methods)]

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use weir_meta::model::{Command, Proposer};
use weir_proto::streamd::CloseStreamRequest;
use weir_shared::ids::NodeId;
use weir_tests::gateway::{Gatewayd, SseReader};
use weir_tests::streamd::{Backend, Stack};
use weir_tests::wait_for;

/// A stack with metad placing streams itself, and one gateway.
async fn stack(nodes: usize, gateway_extra: &[&str]) -> (Stack, Gatewayd) {
    let stack = Stack::start_with(nodes, Backend::FileWal, &[], &[]).await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), gateway_extra);
    gw.wait_ready().await;
    (stack, gw)
}

/// A stack where the test places streams itself, and one gateway.
async fn manual_stack(nodes: usize) -> (Stack, Gatewayd) {
    let stack = Stack::start(nodes, Backend::FileWal, &[]).await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), &[]);
    gw.wait_ready().await;
    (stack, gw)
}

fn bodies(records: &[Value]) -> Vec<String> {
    records
        .iter()
        .map(|r| r["body"].as_str().expect("body").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn append_then_read_back_with_keys_headers_and_base64() {
    let (_stack, gw) = stack(1, &[]).await;
    let created = gw.create_stream("orders").await;
    assert_eq!(created["name"], "orders");
    gw.wait_open("orders").await;

    assert_eq!(gw.append("orders", &["a", "b"]).await, (0, 2));
    let (status, body) = gw
        .send(gw.request(Method::POST, "/v1/streams/orders/records").json(&json!({
            "records": [{"body": "c", "key": "user-1", "headers": [["trace", "t-1"], ["empty", null]], "timestamp": 1700000000000i64}]
        })))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["start_seq_num"], 2);
    // Binary bodies travel as base64.
    let (status, _) = gw
        .send(
            gw.request(Method::POST, "/v1/streams/orders/records?format=base64")
                .json(&json!({"records": [{"body": "AAEC/w=="}]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    let records = gw.read_all("orders").await;
    assert_eq!(records.len(), 4);
    assert_eq!(bodies(&records[..3]), ["a", "b", "c"]);
    let seqs: Vec<u64> = records.iter().map(|r| r["seq_num"].as_u64().expect("seq")).collect();
    assert_eq!(seqs, [0, 1, 2, 3]);
    assert_eq!(records[2]["key"], "user-1");
    assert_eq!(records[2]["headers"], json!([["trace", "t-1"], ["empty", null]]));
    assert_eq!(records[2]["timestamp"], 1700000000000i64);
    let (_, b64) = gw
        .send(gw.request(Method::GET, "/v1/streams/orders/records?seq_num=3&format=base64"))
        .await;
    assert_eq!(b64["records"][0]["body"], "AAEC/w==");

    // Paging: count bounds a read and next_seq_num continues it.
    let (_, page) = gw
        .send(gw.request(Method::GET, "/v1/streams/orders/records?seq_num=1&count=2"))
        .await;
    assert_eq!(bodies(page["records"].as_array().expect("records")), ["b", "c"]);
    assert_eq!(page["next_seq_num"], 3);
    assert_eq!(page["tail"], 4);

    let (_, tail) = gw
        .send(gw.request(Method::GET, "/v1/streams/orders/records/tail"))
        .await;
    assert_eq!(tail["tail"], 4);
    let (_, described) = gw.send(gw.request(Method::GET, "/v1/streams/orders")).await;
    assert_eq!(described["state"], "open");
    assert_eq!(described["tail"], 4);
    assert!(described["owner"]["node"].is_string());

    let (_, listed) = gw.send(gw.request(Method::GET, "/v1/streams?prefix=ord")).await;
    assert_eq!(listed["streams"][0]["name"], "orders");
    assert_eq!(listed["has_more"], false);
}

/// Issue 17 ("reads fill the request"): one read returns records up to its count across
/// any number of data objects and the tail buffer. 60 records each in an object of its
/// own (a 5 KB record passes the 4 KiB upload threshold), then 10 small ones that stay
/// in memory (no upload by time), all come back from one read of count=1000.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_fills_its_count_across_many_objects_and_the_tail_buffer() {
    let flags = ["--upload-bytes", "4096", "--upload-interval-ms", "86400000"];
    let stack = Stack::start_with(1, Backend::FileWal, &flags, &[]).await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), &[]);
    gw.wait_ready().await;
    gw.create_stream("fill").await;
    gw.wait_open("fill").await;
    let big = "b".repeat(5000);
    for _ in 0..60 {
        let (_, end) = gw.append("fill", &[&big]).await;
        wait_for(
            "each big record committed in its own object",
            Duration::from_secs(30),
            || async {
                let (_, d) = gw.send(gw.request(Method::GET, "/v1/streams/fill")).await;
                (d["committed_seq_num"].as_u64() >= Some(end)).then_some(())
            },
        )
        .await;
    }
    for i in 0..10 {
        gw.append("fill", &[&format!("small-{i}")]).await;
    }
    let (_, described) = gw.send(gw.request(Method::GET, "/v1/streams/fill")).await;
    assert_eq!(
        described["committed_seq_num"], 60,
        "the small records are still buffered: {described}"
    );
    let (status, page) = gw
        .send(gw.request(Method::GET, "/v1/streams/fill/records?seq_num=0&count=1000"))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let records = page["records"].as_array().expect("records");
    let seqs: Vec<u64> = records.iter().map(|r| r["seq_num"].as_u64().expect("seq")).collect();
    assert_eq!(
        seqs,
        (0..70).collect::<Vec<u64>>(),
        "one read returns every record in order"
    );
    assert_eq!(page["next_seq_num"], 70);
    assert_eq!(records[69]["body"], "small-9");
}

#[tokio::test(flavor = "multi_thread")]
async fn list_pages_through_streams_in_name_order() {
    let (stack, gw) = stack(1, &[]).await;
    for name in ["a-1", "a-2", "a-3", "b-1"] {
        gw.create_stream(name).await;
    }
    let (_, first) = gw.send(gw.request(Method::GET, "/v1/streams?prefix=a-&limit=2")).await;
    let names: Vec<&str> = first["streams"]
        .as_array()
        .expect("streams")
        .iter()
        .map(|s| s["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["a-1", "a-2"]);
    assert_eq!(first["has_more"], true);
    let (_, second) = gw
        .send(gw.request(Method::GET, "/v1/streams?prefix=a-&limit=2&start_after=a-2"))
        .await;
    assert_eq!(second["streams"][0]["name"], "a-3");
    assert_eq!(second["has_more"], false);

    let (status, _) = gw.send(gw.request(Method::DELETE, "/v1/streams/a-1")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, body) = gw.send(gw.request(Method::GET, "/v1/streams/a-1")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");
    // Its owner stops serving it and destroys its row (FO-TKO: deleted streams are destroyed).
    wait_for("a-1 destroyed", Duration::from_secs(30), || async {
        let state = stack.metad.state_of(0).await?;
        let rows = state["streams"].as_object()?.clone();
        (!rows.values().any(|r| r["name"] == "a-1")).then_some(())
    })
    .await;
}

// Issue 21: a delete whose proposal lands after its caller gave up, once the stream
// was deleted again and recreated, names the stream it meant by id and deletes
// nothing: the new stream keeps what was acknowledged to it. Failpoint
// `late_delete_stream`: metad answers the first delete as if its answer were lost and
// writes it when the test removes a file (a proposal delayed in a paused replica).
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_landing_after_the_stream_was_recreated_deletes_nothing() {
    let late = weir_tests::metad::LateProposal::new("delete_stream");
    let stack = Stack::start_replicas_with_env(1, 1, Backend::FileWal, &[], &[], &late.env()).await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), &[]);
    gw.wait_ready().await;
    gw.create_stream("re").await;
    gw.wait_open("re").await;
    gw.append("re", &["old"]).await;
    let (status, body) = gw.send(gw.request(Method::DELETE, "/v1/streams/re")).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the first delete's answer is lost: {body}"
    );
    let (status, body) = gw.send(gw.request(Method::DELETE, "/v1/streams/re")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "the retry deletes it: {body}");
    wait_for("re destroyed", Duration::from_secs(30), || async {
        let state = stack.metad.state_of(0).await?;
        let rows = state["streams"].as_object()?.clone();
        (!rows.values().any(|r| r["name"] == "re")).then_some(())
    })
    .await;
    gw.create_stream("re").await;
    gw.wait_open("re").await;
    gw.append("re", &["new"]).await;
    let metad = &stack.metad.replicas[0];
    assert!(
        late.land(metad).await,
        "the late delete is refused: {}",
        metad.log_text()
    );
    let (status, row) = gw.send(gw.request(Method::GET, "/v1/streams/re")).await;
    assert_eq!(status, StatusCode::OK, "{row}");
    assert_eq!(row["state"], "open");
    assert_eq!(bodies(&gw.read_all("re").await), ["new"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn long_poll_wakes_on_an_append() {
    let (_stack, gw) = stack(1, &[]).await;
    gw.create_stream("polled").await;
    gw.wait_open("polled").await;
    let gw = Arc::new(gw);
    let reader = {
        let gw = gw.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let (status, body) = gw
                .send(gw.request(Method::GET, "/v1/streams/polled/records?seq_num=0&wait=30"))
                .await;
            (status, body, started.elapsed())
        })
    };
    // The poll is parked at the tail before the append arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.append("polled", &["woke"]).await;
    let (status, body, took) = tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .expect("the long poll answered")
        .expect("reader task");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(bodies(body["records"].as_array().expect("records")), ["woke"]);
    assert!(
        took < Duration::from_secs(25),
        "woke by the append, not the timeout: {took:?}"
    );

    // With nothing to read, a short wait answers empty at the tail.
    let (status, empty) = gw
        .send(gw.request(Method::GET, "/v1/streams/polled/records?seq_num=1&wait=1"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(empty["records"], json!([]));
    assert_eq!(empty["next_seq_num"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn sse_delivers_appends_in_order_and_resumes_from_last_event_id() {
    let (_stack, gw) = stack(1, &[]).await;
    gw.create_stream("events").await;
    gw.wait_open("events").await;
    gw.append("events", &["e0", "e1"]).await;

    let response = gw
        .request(Method::GET, "/v1/streams/events/records?seq_num=0")
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("subscribe");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"]
        .to_str()
        .expect("content type")
        .starts_with("text/event-stream"));
    let mut events = SseReader::new(response);
    let mut seen = Vec::new();
    for i in 0..5u64 {
        if i == 2 {
            // Records appended while subscribed arrive too.
            gw.append("events", &["e2", "e3", "e4"]).await;
        }
        let ev = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("an event in time")
            .expect("the subscription is open");
        assert_eq!(ev.event, "record");
        assert_eq!(ev.id.as_deref(), Some(i.to_string().as_str()));
        let record: Value = serde_json::from_str(&ev.data).expect("record JSON");
        seen.push(record["body"].as_str().expect("body").to_string());
    }
    assert_eq!(seen, ["e0", "e1", "e2", "e3", "e4"]);
    drop(events);

    // Reconnecting with Last-Event-ID resumes right after it.
    gw.append("events", &["e5"]).await;
    let response = gw
        .request(Method::GET, "/v1/streams/events/records")
        .header("accept", "text/event-stream")
        .header("last-event-id", "3")
        .send()
        .await
        .expect("resubscribe");
    let mut events = SseReader::new(response);
    let mut resumed = Vec::new();
    for _ in 0..2 {
        let ev = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("an event in time")
            .expect("open");
        resumed.push((
            ev.id.expect("id"),
            serde_json::from_str::<Value>(&ev.data).expect("json")["body"].clone(),
        ));
    }
    assert_eq!(
        resumed,
        [("4".to_string(), json!("e4")), ("5".to_string(), json!("e5"))]
    );
    // Issue 19: a Last-Event-ID with no next sequence number is a 400, not an overflow.
    for id in [u64::MAX.to_string(), "18446744073709551616".into(), "-1".into()] {
        let (status, body) = gw
            .send(
                gw.request(Method::GET, "/v1/streams/events/records")
                    .header("accept", "text/event-stream")
                    .header("last-event-id", id.as_str()),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{id}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("Last-Event-ID")),
            "{body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_appenders_get_distinct_contiguous_offsets() {
    let (_stack, gw) = stack(1, &[]).await;
    gw.create_stream("shared").await;
    gw.wait_open("shared").await;
    let gw = Arc::new(gw);
    let mut tasks = Vec::new();
    for client in 0..8 {
        let gw = gw.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..25 {
                let n = 1 + (i % 3);
                let names: Vec<String> = (0..n).map(|j| format!("c{client}-{i}-{j}")).collect();
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                let (start, end) = gw.append("shared", &refs).await;
                assert_eq!(end - start, n as u64);
                acked.push((start, end, names));
            }
            acked
        }));
    }
    let mut ranges = Vec::new();
    for t in tasks {
        ranges.extend(t.await.expect("appender"));
    }
    ranges.sort_by_key(|r| r.0);
    let mut expected_start = 0;
    for (start, end, _) in &ranges {
        assert_eq!(*start, expected_start, "ranges are contiguous and disjoint");
        expected_start = *end;
    }
    let records = gw.read_all("shared").await;
    assert_eq!(records.len() as u64, expected_start);
    for (start, _, names) in &ranges {
        for (j, name) in names.iter().enumerate() {
            assert_eq!(records[*start as usize + j]["body"], json!(name));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_append_with_the_same_idempotency_key_is_applied_once_even_after_a_move() {
    let (stack, gw) = manual_stack(2).await;
    stack.create_stream("idem", 0).await;
    gw.wait_open("idem").await;
    let append = |key: &str, body: &str| {
        gw.request(Method::POST, "/v1/streams/idem/records")
            .header("idempotency-key", key)
            .json(&json!({"records": [{"body": body}, {"body": format!("{body}-2")}]}))
    };
    let (status, first) = gw.send(append("k-1", "once")).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (_, retry) = gw.send(append("k-1", "once")).await;
    assert_eq!(retry["start_seq_num"], first["start_seq_num"]);
    assert_eq!(retry["end_seq_num"], first["end_seq_num"]);
    // The key can also be in the body.
    let (_, other) = gw
        .send(
            gw.request(Method::POST, "/v1/streams/idem/records")
                .json(&json!({"records": [{"body": "next"}], "idempotency_key": "k-2"})),
        )
        .await;
    assert_eq!(other["start_seq_num"], 2);

    // Move the stream: the new owner rebuilds the keys from the stored batches.
    let owner = owner_index(&stack, &gw, "idem").await;
    let mut client = stack.nodes[owner].client().await;
    client
        .close_stream(CloseStreamRequest {
            stream: "idem".into(),
            timeout_ms: 0,
        })
        .await
        .expect("close");
    let moved_to = 1 - owner;
    place(&stack, "idem", moved_to).await;
    wait_for("idem moved", Duration::from_secs(30), || async {
        (owner_index(&stack, &gw, "idem").await == moved_to).then_some(())
    })
    .await;
    let (status, after_move) = gw.send(append("k-1", "once")).await;
    assert_eq!(status, StatusCode::OK, "{after_move}");
    assert_eq!(after_move["start_seq_num"], first["start_seq_num"]);
    let records = gw.read_all("idem").await;
    assert_eq!(bodies(&records), ["once", "once-2", "next"]);
}

/// The index of the stack node that owns `stream` as the gateway describes it.
async fn owner_index(stack: &Stack, gw: &Gatewayd, stream: &str) -> usize {
    let (_, d) = gw.send(gw.request(Method::GET, &format!("/v1/streams/{stream}"))).await;
    let node = d["owner"]["node"].as_str().unwrap_or_default().to_string();
    if d["state"] != "open" {
        return usize::MAX;
    }
    stack.nodes.iter().position(|n| n.id == node).unwrap_or(usize::MAX)
}

async fn place(stack: &Stack, stream: &str, on: usize) {
    let client = stack.metad.client();
    let id = wait_for("closed stream row", Duration::from_secs(20), || async {
        let state = stack.metad.state_of(0).await?;
        let row = state["streams"]
            .as_object()?
            .values()
            .find(|r| r["name"] == stream && r["state"] == "closed")?
            .clone();
        row["id"].as_u64()
    })
    .await;
    let op = Proposer::Operator {
        principal: "test".into(),
    };
    let (_, outcome) = client
        .propose(
            &op,
            Command::PlaceStream {
                stream: weir_shared::ids::StreamId(id),
                node: NodeId::new(stack.nodes[on].id.clone()),
            },
        )
        .await
        .expect("place");
    outcome.expect("placed");
}

/// Routing follows ownership: appenders run while the stream moves between nodes, and
/// every acknowledged record is read back exactly once, in acknowledgement order.
#[tokio::test(flavor = "multi_thread")]
async fn appends_follow_the_stream_while_it_moves_and_nothing_acknowledged_is_lost() {
    let (stack, gw) = manual_stack(2).await;
    stack.create_stream("moving", 0).await;
    gw.wait_open("moving").await;
    let gw = Arc::new(gw);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (gw, stop) = (gw.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut acked: Vec<(u64, String)> = Vec::new();
            let mut unknown = Vec::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let body = format!("w{w}-{i}");
                i += 1;
                let r = gw
                    .request(Method::POST, "/v1/streams/moving/records")
                    .json(&json!({"records": [{"body": body}]}))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == StatusCode::OK => {
                        let v: Value = r.json().await.expect("json");
                        acked.push((v["start_seq_num"].as_u64().expect("seq"), body));
                    }
                    // Refused before anything was applied: retryable 503.
                    Ok(r) if r.status() == StatusCode::SERVICE_UNAVAILABLE => {
                        assert!(r.headers().contains_key("retry-after"));
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    // May have been applied (D-7): 504 `interrupted`.
                    Ok(r) if r.status() == StatusCode::GATEWAY_TIMEOUT => {
                        let v: Value = r.json().await.unwrap_or(Value::Null);
                        assert_eq!(v["error"]["code"], "interrupted", "{v}");
                        unknown.push(body);
                    }
                    Ok(r) => panic!("unexpected status {}", r.status()),
                    Err(_) => unknown.push(body),
                }
            }
            (acked, unknown)
        }));
    }
    // Three moves, back and forth, while the writers run.
    for m in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let from = owner_index(&stack, &gw, "moving").await;
        assert!(from < 2, "the stream has an owner before move {m}");
        let mut client = stack.nodes[from].client().await;
        client
            .close_stream(CloseStreamRequest {
                stream: "moving".into(),
                timeout_ms: 0,
            })
            .await
            .expect("close");
        place(&stack, "moving", 1 - from).await;
        wait_for("moved", Duration::from_secs(30), || async {
            (owner_index(&stack, &gw, "moving").await == 1 - from).then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked = Vec::new();
    let mut unknown = HashSet::new();
    for w in writers {
        let (a, u) = w.await.expect("writer");
        // Each writer's acknowledgements come in offset order.
        assert!(a.windows(2).all(|p| p[0].0 < p[1].0), "per-writer order");
        acked.extend(a);
        unknown.extend(u);
    }
    assert!(acked.len() > 20, "writers made progress: {}", acked.len());
    let records = gw.read_all("moving").await;
    let mut seen = HashSet::new();
    for r in &records {
        let body = r["body"].as_str().expect("body").to_string();
        assert!(seen.insert(body.clone()), "{body} read twice");
    }
    for (seq, body) in &acked {
        assert_eq!(
            records[*seq as usize]["body"],
            json!(body),
            "acknowledged record at {seq}"
        );
    }
    for body in &seen {
        assert!(
            acked.iter().any(|(_, b)| b == body) || unknown.contains(body),
            "{body} was read back but never appended"
        );
    }
}

/// FO-TKO-11, FO-TKO-12: a stream without a live owner is a retryable 503, never 404.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_without_a_live_owner_is_a_retryable_503() {
    // metad does not place streams here, so a created stream stays ownerless.
    let stack = Stack::start(1, Backend::FileWal, &[]).await;
    let gw = Gatewayd::start(
        "gw-1",
        &stack.metad.replicas[0].grpc,
        stack.dir.path(),
        &["--route-retry-ms", "300"],
    );
    gw.wait_ready().await;
    gw.create_stream("unplaced").await;
    let r = gw
        .request(Method::POST, "/v1/streams/unplaced/records")
        .json(&json!({"records": [{"body": "x"}]}))
        .send()
        .await
        .expect("sent");
    // FO-TKO-12: an append to a stream no node has opened (as between a close and the
    // next placement) gets a retryable 503, never a 404.
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "unavailable");
    let (status, _) = gw
        .send(gw.request(Method::GET, "/v1/streams/unplaced/records?seq_num=0"))
        .await;
    // FO-TKO-12: and so does a read.
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

/// FO-MDO-1, FO-MDO-3, FO-MDO-5: with the metadata quorum gone the gateway keeps
/// routing by its last view, and metadata changes are refused with a retryable 503.
#[tokio::test(flavor = "multi_thread")]
async fn during_a_metadata_outage_data_keeps_flowing_and_changes_are_refused() {
    let (mut stack, gw) = stack(1, &[]).await;
    gw.create_stream("steady").await;
    gw.wait_open("steady").await;
    gw.append("steady", &["before"]).await;
    stack.metad.replicas[0].kill();

    // FO-MDO-1: with metad gone, an append is acknowledged through the last view,
    assert_eq!(gw.append("steady", &["during"]).await, (1, 2));
    let records = gw.read_all("steady").await;
    // FO-MDO-1: and reads return it.
    assert_eq!(bodies(&records), ["before", "during"]);
    let (status, body) = gw
        .send(
            gw.request(Method::POST, "/v1/streams")
                .json(&json!({"stream": "new-one"})),
        )
        .await;
    // FO-MDO-3: a stream create, a metadata change, is refused with a retryable 503
    // `unavailable`.
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "unavailable");
}

/// RR-FEN-3, OBS-2: a gateway started while metad is away registers once metad is
/// back; until then it answers at once, alive and not ready, every API request gets a
/// 503 with a JSON error and a Kafka connection is closed, rather than leaving clients
/// and probes in the accept queue.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_registering_answers_probes_and_requests_at_once() {
    let (stack, _gw) = stack(1, &[]).await;
    for r in &stack.metad.replicas {
        r.pause();
    }
    let late = Gatewayd::start("gw-late", &stack.metad.replicas[0].grpc, stack.dir.path(), &[]);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let status = |path: &'static str| {
        let req = http.get(late.url(path));
        async move { req.send().await.ok().map(|r| r.status()) }
    };
    // OBS-2, RR-FEN-3: before it is admitted, the gateway is live: `/livez` 200.
    wait_for(
        "the registering gateway answers /livez",
        Duration::from_secs(30),
        || async { (status("/livez").await == Some(StatusCode::OK)).then_some(()) },
    )
    .await;
    // RR-FEN-3: but not ready,
    assert_eq!(status("/readyz").await, Some(StatusCode::SERVICE_UNAVAILABLE));
    let (code, body) = late.send(late.request(Method::GET, "/v1/streams")).await;
    // RR-FEN-3: and an API request gets a retryable 503.
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    let mut kafka = weir_tests::kafka_wire::connect(&late.kafka);
    assert!(
        weir_tests::kafka_wire::closed_by_peer(&mut kafka),
        "a Kafka connection is closed at once, not left waiting"
    );
    for r in &stack.metad.replicas {
        r.resume();
    }
    late.wait_ready().await;
    let (code, body) = late.send(late.request(Method::GET, "/v1/streams")).await;
    assert_eq!(code, StatusCode::OK, "registered, it serves the API: {body}");
}

/// Bad inputs, each with its documented status and code; none changes anything.
#[tokio::test(flavor = "multi_thread")]
async fn bad_inputs_get_their_documented_status_and_code() {
    let (_stack, gw) = stack(1, &["--max-body-bytes", "4096"]).await;
    gw.create_stream("valid").await;
    gw.wait_open("valid").await;
    gw.append("valid", &["only"]).await;
    let big = "x".repeat(8192);
    let json_post = |path: &str, body: Value| gw.request(Method::POST, path).json(&body);
    let cases: Vec<(&str, reqwest::RequestBuilder, StatusCode, &str)> = vec![
        (
            "invalid stream name",
            json_post("/v1/streams", json!({"stream": "bad name!"})),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "existing stream",
            json_post("/v1/streams", json!({"stream": "valid"})),
            StatusCode::CONFLICT,
            "conflict",
        ),
        (
            "unknown field in create",
            json_post("/v1/streams", json!({"stream": "x", "colour": "red"})),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "malformed JSON",
            gw.request(Method::POST, "/v1/streams/valid/records")
                .header("content-type", "application/json")
                .body("{\"records\": [}"),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "body that is not JSON",
            gw.request(Method::POST, "/v1/streams/valid/records").body("plain"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_argument",
        ),
        (
            "body over the limit",
            json_post("/v1/streams/valid/records", json!({"records": [{"body": big}]})),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
        ),
        (
            "no records",
            json_post("/v1/streams/valid/records", json!({"records": []})),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "bad base64",
            json_post(
                "/v1/streams/valid/records?format=base64",
                json!({"records": [{"body": "!!"}]}),
            ),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "unknown format",
            gw.request(Method::GET, "/v1/streams/valid/records?format=hex"),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "append to a missing stream",
            json_post("/v1/streams/missing/records", json!({"records": [{"body": "x"}]})),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "match_seq_num mismatch",
            json_post(
                "/v1/streams/valid/records",
                json!({"records": [{"body": "x"}], "match_seq_num": 7}),
            ),
            StatusCode::CONFLICT,
            "conflict",
        ),
        (
            "read past the tail",
            gw.request(Method::GET, "/v1/streams/valid/records?seq_num=99"),
            StatusCode::RANGE_NOT_SATISFIABLE,
            "invalid_argument",
        ),
        (
            "unknown query parameter",
            gw.request(Method::GET, "/v1/streams/valid/records?seqnum=0"),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "negative seq_num",
            gw.request(Method::GET, "/v1/streams/valid/records?seq_num=-1"),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "count out of range",
            gw.request(Method::GET, "/v1/streams/valid/records?count=0"),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "wait too long",
            gw.request(Method::GET, "/v1/streams/valid/records?wait=3600"),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "read a missing stream",
            gw.request(Method::GET, "/v1/streams/missing/records"),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "unknown endpoint",
            gw.request(Method::GET, "/v1/nothing-here"),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "wrong method",
            gw.request(Method::PUT, "/v1/streams"),
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_argument",
        ),
        (
            "unknown token scope",
            json_post("/v1/admin/tokens", json!({"name": "t", "scopes": ["root"]})),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "delete a missing stream",
            gw.request(Method::DELETE, "/v1/streams/missing"),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
    ];
    for (what, request, status, code) in cases {
        let r = request.send().await.unwrap_or_else(|e| panic!("{what}: {e}"));
        let got = r.status();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(got, status, "{what}: {body}");
        assert_eq!(body["error"]["code"], code, "{what}: {body}");
        assert!(
            body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what} has a message"
        );
    }
    // Nothing half-applied: the stream holds exactly what was acknowledged.
    assert_eq!(bodies(&gw.read_all("valid").await), ["only"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_auth_every_request_needs_a_live_token() {
    let (stack, mut gw) = stack(1, &["--auth"]).await;
    // The first admin token comes from an operator through metad (as `weir tokens issue`).
    let secret = "weir_test-admin-secret";
    stack.metad.issue_token("root", secret, &["admin"]).await;

    let (status, body) = gw.send(gw.request(Method::GET, "/v1/streams")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "unauthorized");
    gw.token = Some("weir_wrong".into());
    let (status, _) = gw.send(gw.request(Method::GET, "/v1/streams")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Health endpoints stay open.
    let (status, _) = gw.send(gw.request(Method::GET, "/ready")).await;
    assert_eq!(status, StatusCode::OK);

    gw.token = Some(secret.into());
    wait_for("root token known", Duration::from_secs(10), || async {
        let (s, _) = gw.send(gw.request(Method::GET, "/v1/streams")).await;
        (s == StatusCode::OK).then_some(())
    })
    .await;
    let (status, issued) = gw
        .send(
            gw.request(Method::POST, "/v1/admin/tokens")
                .json(&json!({"name": "app"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{issued}");
    let app = issued["token"].as_str().expect("secret").to_string();

    gw.token = Some(app.clone());
    let (status, _) = gw.send(gw.request(Method::GET, "/v1/streams")).await;
    assert_eq!(status, StatusCode::OK, "a data token reads");
    let (status, body) = gw.send(gw.request(Method::GET, "/v1/admin/tokens")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized");

    gw.token = Some(secret.into());
    let (status, _) = gw.send(gw.request(Method::DELETE, "/v1/admin/tokens/app")).await;
    assert_eq!(status, StatusCode::OK);
    gw.token = Some(app);
    let (status, body) = gw.send(gw.request(Method::GET, "/v1/streams")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a revoked token is refused at once");
    assert!(body["error"]["message"].as_str().expect("message").contains("revoked"));
}

// Issue 18: a token issued with `ttl_sec` authenticates until then and is refused
// after, saying it expired; a bad `ttl_sec` is a 400 naming it.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_stops_authenticating_when_it_expires() {
    let (stack, mut gw) = stack(1, &["--auth"]).await;
    let secret = "weir_test-admin-secret";
    stack.metad.issue_token("root", secret, &["admin"]).await;
    gw.token = Some(secret.into());
    wait_for("root token known", Duration::from_secs(10), || async {
        let (s, _) = gw.send(gw.request(Method::GET, "/v1/streams")).await;
        (s == StatusCode::OK).then_some(())
    })
    .await;
    for bad in [json!(0), json!(-1), json!("soon"), json!(400_000_000u64)] {
        let (status, body) = gw
            .send(
                gw.request(Method::POST, "/v1/admin/tokens")
                    .json(&json!({"name": "bad", "ttl_sec": bad})),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "ttl_sec {bad}: {body}");
        assert!(
            body["error"]["message"].as_str().is_some_and(|m| m.contains("ttl_sec")),
            "{body}"
        );
    }
    let (status, issued) = gw
        .send(
            gw.request(Method::POST, "/v1/admin/tokens")
                .json(&json!({"name": "brief", "ttl_sec": 3})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{issued}");
    let expires_at = issued["expires_at_ms"].as_u64().expect("expiry");
    let (_, listed) = gw.send(gw.request(Method::GET, "/v1/admin/tokens")).await;
    let row = listed["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .find(|t| t["name"] == "brief")
        .cloned()
        .expect("listed");
    assert_eq!(row["expires_at_ms"], expires_at, "{row}");

    gw.token = Some(issued["token"].as_str().expect("secret").into());
    let (status, body) = gw.send(gw.request(Method::GET, "/v1/streams")).await;
    assert_eq!(status, StatusCode::OK, "before its expiry: {body}");
    let body = wait_for("the token refused", Duration::from_secs(10), || async {
        let (s, body) = gw.send(gw.request(Method::GET, "/v1/streams")).await;
        (s == StatusCode::UNAUTHORIZED).then_some(body)
    })
    .await;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    assert!(now_ms >= expires_at, "refused {} ms early", expires_at - now_ms);
    assert!(
        body["error"]["message"].as_str().is_some_and(|m| m.contains("expired")),
        "{body}"
    );
}

/// OBS-2, OBS-3, OBS-4: readiness as JSON, liveness, and Prometheus metrics.
#[tokio::test(flavor = "multi_thread")]
async fn health_readiness_and_metrics() {
    let (_stack, gw) = stack(1, &[]).await;
    let (status, ready) = gw.send(gw.request(Method::GET, "/ready")).await;
    assert_eq!(status, StatusCode::OK);
    // OBS-4: `/ready` is JSON with `ready`, `fenced`, `terminating`, the node ID and its
    // epoch (this assertion and the five below).
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["caught_up"], true);
    assert_eq!(ready["fenced"], false);
    assert_eq!(ready["terminating"], false);
    assert_eq!(ready["node_id"], "gw-1");
    assert!(ready["epoch"].as_u64().is_some());
    let live = gw.request(Method::GET, "/livez").send().await.expect("livez");
    // OBS-2: `/livez` answers 200 while the process is alive.
    assert_eq!(live.status(), StatusCode::OK);
    let (_, nodes) = gw.send(gw.request(Method::GET, "/admin/nodes")).await;
    assert!(nodes.to_string().contains("gw-1"), "{nodes}");
    let (status, openapi) = gw.send(gw.request(Method::GET, "/v1/openapi.json")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(openapi["openapi"], "3.0.3");

    gw.create_stream("m").await;
    gw.wait_open("m").await;
    gw.append("m", &["x"]).await;
    let metrics = weir_tests::get_text(&gw.url("/metrics")).await;
    assert!(
        metrics.contains("weir_gatewayd_appends_total{result=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains(
        "weir_gatewayd_http_requests_total{method=\"POST\",route=\"/v1/streams/{name}/records\",status=\"200\"}"
    ));
}

/// SIGTERM stops a gateway cleanly with exit 0.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_the_gateway_cleanly() {
    let (_stack, mut gw) = stack(1, &[]).await;
    gw.proc().term();
    assert_eq!(gw.proc().wait_exit(Duration::from_secs(30)).await, Some(0));
}

/// Makes stream `name` (three records, one range, committed) damaged on disk and served
/// by node 1, so reads go to the damaged object. Returns each damaged object's path
/// and its original bytes, to restore them.
async fn damaged_stream(stack: &Stack, gw: &Gatewayd, name: &str) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let id = stack.create_stream(name, 0).await;
    gw.append(name, &["d0", "d1", "d2"]).await;
    let mut owner = stack.nodes[0].client().await;
    owner
        .close_stream(CloseStreamRequest {
            stream: name.into(),
            timeout_ms: 0,
        })
        .await
        .expect("close");
    let mut originals = Vec::new();
    for path in weir_tests::files_under(&stack.s3.dir.path().join(weir_tests::s3::BUCKET).join("data")) {
        if path.extension().is_some_and(|e| e == "wdo") {
            let data = std::fs::read(&path).expect("object");
            let mut damaged = data.clone();
            damaged[20] ^= 0xff;
            std::fs::write(&path, damaged).expect("rewrite");
            originals.push((path, data));
        }
    }
    assert!(!originals.is_empty(), "no data object to damage");
    stack.place(id, 1).await;
    stack.wait_serving(name, 1).await;
    originals
}

/// Issue 20, defect 5: damaged data ends an SSE subscription with an `error` event
/// (naming the object), instead of retrying every 200 ms forever.
#[tokio::test(flavor = "multi_thread")]
async fn sse_over_damaged_data_ends_with_an_error_event() {
    let (stack, gw) = manual_stack(2).await;
    damaged_stream(&stack, &gw, "damaged").await;
    let response = gw
        .request(Method::GET, "/v1/streams/damaged/records?seq_num=0")
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("subscribe");
    assert_eq!(response.status(), StatusCode::OK);
    let mut events = SseReader::new(response);
    let ev = tokio::time::timeout(Duration::from_secs(30), events.next())
        .await
        .expect("an event in time")
        .expect("an error event before the end");
    assert_eq!(ev.event, "error", "{ev:?}");
    let data: Value = serde_json::from_str(&ev.data).expect("json");
    assert_eq!(data["error"]["code"], "internal", "{data}");
    assert!(
        data["error"]["message"].as_str().is_some_and(|m| m.contains(".wdo")),
        "the error names the object: {data}"
    );
    let end = tokio::time::timeout(Duration::from_secs(30), events.next())
        .await
        .expect("the subscription ends");
    assert!(end.is_none(), "the subscription went on: {end:?}");
}

/// Runs the `weir` CLI against the stack's metad; its exit status and output.
fn weir(stack: &Stack, args: &[&str]) -> (bool, String) {
    let mut all = vec!["--metad", stack.metad.replicas[0].grpc.as_str()];
    all.extend(args);
    weir_tests::tls::weir_outcome(&all, &[])
}

/// Issue 20, defect 5: damage found on read is reported to the metadata log, marked on
/// the stream, counted, shown in the owner's `/ready` and by `weir streams damaged`, and
/// refused at once, until the operator acts. `weir streams repair --restored` after the
/// object is put back serves the records again; `--trim-past` moves the start past the
/// damage. Neither leaves a hole above the start, and both are in the metadata log.
#[tokio::test(flavor = "multi_thread")]
async fn damage_is_marked_listed_and_repaired_by_the_operator() {
    let (stack, gw) = manual_stack(2).await;
    let originals = damaged_stream(&stack, &gw, "hurt").await;
    let read = || gw.send(gw.request(Method::GET, "/v1/streams/hurt/records?seq_num=0"));
    let (status, body) = read().await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["error"]["code"], "internal", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("corrupt data")),
        "{body}"
    );
    let metad = stack.metad.client();
    let damage = wait_for("the damage marked", Duration::from_secs(20), || async {
        let v = metad.admin("streams", 0, 0).await.ok()?;
        let row = weir_tests::stream_named(&v, "hurt")?;
        (!row["damage"].is_null()).then_some(row["damage"].clone())
    })
    .await;
    assert_eq!(
        (damage["from"].as_u64(), damage["until"].as_u64()),
        (Some(0), Some(3)),
        "{damage}"
    );
    assert!(damage["what"].as_str().is_some_and(|w| w.contains(".wdo")), "{damage}");
    // Now refused at once, naming the marked damage and the remedy.
    let (_, body) = read().await;
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("weir streams repair")),
        "{body}"
    );
    let (ok, listed) = weir(&stack, &["streams", "damaged"]);
    assert!(ok && listed.contains("hurt") && listed.contains("0..3"), "{listed}");
    let ready: Value = weir_tests::http_get(format!("http://{}/ready", stack.nodes[1].http))
        .await
        .expect("ready")
        .json()
        .await
        .expect("json");
    assert_eq!(ready["damaged_streams"], json!(["hurt"]), "{ready}");
    let metrics = weir_tests::http_get(format!("http://{}/metrics", stack.nodes[1].http))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("weir_streamd_damaged_streams 1"), "{metrics}");
    assert!(metrics.contains("weir_streamd_damage_found_total 1"), "{metrics}");

    // The operator puts the object back: the records are served again.
    for (path, data) in &originals {
        std::fs::write(path, data).expect("restore");
    }
    let (ok, out) = weir(&stack, &["streams", "repair", "hurt", "--restored"]);
    assert!(ok, "{out}");
    let records = wait_for("the restored records served", Duration::from_secs(20), || async {
        let (status, body) = read().await;
        (status == StatusCode::OK).then(|| bodies(body["records"].as_array().expect("records")))
    })
    .await;
    assert_eq!(records, ["d0", "d1", "d2"]);
    let (ok, listed) = weir(&stack, &["streams", "damaged"]);
    assert!(ok && !listed.contains("hurt"), "{listed}");

    // Another damaged stream is trimmed past instead: its start moves past the damage.
    damaged_stream(&stack, &gw, "cut").await;
    let (status, _) = gw
        .send(gw.request(Method::GET, "/v1/streams/cut/records?seq_num=0"))
        .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    wait_for("the damage marked", Duration::from_secs(20), || async {
        let v = metad.admin("streams", 0, 0).await.ok()?;
        let row = weir_tests::stream_named(&v, "cut")?;
        (!row["damage"].is_null()).then_some(())
    })
    .await;
    let (ok, out) = weir(&stack, &["streams", "repair", "cut", "--trim-past"]);
    assert!(ok, "{out}");
    wait_for("the start moved past the damage", Duration::from_secs(20), || async {
        let (_, described) = gw.send(gw.request(Method::GET, "/v1/streams/cut")).await;
        (described["start_seq_num"] == 3).then_some(())
    })
    .await;
    let (ok, listed) = weir(&stack, &["streams", "damaged"]);
    assert!(ok && !listed.contains("cut"), "{listed}");
    let log = metad.admin("log", 0, 100_000).await.expect("log").to_string();
    assert!(
        log.contains("report_damage") && log.contains("resolve_damage"),
        "the audit trail is in the log"
    );
}

// Issue 18: a token's scopes and their name prefixes limit what it may do over HTTP.
// `read:orders-` reads (and lists) only streams starting `orders-`; without `write` it
// cannot append, without `manage` it cannot create, trim or delete; a bad scope is
// refused when the token is issued; a token without scopes keeps full data access but
// no admin endpoints.
#[tokio::test(flavor = "multi_thread")]
async fn a_tokens_scopes_and_prefixes_limit_what_it_may_do() {
    let (stack, mut gw) = stack(1, &["--auth"]).await;
    let root = "weir_scopes-root";
    stack.metad.issue_token("root", root, &["admin"]).await;
    gw.token = Some(root.into());
    wait_for("root token known", Duration::from_secs(10), || async {
        let (s, _) = gw.send(gw.request(Method::GET, "/v1/streams")).await;
        (s == StatusCode::OK).then_some(())
    })
    .await;
    let (status, body) = gw
        .send(
            gw.request(Method::POST, "/v1/admin/tokens")
                .json(&json!({"name": "bad", "scopes": ["admin:x"]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let gw_ref = &gw;
    let issue = |name: &'static str, scopes: Value| async move {
        let req = gw_ref
            .request(Method::POST, "/v1/admin/tokens")
            .json(&json!({"name": name, "scopes": scopes}));
        let (status, body) = gw_ref.send(req).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["token"].as_str().expect("secret").to_string()
    };
    let reader = issue("reader", json!(["read:orders-"])).await;
    let writer = issue("writer", json!(["read:orders-", "write:orders-"])).await;
    let legacy = issue("legacy", json!([])).await;
    for s in ["orders-eu", "payments"] {
        gw.create_stream(s).await;
        gw.wait_open(s).await;
    }
    gw.append("orders-eu", &["o1"]).await;
    gw.append("payments", &["p1"]).await;

    // A client of its own: the gateway's carries the root token.
    let client = weir_tests::http();
    let as_token = |secret: &str, method: Method, path: &str| client.request(method, gw.url(path)).bearer_auth(secret);
    let forbidden = |status: StatusCode, body: &Value, want: &str| {
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        assert!(
            body["error"]["message"].as_str().is_some_and(|m| m.contains(want)),
            "{body}"
        );
    };
    // Reading: only what the prefix covers, and the list shows only that.
    let (status, body) = gw
        .send(as_token(
            &reader,
            Method::GET,
            "/v1/streams/orders-eu/records?seq_num=0",
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["records"][0]["body"], "o1");
    let (status, body) = gw
        .send(as_token(&reader, Method::GET, "/v1/streams/payments/records?seq_num=0"))
        .await;
    forbidden(status, &body, "user 'reader' may not read stream 'payments'");
    let (status, body) = gw.send(as_token(&reader, Method::GET, "/v1/streams/payments")).await;
    forbidden(status, &body, "may not describe stream 'payments'");
    let (_, listed) = gw.send(as_token(&reader, Method::GET, "/v1/streams")).await;
    let names: Vec<&str> = listed["streams"]
        .as_array()
        .expect("streams")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["orders-eu"], "{listed}");
    // Appending needs `write` on the name.
    let append = |secret: &str, stream: &str| {
        as_token(secret, Method::POST, &format!("/v1/streams/{stream}/records"))
            .json(&json!({"records": [{"body": "x"}]}))
    };
    let (status, body) = gw.send(append(&reader, "orders-eu")).await;
    forbidden(status, &body, "may not write stream 'orders-eu'");
    let (status, body) = gw.send(append(&writer, "orders-eu")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = gw.send(append(&writer, "payments")).await;
    forbidden(status, &body, "may not write stream 'payments'");
    // Creating, trimming and deleting need `manage`; admin endpoints need `admin`.
    let (status, body) = gw
        .send(as_token(&writer, Method::POST, "/v1/streams").json(&json!({"stream": "orders-new"})))
        .await;
    forbidden(status, &body, "may not create stream 'orders-new'");
    let (status, body) = gw
        .send(as_token(&writer, Method::POST, "/v1/streams/orders-eu/trim").json(&json!({"seq_num": 1})))
        .await;
    forbidden(status, &body, "may not delete stream 'orders-eu'");
    let (status, body) = gw
        .send(as_token(&writer, Method::DELETE, "/v1/streams/orders-eu"))
        .await;
    forbidden(status, &body, "may not delete stream 'orders-eu'");
    let (status, _) = gw.send(as_token(&legacy, Method::GET, "/v1/admin/tokens")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // A token without scopes reads, writes and manages everything, as before scopes.
    let (status, body) = gw.send(append(&legacy, "payments")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = gw
        .send(as_token(&legacy, Method::POST, "/v1/streams").json(&json!({"stream": "legacy-made"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}
