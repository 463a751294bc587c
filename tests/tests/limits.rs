//! Issue 19: the limits every listener enforces, with real sockets against real
//! processes. Each test also checks that the process's memory stays within a stated
//! bound and that other clients are served.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::Compression;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use reqwest::{Method, StatusCode};
use std::io::{Read, Write};
use std::time::{Duration, Instant};
use weir_tests::gateway::Gatewayd;
use weir_tests::kafka_wire::{connect as kafka_connect, sasl_v0};
use weir_tests::streamd::{Backend, Stack};
use weir_tests::{get_text, metric_value, rss_bytes, wait_for};

const T: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;

/// Runs a test body with an overall bound.
async fn bounded<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(Duration::from_secs(240), f)
        .await
        .expect("the test finished within its bound");
}

/// One metad and one streamd, both with `server_flags`, and a ready gateway with
/// `gateway_flags`.
async fn stack_and_gateway(server_flags: &[&str], gateway_flags: &[&str]) -> (Stack, Gatewayd) {
    let stack = Stack::start_with(1, Backend::FileWal, server_flags, server_flags).await;
    let gw = Gatewayd::start("gw-1", &stack.metad.replicas[0].grpc, stack.dir.path(), gateway_flags);
    gw.wait_ready().await;
    (stack, gw)
}

/// Fails unless process `pid` (`what`) holds less than `bound` MiB resident.
fn assert_rss(pid: u32, bound: u64, what: &str) {
    let rss = rss_bytes(pid);
    assert!(
        rss < bound * MIB,
        "{what} holds {} MiB, over its {bound} MiB bound",
        rss / MIB
    );
}

/// Whether the server closed `s`: a read gives EOF or a reset rather than timing out
/// (what the server sent before, such as HTTP/2 settings, is read past).
fn closed(s: &mut std::net::TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

/// Opens a connection, sends `head`, then one byte of `trickle` every 200 ms (so it is
/// never idle), and returns how long until the server closed it (`None`: never, in 10 s).
fn slowloris(addr: &str, head: &[u8], trickle: &[u8]) -> Option<Duration> {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(10))).expect("timeout");
    let started = Instant::now();
    s.write_all(head).expect("write the head");
    for b in trickle.iter().cycle() {
        if started.elapsed() > Duration::from_secs(10) {
            return None;
        }
        if s.write_all(&[*b]).is_err() || closed(&mut s) || closed(&mut s) {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    unreachable!("cycle never ends")
}

/// An ApiVersions v0 request frame.
fn api_versions(correlation: i32) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&10i32.to_be_bytes());
    f.extend_from_slice(&18i16.to_be_bytes());
    f.extend_from_slice(&0i16.to_be_bytes());
    f.extend_from_slice(&correlation.to_be_bytes());
    f.extend_from_slice(&(-1i16).to_be_bytes());
    f
}

/// Sends ApiVersions on `s` and reads the answer's correlation id.
fn kafka_ping(s: &mut std::net::TcpStream, correlation: i32) -> Option<i32> {
    s.write_all(&api_versions(correlation)).ok()?;
    let mut head = [0u8; 8];
    s.read_exact(&mut head).ok()?;
    let size = i32::from_be_bytes(head[..4].try_into().expect("4"));
    let mut rest = vec![0u8; size as usize - 4];
    s.read_exact(&mut rest).ok()?;
    Some(i32::from_be_bytes(head[4..].try_into().expect("4")))
}

