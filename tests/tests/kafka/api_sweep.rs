//! Issue 59: every API the gateway advertises answers a valid request at every version
//! it advertises, with a response that decodes at that version. Requests are built with
//! `kafka-protocol`'s own encoders, in orders that make them valid (a SyncGroup after
//! its JoinGroup, an EndTxn after its InitProducerId), on one authenticated connection.
//! A version the gateway advertises but cannot answer (ListOffsets v1–v3 once closed the
//! connection) fails here, named.

use super::*;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use std::collections::BTreeSet;
use std::net::TcpStream;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn topic(v: &str) -> TopicName {
    TopicName(s(v))
}

fn group(v: &str) -> GroupId {
    GroupId(s(v))
}

fn txn_id(v: &str) -> TransactionalId {
    TransactionalId(s(v))
}

const TOPIC: &str = "sweep";
const SECRET: &str = "weir_sweep-secret";

/// Why a request got no usable answer.
#[derive(Debug)]
enum Failed {
    /// The gateway closed the connection (or reset it) instead of answering.
    Closed(std::io::Error),
    /// An answer came that does not decode at the request's version.
    Undecodable(String),
    /// The answer is for another request.
    WrongCorrelation(i32),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Closed(e) => write!(f, "no answer, the connection closed: {e}"),
            Failed::Undecodable(e) => write!(f, "the answer does not decode at this version: {e}"),
            Failed::WrongCorrelation(id) => write!(f, "the answer carries correlation id {id}"),
        }
    }
}

/// One authenticated connection, reopened after a request closed it so that one
/// failure does not hide the next.
struct Conn {
    addr: String,
    s: TcpStream,
    correlation: i32,
    /// Every (API key, version) a request was sent at.
    covered: BTreeSet<(i16, i16)>,
    failures: Vec<String>,
}

impl Conn {
    fn open(addr: &str) -> Conn {
        let mut c = Conn::unauthenticated(addr);
        c.authenticate();
        c
    }

    /// A new connection, before SASL.
    fn unauthenticated(addr: &str) -> Conn {
        Conn {
            addr: addr.to_string(),
            s: weir_tests::kafka_wire::connect(addr),
            correlation: 100,
            covered: BTreeSet::new(),
            failures: vec![],
        }
    }

    fn authenticate(&mut self) {
        let hs = RequestKind::SaslHandshake(SaslHandshakeRequest::default().with_mechanism(s("PLAIN")));
        let answer = self.send(ApiKey::SaslHandshake, 1, &hs).expect("SaslHandshake v1");
        let ResponseKind::SaslHandshake(hs) = answer else {
            unreachable!()
        };
        assert_eq!(hs.error_code, 0, "PLAIN is offered");
        let token = format!("\0sweep\0{SECRET}");
        let auth = RequestKind::SaslAuthenticate(
            SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::from(token.into_bytes())),
        );
        let answer = self
            .send(ApiKey::SaslAuthenticate, 2, &auth)
            .expect("SaslAuthenticate v2");
        let ResponseKind::SaslAuthenticate(auth) = answer else {
            unreachable!()
        };
        assert_eq!(
            auth.error_code, 0,
            "the sweep's token authenticates: {:?}",
            auth.error_message
        );
    }

    /// Sends `req` at `version` and decodes its answer at that version.
    fn send(&mut self, key: ApiKey, version: i16, req: &RequestKind) -> Result<ResponseKind, Failed> {
        self.correlation += 1;
        let mut buf = bytes::BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(s("api-sweep")))
            .encode(&mut buf, key.request_header_version(version))
            .expect("encode header");
        // DescribeLogDirs v0 has v1's schema; the codec knows only v1 and later.
        let codec = if key == ApiKey::DescribeLogDirs && version == 0 {
            1
        } else {
            version
        };
        req.encode(&mut buf, codec)
            .unwrap_or_else(|e| panic!("the sweep's own {key:?} v{version} request does not encode: {e}"));
        self.s
            .write_all(&(buf.len() as i32).to_be_bytes())
            .map_err(Failed::Closed)?;
        self.s.write_all(&buf).map_err(Failed::Closed)?;
        let mut size = [0u8; 4];
        self.s.read_exact(&mut size).map_err(Failed::Closed)?;
        let mut answer = vec![0u8; i32::from_be_bytes(size).max(0) as usize];
        self.s.read_exact(&mut answer).map_err(Failed::Closed)?;
        let mut answer = bytes::Bytes::from(answer);
        let header = ResponseHeader::decode(&mut answer, key.response_header_version(version))
            .map_err(|e| Failed::Undecodable(format!("header: {e}")))?;
        if header.correlation_id != self.correlation {
            return Err(Failed::WrongCorrelation(header.correlation_id));
        }
        let body = ResponseKind::decode(key, &mut answer, codec).map_err(|e| Failed::Undecodable(e.to_string()))?;
        if !answer.is_empty() {
            return Err(Failed::Undecodable(format!("{} bytes left over", answer.len())));
        }
        Ok(body)
    }

    /// Sends `req` at `version`, noting a failure (and reconnecting) instead of
    /// stopping; the answer when there is one.
    fn sweep(&mut self, key: ApiKey, version: i16, req: RequestKind) -> Option<ResponseKind> {
        self.covered.insert((key as i16, version));
        match self.send(key, version, &req) {
            Ok(answer) => Some(answer),
            Err(e) => {
                self.failures.push(format!("{key:?} v{version}: {e}"));
                self.s = weir_tests::kafka_wire::connect(&self.addr);
                self.authenticate();
                None
            }
        }
    }
}

