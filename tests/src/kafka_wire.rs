//! Raw Kafka connections for tests that need what a client library hides: the exact
//! moment a connection is closed, or an old client's wire exchange.

use kafka_protocol::protocol::{Decodable, Encodable};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A TCP connection to a Kafka listener, with a 10 s read timeout.
pub fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s
}

/// Authenticates a new Kafka connection with SASL/PLAIN through SaslHandshake v0 and a
/// raw token, as old clients do; `None` when the gateway closed it instead.
pub fn sasl_v0(addr: &str, user: &str, secret: &str) -> Option<TcpStream> {
    let (error, mut s) = sasl_handshake_v0(addr, "PLAIN")?;
    if error != 0 {
        return None;
    }
    let token = format!("\0{user}\0{secret}");
    s.write_all(&(token.len() as i32).to_be_bytes()).ok()?;
    s.write_all(token.as_bytes()).ok()?;
    let mut ok = [0u8; 4];
    s.read_exact(&mut ok).ok()?;
    Some(s)
}

/// A SaslHandshake v0 for `mechanism` on a new connection: the answer's error code, and
/// the connection.
pub fn sasl_handshake_v0(addr: &str, mechanism: &str) -> Option<(i16, TcpStream)> {
    let mut s = connect(addr);
    let mut handshake = Vec::new();
    handshake.extend_from_slice(&17i16.to_be_bytes());
    handshake.extend_from_slice(&0i16.to_be_bytes());
    handshake.extend_from_slice(&9i32.to_be_bytes());
    handshake.extend_from_slice(&(-1i16).to_be_bytes());
    handshake.extend_from_slice(&(mechanism.len() as i16).to_be_bytes());
    handshake.extend_from_slice(mechanism.as_bytes());
    s.write_all(&(handshake.len() as i32).to_be_bytes()).ok()?;
    s.write_all(&handshake).ok()?;
    let mut size = [0u8; 4];
    s.read_exact(&mut size).ok()?;
    let mut answer = vec![0u8; i32::from_be_bytes(size) as usize];
    s.read_exact(&mut answer).ok()?;
    // Correlation id, then the error code.
    let error = i16::from_be_bytes(answer.get(4..6)?.try_into().ok()?);
    Some((error, s))
}

/// Whether the peer closed `s` (EOF or a reset) before its read timeout.
pub fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

/// Why an exchange got no answer.
#[derive(Debug, PartialEq, Eq)]
pub enum NoAnswer {
    /// The peer closed or reset the connection.
    Closed,
    /// Nothing came within the read timeout.
    TimedOut,
    /// Something came that is not the response asked for.
    Undecodable,
}

fn no_answer(e: std::io::Error) -> NoAnswer {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => NoAnswer::TimedOut,
        _ => NoAnswer::Closed,
    }
}

/// Sends one request of `key` at `version` on `s` and reads its response.
pub fn exchange<Req, Resp>(
    s: &mut TcpStream,
    key: kafka_protocol::messages::ApiKey,
    version: i16,
    req: &Req,
) -> Result<Resp, NoAnswer>
where
    Req: Encodable,
    Resp: Decodable,
{
    use kafka_protocol::messages::{RequestHeader, ResponseHeader};
    let mut buf = bytes::BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(3)
        .encode(&mut buf, key.request_header_version(version))
        .expect("encode header");
    req.encode(&mut buf, version).expect("encode request");
    s.write_all(&(buf.len() as i32).to_be_bytes()).map_err(no_answer)?;
    s.write_all(&buf).map_err(no_answer)?;
    let mut size = [0u8; 4];
    s.read_exact(&mut size).map_err(no_answer)?;
    let mut answer = vec![0u8; i32::from_be_bytes(size).max(0) as usize];
    s.read_exact(&mut answer).map_err(no_answer)?;
    let mut answer = bytes::Bytes::from(answer);
    ResponseHeader::decode(&mut answer, key.response_header_version(version)).map_err(|_| NoAnswer::Undecodable)?;
    Resp::decode(&mut answer, version).map_err(|_| NoAnswer::Undecodable)
}

/// A Metadata v4 request on `s`, for `topics` or (with `None`) for every topic: each
/// topic's name and error code, in order.
pub fn metadata_errors(s: &mut TcpStream, topics: Option<&[&str]>) -> Result<Vec<(String, i16)>, NoAnswer> {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{ApiKey, MetadataRequest, MetadataResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let wanted = topics.map(|ts| {
        ts.iter()
            .map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(t.to_string())))))
            .collect()
    });
    let request = MetadataRequest::default()
        .with_topics(wanted)
        .with_allow_auto_topic_creation(false);
    let response: MetadataResponse = exchange(s, ApiKey::Metadata, 4, &request)?;
    Ok(response
        .topics
        .iter()
        .map(|t| {
            let name = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
            (name, t.error_code)
        })
        .collect())
}

/// A Produce v7 (acks=all) of one record `value` to `topic`'s partition 0 on `s`: the
/// partition's error code and the response's `throttle_time_ms`.
pub fn produce_answer(s: &mut TcpStream, topic: &str, value: &[u8]) -> Result<(i16, i32), NoAnswer> {
    let (response, partition) = produce(s, topic, value)?;
    Ok((partition.error_code, response.throttle_time_ms))
}

/// As [`produce_answer`]: the partition's error code and the offset the record got.
pub fn produce_at(s: &mut TcpStream, topic: &str, value: &[u8]) -> Result<(i16, i64), NoAnswer> {
    let (_, partition) = produce(s, topic, value)?;
    Ok((partition.error_code, partition.base_offset))
}

fn produce(
    s: &mut TcpStream,
    topic: &str,
    value: &[u8],
) -> Result<
    (
        kafka_protocol::messages::ProduceResponse,
        kafka_protocol::messages::produce_response::PartitionProduceResponse,
    ),
    NoAnswer,
> {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let partition = PartitionProduceData::default()
        .with_index(0)
        .with_records(Some(bytes::Bytes::from(crate::batches::batch(value))));
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![partition])]);
    let response: ProduceResponse = exchange(s, ApiKey::Produce, 7, &request)?;
    let partition = response
        .responses
        .first()
        .and_then(|t| t.partition_responses.first())
        .cloned()
        .ok_or(NoAnswer::Undecodable)?;
    Ok((response, partition))
}
