//! Issue 18, D-21: mTLS between services. Every metad, streamd and gatewayd presents a
//! certificate from `weir certs` naming its role and id; servers take the caller's
//! identity from it, never from a request's body.

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use reqwest::{Method, StatusCode};
use std::time::Duration;
use weir_meta::client::MetadClient;
use weir_meta::model::{Command, Proposer};
use weir_proto::raft::raft_client::RaftClient;
use weir_proto::raft::RaftRequest;
use weir_proto::streamd::streamd_client::StreamdClient;
use weir_proto::streamd::CloseStreamRequest;
use weir_shared::cluster_tls::ClusterTls;
use weir_shared::ids::{Epoch, Incarnation, NodeId};
use weir_tests::gateway::Gatewayd;
use weir_tests::metad::ADMIN_SECRET;
use weir_tests::streamd::{Backend, Stack};
use weir_tests::wait_for;

const T: Duration = Duration::from_secs(60);

async fn gateway(stack: &Stack, id: &str) -> Gatewayd {
    stack.gateway(id, &[]).await
}

fn metad_as(stack: &Stack, tls: Option<&ClusterTls>) -> MetadClient {
    let addrs: Vec<String> = stack.metad.replicas.iter().map(|r| r.grpc.clone()).collect();
    MetadClient::with_tls(&addrs, Duration::from_secs(5), tls).expect("client")
}

fn node(id: &str, epoch: u64) -> Proposer {
    Proposer::Node(Incarnation {
        node: NodeId::new(id),
        epoch: Epoch(epoch),
    })
}

/// The kinds of every applied entry of the metadata log.
async fn log_kinds(stack: &Stack) -> String {
    stack
        .metad
        .client()
        .admin("log", 0, 100_000)
        .await
        .expect("log dump")
        .to_string()
}

/// The node that owns `stream`, once it is open on a node other than `not`.
async fn owner_other_than(gw: &Gatewayd, stream: &str, not: &str) -> String {
    wait_for(&format!("{stream} served by a node other than {not}"), T, || async {
        let (s, info) = gw.send(gw.request(Method::GET, &format!("/v1/streams/{stream}"))).await;
        let owner = info["owner"]["node"].as_str()?;
        (s == StatusCode::OK && info["state"] == "open" && owner != not).then(|| owner.to_string())
    })
    .await
}

