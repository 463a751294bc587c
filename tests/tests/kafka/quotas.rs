//! Issue 59: client quotas, set and listed with AlterClientQuotas and
//! DescribeClientQuotas (built with kafka-protocol: neither Python client has them),
//! enforced on a real Kafka producer and on HTTP appends.

use super::*;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_tests::kafka_wire::{exchange, sasl_v0};

const RATE: f64 = 1_000_000.0;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn alter(
    addr: &str,
    user: &str,
    secret: &str,
    entity_user: &str,
    key: &str,
    value: f64,
    remove: bool,
) -> (i16, Option<String>) {
    use alter_client_quotas_request::{EntityData, EntryData, OpData};
    let mut c = sasl_v0(addr, user, secret).expect("SASL");
    let req = AlterClientQuotasRequest::default().with_entries(vec![EntryData::default()
        .with_entity(vec![EntityData::default()
            .with_entity_type(s("user"))
            .with_entity_name(Some(s(entity_user)))])
        .with_ops(vec![OpData::default()
            .with_key(s(key))
            .with_value(value)
            .with_remove(remove)])]);
    let resp: AlterClientQuotasResponse = exchange(&mut c, ApiKey::AlterClientQuotas, 1, &req).expect("answered");
    let e = &resp.entries[0];
    (e.error_code, e.error_message.as_ref().map(|m| m.to_string()))
}

/// The quotas DescribeClientQuotas lists for user `name`: (key, value) pairs.
fn describe(addr: &str, user: &str, secret: &str, name: &str) -> (i16, Vec<(String, f64)>) {
    use describe_client_quotas_request::ComponentData;
    let mut c = sasl_v0(addr, user, secret).expect("SASL");
    let req = DescribeClientQuotasRequest::default().with_components(vec![ComponentData::default()
        .with_entity_type(s("user"))
        .with_match_type(0)
        .with_match(Some(s(name)))]);
    let resp: DescribeClientQuotasResponse = exchange(&mut c, ApiKey::DescribeClientQuotas, 1, &req).expect("answered");
    let values = resp
        .entries
        .iter()
        .flatten()
        .flat_map(|e| e.values.iter().map(|v| (v.key.to_string(), v.value)))
        .collect();
    (resp.error_code, values)
}

