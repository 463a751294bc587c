//! One Kafka connection: frames in, responses out in request order. Produce and Fetch
//! are pipelined (D-22); a Produce's batches reach their owners in arrival order
//! through the connection's ordered appends, so a producer's batches to a partition
//! are stored in the order it sent them.

use super::caller::Caller;
use super::frame::{self, DecodeError, FrameError};
use super::response_frame::SharedFrame;
use super::throttle::Throttle;
use super::{admin, brokers, groups, introspection, produce, sasl, transactions, versions, Kafka};
use crate::ordered_appends::OrderedAppends;
use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, StreamExt};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::Encodable;
use kafka_protocol::ResponseError as KafkaError;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_meta::model::grants::Grants;
use weir_shared::listener::Guarded;
use weir_shared::tls::MaybeTls;

const UNSUPPORTED_VERSION: i16 = KafkaError::UnsupportedVersion.code();

/// Per-connection state.
pub struct Session {
    /// Who sends the requests: what a handler is given.
    pub caller: Caller,
    /// The mechanism agreed by SaslHandshake.
    pub mechanism: Option<String>,
    /// The authenticated principal's connection slot, held while the connection lives.
    pub principal_slot: Option<super::principals::PrincipalSlot>,
    /// When the authenticated token was issued (rechecked while the connection lives).
    pub token_issued: Option<u64>,
    /// The connection runs under TLS (`SSL` or `SASL_SSL`).
    pub tls: bool,
    /// A SCRAM exchange between its two round trips.
    pub scram: Option<super::scram::Started>,
}

impl Session {
    fn authenticated(&mut self, who: sasl::Authenticated) {
        self.caller.principal = Some(who.name);
        self.caller.grants = who.grants.at(self.caller.peer.ip());
        self.token_issued = Some(who.issued_index);
        self.principal_slot = Some(who.slot);
    }
}

struct Open;
impl Open {
    fn new() -> Self {
        crate::metrics::metrics().kafka_connections.inc();
        Open
    }
}
impl Drop for Open {
    fn drop(&mut self) {
        crate::metrics::metrics().kafka_connections.dec();
    }
}

/// How often an authenticated connection checks that its token is still live: a
/// revoked token's connections close within this (issue 18 asks for 5 s).
const TOKEN_RECHECK: Duration = Duration::from_secs(1);

/// Requests of one connection admitted and not yet answered. Past it, or past
/// [`MAX_IN_FLIGHT_BYTES`] of their frames, the next frame is not read (librdkafka's
/// default allows 1,000,000 in flight). librdkafka sends a Produce per partition, so
/// at an object WAL's ~50 ms a cap of 64 held a 16-partition producer to about 1,300
/// requests a second and queued 1.5 s in the client (issue 58).
const MAX_IN_FLIGHT: usize = 1024;
/// Bytes of admitted, unanswered request frames past which the next is not read (one
/// frame is always admitted, whatever its size up to `--kafka-max-frame-bytes`).
const MAX_IN_FLIGHT_BYTES: usize = 64 << 20;

/// A pipelined request's answer, with what its response header needs.
struct Done {
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    started: std::time::Instant,
    answer: Answer,
    /// The request frame's bytes, counted against [`MAX_IN_FLIGHT_BYTES`] until answered.
    frame_bytes: usize,
    /// The time a pipelined request took to admit: what it costs the request quota
    /// (its wait for durability or data is not the gateway's work). Others cost the
    /// time until answered.
    admitted: Option<Duration>,
    /// What a Produce owed its quota when admitted (its `throttle_time_ms`).
    throttled: Duration,
}

type InFlight<'a> = FuturesOrdered<BoxFuture<'a, Done>>;
type Reader = ReadHalf<MaybeTls<Guarded>>;
type Writer = WriteHalf<MaybeTls<Guarded>>;

/// The read half and the next frame from it; the read half comes back with the frame,
/// so the read can be polled alongside answers without losing a partial frame.
fn read_next(
    mut rd: Reader,
    max: usize,
    within: Duration,
    partial: Arc<AtomicBool>,
) -> BoxFuture<'static, (Reader, Result<bytes::Bytes, FrameError>)> {
    Box::pin(async move {
        let frame = frame::read_frame_noting(&mut rd, max, within, &partial).await;
        (rd, frame)
    })
}