// Issue 19: a peer trickling a request head is cut at --header-read-timeout-sec on every
// listener (gatewayd HTTP and Kafka, streamd and metad gRPC and HTTP), while other
// clients are served.
#[tokio::test(flavor = "multi_thread")]
async fn a_slowloris_is_cut_on_every_listener() {
    bounded(async {
        let quick = ["--header-read-timeout-sec", "1"];
        let (stack, mut gw) = stack_and_gateway(&quick, &quick).await;
        let http_head: &[u8] = b"GET /health HTTP/1.1\r\nHost: x\r\n";
        let kafka_head: &[u8] = &100i32.to_be_bytes();
        let h2_head: &[u8] = b"PRI ";
        let listeners = [
            ("gatewayd http", gw.http.clone(), http_head, &b"X-Slow: yes\r\n"[..]),
            ("gatewayd kafka", gw.kafka.clone(), kafka_head, &b"\x00"[..]),
            (
                "streamd grpc",
                stack.nodes[0].grpc.clone(),
                h2_head,
                &b"* HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
            ),
            (
                "streamd http",
                stack.nodes[0].http.clone(),
                http_head,
                &b"X-Slow: yes\r\n"[..],
            ),
            (
                "metad grpc",
                stack.metad.replicas[0].grpc.clone(),
                h2_head,
                &b"* HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
            ),
            (
                "metad http",
                stack.metad.replicas[0].http.clone(),
                http_head,
                &b"X-Slow: yes\r\n"[..],
            ),
        ];
        let attacks: Vec<_> = listeners
            .iter()
            .map(|(name, addr, head, trickle)| {
                let (name, addr, head, trickle) = (*name, addr.clone(), head.to_vec(), trickle.to_vec());
                std::thread::spawn(move || (name, slowloris(&addr, &head, &trickle)))
            })
            .collect();
        // Others are served while the attacks run.
        gw.create_stream("s").await;
        gw.append("s", &["served"]).await;
        for attack in attacks {
            let (name, cut) = attack.join().expect("attack thread");
            let cut = cut.unwrap_or_else(|| panic!("{name}: a trickled request head was never cut"));
            println!("{name}: cut after {cut:?}");
            assert!(cut < Duration::from_secs(5), "{name}: cut only after {cut:?}");
        }
        assert_eq!(gw.read_all("s").await.len(), 1);
        let metrics = get_text(&gw.url("/metrics")).await;
        for listener in ["http", "kafka"] {
            let line = format!(
                "weir_listener_connections_closed_total{{listener=\"{listener}\",reason=\"header_read_timeout\"}}"
            );
            assert!(
                metric_value(&metrics, &line).unwrap_or(0.0) >= 1.0,
                "{line} in {metrics}"
            );
        }
        let streamd = get_text(&format!("http://{}/metrics", stack.nodes[0].http)).await;
        let line = "weir_listener_connections_closed_total{listener=\"grpc\",reason=\"header_read_timeout\"}";
        assert!(
            metric_value(&streamd, line).unwrap_or(0.0) >= 1.0,
            "{line} in {streamd}"
        );
        assert_rss(gw.proc().pid(), 128, "gatewayd");
        assert_rss(stack.nodes[0].pid(), 128, "streamd");
        assert_rss(stack.metad.replicas[0].pid(), 384, "metad");
    })
    .await;
}

// Issue 19: a connection that moves no byte for --idle-timeout-sec is closed; one that
// keeps talking is not.
#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_are_closed_and_busy_ones_kept() {
    bounded(async {
        let (_stack, mut gw) = stack_and_gateway(&[], &["--idle-timeout-sec", "2"]).await;
        let (idle_addr, busy_addr) = (gw.kafka.clone(), gw.kafka.clone());
        let idle = std::thread::spawn(move || {
            let mut s = kafka_connect(&idle_addr);
            let started = Instant::now();
            assert!(closed(&mut s), "an idle connection was never closed");
            started.elapsed()
        });
        let busy = std::thread::spawn(move || {
            let mut s = kafka_connect(&busy_addr);
            for i in 0..6 {
                assert_eq!(kafka_ping(&mut s, i), Some(i), "a busy connection was closed");
                std::thread::sleep(Duration::from_millis(1000));
            }
        });
        let idle_for = idle.join().expect("idle thread");
        assert!(
            idle_for >= Duration::from_millis(1500) && idle_for < Duration::from_secs(8),
            "closed after {idle_for:?}"
        );
        busy.join().expect("busy thread");
        let metrics = get_text(&gw.url("/metrics")).await;
        let line = "weir_listener_connections_closed_total{listener=\"kafka\",reason=\"idle_timeout\"}";
        assert!(
            metric_value(&metrics, line).unwrap_or(0.0) >= 1.0,
            "{line} in {metrics}"
        );
        assert_rss(gw.proc().pid(), 128, "gatewayd");
    })
    .await;
}

