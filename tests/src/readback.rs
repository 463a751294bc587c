//! Reading streams back over HTTP and comparing them with what was acknowledged, many
//! streams at once: the check behind "every acknowledged record reads back".

use futures::StreamExt;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How many streams are read at once.
const CONCURRENCY: usize = 8;
/// How long a stream may answer 503 (no live owner yet) before the read fails.
const UNAVAILABLE_FOR: Duration = Duration::from_secs(60);

/// Every record body of `stream` over the HTTP API at `gateway` (host:port), page by page.
pub async fn read_bodies(http: &reqwest::Client, gateway: &str, stream: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut next = 0;
    let name = stream.replace('/', "%2F");
    let unavailable_until = Instant::now() + UNAVAILABLE_FOR;
    loop {
        let url = format!("http://{gateway}/v1/streams/{name}/records?seq_num={next}&count=1000");
        let response = http.get(&url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = response.status();
        let body: Value = response.json().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
        // A stream still being placed or recovered answers 503, as it would any client.
        if status == reqwest::StatusCode::SERVICE_UNAVAILABLE && Instant::now() < unavailable_until {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        assert!(status.is_success(), "GET {url}: {status} {body}");
        let records = body["records"]
            .as_array()
            .unwrap_or_else(|| panic!("{stream} at {next}: {body}"));
        out.extend(records.iter().map(|r| r["body"].as_str().expect("body").to_string()));
        next = body["next_seq_num"].as_u64().expect("next_seq_num");
        if next >= body["tail"].as_u64().expect("tail") {
            return out;
        }
    }
}

/// Reads every stream of `expected` through `gateway` and asserts each holds exactly
/// what was acknowledged: every record, once, in order.
pub async fn check_every_record(gateway: &str, expected: &BTreeMap<String, Vec<String>>) {
    let http = crate::http_builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("http client");
    let results: Vec<(String, Vec<String>)> = futures::stream::iter(expected.keys().cloned())
        .map(|stream| {
            let http = http.clone();
            async move {
                let got = read_bodies(&http, gateway, &stream).await;
                (stream, got)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    for (stream, got) in results {
        assert_eq!(
            &got, &expected[&stream],
            "{stream}: every acknowledged record, once, in order"
        );
    }
}