/// Serves one connection. Produce and Fetch are pipelined (D-22): each is admitted as
/// soon as it is read (a Produce's batches are sent to their owners in arrival order)
/// and up to [`MAX_IN_FLIGHT`] wait for their answers together; responses go out in
/// request order, as the protocol requires. Every other request is a barrier: it runs
/// once everything before it is answered. Appends to owners go on lanes run on `lanes`.
pub async fn run(
    socket: MaybeTls<Guarded>,
    peer: SocketAddr,
    kafka: Arc<Kafka>,
    lanes: TaskTracker,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let _open = Open::new();
    let tls = socket.is_tls();
    let (rd, mut wr) = tokio::io::split(socket);
    let mut session = Session {
        caller: Caller {
            peer,
            client_id: String::new(),
            principal: (!kafka.gw.auth).then(|| weir_meta::model::names::ANONYMOUS.to_string()),
            grants: if kafka.gw.auth {
                Grants::nothing()
            } else {
                Grants::everything()
            },
        },
        mechanism: None,
        principal_slot: None,
        token_issued: None,
        tls,
        scram: None,
    };
    let refused = |reason: &str| {
        crate::metrics::metrics()
            .kafka_refused_frames
            .with_label_values(&[reason])
            .inc()
    };
    // Until it authenticates, a peer may send only small frames (issue 19). The next
    // frame is read only once the one before was dispatched, so a SASL exchange that
    // authenticates is over before the limit is chosen again.
    let partial = Arc::new(AtomicBool::new(false));
    let next_frame = |rd: Reader, session: &Session| {
        let max = if session.caller.principal.is_some() {
            kafka.max_frame_bytes
        } else {
            kafka.max_unauthenticated_frame_bytes
        };
        read_next(rd, max, kafka.header_read_timeout, partial.clone())
    };
    let appends = OrderedAppends::new(lanes);
    let mut in_flight: InFlight<'_> = FuturesOrdered::new();
    // Frame bytes of the requests in `in_flight`; a drain empties it, so the count
    // starts again from 0 whenever it is empty.
    let mut bytes_in_flight = 0usize;
    let mut reading = next_frame(rd, &session);
    // RR-FEN-2: when this connection stops waiting for the gateway's catch-up.
    let mut admission_deadline: Option<tokio::time::Instant> = None;
    let mut throttle = Throttle::new(kafka.gw.clone());
    let mut recheck = tokio::time::interval(TOKEN_RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // A connection over its quota reads nothing until its throttle is served (KIP-219).
        let muted = throttle.muted_until();
        let (mut rd, frame) = tokio::select! {
            biased;
            Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                bytes_in_flight = bytes_in_flight.saturating_sub(done.frame_bytes);
                if !respond(&mut wr, &peer, done, &mut throttle).await? {
                    return Ok(());
                }
                continue;
            }
            _ = stop.cancelled() => {
                // Requests already admitted are answered; nothing more is read, and a
                // request half received is dropped unanswered (SD-INT-12).
                if partial.load(Ordering::Relaxed) {
                    crate::metrics::metrics().requests_dropped.with_label_values(&["kafka"]).inc();
                    tracing::debug!(%peer, "kafka request dropped mid-frame: the gateway is stopping");
                }
                drain(&mut in_flight, &mut wr, &peer, &mut throttle).await?;
                return Ok(());
            }
            _ = recheck.tick(), if session.token_issued.is_some() => {
                let principal = session.caller.principal.as_deref().unwrap_or_default();
                let issued = session.token_issued.unwrap_or_default();
                if let Err(why) = sasl::still_valid(&kafka, principal, issued) {
                    // Admitted requests were authorized when read; nothing more is.
                    tracing::warn!(%peer, principal, reason = %why, "kafka connection's token is no longer valid; closing the connection");
                    drain(&mut in_flight, &mut wr, &peer, &mut throttle).await?;
                    return Ok(());
                }
                continue;
            }
            _ = tokio::time::sleep_until(muted.unwrap_or_else(tokio::time::Instant::now)), if muted.is_some() => continue,
            read = &mut reading, if muted.is_none() && (in_flight.is_empty() || (in_flight.len() < MAX_IN_FLIGHT && bytes_in_flight < MAX_IN_FLIGHT_BYTES)) => read,
        };
        let frame = match frame {
            Ok(f) => f,
            Err(FrameError::Closed) => {
                drain(&mut in_flight, &mut wr, &peer, &mut throttle).await?;
                return Ok(());
            }
            Err(e @ FrameError::TooLarge(..)) => {
                refused(if session.caller.principal.is_some() {
                    "too_large"
                } else {
                    "too_large_unauthenticated"
                });
                tracing::warn!(%peer, error = %e, "kafka frame refused; closing the connection");
                return Ok(());
            }
            Err(e @ FrameError::HeadTimeout(_)) => {
                weir_shared::listener::count_header_timeout("kafka");
                tracing::warn!(%peer, error = %e, "closing the kafka connection");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        let frame_bytes = frame.len();
        let req = match frame::decode(frame, versions::supported) {
            Ok(r) => r,
            Err(DecodeError::Unsupported {
                key: ApiKey::ApiVersions,
                correlation_id,
                ..
            }) => {
                // Answered at v0 so any client can read it, with the versions we have.
                drain(&mut in_flight, &mut wr, &peer, &mut throttle).await?;
                let body = ResponseKind::ApiVersions(versions::api_versions(UNSUPPORTED_VERSION));
                write(&mut wr, correlation_id, ApiKey::ApiVersions, 0, &body).await?;
                reading = next_frame(rd, &session);
                continue;
            }
            Err(e) => {
                refused(match e {
                    DecodeError::Unsupported { .. } => "unsupported_version",
                    DecodeError::UnknownKey(_) => "unknown_api",
                    _ => "malformed",
                });
                tracing::warn!(%peer, error = %e, "kafka request refused; closing the connection");
                return Ok(());
            }
        };
        if let Some(id) = &req.header.client_id {
            if session.caller.client_id != id.as_str() {
                session.caller.client_id = id.to_string();
            }
        }
        let (key, version, correlation_id) = (req.key, req.header.request_api_version, req.header.correlation_id);
        if session.caller.principal.is_none()
            && !matches!(
                key,
                ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
            )
        {
            refused("unauthenticated");
            tracing::warn!(%peer, api = ?key, "kafka request before SASL authentication; closing the connection");
            return Ok(());
        }
        // RR-FEN-2: a request this gateway would answer from a view it has not yet
        // caught up with (metadata, SASL credentials, routes) waits for the catch-up,
        // up to one deadline per connection. Past it, only a Metadata naming topics or
        // none is answered (each topic LEADER_NOT_AVAILABLE, retryable); anything else
        // would be answered from the stale view, so the connection closes and the
        // client reconnects, as it does when a Kafka broker goes away.
        if key != ApiKey::ApiVersions && !kafka.gw.routes.is_admitted() {
            let deadline = *admission_deadline.get_or_insert_with(|| tokio::time::Instant::now() + ADMISSION_WAIT);
            let admitted = tokio::select! {
                admitted = kafka.gw.routes.wait_admitted(deadline) => admitted,
                _ = stop.cancelled() => {
                    // Stopping: the request was never admitted (SD-INT-12).
                    crate::metrics::metrics().requests_dropped.with_label_values(&["kafka"]).inc();
                    tracing::debug!(%peer, api = ?key, "kafka request dropped before the catch-up: the gateway is stopping");
                    drain(&mut in_flight, &mut wr, &peer, &mut throttle).await?;
                    return Ok(());
                }
            };
            if !admitted && !answerable_before_admission(&req.kind) {
                refused("catching_up");
                tracing::warn!(%peer, api = ?key, "kafka request before this gateway caught up with the metadata log; closing the connection");
                drain(&mut in_flight, &mut wr, &peer, &mut throttle).await?;
                return Ok(());
            }
        }
        throttle.follow(&session.caller);
        // Judged against the ACLs as they are now: a change applies to the next request.
        if !session.caller.grants.is_super() {
            let acls = kafka.gw.routes.view().with(|s| s.acls.clone());
            session.caller.grants.set_acls(acls);
        }
        let started = std::time::Instant::now();
        let done = move |answer, admitted| Done {
            key,
            version,
            correlation_id,
            started,
            answer,
            frame_bytes,
            admitted,
            throttled: Duration::ZERO,
        };
        // Pipelined: admitted now, answered in order later.
        match req.kind {
            RequestKind::Produce(r) => {
                bytes_in_flight = if in_flight.is_empty() { 0 } else { bytes_in_flight } + frame_bytes;
                let throttled = throttle.produce_admitted(frame_bytes);
                let produced = produce::start(&kafka, &appends, &session.caller.grants, r);
                let admitted = Some(started.elapsed());
                in_flight.push_back(Box::pin(async move {
                    let answer = match produced.await {
                        Some(resp) => Answer::Respond(ResponseKind::Produce(resp)),
                        None => Answer::Silent,
                    };
                    Done {
                        throttled,
                        ..done(answer, admitted)
                    }
                }));
                reading = next_frame(rd, &session);
                continue;
            }
            RequestKind::Fetch(r) => {
                bytes_in_flight = if in_flight.is_empty() { 0 } else { bytes_in_flight } + frame_bytes;
                let (kafka, grants) = (&kafka, session.caller.grants.clone());
                let owner = session.caller.principal.clone().unwrap_or_default();
                let admitted = Some(started.elapsed());
                in_flight.push_back(Box::pin(async move {
                    done(
                        Answer::Respond(ResponseKind::Fetch(
                            super::fetch_sessions::fetch(kafka, &owner, &grants, r, version).await,
                        )),
                        admitted,
                    )
                }));
                reading = next_frame(rd, &session);
                continue;
            }
            _ => {}
        }
        // A barrier: everything before it is answered first.
        drain(&mut in_flight, &mut wr, &peer, &mut throttle).await?;
        // Boxed: a request's state lives only while it is handled, so an idle connection
        // costs its small loop state, not the largest request's (issue 19).
        let answer = Box::pin(dispatch(&kafka, &mut session, req.kind, req.body, version)).await;
        if let Answer::RespondThenRawSasl(body) = answer {
            record(key, started);
            write(&mut wr, correlation_id, key, version, &body).await?;
            // SaslHandshake v0: the next frame is a bare SASL token.
            let token = match frame::read_frame(&mut rd, 64 * 1024, kafka.header_read_timeout).await {
                Ok(t) => t,
                Err(_) => return Ok(()),
            };
            match sasl::authenticate(&kafka, &token) {
                Ok(who) => {
                    session.authenticated(who);
                    wr.write_all(&0i32.to_be_bytes()).await?;
                    wr.flush().await?;
                }
                Err(why) => {
                    tracing::warn!(%peer, reason = %why, "kafka SASL authentication failed");
                    return Ok(());
                }
            }
        } else if !respond(&mut wr, &peer, done(answer, None), &mut throttle).await? {
            return Ok(());
        }
        reading = next_frame(rd, &session);
    }
}

/// Counts a request and how long it took.
fn record(key: ApiKey, started: std::time::Instant) {
    let m = crate::metrics::metrics();
    let api = format!("{key:?}");
    m.kafka_requests.with_label_values(&[&api]).inc();
    m.kafka_latency
        .with_label_values(&[&api])
        .observe(started.elapsed().as_secs_f64());
}

/// Writes one answered request's response; `false` when the connection must close.
async fn respond(wr: &mut Writer, peer: &SocketAddr, mut done: Done, throttle: &mut Throttle) -> anyhow::Result<bool> {
    record(done.key, done.started);
    let cost = done.admitted.unwrap_or_else(|| done.started.elapsed());
    match &mut done.answer {
        Answer::Respond(body) => throttle.meter(cost, done.throttled, Some(body)),
        _ => throttle.meter(cost, done.throttled, None),
    }
    match done.answer {
        Answer::Respond(body) => write(wr, done.correlation_id, done.key, done.version, &body).await?,
        Answer::Silent => {}
        Answer::Close(why) => {
            tracing::warn!(%peer, api = ?done.key, reason = %why, "closing the kafka connection");
            return Ok(false);
        }
        Answer::RespondThenRawSasl(_) => unreachable!("SaslHandshake is never pipelined"),
        Answer::RespondThenClose(body, why) => {
            write(wr, done.correlation_id, done.key, done.version, &body).await?;
            tracing::debug!(%peer, api = ?done.key, reason = %why, "closing the kafka connection");
            return Ok(false);
        }
    }
    Ok(true)
}

/// Answers every request in flight, in order.
async fn drain(
    in_flight: &mut InFlight<'_>,
    wr: &mut Writer,
    peer: &SocketAddr,
    throttle: &mut Throttle,
) -> anyhow::Result<()> {
    while let Some(done) = in_flight.next().await {
        respond(wr, peer, done, throttle).await?;
    }
    Ok(())
}

/// What to do after a request.
pub enum Answer {
    Respond(ResponseKind),
    /// Produce with acks=0: no response at all.
    Silent,
    /// A protocol violation: close, as Kafka does.
    Close(String),
    /// SaslHandshake v0 accepted: respond, then read a raw token.
    RespondThenRawSasl(ResponseKind),
    /// A failed authentication: respond, then close, as Kafka does (no guessing on
    /// one connection, and no principal kept from before).
    RespondThenClose(ResponseKind, String),
}

/// How long a Kafka connection waits for the gateway's catch-up, over all its requests.
const ADMISSION_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// RR-FEN-2: the one request answered before the catch-up: a Metadata naming its
/// topics (each answered LEADER_NOT_AVAILABLE) or none (brokers only, as clients ask at
/// bootstrap). A Metadata for every topic (a null list) would have to list them from
/// the stale view.
fn answerable_before_admission(kind: &RequestKind) -> bool {
    matches!(kind, RequestKind::Metadata(r) if r.topics.is_some())
}

async fn dispatch(kafka: &Kafka, session: &mut Session, kind: RequestKind, body: bytes::Bytes, version: i16) -> Answer {
    use Answer::Respond;
    match kind {
        RequestKind::ApiVersions(_) => Respond(ResponseKind::ApiVersions(versions::api_versions(0))),
        RequestKind::Metadata(r) => Respond(ResponseKind::Metadata(
            brokers::metadata(kafka, &session.caller, r, version).await,
        )),
        RequestKind::DescribeCluster(_) => Respond(ResponseKind::DescribeCluster(brokers::describe_cluster(kafka))),
        RequestKind::Produce(_) | RequestKind::Fetch(_) => {
            Answer::Close("a pipelined request reached the barrier path".into())
        }
        RequestKind::ListOffsets(r) => Respond(ResponseKind::ListOffsets(
            super::scopes::list_offsets(kafka, &session.caller.grants, r, version).await,
        )),
        RequestKind::CreateTopics(r) => Respond(ResponseKind::CreateTopics(
            admin::create_topics(kafka, &session.caller, r).await,
        )),
        RequestKind::DeleteTopics(r) => Respond(ResponseKind::DeleteTopics(
            admin::delete_topics(kafka, &session.caller, r).await,
        )),
        RequestKind::CreatePartitions(r) => Respond(ResponseKind::CreatePartitions(
            admin::create_partitions(kafka, &session.caller, r).await,
        )),
        RequestKind::DescribeConfigs(r) => Respond(ResponseKind::DescribeConfigs(admin::describe_configs(
            kafka,
            &session.caller,
            r,
        ))),
        RequestKind::AlterConfigs(r) => Respond(ResponseKind::AlterConfigs(
            super::configs::alter_configs(kafka, &session.caller, r).await,
        )),
        RequestKind::IncrementalAlterConfigs(r) => Respond(ResponseKind::IncrementalAlterConfigs(
            super::configs::incremental_alter_configs(kafka, &session.caller, r).await,
        )),
        RequestKind::DeleteRecords(r) => Respond(ResponseKind::DeleteRecords(
            super::scopes::delete_records(kafka, &session.caller.grants, r).await,
        )),
        RequestKind::OffsetForLeaderEpoch(r) => Respond(ResponseKind::OffsetForLeaderEpoch(
            super::leader_epochs::offset_for_leader_epoch(kafka, &session.caller.grants, r).await,
        )),
        RequestKind::DescribeLogDirs(r) => Respond(ResponseKind::DescribeLogDirs(introspection::describe_log_dirs(
            kafka,
            &session.caller,
            r,
        ))),
        RequestKind::DescribeTopicPartitions(r) => Respond(ResponseKind::DescribeTopicPartitions(
            introspection::describe_topic_partitions(kafka, &session.caller, r),
        )),
        RequestKind::ListPartitionReassignments(r) => Respond(ResponseKind::ListPartitionReassignments(
            introspection::list_partition_reassignments(kafka, &session.caller, r),
        )),
        RequestKind::ElectLeaders(r) => Respond(ResponseKind::ElectLeaders(introspection::elect_leaders(
            kafka,
            &session.caller,
            r,
        ))),
        RequestKind::DescribeClientQuotas(r) => Respond(ResponseKind::DescribeClientQuotas(
            super::client_quotas::describe(kafka, &session.caller, r),
        )),
        RequestKind::AlterClientQuotas(r) => Respond(ResponseKind::AlterClientQuotas(
            super::client_quotas::alter(kafka, &session.caller, r).await,
        )),
        RequestKind::DescribeAcls(r) => Respond(ResponseKind::DescribeAcls(super::acls::describe(
            kafka,
            &session.caller,
            r,
        ))),
        RequestKind::CreateAcls(r) => Respond(ResponseKind::CreateAcls(
            super::acls::create(kafka, &session.caller, r).await,
        )),
        RequestKind::DeleteAcls(r) => Respond(ResponseKind::DeleteAcls(
            super::acls::delete(kafka, &session.caller, r).await,
        )),
        RequestKind::DescribeUserScramCredentials(r) => Respond(ResponseKind::DescribeUserScramCredentials(
            super::scram_users::describe(kafka, &session.caller, r),
        )),
        RequestKind::AlterUserScramCredentials(r) => Respond(ResponseKind::AlterUserScramCredentials(
            super::scram_users::alter(kafka, &session.caller, r).await,
        )),
        RequestKind::DescribeProducers(r) => Respond(ResponseKind::DescribeProducers(
            introspection::describe_producers(kafka, &session.caller, r).await,
        )),
        RequestKind::ListTransactions(r) => Respond(ResponseKind::ListTransactions(
            transactions::list_transactions(kafka, &session.caller, r, version).await,
        )),
        RequestKind::DescribeTransactions(r) => Respond(ResponseKind::DescribeTransactions(
            transactions::describe_transactions(kafka, &session.caller, r, version).await,
        )),
        RequestKind::InitProducerId(r) if r.transactional_id.as_ref().is_some_and(|t| !t.0.is_empty()) => Respond(
            ResponseKind::InitProducerId(transactions::init_producer_id(kafka, &session.caller, r, version).await),
        ),
        RequestKind::InitProducerId(r) => Respond(ResponseKind::InitProducerId(
            admin::init_producer_id(kafka, &session.caller, r).await,
        )),
        RequestKind::AddPartitionsToTxn(r) => Respond(ResponseKind::AddPartitionsToTxn(
            transactions::add_partitions(kafka, &session.caller, r, version).await,
        )),
        RequestKind::AddOffsetsToTxn(r) => Respond(ResponseKind::AddOffsetsToTxn(
            transactions::add_offsets(kafka, &session.caller, r, version).await,
        )),
        RequestKind::EndTxn(r) => Respond(ResponseKind::EndTxn(
            transactions::end(kafka, &session.caller, r, version).await,
        )),
        RequestKind::FindCoordinator(r) => Respond(ResponseKind::FindCoordinator(
            groups::find_coordinator(kafka, &session.caller, r, version).await,
        )),
        RequestKind::SaslHandshake(r) => {
            let plain_allowed = session.tls || kafka.allow_plaintext_sasl;
            let asked = r.mechanism.to_string();
            let (resp, agreed) = sasl::handshake(r, plain_allowed, version);
            if agreed.is_none() && asked == "PLAIN" && !plain_allowed {
                tracing::debug!(peer = %session.caller.peer, "SASL/PLAIN refused on a plaintext connection (--kafka-allow-plaintext-sasl)");
            }
            let ok = agreed.is_some();
            session.mechanism = agreed;
            session.scram = None;
            if ok && version == 0 {
                Answer::RespondThenRawSasl(ResponseKind::SaslHandshake(resp))
            } else {
                Respond(ResponseKind::SaslHandshake(resp))
            }
        }
        RequestKind::SaslAuthenticate(r) => {
            let scram = match session.mechanism.as_deref() {
                None => return Answer::Close("SaslAuthenticate before SaslHandshake".into()),
                Some(m) => weir_meta::scram::Mechanism::parse(m),
            };
            let (resp, principal) = match scram {
                Some(m) => sasl::scram_step(kafka, m, &mut session.scram, r),
                None => sasl::authenticate_request(kafka, r),
            };
            match principal {
                Some(who) => {
                    session.authenticated(who);
                    Respond(ResponseKind::SaslAuthenticate(resp))
                }
                // Between SCRAM's two round trips there is no principal yet.
                None if session.scram.is_some() && resp.error_code == 0 => {
                    Respond(ResponseKind::SaslAuthenticate(resp))
                }
                None => Answer::RespondThenClose(
                    ResponseKind::SaslAuthenticate(resp),
                    "SASL authentication failed".into(),
                ),
            }
        }
        // Group requests; anything else was refused by the version check already.
        kind => match groups::forward(kafka, &session.caller, kind, body, version).await {
            Some(resp) => Respond(resp),
            None => Answer::Close("not implemented".into()),
        },
    }
}

async fn write<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    correlation_id: i32,
    key: ApiKey,
    version: i16,
    body: &ResponseKind,
) -> anyhow::Result<()> {
    // A Fetch response's batches are referenced, not copied into the frame (issue 17).
    let shared = match body {
        ResponseKind::Fetch(f) => f
            .responses
            .iter()
            .flat_map(|t| t.partitions.iter())
            .filter_map(|p| p.records.clone())
            .collect(),
        _ => Vec::new(),
    };
    let mut frame = SharedFrame::new(shared);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut frame, key.response_header_version(version))?;
    match body {
        ResponseKind::Fetch(f) => f.encode(&mut frame, version)?,
        // Other responses are small: encoded as the crate does, then one piece.
        other => {
            let mut buf = bytes::BytesMut::new();
            other.encode(&mut buf, versions::codec_version(key, version))?;
            frame.push(buf.freeze());
        }
    }
    w.write_all_buf(&mut frame.finish()).await?;
    // Under TLS, write_all may leave the last records in the session when the socket
    // is full; without a flush they wait for the next response, and a client waiting
    // for this one stalls.
    w.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ApiVersionsResponse;
    use std::sync::Arc;
    use tokio::io::AsyncReadExt;
    use tokio_rustls::rustls;

    // A response larger than the socket's buffer arrives whole under TLS, with no
    // further write on the connection after it.
    #[tokio::test]
    async fn a_response_under_tls_arrives_whole_through_a_full_socket() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = cert.der().clone();
        let server = weir_shared::tls::ServerTls::new(
            vec![der.clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            &[],
        )
        .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(weir_shared::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        // 512 bytes of pipe: a 64 KiB response fills it many times over.
        let (a, b) = tokio::io::duplex(512);
        let tasks = tokio_util::task::TaskTracker::new();
        let writer = tasks.spawn(async move {
            let mut s = weir_shared::tls::start(Some(&server), b, Duration::from_secs(5), "test")
                .await
                .unwrap();
            let big = ApiVersionsResponse::default().with_api_keys(
                (0..8000)
                    .map(|k| {
                        kafka_protocol::messages::api_versions_response::ApiVersion::default().with_api_key(k as i16)
                    })
                    .collect(),
            );
            write(&mut s, 7, ApiKey::ApiVersions, 0, &ResponseKind::ApiVersions(big))
                .await
                .unwrap();
            // Held open, writing nothing more: the response must already be out.
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let mut c = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(rustls::pki_types::ServerName::try_from("localhost").unwrap(), a)
            .await
            .unwrap();
        let mut size = [0u8; 4];
        let read = async {
            c.read_exact(&mut size).await.unwrap();
            let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
            c.read_exact(&mut body).await.unwrap();
            body.len()
        };
        let got = tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("the whole response within 5 s");
        assert!(got > 40_000, "{got}");
        writer.abort();
    }
}