/// The versions of `key` the gateway advertised.
fn versions(advertised: &[(i16, i16, i16)], key: ApiKey) -> std::ops::RangeInclusive<i16> {
    let (_, lo, hi) = advertised
        .iter()
        .find(|(k, ..)| *k == key as i16)
        .copied()
        .unwrap_or((0, 1, 0));
    lo..=hi
}

/// The error codes an answer carries at any level, for answers whose success the
/// sweep checks as well as their shape.
fn error_codes(answer: &ResponseKind) -> Vec<i16> {
    match answer {
        ResponseKind::Produce(r) => r
            .responses
            .iter()
            .flat_map(|t| t.partition_responses.iter().map(|p| p.error_code))
            .collect(),
        ResponseKind::Fetch(r) => std::iter::once(r.error_code)
            .chain(
                r.responses
                    .iter()
                    .flat_map(|t| t.partitions.iter().map(|p| p.error_code)),
            )
            .collect(),
        ResponseKind::ListOffsets(r) => r
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
            .collect(),
        ResponseKind::Metadata(r) => r
            .topics
            .iter()
            .flat_map(|t| std::iter::once(t.error_code).chain(t.partitions.iter().map(|p| p.error_code)))
            .collect(),
        ResponseKind::DescribeConfigs(r) => r.results.iter().map(|r| r.error_code).collect(),
        ResponseKind::OffsetCommit(r) => r
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
            .collect(),
        ResponseKind::OffsetFetch(r) => std::iter::once(r.error_code)
            .chain(r.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code)))
            .chain(r.groups.iter().map(|g| g.error_code))
            .collect(),
        ResponseKind::DescribeCluster(r) => vec![r.error_code],
        ResponseKind::CreateTopics(r) => r.topics.iter().map(|t| t.error_code).collect(),
        ResponseKind::OffsetForLeaderEpoch(r) => r
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
            .collect(),
        ResponseKind::DescribeLogDirs(r) => std::iter::once(r.error_code)
            .chain(r.results.iter().map(|d| d.error_code))
            .collect(),
        ResponseKind::DescribeTopicPartitions(r) => r
            .topics
            .iter()
            .flat_map(|t| std::iter::once(t.error_code).chain(t.partitions.iter().map(|p| p.error_code)))
            .collect(),
        _ => vec![],
    }
}

/// Sweeps `key` at every advertised version with the request `build` makes for it,
/// expecting no error code where `must_succeed`.
fn each_version(
    c: &mut Conn,
    advertised: &[(i16, i16, i16)],
    key: ApiKey,
    must_succeed: bool,
    mut build: impl FnMut(i16) -> RequestKind,
) -> Vec<(i16, ResponseKind)> {
    let mut answers = vec![];
    for v in versions(advertised, key) {
        if let Some(answer) = c.sweep(key, v, build(v)) {
            let errors = error_codes(&answer);
            if must_succeed && errors.iter().any(|e| *e != 0) {
                c.failures.push(format!("{key:?} v{v}: error codes {errors:?}"));
            }
            answers.push((v, answer));
        }
    }
    answers
}

fn produce_request(value: &str) -> RequestKind {
    use produce_request::{PartitionProduceData, TopicProduceData};
    let records = bytes::Bytes::from(weir_tests::batches::batch(value.as_bytes()));
    RequestKind::Produce(
        ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(topic(TOPIC))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(records))])]),
    )
}

fn fetch_request(v: i16) -> RequestKind {
    use fetch_request::{FetchPartition, FetchTopic};
    RequestKind::Fetch(
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(0)
            .with_max_bytes(1 << 20)
            .with_isolation_level(if v >= 4 { 1 } else { 0 })
            .with_topics(vec![FetchTopic::default().with_topic(topic(TOPIC)).with_partitions(
                vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(0)
                    .with_partition_max_bytes(1 << 20)],
            )]),
    )
}

fn list_offsets_request(v: i16, spec: i64) -> RequestKind {
    use list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    RequestKind::ListOffsets(
        ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(if v >= 2 { 1 } else { 0 })
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(topic(TOPIC))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_timestamp(spec)])]),
    )
}

fn metadata_request(v: i16) -> RequestKind {
    use metadata_request::MetadataRequestTopic;
    let mut r = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default().with_name(Some(topic(TOPIC)))
    ]));
    if v >= 4 {
        r = r.with_allow_auto_topic_creation(false);
    }
    RequestKind::Metadata(r)
}

/// A JoinGroup's outcome the later group requests build on.
#[derive(Default, Clone)]
struct Member {
    group: String,
    id: String,
    generation: i32,
}

fn join_request(v: i16, group_id: &str, member: &str) -> RequestKind {
    use join_group_request::JoinGroupRequestProtocol;
    RequestKind::JoinGroup(
        JoinGroupRequest::default()
            .with_group_id(group(group_id))
            .with_session_timeout_ms(30_000)
            .with_rebalance_timeout_ms(if v >= 1 { 30_000 } else { -1 })
            .with_member_id(s(member))
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(subscription(TOPIC))]),
    )
}

