//! Issue 18, TLS for clients: a gateway with a certificate from `weir certs` serves its
//! HTTP API as HTTPS and Kafka as `SASL_SSL` (with `--auth`) to real clients (curl,
//! kcat, confluent-kafka, kafka-python), refuses what does not speak TLS, and SASL/PLAIN
//! never travels in clear unless a flag allows it.

use reqwest::{Method, StatusCode};
use serde_json::json;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;
use weir_tests::gateway::Gatewayd;
use weir_tests::streamd::{Backend, Stack};
use weir_tests::tls::Certs;
use weir_tests::wait_for;

const T: Duration = Duration::from_secs(30);
const SECRET: &str = "weir_tls-app-secret";
const MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// A one-node stack and gateway `gw-1` with `--auth` and the certificate, trusted by its
/// HTTP client, with an admin token `app` known to it.
async fn tls_stack(dir_extra: &[&str]) -> (Stack, Gatewayd, Certs) {
    let stack = Stack::start_with(1, Backend::FileWal, &[], &[]).await;
    let certs = Certs::make(&stack.dir.path().join("certs"), "gw-1");
    let mut flags: Vec<String> = vec!["--auth".into(), "--header-read-timeout-sec".into(), "2".into()];
    flags.extend(certs.flags());
    flags.extend(dir_extra.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), &flags);
    gw.trust(&certs.ca);
    gw.wait_ready().await;
    stack.metad.issue_token("app", SECRET, &["admin"]).await;
    gw.token = Some(SECRET.into());
    wait_for("the token known to the gateway", T, || async {
        let (s, _) = gw.send(gw.request(Method::GET, "/v1/streams")).await;
        (s == StatusCode::OK).then_some(())
    })
    .await;
    (stack, gw, certs)
}

fn curl(args: &[&str]) -> std::process::Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl runs")
}

// Issue 18: HTTPS with a certificate made by `weir certs`: curl trusting the CA creates,
// appends and reads over HTTP/1.1 and HTTP/2 (ALPN); curl without the CA, and plaintext
// HTTP to the port, get nothing; a peer that never finishes its handshake is closed at
// the header-read timeout and counted.
#[tokio::test(flavor = "multi_thread")]
async fn https_serves_curl_trusting_the_weir_ca_and_nothing_else() {
    let (_stack, gw, certs) = tls_stack(&[]).await;
    let ca = certs.ca.display().to_string();
    let bearer = format!("Authorization: Bearer {SECRET}");
    let url = |p: &str| gw.url(p);
    assert!(url("/").starts_with("https://"));

    let created = curl(&[
        "--http1.1",
        "--cacert",
        &ca,
        "-H",
        &bearer,
        "-H",
        "content-type: application/json",
        "-d",
        r#"{"stream":"secure"}"#,
        "-w",
        "\n%{http_code} %{http_version}",
        &url("/v1/streams"),
    ]);
    let text = String::from_utf8_lossy(&created.stdout);
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    assert!(text.ends_with("201 1.1"), "{text}");
    gw.wait_open("secure").await;
    let appended = curl(&[
        "--cacert",
        &ca,
        "--http2",
        "-H",
        &bearer,
        "-H",
        "content-type: application/json",
        "-d",
        r#"{"records":[{"body":"over tls"}]}"#,
        "-w",
        "\n%{http_code} %{http_version}",
        &url("/v1/streams/secure/records"),
    ]);
    let text = String::from_utf8_lossy(&appended.stdout);
    assert!(text.ends_with("200 2"), "HTTP/2 by ALPN: {text}");
    let read = curl(&[
        "--cacert",
        &ca,
        "-H",
        &bearer,
        &url("/v1/streams/secure/records?seq_num=0"),
    ]);
    let body: serde_json::Value = serde_json::from_slice(&read.stdout).expect("json");
    assert_eq!(body["records"][0]["body"], "over tls");

    // Not trusting the CA: curl's "SSL certificate problem" (exit 60).
    let untrusted = curl(&[&url("/v1/streams")]);
    assert_eq!(untrusted.status.code(), Some(60), "{untrusted:?}");
    // Plaintext HTTP to the TLS port gets no HTTP answer.
    let plain = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://{}/readyz", gw.http),
    ]);
    assert!(
        !plain.status.success() && String::from_utf8_lossy(&plain.stdout) == "000",
        "{plain:?}"
    );

    // A peer that connects and sends nothing holds its slot until the header-read
    // timeout (2 s here), no longer.
    let mut silent = std::net::TcpStream::connect(&gw.http).expect("connect");
    silent.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let started = std::time::Instant::now();
    assert!(weir_tests::kafka_wire::closed_by_peer(&mut silent));
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
    let metrics = gw
        .request(Method::GET, "/metrics")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for reason in ["tls_handshake", "header_read_timeout"] {
        assert!(
            metrics.contains(&format!(
                "weir_listener_connections_closed_total{{listener=\"http\",reason=\"{reason}\"}}"
            )),
            "{reason}: {metrics}"
        );
    }
}