// Issue 59: a produce quota of 1 MB/s on a user holds a confluent-kafka producer trying
// to send 10 MB/s to 1 MB/s ±20 %, with throttle_time_ms reported (librdkafka's throttle
// callback); the same quota holds an HTTP client appending as fast as it can to 1 MB/s
// ±20 %, refused 429 with Retry-After while it owes. AlterClientQuotas is refused to a
// user without ALTER_CONFIGS on the cluster (CLUSTER_AUTHORIZATION_FAILED) and for an
// unknown quota (INVALID_REQUEST); DescribeClientQuotas lists the quota until it is
// removed.
#[tokio::test(flavor = "multi_thread")]
async fn a_produce_quota_holds_kafka_and_http_clients_to_its_rate() {
    let (stack, mut gw) = kafka_stack(1, &["--auth", "--kafka-allow-plaintext-sasl"]).await;
    let (ops, alice) = ("weir_ops-secret", "weir_alice-secret");
    stack.metad.issue_token("ops", ops, &["admin"]).await;
    stack
        .metad
        .issue_token("alice", alice, &["read", "write", "manage"])
        .await;
    let addr = gw.kafka.clone();
    let (a, o) = (alice.to_string(), ops.to_string());
    tokio::task::spawn_blocking(move || {
        assert_eq!(
            alter(&addr, "alice", &a, "alice", "producer_byte_rate", RATE, false).0,
            31,
            "alice may not set her own quota"
        );
        let (code, why) = alter(&addr, "ops", &o, "alice", "controller_mutation_rate", 1.0, false);
        assert_eq!(code, 42, "{why:?}");
        assert_eq!(alter(&addr, "ops", &o, "alice", "producer_byte_rate", RATE, false).0, 0);
        assert_eq!(
            describe(&addr, "ops", &o, "alice"),
            (0, vec![("producer_byte_rate".to_string(), RATE)])
        );
        assert_eq!(describe(&addr, "alice", &a, "alice").0, 31);
        let mut c = sasl_v0(&addr, "ops", &o).expect("SASL");
        let create = CreateTopicsRequest::default().with_timeout_ms(30_000).with_topics(vec![
            create_topics_request::CreatableTopic::default()
                .with_name(TopicName(s("quota-t")))
                .with_num_partitions(1)
                .with_replication_factor(1),
        ]);
        let created: CreateTopicsResponse = exchange(&mut c, ApiKey::CreateTopics, 7, &create).expect("answered");
        assert_eq!(created.topics[0].error_code, 0, "{created:?}");
    })
    .await
    .expect("quota set");
    gw.token = Some(ops.to_string());
    gw.wait_open("quota-t/0").await;

    let script = format!("{}/clients/quota_producer.py", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .arg(&script)
            .args([gw.kafka.as_str(), "alice", alice, "quota-t", "10", "10000000"])
            .output(),
    )
    .await
    .expect("the producer finishes")
    .expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the producer's JSON report");
    let rate = report["acked_bytes"].as_f64().unwrap() / report["seconds"].as_f64().unwrap();
    assert!(
        (0.8 * RATE..=1.2 * RATE).contains(&rate),
        "a 1 MB/s quota held the producer to {rate:.0} B/s: {report}"
    );
    assert!(
        report["throttles"].as_u64().unwrap() > 0,
        "throttle_time_ms reported: {report}"
    );
    eprintln!("kafka producer under a 1 MB/s quota: {rate:.0} B/s acknowledged ({report})");

    // HTTP: appends of 256 KiB as fast as the quota lets them, following Retry-After.
    gw.token = Some(alice.to_string());
    let (status, body) = gw
        .send(
            gw.request(Method::POST, "/v1/streams")
                .json(&json!({"stream": "quota-http"})),
        )
        .await;
    assert!(status.is_success(), "{body}");
    let payload = json!({"records": [{"body": "h".repeat(256 * 1024)}]}).to_string();
    let started = std::time::Instant::now();
    let (mut accepted, mut refused) = (0usize, 0usize);
    while started.elapsed() < Duration::from_secs(8) {
        let resp = gw
            .request(Method::POST, "/v1/streams/quota-http/records")
            .header("content-type", "application/json")
            .body(payload.clone())
            .send()
            .await
            .expect("answered");
        match resp.status().as_u16() {
            200 => accepted += payload.len(),
            429 => {
                refused += 1;
                let wait: u64 = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .expect("a 429 carries Retry-After in seconds");
                let body: serde_json::Value = resp.json().await.expect("a JSON body");
                assert_eq!(body["error"]["code"], "too_many_requests", "{body}");
                // Measured to the end of the run, not past it.
                let left = Duration::from_secs(8).saturating_sub(started.elapsed());
                tokio::time::sleep(Duration::from_secs(wait).min(left)).await;
            }
            other => panic!("append answered {other}: {}", resp.text().await.unwrap_or_default()),
        }
    }
    let rate = accepted as f64 / started.elapsed().as_secs_f64();
    eprintln!("HTTP appends under a 1 MB/s quota: {rate:.0} B/s accepted, {refused} refused 429");
    assert!(refused > 0, "an HTTP client over its quota is refused 429");
    assert!(
        (0.8 * RATE..=1.2 * RATE).contains(&rate),
        "a 1 MB/s quota held HTTP appends to {rate:.0} B/s ({refused} refused)"
    );

    let (addr, o) = (gw.kafka.clone(), ops.to_string());
    tokio::task::spawn_blocking(move || {
        assert_eq!(alter(&addr, "ops", &o, "alice", "producer_byte_rate", 0.0, true).0, 0);
        assert_eq!(describe(&addr, "ops", &o, "alice"), (0, vec![]));
    })
    .await
    .expect("quota removed");
}