// D-21: a cluster whose metad quorum (Raft), streamd nodes and gateway talk only mTLS
// serves appends and reads; a SIGKILLed owner's stream fails over to another node, and
// a SIGTERMed one hands its stream off (its own drain, allowed because its certificate
// names it: SD-DRN-10; and metad's CloseStream, accepted from a metad certificate:
// SD-DRN-3), with nothing acknowledged lost; `weir` answers with an operator
// certificate only.
#[tokio::test(flavor = "multi_thread")]
async fn an_mtls_cluster_serves_fails_over_and_drains() {
    let mut stack = Stack::start_mtls(3, 3, Backend::FileWal).await;
    let gw = gateway(&stack, "gw-1").await;
    gw.create_stream("secure").await;
    gw.wait_open("secure").await;
    let bodies: Vec<String> = (0..50).map(|i| format!("r{i}")).collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    gw.append("secure", &refs).await;

    let (_, info) = gw.send(gw.request(Method::GET, "/v1/streams/secure")).await;
    let owner = info["owner"]["node"].as_str().expect("owner").to_string();
    let i = stack.nodes.iter().position(|n| n.id == owner).expect("owner node");
    stack.nodes[i].kill();
    let second = owner_other_than(&gw, "secure", &owner).await;
    gw.append("secure", &["after the failover"]).await;
    let j = stack.nodes.iter().position(|n| n.id == second).expect("second owner");
    stack.nodes[j].term();
    assert_eq!(
        stack.nodes[j].wait_exit(T).await,
        Some(0),
        "{}",
        stack.nodes[j].log_text()
    );
    owner_other_than(&gw, "secure", &second).await;
    gw.append("secure", &["after the drain"]).await;
    let mut want = bodies.clone();
    want.extend(["after the failover".to_string(), "after the drain".to_string()]);
    assert_eq!(gw.bodies("secure").await, want);

    // `weir` with an operator certificate; without one it cannot reach metad.
    let certs = stack.metad.certs.as_ref().expect("certs");
    let mut flags = certs.flags("operator", "alice");
    flags.extend([
        "--metad".into(),
        stack.metad_addrs(),
        "--json".into(),
        "nodes".into(),
        "list".into(),
    ]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let listed = weir_tests::tls::weir(&flags);
    assert!(listed.contains("streamd-1") && listed.contains("gw-1"), "{listed}");
    let plain = std::process::Command::new(weir_tests::bin_path("weir"))
        .args(["--metad", &stack.metad_addrs(), "--timeout-sec", "3", "nodes", "list"])
        .output()
        .expect("weir runs");
    assert!(!plain.status.success(), "a plaintext weir listed nodes");
}

// D-21: who may call what. A caller without a certificate, or with one from another CA,
// is refused at the handshake; a streamd certificate proposing as another node, a
// gatewayd certificate proposing a node command as an operator or as itself, and a
// streamd certificate asking for a transfer are refused and leave nothing in the
// metadata log; a gatewayd certificate can neither speak Raft nor close
// a stream; a proposal at a stale epoch is not applied.
#[tokio::test(flavor = "multi_thread")]
async fn grpc_callers_are_who_their_certificates_say() {
    let stack = Stack::start_mtls(1, 2, Backend::FileWal).await;
    let gw = gateway(&stack, "gw-1").await;
    gw.create_stream("kept").await;
    gw.wait_open("kept").await;
    let certs = stack.metad.certs.as_ref().expect("certs");
    let metad_addr = stack.metad.replicas[0].grpc.clone();

    // No certificate at all: plaintext to an mTLS port.
    let plain = metad_as(&stack, None);
    let err = plain.admin("nodes", 0, 0).await.expect_err("plaintext answered");
    assert!(matches!(err, weir_meta::client::ClientError::Unavailable(_)), "{err:?}");
    // A certificate of another CA, naming a real node.
    let other_dir = stack.dir.path().join("other-ca");
    let other = weir_tests::tls::ClusterCerts::make(&other_dir);
    let foreign = other.tls("streamd", "streamd-1");
    let err = metad_as(&stack, Some(&foreign))
        .admin("nodes", 0, 0)
        .await
        .expect_err("a foreign certificate answered");
    assert!(matches!(err, weir_meta::client::ClientError::Unavailable(_)), "{err:?}");

    // streamd-1's certificate proposing as streamd-2 (fencing it) is refused.
    let nodes = stack.metad.client().admin("nodes", 0, 0).await.expect("nodes");
    let epoch_of = |id: &str| {
        nodes["nodes"]
            .as_array()
            .and_then(|ns| ns.iter().find(|n| n["node_id"] == id))
            .and_then(|n| n["epoch"].as_u64())
            .unwrap_or_else(|| panic!("{id} registered: {nodes}"))
    };
    let s1 = metad_as(&stack, Some(&certs.tls("streamd", "streamd-1")));
    let err = s1
        .propose(&node("streamd-2", epoch_of("streamd-2")), Command::FenceSelf)
        .await
        .expect_err("streamd-1 proposed as streamd-2");
    assert!(
        err.to_string()
            .contains("streamd 'streamd-1' may not propose as node 'streamd-2'"),
        "{err}"
    );
    // gw-1's certificate proposing FenceNode as an operator is refused.
    let g = metad_as(&stack, Some(&certs.tls("gatewayd", "gw-1")));
    let err = g
        .propose(
            &Proposer::Operator { principal: "x".into() },
            Command::FenceNode {
                node: NodeId::new("streamd-1"),
                epoch: Epoch(epoch_of("streamd-1")),
                seen_heartbeats: 0,
            },
        )
        .await
        .expect_err("a gateway fenced a node");
    assert!(
        err.to_string()
            .contains("gatewayd 'gw-1' may not propose fence_node as an operator"),
        "{err}"
    );
    // ... nor as a node: a live node's privileges in the state machine are not a
    // gateway certificate's.
    let err = g
        .propose(
            &node("gw-1", epoch_of("gw-1")),
            Command::FenceNode {
                node: NodeId::new("streamd-1"),
                epoch: Epoch(epoch_of("streamd-1")),
                seen_heartbeats: 0,
            },
        )
        .await
        .expect_err("a gateway fenced a node as itself");
    assert!(
        err.to_string()
            .contains("gatewayd 'gw-1' may not propose fence_node as a node"),
        "{err}"
    );
    // A streamd certificate cannot move streams.
    let err = s1
        .transfer(
            weir_proto::metad::TransferRequest {
                stream: "kept".into(),
                target: "streamd-2".into(),
                ..Default::default()
            },
            Duration::from_secs(5),
        )
        .await
        .expect_err("a streamd moved a stream");
    assert!(err.to_string().contains("may not call Transfer"), "{err}");
    let log = log_kinds(&stack).await;
    assert!(!log.contains("fence_self") && !log.contains("fence_node"), "{log}");
    // streamd-1 as itself, at an epoch it does not hold: answered, not applied.
    let (_, outcome) = s1
        .propose(&node("streamd-1", epoch_of("streamd-1") + 7), Command::Heartbeat)
        .await
        .expect("answered");
    assert!(outcome.is_err(), "a stale epoch's heartbeat was applied: {outcome:?}");

    // A gateway certificate cannot speak Raft or close a stream.
    let gw_tls = certs.tls("gatewayd", "gw-1");
    let ch = weir_shared::grpc::channel_with(&metad_addr, Some(gw_tls.client())).expect("channel");
    let denied = RaftClient::new(ch)
        .vote(RaftRequest {
            payload: b"{}".to_vec(),
        })
        .await
        .expect_err("a gateway voted");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    let (_, info) = gw.send(gw.request(Method::GET, "/v1/streams/kept")).await;
    let owner = info["owner"]["node"].as_str().expect("owner");
    let owner_addr = &stack.nodes.iter().find(|n| n.id == owner).expect("owner").grpc;
    let ch = weir_shared::grpc::channel_with(owner_addr, Some(gw_tls.client())).expect("channel");
    let denied = StreamdClient::new(ch)
        .close_stream(CloseStreamRequest {
            stream: "kept".into(),
            ..Default::default()
        })
        .await
        .expect_err("a gateway closed a stream");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    gw.append("kept", &["still open"]).await;
    // Nothing was fenced.
    let nodes = stack.metad.client().admin("nodes", 0, 0).await.expect("nodes");
    for n in nodes["nodes"].as_array().expect("nodes") {
        assert_eq!(n["fenced"], false, "{n}");
    }
}

/// A client of metad with `tls` and, on every call, the bearer `token`.
fn metad_with(stack: &Stack, tls: Option<tonic::transport::ClientTlsConfig>, token: Option<&str>) -> MetadClient {
    let addrs: Vec<String> = stack.metad.replicas.iter().map(|r| r.grpc.clone()).collect();
    MetadClient::with_credentials(&addrs, Duration::from_secs(5), tls, token).expect("client")
}

fn create(name: &str) -> Command {
    Command::CreateStream {
        name: name.into(),
        config: Default::default(),
    }
}

fn user(principal: &str) -> Proposer {
    Proposer::Operator {
        principal: principal.into(),
    }
}

// Issue 18, D-21: a gateway proposes user-level changes in its user's name, and metad
// checks that user's token, so a gateway certificate alone grants nothing its users
// could not do: a change outside the token's scope or prefix, for a revoked or unknown
// token, or for the anonymous users of a gateway without --auth is refused and not
// applied; within the scope it is. A drain a gateway asks for needs an admin user.
// The gateway's own consumer offsets topic needs no user's scope.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_certificate_grants_only_what_its_users_tokens_do() {
    let stack = Stack::start_mtls(1, 1, Backend::FileWal).await;
    let gw = stack.gateway("gw-1", &["--kafka-allow-plaintext-sasl"]).await;
    gw.create_stream("by-admin").await;
    stack
        .metad
        .issue_token("orders", "weir_orders-secret", &["manage:orders-", "write:orders-"])
        .await;
    stack.metad.issue_token("reader", "weir_reader-secret", &["read"]).await;
    let certs = stack.metad.certs.as_ref().expect("certs");
    let as_gw = metad_as(&stack, Some(&certs.tls("gatewayd", "gw-1")));

    for (principal, stream, why) in [
        ("orders", "payments", "user 'orders' may not create topic 'payments'"),
        ("reader", "orders-r", "user 'reader' may not create topic 'orders-r'"),
        ("nobody", "orders-n", "no token 'nobody'"),
        ("anonymous", "orders-a", "--allow-anonymous-gateways"),
    ] {
        let err = as_gw
            .propose(&user(principal), create(stream))
            .await
            .expect_err("a change outside the user's scope was proposed");
        let message = err.to_string();
        assert!(
            message.contains(&format!(
                "gatewayd 'gw-1' may not propose create_stream for user '{principal}'"
            )) && message.contains(why),
            "{message}"
        );
    }
    let (_, outcome) = as_gw
        .propose(&user("orders"), create("orders-1"))
        .await
        .expect("within the token's scope");
    outcome.expect("created");
    // Naming an admin user does not let a gateway mint an admin token, which would
    // reach metad directly as an operator.
    let mint = Command::IssueToken {
        name: "minted".into(),
        secret_sha256: weir_gatewayd::api::auth::secret_hash("weir_minted"),
        scopes: vec!["admin".into()],
        expires_at_ms: None,
        scram: None,
    };
    let err = as_gw
        .propose(&user("admin"), mint)
        .await
        .expect_err("a gateway minted an admin token");
    assert!(err.to_string().contains("issued by an operator"), "{err}");
    stack.metad.revoke_token("orders").await;
    let err = as_gw
        .propose(&user("orders"), create("orders-2"))
        .await
        .expect_err("a revoked token's change");
    assert!(err.to_string().contains("token 'orders' is revoked"), "{err}");
    let drain = |principal: &str| weir_proto::metad::DrainRequest {
        node: "streamd-1".into(),
        budget_ms: 5_000,
        principal: principal.into(),
        ..Default::default()
    };
    let err = as_gw
        .drain(drain("reader"), Duration::from_secs(10))
        .await
        .expect_err("a reader drained a node");
    assert!(err.to_string().contains("token 'reader' has no 'admin' scope"), "{err}");

    let streams = stack
        .metad
        .client()
        .admin("streams", 0, 0)
        .await
        .expect("streams")
        .to_string();
    for refused in ["payments", "orders-r", "orders-n", "orders-a", "orders-2"] {
        assert!(
            !streams.contains(&format!("\"{refused}\"")),
            "{refused} created: {streams}"
        );
    }
    assert!(
        streams.contains("\"orders-1\"") && streams.contains("\"by-admin\""),
        "{streams}"
    );
    let log = log_kinds(&stack).await;
    assert!(!log.contains("\"cordon\""), "the refused drain cordoned: {log}");

    // The consumer offsets topic is the gateway's own need, proposed as itself: a
    // group commit works for a user who may only read.
    stack.metad.create_topic("events", 1).await;
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &gw.kafka)
        .set("broker.address.family", "v4")
        .set("group.id", "readers")
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", "PLAIN")
        .set("sasl.username", "reader")
        .set("sasl.password", "weir_reader-secret")
        .create()
        .expect("consumer");
    let mut commit = TopicPartitionList::new();
    commit
        .add_partition_offset("events", 0, Offset::Offset(0))
        .expect("partition");
    wait_for("a group commit", T, || async {
        consumer.commit(&commit, CommitMode::Sync).ok()
    })
    .await;
    let committed = consumer
        .committed_offsets(commit.clone(), T)
        .expect("committed offsets");
    let events = committed.find_partition("events", 0).expect("events/0");
    assert_eq!(events.offset(), Offset::Offset(0));
}