/// Debian's kcat, with the system's librdkafka (built with OpenSSL): cargo's
/// `LD_LIBRARY_PATH` for tests would load the `rdkafka` crate's copy, built without it.
fn kcat_command() -> Command {
    let mut c = Command::new("kcat");
    c.env_remove("LD_LIBRARY_PATH");
    c
}

fn kcat(gw: &Gatewayd, ca: &str, password: &str, args: &[&str]) -> Command {
    kcat_with(gw, ca, "PLAIN", password, args)
}

fn kcat_with(gw: &Gatewayd, ca: &str, mechanism: &str, password: &str, args: &[&str]) -> Command {
    let mut c = kcat_command();
    c.args(["-b", &gw.kafka])
        .args([
            "-X",
            "security.protocol=SASL_SSL",
            "-X",
            &format!("sasl.mechanisms={mechanism}"),
        ])
        .args(["-X", "sasl.username=app", "-X", &format!("sasl.password={password}")])
        .args(["-X", &format!("ssl.ca.location={ca}"), "-X", "broker.address.family=v4"])
        .args(args);
    c
}

// Issue 18: Kafka over SASL_SSL: kcat (librdkafka 2.0, OpenSSL) produces and consumes
// with PLAIN and reads back with SCRAM-SHA-256 and SCRAM-SHA-512; confluent-kafka and
// kafka-python produce and read everything back once with each of PLAIN,
// SCRAM-SHA-256 and SCRAM-SHA-512 (`tests/clients/tls_clients.py`); a client not
// trusting the CA, a wrong password (PLAIN and SCRAM) and a plaintext client get nothing.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_clients_produce_and_consume_over_sasl_ssl() {
    let (stack, gw, certs) = tls_stack(&[]).await;
    let ca = certs.ca.display().to_string();
    for mechanism in MECHANISMS {
        weir_tests::tls::weir(&[
            "--metad",
            &stack.metad.replicas[0].grpc,
            "topics",
            "create",
            &format!("tls-{}", mechanism.to_lowercase()),
            "--partitions",
            "1",
        ]);
    }
    weir_tests::tls::weir(&[
        "--metad",
        &stack.metad.replicas[0].grpc,
        "topics",
        "create",
        "kc",
        "--partitions",
        "1",
    ]);
    for mechanism in MECHANISMS {
        gw.wait_open(&format!("tls-{}/0", mechanism.to_lowercase())).await;
    }
    gw.wait_open("kc/0").await;

    let mut p = kcat(&gw, &ca, SECRET, &["-P", "-t", "kc", "-K:", "-X", "acks=all"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat -P");
    let lines: String = (0..100).map(|i| format!("k{i}:v{i}\n")).collect();
    p.stdin
        .take()
        .expect("stdin")
        .write_all(lines.as_bytes())
        .expect("write");
    let produced = p.wait_with_output().expect("kcat -P");
    assert!(
        produced.status.success(),
        "{}",
        String::from_utf8_lossy(&produced.stderr)
    );
    let consumed = tokio::time::timeout(
        T,
        tokio::process::Command::from(kcat(
            &gw,
            &ca,
            SECRET,
            &["-C", "-t", "kc", "-o", "beginning", "-c", "100", "-f", "%k=%s@%o\n"],
        ))
        .output(),
    )
    .await
    .expect("kcat -C finishes")
    .expect("kcat -C");
    assert!(
        consumed.status.success(),
        "{}",
        String::from_utf8_lossy(&consumed.stderr)
    );
    let want: String = (0..100).map(|i| format!("k{i}=v{i}@{i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&consumed.stdout), want);
    for scram in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let read = tokio::time::timeout(
            T,
            tokio::process::Command::from(kcat_with(
                &gw,
                &ca,
                scram,
                SECRET,
                &["-C", "-t", "kc", "-o", "beginning", "-c", "100", "-f", "%k=%s@%o\n"],
            ))
            .output(),
        )
        .await
        .expect("kcat -C finishes")
        .expect("kcat -C");
        assert!(
            read.status.success(),
            "{scram}: {}",
            String::from_utf8_lossy(&read.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&read.stdout), want, "{scram}");
        let wrong = tokio::time::timeout(
            T,
            tokio::process::Command::from(kcat_with(&gw, &ca, scram, "weir_wrong", &["-L", "-m", "5"])).output(),
        )
        .await
        .expect("kcat -L finishes")
        .expect("kcat -L");
        assert!(!wrong.status.success(), "{scram}: a wrong password listed metadata");
    }

    let wrong = tokio::time::timeout(
        T,
        tokio::process::Command::from(kcat(&gw, &ca, "weir_wrong", &["-L", "-m", "5"])).output(),
    )
    .await
    .expect("kcat -L finishes")
    .expect("kcat -L");
    assert!(!wrong.status.success(), "a wrong password listed metadata");
    // A plaintext Kafka client gets no answer from the TLS listener.
    let plain = tokio::time::timeout(
        T,
        tokio::process::Command::from(kcat_command())
            .args(["-b", &gw.kafka, "-L", "-m", "5"])
            .output(),
    )
    .await
    .expect("kcat -L finishes")
    .expect("kcat -L");
    assert!(!plain.status.success(), "a plaintext client listed metadata");

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/tls_clients.py");
    for mechanism in MECHANISMS {
        let out = tokio::time::timeout(
            Duration::from_secs(240),
            tokio::process::Command::new("python3")
                .env_remove("LD_LIBRARY_PATH")
                .args([script, &gw.kafka, &ca, "app", SECRET, mechanism])
                .output(),
        )
        .await
        .expect("python clients finish in time")
        .expect("python3 runs");
        assert!(
            out.status.success(),
            "{mechanism}\nstdout:\n{}\nstderr:\n{}\ngateway log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            gw.log_text()
        );
    }
}

// Issue 18: SASL/PLAIN carries the token's secret itself, so a plaintext listener does
// not offer it (UNSUPPORTED_SASL_MECHANISM, and the gateway says at startup that Kafka
// clients cannot authenticate with it) unless `--kafka-allow-plaintext-sasl` says so;
// SCRAM, which never sends the secret, is offered there.
#[tokio::test(flavor = "multi_thread")]
async fn sasl_plain_is_refused_in_clear_unless_a_flag_allows_it() {
    use weir_tests::kafka_wire::{sasl_handshake_v0, sasl_v0};
    const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
    let stack = Stack::start_with(1, Backend::FileWal, &[], &[]).await;
    let metad = stack.metad.replicas[0].grpc.clone();
    let strict = Gatewayd::start("gw-strict", &metad, stack.dir.path(), &["--auth"]);
    let allowing = Gatewayd::start(
        "gw-allowing",
        &metad,
        stack.dir.path(),
        &["--auth", "--kafka-allow-plaintext-sasl"],
    );
    strict.wait_ready().await;
    allowing.wait_ready().await;
    stack.metad.issue_token("app", SECRET, &[]).await;

    let (error, _) = sasl_handshake_v0(&strict.kafka, "PLAIN").expect("handshake answered");
    assert_eq!(error, UNSUPPORTED_SASL_MECHANISM);
    assert!(
        strict
            .log_text()
            .contains("Kafka clients cannot authenticate with PLAIN: SASL/PLAIN is refused on a plaintext listener"),
        "{}",
        strict.log_text()
    );
    let addr = allowing.kafka.clone();
    wait_for("PLAIN accepted where allowed", T, || {
        let addr = addr.clone();
        async move { sasl_v0(&addr, "app", SECRET) }
    })
    .await;
    assert!(!allowing.log_text().contains("Kafka clients cannot authenticate"));
    // The same token over the strict listener: refused at the handshake, whatever the
    // secret.
    assert!(sasl_v0(&strict.kafka, "app", SECRET).is_none());
    // SCRAM never sends the secret, so the strict plaintext listener offers it.
    let scram = tokio::time::timeout(
        T,
        tokio::process::Command::from(kcat_command())
            .args([
                "-b",
                &strict.kafka,
                "-L",
                "-m",
                "10",
                "-X",
                "security.protocol=SASL_PLAINTEXT",
            ])
            .args(["-X", "sasl.mechanisms=SCRAM-SHA-512", "-X", "sasl.username=app"])
            .args(["-X", &format!("sasl.password={SECRET}")])
            .output(),
    )
    .await
    .expect("kcat -L finishes")
    .expect("kcat -L");
    let listed = String::from_utf8_lossy(&scram.stdout);
    assert!(
        scram.status.success() && listed.contains("2 brokers"),
        "{listed}{}",
        String::from_utf8_lossy(&scram.stderr)
    );
}

// Issue 18, secure by default: a gateway listening beyond loopback without TLS or
// without --auth refuses to start (exit 2, naming what is missing), unless --insecure;
// so do metad and streamd with gRPC beyond loopback without mTLS, or admin HTTP beyond
// loopback at all.
#[tokio::test(flavor = "multi_thread")]
async fn listeners_open_beyond_loopback_need_tls_and_auth_or_insecure() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = Certs::make(&dir.path().join("certs"), "gw-1");
    let port = || weir_tests::free_port().to_string();
    let run = |extra: &[String]| {
        Command::new(weir_tests::bin_path("gatewayd"))
            .args(["--id", "gw-1", "--metad", "127.0.0.1:1"])
            .args(["--http-listen", &format!("0.0.0.0:{}", port())])
            .args(["--kafka-listen", &format!("127.0.0.1:{}", port())])
            .args(extra)
            .output()
            .expect("gatewayd runs")
    };
    let open = run(&[]);
    let stderr = String::from_utf8_lossy(&open.stderr);
    assert_eq!(open.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--http-listen 0.0.0.0:") && stderr.contains("no TLS (--tls-cert, --tls-key) and no --auth"),
        "{stderr}"
    );
    let out = run(&certs.flags());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("and the gateway has no --auth"), "{stderr}");
    // What passes the check is covered by `config::tests` (a passing gateway goes on
    // to wait for metad, so its exit cannot be awaited here).

    // metad and streamd: gRPC beyond loopback needs mTLS, admin HTTP loopback.
    let data = dir.path().join("metad");
    let metad = |listen: &str, http: &str| {
        Command::new(weir_tests::bin_path("metad"))
            .args([
                "--id",
                "1",
                "--listen",
                listen,
                "--http-listen",
                http,
                "--advertise",
                "metad-1:7400",
            ])
            .arg("--data-dir")
            .arg(&data)
            .output()
            .expect("metad runs")
    };
    let loopback = || format!("127.0.0.1:{}", port());
    let open = metad(&format!("0.0.0.0:{}", port()), &loopback());
    let stderr = String::from_utf8_lossy(&open.stderr);
    assert_eq!(open.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "is reachable beyond this host, and metad has no mTLS (--cluster-ca, --cluster-cert, --cluster-key)"
        ),
        "{stderr}"
    );
    let open = metad(&loopback(), &format!("0.0.0.0:{}", port()));
    let stderr = String::from_utf8_lossy(&open.stderr);
    assert_eq!(open.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("admin HTTP (/admin, /metrics) has no TLS or auth"),
        "{stderr}"
    );
    let open = Command::new(weir_tests::bin_path("streamd"))
        .args([
            "--id",
            "s1",
            "--metad",
            "127.0.0.1:1",
            "--object-store",
            "file:///tmp/none",
        ])
        .args(["--listen", &format!("0.0.0.0:{}", port()), "--http-listen", &loopback()])
        .output()
        .expect("streamd runs");
    let stderr = String::from_utf8_lossy(&open.stderr);
    assert_eq!(open.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("and streamd has no mTLS"), "{stderr}");
}

