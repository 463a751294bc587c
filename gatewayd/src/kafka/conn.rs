//! One Kafka connection: frames in, responses out in request order (Kafka processes a
//! connection's requests one at a time, which is what keeps a producer's pipelined
//! batches to one partition in order).

use super::frame::{self, DecodeError, FrameError};
use super::{admin, brokers, fetch, groups, produce, sasl, versions, Kafka};
use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::Encodable;
use kafka_protocol::ResponseError as KafkaError;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;
use weir_shared::listener::Guarded;

const UNSUPPORTED_VERSION: i16 = KafkaError::UnsupportedVersion.code();

/// Per-connection state.
pub struct Session {
    pub peer: SocketAddr,
    pub client_id: String,
    /// The token name once SASL/PLAIN succeeded; `anonymous` without `--auth`.
    pub principal: Option<String>,
    /// The mechanism agreed by SaslHandshake.
    pub mechanism: Option<String>,
    /// The authenticated principal's connection slot, held while the connection lives.
    pub principal_slot: Option<super::principals::PrincipalSlot>,
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

pub async fn run(socket: Guarded, peer: SocketAddr, kafka: Arc<Kafka>, stop: CancellationToken) -> anyhow::Result<()> {
    let _open = Open::new();
    let (mut rd, mut wr) = tokio::io::split(socket);
    let mut session = Session {
        peer,
        client_id: String::new(),
        principal: (!kafka.gw.auth).then(|| "anonymous".to_string()),
        mechanism: None,
        principal_slot: None,
    };
    let refused = |reason: &str| {
        crate::metrics::metrics()
            .kafka_refused_frames
            .with_label_values(&[reason])
            .inc()
    };
    loop {
        // Until it authenticates, a peer may send only small frames (issue 19).
        let max_frame = if session.principal.is_some() {
            kafka.max_frame_bytes
        } else {
            kafka.max_unauthenticated_frame_bytes
        };
        let frame = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            f = frame::read_frame(&mut rd, max_frame, kafka.header_read_timeout) => f,
        };
        let frame = match frame {
            Ok(f) => f,
            Err(FrameError::Closed) => return Ok(()),
            Err(e @ FrameError::TooLarge(..)) => {
                refused(if session.principal.is_some() {
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
        let req = match frame::decode(frame, versions::supported) {
            Ok(r) => r,
            Err(DecodeError::Unsupported {
                key: ApiKey::ApiVersions,
                correlation_id,
                ..
            }) => {
                // Answered at v0 so any client can read it, with the versions we have.
                let body = ResponseKind::ApiVersions(versions::api_versions(UNSUPPORTED_VERSION));
                write(&mut wr, correlation_id, ApiKey::ApiVersions, 0, &body).await?;
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
            if session.client_id != id.as_str() {
                session.client_id = id.to_string();
            }
        }
        let (key, version, correlation_id) = (req.key, req.header.request_api_version, req.header.correlation_id);
        if session.principal.is_none()
            && !matches!(
                key,
                ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
            )
        {
            refused("unauthenticated");
            tracing::warn!(%peer, api = ?key, "kafka request before SASL authentication; closing the connection");
            return Ok(());
        }
        let started = std::time::Instant::now();
        // Boxed: a request's state lives only while it is handled, so an idle connection
        // costs its small loop state, not the largest request's (issue 19).
        let answer = Box::pin(dispatch(&kafka, &mut session, req.kind, req.body, version)).await;
        let m = crate::metrics::metrics();
        let api = format!("{key:?}");
        m.kafka_requests.with_label_values(&[&api]).inc();
        m.kafka_latency
            .with_label_values(&[&api])
            .observe(started.elapsed().as_secs_f64());
        match answer {
            Answer::Respond(body) => write(&mut wr, correlation_id, key, version, &body).await?,
            Answer::Silent => {}
            Answer::Close(why) => {
                tracing::warn!(%peer, api = ?key, reason = %why, "closing the kafka connection");
                return Ok(());
            }
            Answer::RespondThenRawSasl(body) => {
                write(&mut wr, correlation_id, key, version, &body).await?;
                // SaslHandshake v0: the next frame is a bare SASL token.
                let token = match frame::read_frame(&mut rd, 64 * 1024, kafka.header_read_timeout).await {
                    Ok(t) => t,
                    Err(_) => return Ok(()),
                };
                match sasl::authenticate(&kafka, &token) {
                    Ok((name, slot)) => {
                        session.principal = Some(name);
                        session.principal_slot = Some(slot);
                        wr.write_all(&0i32.to_be_bytes()).await?;
                    }
                    Err(why) => {
                        tracing::warn!(%peer, reason = %why, "kafka SASL authentication failed");
                        return Ok(());
                    }
                }
            }
        }
    }
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
}

async fn dispatch(kafka: &Kafka, session: &mut Session, kind: RequestKind, body: bytes::Bytes, version: i16) -> Answer {
    use Answer::Respond;
    match kind {
        RequestKind::ApiVersions(_) => Respond(ResponseKind::ApiVersions(versions::api_versions(0))),
        RequestKind::Metadata(r) => Respond(ResponseKind::Metadata(
            brokers::metadata(kafka, session, r, version).await,
        )),
        RequestKind::DescribeCluster(_) => Respond(ResponseKind::DescribeCluster(brokers::describe_cluster(kafka))),
        RequestKind::Produce(r) => match produce::produce(kafka, r).await {
            Some(resp) => Respond(ResponseKind::Produce(resp)),
            None => Answer::Silent,
        },
        RequestKind::Fetch(r) => Respond(ResponseKind::Fetch(fetch::fetch(kafka, r).await)),
        RequestKind::ListOffsets(r) => Respond(ResponseKind::ListOffsets(fetch::list_offsets(kafka, r).await)),
        RequestKind::CreateTopics(r) => Respond(ResponseKind::CreateTopics(
            admin::create_topics(kafka, session, r).await,
        )),
        RequestKind::DeleteTopics(r) => Respond(ResponseKind::DeleteTopics(
            admin::delete_topics(kafka, session, r).await,
        )),
        RequestKind::CreatePartitions(r) => Respond(ResponseKind::CreatePartitions(
            admin::create_partitions(kafka, session, r).await,
        )),
        RequestKind::DescribeConfigs(r) => Respond(ResponseKind::DescribeConfigs(admin::describe_configs(kafka, r))),
        RequestKind::AlterConfigs(r) => Respond(ResponseKind::AlterConfigs(
            super::configs::alter_configs(kafka, session, r).await,
        )),
        RequestKind::IncrementalAlterConfigs(r) => Respond(ResponseKind::IncrementalAlterConfigs(
            super::configs::incremental_alter_configs(kafka, session, r).await,
        )),
        RequestKind::DeleteRecords(r) => Respond(ResponseKind::DeleteRecords(
            super::delete_records::delete_records(kafka, r).await,
        )),
        RequestKind::InitProducerId(r) => Respond(ResponseKind::InitProducerId(
            admin::init_producer_id(kafka, session, r).await,
        )),
        RequestKind::FindCoordinator(r) => Respond(ResponseKind::FindCoordinator(
            groups::find_coordinator(kafka, session, r, version).await,
        )),
        RequestKind::SaslHandshake(r) => {
            let (resp, ok) = sasl::handshake(r);
            if ok {
                session.mechanism = Some("PLAIN".into());
            }
            if ok && version == 0 {
                Answer::RespondThenRawSasl(ResponseKind::SaslHandshake(resp))
            } else {
                Respond(ResponseKind::SaslHandshake(resp))
            }
        }
        RequestKind::SaslAuthenticate(r) => {
            if session.mechanism.is_none() {
                return Answer::Close("SaslAuthenticate before SaslHandshake".into());
            }
            let (resp, principal) = sasl::authenticate_request(kafka, r);
            if let Some((name, slot)) = principal {
                session.principal = Some(name);
                session.principal_slot = Some(slot);
            }
            Respond(ResponseKind::SaslAuthenticate(resp))
        }
        // Group requests; anything else was refused by the version check already.
        kind => match groups::forward(kafka, session, kind, body, version).await {
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
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, key.response_header_version(version))?;
    body.encode(&mut buf, version)?;
    let size = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&size.to_be_bytes());
    w.write_all(&buf).await?;
    Ok(())
}