/// A ConsumerProtocolSubscription v0 for `topic`, as a classic consumer sends.
fn subscription(topic: &str) -> bytes::Bytes {
    let mut b = vec![0, 0, 0, 0, 0, 1];
    b.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    b.extend_from_slice(topic.as_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    bytes::Bytes::from(b)
}

/// Waits until `key`'s coordinator (`key_type` 0: a group, 1: a transactional id) is
/// available, as a client retries FindCoordinator: the internal topics are created on
/// first use and their partitions open then.
fn wait_coordinator(c: &mut Conn, key: &str, key_type: i8) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let find = RequestKind::FindCoordinator(
            FindCoordinatorRequest::default()
                .with_key_type(key_type)
                .with_coordinator_keys(vec![s(key)]),
        );
        if let Ok(ResponseKind::FindCoordinator(r)) = c.send(ApiKey::FindCoordinator, 4, &find) {
            if r.coordinators.first().is_some_and(|k| k.error_code == 0) {
                return;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no coordinator for {key} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Joins `group_id` at `v`, answering MEMBER_ID_REQUIRED (v4+) with the id given.
fn join(c: &mut Conn, v: i16, group_id: &str) -> Option<Member> {
    let ResponseKind::JoinGroup(first) = c.sweep(ApiKey::JoinGroup, v, join_request(v, group_id, ""))? else {
        unreachable!()
    };
    let answer = if first.error_code == 79 {
        let ResponseKind::JoinGroup(second) =
            c.sweep(ApiKey::JoinGroup, v, join_request(v, group_id, &first.member_id))?
        else {
            unreachable!()
        };
        second
    } else {
        first
    };
    if answer.error_code != 0 {
        c.failures
            .push(format!("JoinGroup v{v} of a new group: error {}", answer.error_code));
        return None;
    }
    Some(Member {
        group: group_id.to_string(),
        id: answer.member_id.to_string(),
        generation: answer.generation_id,
    })
}

fn sync_request(v: i16, m: &Member) -> RequestKind {
    use sync_group_request::SyncGroupRequestAssignment;
    let mut r = SyncGroupRequest::default()
        .with_group_id(group(&m.group))
        .with_generation_id(m.generation)
        .with_member_id(s(&m.id))
        .with_assignments(vec![SyncGroupRequestAssignment::default()
            .with_member_id(s(&m.id))
            .with_assignment(bytes::Bytes::from_static(&[0, 1, 0, 0, 0, 0, 0, 0, 0, 0]))]);
    if v >= 5 {
        r = r
            .with_protocol_type(Some(s("consumer")))
            .with_protocol_name(Some(s("range")));
    }
    RequestKind::SyncGroup(r)
}

/// The group requests, in the order a consumer sends them: join, sync, heartbeat,
/// commit, fetch, describe, list, leave, delete.
fn sweep_groups(c: &mut Conn, adv: &[(i16, i16, i16)]) {
    let mut members = vec![];
    for group in ["sweep-offsets", "sweep-txn-group"] {
        wait_coordinator(c, group, 0);
    }
    for v in versions(adv, ApiKey::JoinGroup) {
        wait_coordinator(c, &format!("sweep-join-v{v}"), 0);
        if let Some(m) = join(c, v, &format!("sweep-join-v{v}")) {
            members.push(m);
        }
    }
    assert!(
        !members.is_empty(),
        "no JoinGroup version joined a new group: {:?}",
        c.failures
    );
    let m = members[0].clone();
    each_version(c, adv, ApiKey::SyncGroup, false, |v| sync_request(v, &m));
    each_version(c, adv, ApiKey::Heartbeat, false, |_| {
        RequestKind::Heartbeat(
            HeartbeatRequest::default()
                .with_group_id(group(&m.group))
                .with_generation_id(m.generation)
                .with_member_id(s(&m.id)),
        )
    });
    each_version(c, adv, ApiKey::OffsetCommit, true, |v| {
        use offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
        let mut r = OffsetCommitRequest::default()
            .with_group_id(group("sweep-offsets"))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(topic(TOPIC))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(i64::from(v))
                    .with_committed_metadata(Some(s("sweep")))])]);
        if v <= 4 {
            r = r.with_retention_time_ms(-1);
        }
        RequestKind::OffsetCommit(r)
    });
    each_version(c, adv, ApiKey::OffsetFetch, true, |v| {
        let r = if v >= 8 {
            use offset_fetch_request::{OffsetFetchRequestGroup, OffsetFetchRequestTopics};
            OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(group("sweep-offsets"))
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_name(topic(TOPIC))
                    .with_partition_indexes(vec![0])]))])
        } else {
            use offset_fetch_request::OffsetFetchRequestTopic;
            OffsetFetchRequest::default()
                .with_group_id(group("sweep-offsets"))
                .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                    .with_name(topic(TOPIC))
                    .with_partition_indexes(vec![0])]))
        };
        RequestKind::OffsetFetch(r)
    });
    each_version(c, adv, ApiKey::FindCoordinator, false, |v| {
        let r = FindCoordinatorRequest::default();
        RequestKind::FindCoordinator(if v >= 4 {
            r.with_coordinator_keys(vec![s(&m.group)])
        } else {
            r.with_key(s(&m.group))
        })
    });
    each_version(c, adv, ApiKey::DescribeGroups, false, |_| {
        RequestKind::DescribeGroups(DescribeGroupsRequest::default().with_groups(vec![group(&m.group)]))
    });
    each_version(c, adv, ApiKey::ListGroups, false, |_| {
        RequestKind::ListGroups(ListGroupsRequest::default())
    });
    let deleted = each_version(c, adv, ApiKey::OffsetDelete, false, |_| {
        use offset_delete_request::{OffsetDeleteRequestPartition, OffsetDeleteRequestTopic};
        RequestKind::OffsetDelete(
            OffsetDeleteRequest::default()
                .with_group_id(group("sweep-offsets"))
                .with_topics(vec![OffsetDeleteRequestTopic::default()
                    .with_name(topic(TOPIC))
                    .with_partitions(vec![
                        OffsetDeleteRequestPartition::default().with_partition_index(0)
                    ])]),
        )
    });
    // OffsetDelete deleted the idle group's offset (OffsetFetch finds none), and
    // refuses a topic a live member subscribes to.
    let fetched = c.sweep(ApiKey::OffsetFetch, 1, {
        use offset_fetch_request::OffsetFetchRequestTopic;
        RequestKind::OffsetFetch(
            OffsetFetchRequest::default()
                .with_group_id(group("sweep-offsets"))
                .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                    .with_name(topic(TOPIC))
                    .with_partition_indexes(vec![0])])),
        )
    });
    if let Some(ResponseKind::OffsetFetch(f)) = fetched.filter(|_| versions(adv, ApiKey::OffsetDelete).count() > 0) {
        let offset = f
            .topics
            .first()
            .and_then(|t| t.partitions.first())
            .map(|p| p.committed_offset);
        if offset != Some(-1) {
            c.failures.push(format!(
                "OffsetDelete left the offset: {offset:?}; it answered {deleted:?}"
            ));
        }
        let refused = c.sweep(ApiKey::OffsetDelete, 0, {
            use offset_delete_request::{OffsetDeleteRequestPartition, OffsetDeleteRequestTopic};
            RequestKind::OffsetDelete(
                OffsetDeleteRequest::default()
                    .with_group_id(group(&m.group))
                    .with_topics(vec![OffsetDeleteRequestTopic::default()
                        .with_name(topic(TOPIC))
                        .with_partitions(vec![
                            OffsetDeleteRequestPartition::default().with_partition_index(0)
                        ])]),
            )
        });
        let code = match &refused {
            Some(ResponseKind::OffsetDelete(r)) => r
                .topics
                .first()
                .and_then(|t| t.partitions.first())
                .map(|p| p.error_code),
            _ => None,
        };
        if code != Some(86) {
            c.failures.push(format!(
                "OffsetDelete of a subscribed topic: {code:?}, not GROUP_SUBSCRIBED_TO_TOPIC: {refused:?}"
            ));
        }
    }
    let mut leaving = members.into_iter();
    each_version(c, adv, ApiKey::LeaveGroup, false, |v| {
        use leave_group_request::MemberIdentity;
        let m = leaving.next().unwrap_or_else(|| m.clone());
        let r = LeaveGroupRequest::default().with_group_id(group(&m.group));
        RequestKind::LeaveGroup(if v >= 3 {
            r.with_members(vec![MemberIdentity::default().with_member_id(s(&m.id))])
        } else {
            r.with_member_id(s(&m.id))
        })
    });
    each_version(c, adv, ApiKey::DeleteGroups, false, |v| {
        RequestKind::DeleteGroups(
            DeleteGroupsRequest::default().with_groups_names(vec![group(&format!("sweep-join-v{v}"))]),
        )
    });
    for v in versions(adv, ApiKey::ConsumerGroupHeartbeat) {
        wait_coordinator(c, &format!("sweep-848-v{v}"), 0);
    }
    each_version(c, adv, ApiKey::ConsumerGroupHeartbeat, false, |v| {
        RequestKind::ConsumerGroupHeartbeat(
            ConsumerGroupHeartbeatRequest::default()
                .with_group_id(group(&format!("sweep-848-v{v}")))
                .with_member_id(s(&format!("sweep-member-{v}-0000000000")))
                .with_member_epoch(0)
                .with_rebalance_timeout_ms(30_000)
                .with_subscribed_topic_names(Some(vec![topic(TOPIC)]))
                .with_topic_partitions(Some(vec![])),
        )
    });
    each_version(c, adv, ApiKey::ConsumerGroupDescribe, false, |v| {
        RequestKind::ConsumerGroupDescribe(
            ConsumerGroupDescribeRequest::default().with_group_ids(vec![group(&format!("sweep-848-v{v}"))]),
        )
    });
}