// Issue 18: `weir dev --tls` makes its CA in the data directory, prints it, and serves
// HTTPS and Kafka `SSL` with a certificate for localhost and 127.0.0.1.
#[tokio::test(flavor = "multi_thread")]
async fn weir_dev_tls_serves_https_and_kafka_ssl_with_its_own_ca() {
    use weir_tests::process::Proc;
    let dir = tempfile::tempdir().expect("temp dir");
    let http = format!("127.0.0.1:{}", weir_tests::free_port());
    let kafka = format!("127.0.0.1:{}", weir_tests::free_port());
    let mut command = Command::new(weir_tests::bin_path("weir"));
    command
        .args(["dev", "--tls"])
        .args(["--data-dir", &dir.path().join("data").display().to_string()]);
    for (flag, addr) in [
        ("--http-listen", http.clone()),
        ("--kafka-listen", kafka.clone()),
        ("--metad-listen", format!("127.0.0.1:{}", weir_tests::free_port())),
        ("--metad-http-listen", format!("127.0.0.1:{}", weir_tests::free_port())),
        ("--streamd-listen", format!("127.0.0.1:{}", weir_tests::free_port())),
        (
            "--streamd-http-listen",
            format!("127.0.0.1:{}", weir_tests::free_port()),
        ),
    ] {
        command.args([flag, &addr]);
    }
    let mut proc = Proc::new("weir-dev", dir.path().join("dev.log"));
    proc.spawn(command);
    let made = dir.path().join("data/tls/ca.pem");
    let client = wait_for("the CA made", T, || async {
        made.exists().then(|| {
            weir_tests::http_builder()
                .use_preconfigured_tls(weir_tests::tls::client_config(&made))
                .build()
                .expect("client")
        })
    })
    .await;
    let ca = std::fs::canonicalize(&made).expect("CA path");
    wait_for("weir dev ready over https", Duration::from_secs(60), || async {
        let r = client.get(format!("https://{http}/readyz")).send().await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    let log = proc.log_text();
    assert!(
        log.contains(&format!("HTTP API on https://{http} (curl --cacert {})", ca.display())),
        "{log}"
    );
    let r = client
        .post(format!("https://{http}/v1/streams"))
        .json(&json!({"stream": "hello"}))
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), StatusCode::CREATED);
    let listed = tokio::process::Command::from(kcat_command())
        .args(["-b", &kafka, "-L", "-X", "security.protocol=SSL"])
        .args(["-X", &format!("ssl.ca.location={}", ca.display())])
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
}