/// The `weir` command with an admin token in `WEIR_TOKEN`; its output and success.
/// The login name it would otherwise log changes in is one metad must not believe.
fn weir_with_token(token: &str, args: &[&str]) -> (bool, String) {
    weir_tests::tls::weir_outcome(args, &[("WEIR_TOKEN", token), ("USER", "mallory")])
}

// Issue 18: an operator without a certificate uses `weir` with an admin token over TLS
// (trusting the cluster's CA), through a follower that forwards to the leader; metad
// logs the change in the token's name, whatever the request says. A token without the
// admin scope, a token without --cluster-ca, and a call with neither certificate nor
// token are refused; an admin token does not make its holder a Raft peer or a node.
#[tokio::test(flavor = "multi_thread")]
async fn weir_authenticates_with_an_admin_token_over_tls() {
    let stack = Stack::start_mtls(3, 1, Backend::FileWal).await;
    stack.metad.issue_token("reader", "weir_reader-secret", &["read"]).await;
    let ca = stack.metad.certs.as_ref().expect("certs").dir.join("ca.pem");
    let ca = ca.display().to_string();
    let leader = stack.metad.wait_leader(&[]).await;
    let follower = (leader + 1) % stack.metad.replicas.len();
    let metad = stack.metad.replicas[follower].grpc.clone();
    let base = ["--cluster-ca", ca.as_str(), "--metad", metad.as_str(), "--json"];
    let with = |more: &[&str]| -> Vec<String> { base.iter().chain(more).map(|s| s.to_string()).collect() };

    let listed = with(&["nodes", "list"]);
    let listed: Vec<&str> = listed.iter().map(String::as_str).collect();
    let (ok, out) = weir_with_token(ADMIN_SECRET, &listed);
    assert!(ok && out.contains("streamd-1"), "{out}");
    let cordon = with(&["nodes", "cordon", "streamd-1"]);
    let cordon: Vec<&str> = cordon.iter().map(String::as_str).collect();
    let (ok, out) = weir_with_token(ADMIN_SECRET, &cordon);
    assert!(ok, "{out}");
    let log = stack.metad.client().admin("log", 0, 100_000).await.expect("log");
    let entry = log["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e.to_string().contains("\"cordon\""))
        .unwrap_or_else(|| panic!("no cordon in {log}"))
        .to_string();
    assert!(entry.contains("\"principal\":\"admin\""), "{entry}");

    let (ok, out) = weir_with_token("weir_reader-secret", &listed);
    assert!(!ok && out.contains("token 'reader' lacks the 'admin' scope"), "{out}");
    let (ok, out) = weir_with_token("weir_wrong", &listed);
    assert!(!ok && out.contains("unknown token"), "{out}");
    let (ok, out) = weir_with_token(ADMIN_SECRET, &["--metad", metad.as_str(), "nodes", "list"]);
    assert!(!ok && out.contains("--token needs --cluster-ca"), "{out}");

    let trust = || weir_shared::cluster_tls::trust_only(std::path::Path::new(&ca)).expect("ca");
    let err = metad_with(&stack, Some(trust()), None)
        .admin("nodes", 0, 0)
        .await
        .expect_err("a caller without certificate or token was answered");
    assert!(err.to_string().contains("or an admin token"), "{err}");
    // The admin token is an operator's, not a metad peer's.
    let ch = weir_shared::grpc::channel_with(&stack.metad.replicas[0].grpc, Some(trust())).expect("channel");
    let mut vote = tonic::Request::new(RaftRequest {
        payload: b"{}".to_vec(),
    });
    let bearer = format!("Bearer {ADMIN_SECRET}").parse().expect("header");
    vote.metadata_mut().insert("authorization", bearer);
    let denied = RaftClient::new(ch).vote(vote).await.expect_err("a token voted");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains("operator 'admin'"), "{denied:?}");
    let as_admin = metad_with(&stack, Some(trust()), Some(ADMIN_SECRET));
    let nodes = as_admin.admin("nodes", 0, 0).await.expect("nodes");
    let epoch = nodes["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["node_id"] == "streamd-1"))
        .and_then(|n| n["epoch"].as_u64())
        .expect("streamd-1's epoch");
    let err = as_admin
        .propose(&node("streamd-1", epoch), Command::FenceSelf)
        .await
        .expect_err("an admin token proposed as a node");
    assert!(
        err.to_string()
            .contains("operator 'admin' may not propose as node 'streamd-1'"),
        "{err}"
    );
}