/// The transactional requests, one whole transaction per version: InitProducerId,
/// AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn.
fn sweep_transactions(c: &mut Conn, adv: &[(i16, i16, i16)]) {
    let rounds = [
        ApiKey::InitProducerId,
        ApiKey::AddPartitionsToTxn,
        ApiKey::AddOffsetsToTxn,
        ApiKey::TxnOffsetCommit,
        ApiKey::EndTxn,
    ]
    .iter()
    .map(|k| *versions(adv, *k).end())
    .max()
    .unwrap_or(0);
    for round in 0..=rounds {
        let at = |key: ApiKey| {
            let vs = versions(adv, key);
            round.clamp(*vs.start(), *vs.end())
        };
        let tid = format!("sweep-tx-{round}");
        wait_coordinator(c, &tid, 1);
        let v = at(ApiKey::InitProducerId);
        let Some(ResponseKind::InitProducerId(init)) = c.sweep(
            ApiKey::InitProducerId,
            v,
            RequestKind::InitProducerId(
                InitProducerIdRequest::default()
                    .with_transactional_id(Some(txn_id(&tid)))
                    .with_transaction_timeout_ms(60_000),
            ),
        ) else {
            continue;
        };
        if init.error_code != 0 {
            c.failures
                .push(format!("InitProducerId v{v}: error {}", init.error_code));
            continue;
        }
        let (pid, epoch) = (init.producer_id, init.producer_epoch);
        let v = at(ApiKey::AddPartitionsToTxn);
        c.sweep(
            ApiKey::AddPartitionsToTxn,
            v,
            RequestKind::AddPartitionsToTxn(
                AddPartitionsToTxnRequest::default()
                    .with_v3_and_below_transactional_id(txn_id(&tid))
                    .with_v3_and_below_producer_id(pid)
                    .with_v3_and_below_producer_epoch(epoch)
                    .with_v3_and_below_topics(vec![add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                        .with_name(topic(TOPIC))
                        .with_partitions(vec![0])]),
            ),
        );
        let v = at(ApiKey::AddOffsetsToTxn);
        c.sweep(
            ApiKey::AddOffsetsToTxn,
            v,
            RequestKind::AddOffsetsToTxn(
                AddOffsetsToTxnRequest::default()
                    .with_transactional_id(txn_id(&tid))
                    .with_producer_id(pid)
                    .with_producer_epoch(epoch)
                    .with_group_id(group("sweep-txn-group")),
            ),
        );
        let v = at(ApiKey::TxnOffsetCommit);
        c.sweep(ApiKey::TxnOffsetCommit, v, {
            use txn_offset_commit_request::{TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic};
            RequestKind::TxnOffsetCommit(
                TxnOffsetCommitRequest::default()
                    .with_transactional_id(txn_id(&tid))
                    .with_group_id(group("sweep-txn-group"))
                    .with_producer_id(pid)
                    .with_producer_epoch(epoch)
                    .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                        .with_name(topic(TOPIC))
                        .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(1)])]),
            )
        });
        if round == 0 {
            // A transaction left open, with a batch in it, for the introspection
            // requests to find.
            let batch = weir_tests::batches::idempotent(weir_tests::batches::batch(b"in-txn"), pid.0, epoch, 0);
            let records = bytes::Bytes::from(weir_tests::batches::transactional(batch));
            let produced = c.sweep(ApiKey::Produce, 9, {
                use produce_request::{PartitionProduceData, TopicProduceData};
                RequestKind::Produce(
                    ProduceRequest::default()
                        .with_transactional_id(Some(txn_id(&tid)))
                        .with_acks(-1)
                        .with_timeout_ms(10_000)
                        .with_topic_data(vec![TopicProduceData::default()
                            .with_name(topic(TOPIC))
                            .with_partition_data(vec![PartitionProduceData::default()
                                .with_index(0)
                                .with_records(Some(records))])]),
                )
            });
            if let Some(answer) = produced {
                let errors = error_codes(&answer);
                if errors != [0] {
                    c.failures
                        .push(format!("a transactional Produce: error codes {errors:?}"));
                }
            }
            // ListTransactions finds it by state, and DescribeTransactions shows its
            // partition.
            let listed = each_version(c, adv, ApiKey::ListTransactions, false, |v| {
                let r = ListTransactionsRequest::default().with_state_filters(vec![s("Ongoing")]);
                RequestKind::ListTransactions(if v >= 2 {
                    r.with_transactional_id_pattern(Some(s("sweep-tx-.*")))
                } else {
                    r
                })
            });
            for (v, answer) in listed {
                let ResponseKind::ListTransactions(r) = answer else {
                    unreachable!()
                };
                let found: Vec<(String, String)> = r
                    .transaction_states
                    .iter()
                    .map(|t| (t.transactional_id.to_string(), t.transaction_state.to_string()))
                    .collect();
                if r.error_code != 0 || found != [(tid.clone(), "Ongoing".to_string())] {
                    c.failures
                        .push(format!("ListTransactions v{v}: {} {found:?}", r.error_code));
                }
            }
            let described = each_version(c, adv, ApiKey::DescribeTransactions, false, |_| {
                RequestKind::DescribeTransactions(
                    DescribeTransactionsRequest::default().with_transactional_ids(vec![txn_id(&tid)]),
                )
            });
            for (v, answer) in described {
                let ResponseKind::DescribeTransactions(r) = answer else {
                    unreachable!()
                };
                let t = r.transaction_states.first();
                let shown = t.map(|t| {
                    let topics: Vec<(String, Vec<i32>)> = t
                        .topics
                        .iter()
                        .map(|d| (d.topic.to_string(), d.partitions.clone()))
                        .collect();
                    (t.error_code, t.transaction_state.to_string(), t.producer_id.0, topics)
                });
                // The partition written to, and the group's offsets partition that
                // AddOffsetsToTxn added (as Kafka shows it).
                let as_expected = shown.as_ref().is_some_and(|(error, state, producer, topics)| {
                    let names: Vec<&str> = topics.iter().map(|(t, _)| t.as_str()).collect();
                    *error == 0
                        && state == "Ongoing"
                        && *producer == pid.0
                        && topics.contains(&(TOPIC.to_string(), vec![0]))
                        && names == ["__consumer_offsets", TOPIC]
                });
                if !as_expected {
                    c.failures.push(format!("DescribeTransactions v{v}: {shown:?}"));
                }
            }
            let described = each_version(c, adv, ApiKey::DescribeProducers, false, |_| {
                use describe_producers_request::TopicRequest;
                RequestKind::DescribeProducers(DescribeProducersRequest::default().with_topics(vec![
                    TopicRequest::default().with_name(topic(TOPIC)).with_partition_indexes(vec![0]),
                ]))
            });
            // The transaction's producer, at its epoch, with its one batch's sequence
            // and the open transaction's first offset.
            for (v, answer) in described {
                let ResponseKind::DescribeProducers(r) = answer else {
                    unreachable!()
                };
                let p = r.topics.first().and_then(|t| t.partitions.first());
                let found = p.and_then(|p| p.active_producers.iter().find(|a| a.producer_id == pid));
                let ok = p.is_some_and(|p| p.error_code == 0)
                    && found.is_some_and(|a| {
                        a.producer_epoch == i32::from(epoch) && a.last_sequence == 0 && a.current_txn_start_offset >= 0
                    });
                if !ok {
                    c.failures.push(format!("DescribeProducers v{v}: {p:?}"));
                }
            }
        }
        let v = at(ApiKey::EndTxn);
        c.sweep(
            ApiKey::EndTxn,
            v,
            RequestKind::EndTxn(
                EndTxnRequest::default()
                    .with_transactional_id(txn_id(&tid))
                    .with_producer_id(pid)
                    .with_producer_epoch(epoch)
                    .with_committed(true),
            ),
        );
    }
}

