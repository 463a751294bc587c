//! `weir dev`: the README's first command runs metad, streamd and gatewayd on local
//! disk, and the README's curl flow works against it.

use reqwest::{Method, StatusCode};
use serde_json::json;
use std::process::Command;
use std::time::Duration;
use weir_tests::process::Proc;
use weir_tests::{bin_path, free_port, wait_for};

#[tokio::test(flavor = "multi_thread")]
async fn weir_dev_serves_http_and_kafka_on_local_disk_and_stops_cleanly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let http = format!("127.0.0.1:{}", free_port());
    let kafka = format!("127.0.0.1:{}", free_port());
    let mut command = Command::new(bin_path("weir"));
    command
        .arg("dev")
        .args(["--data-dir", &dir.path().join("data").display().to_string()]);
    for (flag, port) in [
        ("--http-listen", http.clone()),
        ("--kafka-listen", kafka.clone()),
        ("--metad-listen", format!("127.0.0.1:{}", free_port())),
        ("--metad-http-listen", format!("127.0.0.1:{}", free_port())),
        ("--streamd-listen", format!("127.0.0.1:{}", free_port())),
        ("--streamd-http-listen", format!("127.0.0.1:{}", free_port())),
    ] {
        command.args([flag, &port]);
    }
    let mut proc = Proc::new("weir-dev", dir.path().join("dev.log"));
    proc.spawn(command);
    let client = weir_tests::http();
    let url = |p: &str| format!("http://{http}{p}");
    wait_for("weir dev ready", Duration::from_secs(60), || async {
        let r = client.get(url("/readyz")).send().await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;

    // The README's flow: create, append, read.
    let r = client
        .post(url("/v1/streams"))
        .json(&json!({"stream": "hello"}))
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), StatusCode::CREATED);
    let appended = wait_for("append accepted", Duration::from_secs(30), || async {
        let r = client
            .request(Method::POST, url("/v1/streams/hello/records"))
            .json(&json!({"records": [{"body": "hello, weir"}]}))
            .send()
            .await
            .ok()?;
        (r.status() == StatusCode::OK).then_some(r.json::<serde_json::Value>().await.ok()?)
    })
    .await;
    assert_eq!(appended["start_seq_num"], 0);
    let read: serde_json::Value = client
        .get(url("/v1/streams/hello/records?seq_num=0"))
        .send()
        .await
        .expect("read")
        .json()
        .await
        .expect("json");
    assert_eq!(read["records"][0]["body"], "hello, weir");
    // Issue 62: the gateway called streamd in process, not over loopback gRPC (the
    // create's placement, the append and the read went to streamd at least twice).
    let metrics = weir_tests::get_text(&url("/metrics")).await;
    let in_process = weir_tests::metric_value(&metrics, "weir_in_process_calls_total").unwrap_or(0.0);
    assert!(in_process >= 2.0, "in-process calls: {in_process}\n{metrics}");

    // Kafka clients reach the same cluster, at the address `weir dev` printed (issue 4).
    assert!(
        proc.log_text().contains(&format!("Kafka on {kafka}")),
        "{}",
        proc.log_text()
    );
    let listed = tokio::process::Command::new("kcat")
        .args(["-b", &kafka, "-L"])
        .output()
        .await
        .expect("kcat runs");
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success() && text.contains("1 brokers"), "{text}");

    proc.term();
    assert_eq!(
        proc.wait_exit(Duration::from_secs(60)).await,
        Some(0),
        "{}",
        proc.log_text()
    );
    assert!(dir.path().join("data/metad").exists());
    assert!(dir.path().join("data/objects").exists());
}

/// Issue 20, defect 6: `weir dev` never runs half-alive. With one component's port held
/// by another socket, that component cannot bind, and the whole process exits non-zero
/// with a message naming the component and the address, instead of serving HTTP and
/// Kafka without it.
async fn a_held_port_ends_weir_dev(held_flag: &str, component: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port");
    let held_addr = held.local_addr().expect("addr").to_string();
    let mut command = Command::new(bin_path("weir"));
    command
        .arg("dev")
        .args(["--data-dir", &dir.path().join("data").display().to_string()]);
    for flag in [
        "--http-listen",
        "--kafka-listen",
        "--metad-listen",
        "--metad-http-listen",
        "--streamd-listen",
        "--streamd-http-listen",
    ] {
        let addr = if flag == held_flag {
            held_addr.clone()
        } else {
            format!("127.0.0.1:{}", free_port())
        };
        command.args([flag, &addr]);
    }
    command.args(["--shutdown-deadline-sec", "10"]);
    let mut proc = Proc::new("weir-dev", dir.path().join("dev.log"));
    proc.spawn(command);
    let code = proc.wait_exit(Duration::from_secs(60)).await;
    let log = proc.log_text();
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}; log:\n{log}");
    assert!(
        log.contains(&format!("the dev {component} failed")) && log.contains(&held_addr) && log.contains("in use"),
        "the error names neither the component nor the held address:\n{log}"
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread")]
async fn weir_dev_exits_naming_streamd_when_its_port_is_held() {
    tokio::time::timeout(
        Duration::from_secs(120),
        a_held_port_ends_weir_dev("--streamd-listen", "streamd"),
    )
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread")]
async fn weir_dev_exits_naming_metad_when_its_port_is_held() {
    tokio::time::timeout(
        Duration::from_secs(120),
        a_held_port_ends_weir_dev("--metad-listen", "metad"),
    )
    .await
    .expect("test timed out");
}