// Issue 19: 10,000 idle connections cost the gateway a bounded amount of memory; one
// past --max-connections is closed at once, one peer address past
// --max-connections-per-ip is refused while another address is served.
#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_idle_connections_cost_bounded_memory() {
    bounded(async {
        let (_stack, mut gw) = stack_and_gateway(
            &[],
            &["--max-connections", "10000", "--max-connections-per-ip", "10000"],
        )
        .await;
        let pid = gw.proc().pid();
        let before = rss_bytes(pid);
        let mut idle = Vec::with_capacity(10_000);
        for _ in 0..10_000 {
            idle.push(tokio::net::TcpStream::connect(&gw.kafka).await.expect("connect"));
        }
        let open = "weir_listener_connections_open{listener=\"kafka\"}";
        wait_for("10,000 connections accepted", T, || async {
            let m = get_text(&gw.url("/metrics")).await;
            (metric_value(&m, open) == Some(10_000.0)).then_some(())
        })
        .await;
        let after = rss_bytes(pid);
        println!(
            "gatewayd RSS {} MiB before, {} MiB with 10,000 idle connections",
            before / MIB,
            after / MIB
        );
        // The stated bound: 10 KiB a connection (measured: about 3 KiB).
        assert!(
            after < before + 100 * MIB,
            "10,000 idle connections took {} MiB",
            (after - before) / MIB
        );
        // One more is closed at once; HTTP clients are served meanwhile.
        let mut over = kafka_connect(&gw.kafka);
        assert!(
            kafka_ping(&mut over, 1).is_none(),
            "a connection past --max-connections was served"
        );
        gw.create_stream("s").await;
        gw.append("s", &["served"]).await;
        let m = get_text(&gw.url("/metrics")).await;
        let refused = "weir_listener_connections_refused_total{listener=\"kafka\",reason=\"max_connections\"}";
        assert!(metric_value(&m, refused).unwrap_or(0.0) >= 1.0, "{refused} in {m}");
        // Their slots come back when they close.
        idle.clear();
        wait_for("the idle connections' slots freed", T, || async {
            let mut s = kafka_connect(&gw.kafka);
            kafka_ping(&mut s, 7).map(|_| ())
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_peer_address_cannot_take_every_slot() {
    bounded(async {
        let (_stack, mut gw) = stack_and_gateway(&[], &["--max-connections-per-ip", "20"]).await;
        let port: u16 = gw.kafka.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
        let from_other_address = || {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket
                .bind("127.0.0.2:0".parse().expect("addr"))
                .expect("bind 127.0.0.2");
            socket.connect(([127, 0, 0, 1], port).into())
        };
        let mut hogs = Vec::new();
        for _ in 0..20 {
            hogs.push(from_other_address().await.expect("connect"));
        }
        let extra = from_other_address().await.expect("connect").into_std().expect("std");
        extra.set_nonblocking(false).expect("blocking");
        extra.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut extra = extra;
        assert!(closed(&mut extra), "a 21st connection from one address was kept");
        // Another address is served.
        let mut mine = kafka_connect(&gw.kafka);
        assert_eq!(kafka_ping(&mut mine, 3), Some(3));
        let m = get_text(&gw.url("/metrics")).await;
        let refused = "weir_listener_connections_refused_total{listener=\"kafka\",reason=\"max_connections_per_ip\"}";
        assert!(metric_value(&m, refused).unwrap_or(0.0) >= 1.0, "{refused} in {m}");
        drop(hogs);
        assert_rss(gw.proc().pid(), 128, "gatewayd");
    })
    .await;
}

/// One zstd batch of a single record of `bytes` zeros: a few hundred bytes on the wire.
fn bomb(bytes: usize) -> Bytes {
    weir_tests::batches::encoded(&[&vec![0u8; bytes]], Compression::Zstd)
}

/// Produces `records` to `topic` partition 0 over a raw connection; the partition's error code.
fn produce(addr: &str, topic: &str, records: Bytes) -> i16 {
    let version = 8;
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Produce as i16)
        .with_request_api_version(version)
        .with_correlation_id(5)
        .with_client_id(Some(StrBytes::from_static_str("limits-test")));
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let mut body = BytesMut::new();
    header
        .encode(&mut body, ProduceRequest::header_version(version))
        .expect("header");
    request.encode(&mut body, version).expect("body");
    let mut s = kafka_connect(addr);
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    s.write_all(&(body.len() as i32).to_be_bytes()).expect("write");
    s.write_all(&body).expect("write");
    let mut size = [0u8; 4];
    s.read_exact(&mut size).expect("answer size");
    let mut answer = vec![0u8; i32::from_be_bytes(size) as usize];
    s.read_exact(&mut answer).expect("answer");
    let mut answer = Bytes::from(answer);
    ResponseHeader::decode(&mut answer, ProduceResponse::header_version(version)).expect("response header");
    let response = ProduceResponse::decode(&mut answer, version).expect("response");
    response.responses[0].partition_responses[0].error_code
}

// Issue 19: a decompression bomb is refused when produced (MESSAGE_TOO_LARGE) and a
// stored one is never inflated past the gateway's limit on read (413 too_large); neither
// process's memory grows with what the bomb would inflate to.
#[tokio::test(flavor = "multi_thread")]
async fn a_decompression_bomb_is_refused_when_produced_and_never_inflated_on_read() {
    bounded(async {
        let stack = Stack::start_with(
            1,
            Backend::FileWal,
            &["--max-decompressed-bytes", &(128 * MIB).to_string()],
            &[],
        )
        .await;
        let mut gw = Gatewayd::start(
            "gw-1",
            &stack.metad.replicas[0].grpc,
            stack.dir.path(),
            &["--max-decompressed-bytes", &(4 * MIB).to_string()],
        );
        gw.wait_ready().await;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &gw.kafka)
            .set("broker.address.family", "v4")
            .create()
            .expect("admin client");
        let created = admin
            .create_topics(
                &[NewTopic::new("bombs", 1, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await
            .expect("create topics");
        assert!(created.iter().all(|r| r.is_ok()), "{created:?}");
        gw.wait_open("bombs/0").await;

        // 200 MiB of zeros in a few hundred bytes: past streamd's 128 MiB.
        let big = bomb(200 * MIB as usize);
        assert!(big.len() < 64 << 10, "the bomb is {} bytes", big.len());
        let message_too_large = kafka_protocol::ResponseError::MessageTooLarge.code();
        assert_eq!(produce(&gw.kafka, "bombs", big), message_too_large);
        let streamd_rss = rss_bytes(stack.nodes[0].pid());
        println!("streamd RSS after refusing a 200 MiB bomb: {} MiB", streamd_rss / MIB);
        assert!(
            streamd_rss < 160 * MIB,
            "streamd holds {} MiB after refusing the bomb",
            streamd_rss / MIB
        );

        // 100 MiB is within streamd's limit and stored, but past the gateway's 4 MiB.
        assert_eq!(produce(&gw.kafka, "bombs", bomb(100 * MIB as usize)), 0);
        let (status, body) = gw
            .send(gw.request(Method::GET, "/v1/streams/bombs%2F0/records?seq_num=0"))
            .await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
        assert_eq!(body["error"]["code"], "too_large", "{body}");
        let gateway_rss = rss_bytes(gw.proc().pid());
        println!(
            "gatewayd RSS after refusing to inflate 100 MiB: {} MiB",
            gateway_rss / MIB
        );
        assert!(
            gateway_rss < 96 * MIB,
            "gatewayd holds {} MiB after refusing to inflate 100 MiB",
            gateway_rss / MIB
        );
        // Other reads and writes go on.
        gw.create_stream("plain").await;
        gw.append("plain", &["ok"]).await;
        assert_eq!(gw.read_all("plain").await.len(), 1);
    })
    .await;
}

// Issue 19: SSE subscriptions and long polls are capped per gateway (429
// too_many_requests, naming the flag), and a slot comes back when its read ends.
#[tokio::test(flavor = "multi_thread")]
async fn live_reads_are_capped_per_gateway() {
    bounded(async {
        let (_stack, mut gw) = stack_and_gateway(&[], &["--max-sse-subscribers", "1", "--max-long-polls", "1"]).await;
        gw.create_stream("s").await;
        let subscribe = || {
            gw.request(Method::GET, "/v1/streams/s/records")
                .header("accept", "text/event-stream")
                .send()
        };
        let first = subscribe().await.expect("subscribe");
        assert_eq!(first.status(), StatusCode::OK);
        let second = subscribe().await.expect("subscribe");
        assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
        let body: serde_json::Value = second.json().await.expect("json");
        assert_eq!(body["error"]["code"], "too_many_requests", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("--max-sse-subscribers")),
            "{body}"
        );
        drop(first);
        wait_for("the subscription's slot back", T, || async {
            let again = subscribe().await.ok()?;
            (again.status() == StatusCode::OK).then_some(())
        })
        .await;

        // A long poll holds its slot while it waits.
        let waiting = gw
            .request(Method::GET, "/v1/streams/s/records?seq_num=0&wait=20")
            .send();
        let waiting = tokio_util::task::TaskTracker::new().spawn(waiting);
        wait_for("the long poll waiting", T, || async {
            let m = get_text(&gw.url("/metrics")).await;
            (metric_value(&m, "weir_gatewayd_live_reads{kind=\"long_poll\"}") == Some(1.0)).then_some(())
        })
        .await;
        let refused = wait_for("a second long poll refused", T, || async {
            let (status, body) = gw
                .send(gw.request(Method::GET, "/v1/streams/s/records?seq_num=0&wait=1"))
                .await;
            (status == StatusCode::TOO_MANY_REQUESTS).then_some(body)
        })
        .await;
        assert!(
            refused["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("--max-long-polls")),
            "{refused}"
        );
        // Reads that do not wait are not capped.
        let (status, _) = gw
            .send(gw.request(Method::GET, "/v1/streams/s/records?seq_num=0"))
            .await;
        assert_eq!(status, StatusCode::OK);
        gw.append("s", &["wakes the poll"]).await;
        let woke = waiting.await.expect("task").expect("long poll");
        assert_eq!(woke.status(), StatusCode::OK);
        let m = get_text(&gw.url("/metrics")).await;
        for kind in ["sse", "long_poll"] {
            let line = format!("weir_gatewayd_live_reads_refused_total{{kind=\"{kind}\"}}");
            assert!(metric_value(&m, &line).unwrap_or(0.0) >= 1.0, "{line} in {m}");
        }
        assert_rss(gw.proc().pid(), 128, "gatewayd");
    })
    .await;
}

// Issue 19: a metad replica serves at most --max-watch-streams Watch streams; one more
// is refused with RESOURCE_EXHAUSTED naming the flag, and a slot comes back when a
// watcher goes away.
#[tokio::test(flavor = "multi_thread")]
async fn watch_streams_are_capped_per_metad() {
    bounded(async {
        let stack = Stack::start_with(1, Backend::FileWal, &[], &["--max-watch-streams", "4"]).await;
        let replica = &stack.metad.replicas[0];
        let watch = || async {
            let mut client = weir_proto::metad::metad_client::MetadClient::connect(format!("http://{}", replica.grpc))
                .await
                .expect("connect");
            client
                .watch(weir_proto::metad::WatchRequest { after_index: None })
                .await
                .map(|r| r.into_inner())
        };
        let mut mine = Vec::new();
        let refused = loop {
            match watch().await {
                Ok(stream) => mine.push(stream),
                Err(status) => break status,
            }
            assert!(mine.len() <= 4, "more than 4 watch streams were served");
        };
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("--max-watch-streams"), "{refused:?}");
        let metrics = get_text(&format!("http://{}/metrics", replica.http)).await;
        assert_eq!(metric_value(&metrics, "weir_metad_watchers"), Some(4.0), "{metrics}");
        mine.pop();
        wait_for("a watch slot back", T, || async { watch().await.ok().map(|_| ()) }).await;
        assert_rss(replica.pid(), 384, "metad");
    })
    .await;
}

// Issue 19: one token holds at most --kafka-max-connections-per-principal Kafka
// connections; one more fails authentication, others are served, and a closed
// connection gives its slot back.
#[tokio::test(flavor = "multi_thread")]
async fn one_token_cannot_take_every_kafka_connection() {
    bounded(async {
        let (stack, mut gw) = stack_and_gateway(
            &[],
            &[
                "--auth",
                "--kafka-allow-plaintext-sasl",
                "--kafka-max-connections-per-principal",
                "2",
            ],
        )
        .await;
        stack.metad.issue_token("app", "weir_app-secret", &[]).await;
        stack.metad.issue_token("other", "weir_other-secret", &[]).await;
        let addr = gw.kafka.clone();
        let first = wait_for("the token known to the gateway", T, || {
            let addr = addr.clone();
            async move { sasl_v0(&addr, "app", "weir_app-secret") }
        })
        .await;
        let _second = sasl_v0(&gw.kafka, "app", "weir_app-secret").expect("a second connection");
        assert!(
            sasl_v0(&gw.kafka, "app", "weir_app-secret").is_none(),
            "a third connection of one token was authenticated"
        );
        let other = wait_for("the other token known", T, || {
            let addr = addr.clone();
            async move { sasl_v0(&addr, "other", "weir_other-secret") }
        })
        .await;
        drop(other);
        drop(first);
        wait_for("the closed connection's slot back", T, || {
            let addr = addr.clone();
            async move { sasl_v0(&addr, "app", "weir_app-secret") }
        })
        .await;
        let m = get_text(&gw.url("/metrics")).await;
        let refused =
            "weir_listener_connections_refused_total{listener=\"kafka\",reason=\"max_connections_per_principal\"}";
        assert!(metric_value(&m, refused).unwrap_or(0.0) >= 1.0, "{refused} in {m}");
        assert_rss(gw.proc().pid(), 128, "gatewayd");
    })
    .await;
}

/// Fetch v4 of `partitions` of `topic` (in that order, repeats allowed) from offset 0;
/// per listed partition (error, high watermark, records bytes).
fn fetch_v4(addr: &str, topic: &str, partitions: &[i32], max_bytes: i32, partition_max: i32) -> Vec<(i16, i64, usize)> {
    let mut f = vec![0, 1, 0, 4];
    f.extend_from_slice(&11i32.to_be_bytes());
    f.extend_from_slice(&(-1i16).to_be_bytes()); // client id
    f.extend_from_slice(&(-1i32).to_be_bytes()); // replica id
    f.extend_from_slice(&0i32.to_be_bytes()); // max wait
    f.extend_from_slice(&0i32.to_be_bytes()); // min bytes
    f.extend_from_slice(&max_bytes.to_be_bytes());
    f.push(0); // read uncommitted
    f.extend_from_slice(&1i32.to_be_bytes());
    f.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    f.extend_from_slice(topic.as_bytes());
    f.extend_from_slice(&(partitions.len() as i32).to_be_bytes());
    for p in partitions {
        f.extend_from_slice(&p.to_be_bytes());
        f.extend_from_slice(&0i64.to_be_bytes());
        f.extend_from_slice(&partition_max.to_be_bytes());
    }
    let mut s = kafka_connect(addr);
    s.write_all(&(f.len() as i32).to_be_bytes()).expect("write");
    s.write_all(&f).expect("write");
    let mut size = [0u8; 4];
    s.read_exact(&mut size).expect("answered");
    let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
    s.read_exact(&mut body).expect("answer");
    let be_i16 = |at: usize| i16::from_be_bytes(body[at..at + 2].try_into().expect("2"));
    let be_i32 = |at: usize| i32::from_be_bytes(body[at..at + 4].try_into().expect("4"));
    let be_i64 = |at: usize| i64::from_be_bytes(body[at..at + 8].try_into().expect("8"));
    // correlation id, throttle, topics count, topic name, partitions count.
    let mut at = 4 + 4 + 4 + 2 + topic.len();
    assert_eq!(be_i32(at), partitions.len() as i32);
    at += 4;
    let mut out = Vec::new();
    for _ in partitions {
        let (error, hw) = (be_i16(at + 4), be_i64(at + 6));
        at += 4 + 2 + 8 + 8;
        let aborted = be_i32(at);
        at += 4 + 16 * aborted.max(0) as usize;
        let len = be_i32(at).max(0) as usize;
        at += 4 + len;
        out.push((error, hw, len));
    }
    out
}

// Issue 19: a Fetch's byte budget is shared out before any read: listing many partitions
// full of records returns (and holds) at most the budget, the partitions past it are
// answered with their offsets only, and when no whole batch fits the first partition
// with records still gets one, so a consumer makes progress. One partition listed 1,000
// times is read once.
#[tokio::test(flavor = "multi_thread")]
async fn a_fetch_over_many_partitions_holds_one_budget() {
    bounded(async {
        let (stack, mut gw) = stack_and_gateway(&[], &[]).await;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &gw.kafka)
            .set("broker.address.family", "v4")
            .create()
            .expect("admin client");
        let partitions = 8;
        let created = admin
            .create_topics(
                &[NewTopic::new("wide", partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await
            .expect("create topics");
        assert!(created.iter().all(|r| r.is_ok()), "{created:?}");
        let body = "x".repeat(120 << 10);
        for p in 0..partitions {
            gw.wait_open(&format!("wide/{p}")).await;
            for _ in 0..8 {
                gw.append(&format!("wide%2F{p}"), &[&body]).await;
            }
        }
        let all: Vec<i32> = (0..partitions).collect();
        let before = rss_bytes(gw.proc().pid());
        let streamd_metrics = format!("http://{}/metrics", stack.nodes[0].http);
        let read_bytes = || async {
            metric_value(&get_text(&streamd_metrics).await, "weir_streamd_read_bytes_total").unwrap_or(0.0)
        };
        let read_before = read_bytes().await;
        let answers = fetch_v4(&gw.kafka, "wide", &all, 1 << 20, 1 << 20);
        // The owner was asked for no more than the budget: partitions past it are not read.
        let read = read_bytes().await - read_before;
        assert!(
            read > 0.0 && read <= (1 << 20) as f64,
            "the owner read {read} bytes for a 1 MiB Fetch"
        );
        let total: usize = answers.iter().map(|a| a.2).sum();
        assert!(total > 0 && total <= 1 << 20, "{total} bytes returned: {answers:?}");
        assert!(answers.iter().all(|a| a.0 == 0 && a.1 == 8), "{answers:?}");
        assert!(
            answers[1..].iter().all(|a| a.2 == 0),
            "past the budget: offsets only: {answers:?}"
        );
        // A budget smaller than any batch: one whole batch, from the first partition.
        let answers = fetch_v4(&gw.kafka, "wide", &all, 50 << 10, 50 << 10);
        assert!(answers[0].2 > 120 << 10 && answers[0].2 < 130 << 10, "{answers:?}");
        assert!(answers[1..].iter().all(|a| a.2 == 0), "{answers:?}");
        // One partition listed 1,000 times is read once; every repeat is INVALID_REQUEST
        // (42), never read.
        let read_before = read_bytes().await;
        let answers = fetch_v4(&gw.kafka, "wide", &[0; 1000], 55 << 20, 1 << 20);
        assert_eq!(answers.len(), 1000);
        assert!(answers[0].0 == 0 && answers[0].2 > 0, "{:?}", answers[0]);
        assert!(answers[1..].iter().all(|a| a.0 == 42 && a.2 == 0), "repeats read");
        let read = read_bytes().await - read_before;
        assert!(
            read <= (1 << 20) as f64,
            "the owner read {read} bytes for one partition"
        );
        // More such Fetches cost the gateway no more than the budget each.
        for _ in 0..20 {
            fetch_v4(&gw.kafka, "wide", &all, 1 << 20, 1 << 20);
        }
        let after = rss_bytes(gw.proc().pid());
        assert!(
            after < before + 64 * MIB,
            "gatewayd grew from {} to {} MiB",
            before / MIB,
            after / MIB
        );
    })
    .await;
}