/// Topic admin and introspection: create, grow, configure, describe, trim, delete.
fn sweep_admin(c: &mut Conn, adv: &[(i16, i16, i16)]) {
    each_version(c, adv, ApiKey::CreateTopics, true, |v| {
        use create_topics_request::CreatableTopic;
        RequestKind::CreateTopics(CreateTopicsRequest::default().with_timeout_ms(30_000).with_topics(
            vec![CreatableTopic::default()
                    .with_name(topic(&format!("sweep-new-v{v}")))
                    .with_num_partitions(1)
                    .with_replication_factor(-1)],
        ))
    });
    each_version(c, adv, ApiKey::CreatePartitions, false, |v| {
        use create_partitions_request::CreatePartitionsTopic;
        RequestKind::CreatePartitions(CreatePartitionsRequest::default().with_timeout_ms(30_000).with_topics(
            vec![CreatePartitionsTopic::default()
                    .with_name(topic("sweep-grow"))
                    .with_count(i32::from(v) + 2)],
        ))
    });
    each_version(c, adv, ApiKey::DescribeConfigs, true, |v| {
        use describe_configs_request::DescribeConfigsResource;
        let r = DescribeConfigsRequest::default()
            .with_include_synonyms(true)
            .with_resources(vec![
                DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s(TOPIC)),
                DescribeConfigsResource::default()
                    .with_resource_type(4)
                    .with_resource_name(s("1")),
            ]);
        RequestKind::DescribeConfigs(if v >= 3 { r.with_include_documentation(true) } else { r })
    });
    each_version(c, adv, ApiKey::AlterConfigs, false, |_| {
        use alter_configs_request::{AlterConfigsResource, AlterableConfig};
        RequestKind::AlterConfigs(AlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s(TOPIC))
                .with_configs(vec![AlterableConfig::default()
                    .with_name(s("retention.ms"))
                    .with_value(Some(s("86400000")))]),
        ]))
    });
    each_version(c, adv, ApiKey::IncrementalAlterConfigs, false, |_| {
        use incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
        RequestKind::IncrementalAlterConfigs(IncrementalAlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s(TOPIC))
                .with_configs(vec![AlterableConfig::default()
                    .with_name(s("retention.ms"))
                    .with_config_operation(0)
                    .with_value(Some(s("86400000")))]),
        ]))
    });
    each_version(c, adv, ApiKey::DescribeCluster, true, |_| {
        RequestKind::DescribeCluster(DescribeClusterRequest::default())
    });
    each_version(c, adv, ApiKey::DescribeLogDirs, true, |_| {
        use describe_log_dirs_request::DescribableLogDirTopic;
        RequestKind::DescribeLogDirs(DescribeLogDirsRequest::default().with_topics(Some(vec![
            DescribableLogDirTopic::default().with_topic(topic(TOPIC)).with_partitions(vec![0]),
        ])))
    });
    each_version(c, adv, ApiKey::DescribeTopicPartitions, true, |_| {
        use describe_topic_partitions_request::TopicRequest;
        RequestKind::DescribeTopicPartitions(
            DescribeTopicPartitionsRequest::default()
                .with_response_partition_limit(2000)
                .with_topics(vec![TopicRequest::default().with_name(topic(TOPIC))]),
        )
    });
    each_version(c, adv, ApiKey::ListPartitionReassignments, false, |_| {
        RequestKind::ListPartitionReassignments(ListPartitionReassignmentsRequest::default().with_timeout_ms(30_000))
    });
    each_version(c, adv, ApiKey::ElectLeaders, false, |v| {
        use elect_leaders_request::TopicPartitions;
        let r = ElectLeadersRequest::default()
            .with_timeout_ms(30_000)
            .with_topic_partitions(Some(vec![TopicPartitions::default()
                .with_topic(topic(TOPIC))
                .with_partitions(vec![0])]));
        RequestKind::ElectLeaders(if v >= 1 { r.with_election_type(0) } else { r })
    });
    each_version(c, adv, ApiKey::OffsetForLeaderEpoch, true, |v| {
        use offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
        let r = OffsetForLeaderEpochRequest::default().with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(topic(TOPIC))
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(0)
                .with_current_leader_epoch(-1)
                .with_leader_epoch(0)])]);
        RequestKind::OffsetForLeaderEpoch(if v >= 3 { r.with_replica_id(BrokerId(-1)) } else { r })
    });
    each_version(c, adv, ApiKey::DeleteRecords, false, |v| {
        use delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
        RequestKind::DeleteRecords(
            DeleteRecordsRequest::default()
                .with_timeout_ms(30_000)
                .with_topics(vec![DeleteRecordsTopic::default()
                    .with_name(topic(TOPIC))
                    .with_partitions(vec![DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(i64::from(v))])]),
        )
    });
    each_version(c, adv, ApiKey::DeleteTopics, false, |v| {
        let name = topic(&format!("sweep-new-v{}", v + 1));
        let r = DeleteTopicsRequest::default().with_timeout_ms(30_000);
        RequestKind::DeleteTopics(if v >= 6 {
            r.with_topics(vec![
                delete_topics_request::DeleteTopicState::default().with_name(Some(name))
            ])
        } else {
            r.with_topic_names(vec![name])
        })
    });
    // Issue 59: SCRAM users need the admin scope, which the sweep's token lacks; both
    // answer, refusing it as Kafka refuses a user without the cluster's DESCRIBE/ALTER.
    for (v, answer) in each_version(c, adv, ApiKey::DescribeUserScramCredentials, false, |_| {
        RequestKind::DescribeUserScramCredentials(DescribeUserScramCredentialsRequest::default())
    }) {
        let ResponseKind::DescribeUserScramCredentials(r) = answer else {
            unreachable!()
        };
        if r.error_code != 31 {
            c.failures.push(format!("DescribeUserScramCredentials v{v}: {r:?}"));
        }
    }
    for (v, answer) in each_version(c, adv, ApiKey::AlterUserScramCredentials, false, |_| {
        use alter_user_scram_credentials_request::ScramCredentialUpsertion;
        RequestKind::AlterUserScramCredentials(AlterUserScramCredentialsRequest::default().with_upsertions(vec![
            ScramCredentialUpsertion::default()
                .with_name(s("sweep"))
                .with_mechanism(1)
                .with_iterations(4096)
                .with_salt(bytes::Bytes::from_static(b"sweep-salt"))
                .with_salted_password(bytes::Bytes::from_static(&[7; 32])),
        ]))
    }) {
        let ResponseKind::AlterUserScramCredentials(r) = answer else {
            unreachable!()
        };
        if r.results.len() != 1 || r.results[0].error_code != 31 {
            c.failures.push(format!("AlterUserScramCredentials v{v}: {r:?}"));
        }
    }
    // Issue 59: client quotas need the cluster's DESCRIBE_CONFIGS and ALTER_CONFIGS,
    // which the sweep's token lacks: both answer at every version, refusing it.
    for (v, answer) in each_version(c, adv, ApiKey::DescribeClientQuotas, false, |_| {
        RequestKind::DescribeClientQuotas(DescribeClientQuotasRequest::default())
    }) {
        let ResponseKind::DescribeClientQuotas(r) = answer else {
            unreachable!()
        };
        if r.error_code != 31 {
            c.failures.push(format!("DescribeClientQuotas v{v}: {r:?}"));
        }
    }
    for (v, answer) in each_version(c, adv, ApiKey::AlterClientQuotas, false, |_| {
        use alter_client_quotas_request::{EntityData, EntryData, OpData};
        RequestKind::AlterClientQuotas(
            AlterClientQuotasRequest::default().with_entries(vec![EntryData::default()
                .with_entity(vec![EntityData::default()
                    .with_entity_type(s("user"))
                    .with_entity_name(Some(s("sweep")))])
                .with_ops(vec![OpData::default()
                    .with_key(s("producer_byte_rate"))
                    .with_value(1024.0)])]),
        )
    }) {
        let ResponseKind::AlterClientQuotas(r) = answer else {
            unreachable!()
        };
        if r.entries.len() != 1 || r.entries[0].error_code != 31 {
            c.failures.push(format!("AlterClientQuotas v{v}: {r:?}"));
        }
    }
    // Issue 59: ACLs. The sweep's token may not describe or alter the cluster, so all
    // three answer at every version with Kafka's refusal, decoded at that version.
    for (v, answer) in each_version(c, adv, ApiKey::DescribeAcls, false, |_| {
        RequestKind::DescribeAcls(
            DescribeAclsRequest::default()
                .with_resource_type_filter(1)
                .with_pattern_type_filter(1)
                .with_operation(1)
                .with_permission_type(1),
        )
    }) {
        let ResponseKind::DescribeAcls(r) = answer else {
            unreachable!()
        };
        if r.error_code != 31 {
            c.failures.push(format!("DescribeAcls v{v}: {r:?}"));
        }
    }
    for (v, answer) in each_version(c, adv, ApiKey::CreateAcls, false, |_| {
        RequestKind::CreateAcls(CreateAclsRequest::default().with_creations(vec![
            create_acls_request::AclCreation::default()
                .with_resource_type(2)
                .with_resource_name(s(TOPIC))
                .with_resource_pattern_type(3)
                .with_principal(s("User:sweep"))
                .with_host(s("*"))
                .with_operation(3)
                .with_permission_type(3),
        ]))
    }) {
        let ResponseKind::CreateAcls(r) = answer else {
            unreachable!()
        };
        if r.results.len() != 1 || r.results[0].error_code != 31 {
            c.failures.push(format!("CreateAcls v{v}: {r:?}"));
        }
    }
    for (v, answer) in each_version(c, adv, ApiKey::DeleteAcls, false, |_| {
        RequestKind::DeleteAcls(DeleteAclsRequest::default().with_filters(vec![
            delete_acls_request::DeleteAclsFilter::default()
                .with_resource_type_filter(1)
                .with_pattern_type_filter(1)
                .with_operation(1)
                .with_permission_type(1),
        ]))
    }) {
        let ResponseKind::DeleteAcls(r) = answer else {
            unreachable!()
        };
        if r.filter_results.len() != 1 || r.filter_results[0].error_code != 31 {
            c.failures.push(format!("DeleteAcls v{v}: {r:?}"));
        }
    }
}

/// SaslHandshake and SaslAuthenticate at every version, each on a new connection
/// (a connection authenticates once).
fn sweep_sasl(c: &mut Conn, adv: &[(i16, i16, i16)]) {
    for v in versions(adv, ApiKey::SaslHandshake) {
        let mut fresh = Conn::unauthenticated(&c.addr);
        let hs = RequestKind::SaslHandshake(SaslHandshakeRequest::default().with_mechanism(s("PLAIN")));
        c.covered.insert((ApiKey::SaslHandshake as i16, v));
        match fresh.send(ApiKey::SaslHandshake, v, &hs) {
            Ok(ResponseKind::SaslHandshake(r)) if r.error_code == 0 => {}
            Ok(other) => c.failures.push(format!("SaslHandshake v{v}: refused: {other:?}")),
            Err(e) => c.failures.push(format!("SaslHandshake v{v}: {e}")),
        }
    }
    for v in versions(adv, ApiKey::SaslAuthenticate) {
        let mut fresh = Conn::unauthenticated(&c.addr);
        let hs = RequestKind::SaslHandshake(SaslHandshakeRequest::default().with_mechanism(s("PLAIN")));
        fresh.send(ApiKey::SaslHandshake, 1, &hs).expect("SaslHandshake v1");
        let token = format!("\0sweep\0{SECRET}");
        let auth = RequestKind::SaslAuthenticate(
            SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::from(token.into_bytes())),
        );
        c.covered.insert((ApiKey::SaslAuthenticate as i16, v));
        match fresh.send(ApiKey::SaslAuthenticate, v, &auth) {
            Ok(ResponseKind::SaslAuthenticate(r)) if r.error_code == 0 => {}
            Ok(other) => c.failures.push(format!("SaslAuthenticate v{v}: refused: {other:?}")),
            Err(e) => c.failures.push(format!("SaslAuthenticate v{v}: {e}")),
        }
    }
}

// Issue 59: the version sweep. Every (API, version) in ApiVersions is sent a valid
// request and must answer one that decodes at that version, on a connection that stays
// open; Produce, Fetch, ListOffsets, Metadata, DescribeConfigs (topic and broker),
// OffsetCommit/Fetch, CreateTopics, DescribeCluster, DescribeLogDirs and
// DescribeTopicPartitions must also answer without an error code.
#[tokio::test(flavor = "multi_thread")]
async fn every_advertised_api_answers_at_every_advertised_version() {
    let (stack, mut gw) = kafka_stack(1, &["--auth", "--kafka-allow-plaintext-sasl"]).await;
    stack.metad.issue_token("sweep", SECRET, &[]).await;
    gw.token = Some(SECRET.into());
    let addr = gw.kafka.clone();
    let mut c = tokio::task::spawn_blocking(move || Conn::open(&addr))
        .await
        .expect("connect");
    for name in [TOPIC, "sweep-grow"] {
        use create_topics_request::CreatableTopic;
        let create = RequestKind::CreateTopics(CreateTopicsRequest::default().with_timeout_ms(30_000).with_topics(
            vec![CreatableTopic::default()
                    .with_name(topic(name))
                    .with_num_partitions(1)
                    .with_replication_factor(1)],
        ));
        let ResponseKind::CreateTopics(created) = c.send(ApiKey::CreateTopics, 7, &create).expect("create topic")
        else {
            unreachable!()
        };
        assert_eq!(
            created.topics[0].error_code, 0,
            "{name}: {:?}",
            created.topics[0].error_message
        );
        gw.wait_open(&format!("{name}/0")).await;
    }
    let c = tokio::task::spawn_blocking(move || {
        let adv: Vec<(i16, i16, i16)> = {
            let req = RequestKind::ApiVersions(
                ApiVersionsRequest::default()
                    .with_client_software_name(s("weir-sweep"))
                    .with_client_software_version(s("1")),
            );
            let Ok(ResponseKind::ApiVersions(r)) = c.send(ApiKey::ApiVersions, 3, &req) else {
                panic!("ApiVersions v3")
            };
            r.api_keys
                .iter()
                .map(|k| (k.api_key, k.min_version, k.max_version))
                .collect()
        };
        each_version(&mut c, &adv, ApiKey::ApiVersions, false, |v| {
            let r = ApiVersionsRequest::default();
            RequestKind::ApiVersions(if v >= 3 {
                r.with_client_software_name(s("weir-sweep"))
                    .with_client_software_version(s("1"))
            } else {
                r
            })
        });
        each_version(&mut c, &adv, ApiKey::Metadata, true, metadata_request);
        each_version(&mut c, &adv, ApiKey::Produce, true, |v| {
            produce_request(&format!("sweep-{v}"))
        });
        each_version(&mut c, &adv, ApiKey::Fetch, true, fetch_request);
        for spec in [-1, -2, 0] {
            each_version(&mut c, &adv, ApiKey::ListOffsets, true, |v| {
                list_offsets_request(v, spec)
            });
        }
        sweep_groups(&mut c, &adv);
        sweep_transactions(&mut c, &adv);
        sweep_admin(&mut c, &adv);
        sweep_sasl(&mut c, &adv);
        let advertised: BTreeSet<(i16, i16)> = adv
            .iter()
            .flat_map(|(k, lo, hi)| (*lo..=*hi).map(move |v| (*k, v)))
            .collect();
        let unswept: Vec<String> = advertised
            .difference(&c.covered)
            .map(|(k, v)| format!("{:?} v{v}", ApiKey::try_from(*k).map_err(|_| *k)))
            .collect();
        assert!(
            unswept.is_empty(),
            "advertised but not swept (add a request): {unswept:?}"
        );
        c
    })
    .await
    .expect("sweep");
    assert!(
        c.failures.is_empty(),
        "{} of {} (API, version) pairs failed:\n{}",
        c.failures.len(),
        c.covered.len(),
        c.failures.join("\n")
    );
}
