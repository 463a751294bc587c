//! Sending a group request, as Kafka bytes, to the streamd that coordinates the group,
//! and decoding its answer: the one transport every group request handler shares.

use crate::kafka::caller::Caller;
use crate::kafka::errors;
use crate::kafka::Kafka;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable};
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::Resource;
use weir_meta::model::names::offsets_stream;
use weir_proto::streamd::GroupRequest;
use weir_shared::error_code::KafkaApi;

/// Longest a JoinGroup or SyncGroup may wait at its coordinator: Kafka's largest
/// caller timeout (`group.max.caller.timeout.ms`), which bounds a rebalance.
const GROUP_WAIT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// Sends one group request to the owner of `stream`: the response body, or an error code.
/// Sends a group request for `group` (`None` for ListGroups, which names none) to the
/// coordinator that owns `stream`. The token must have `read` on the group (`manage`
/// to delete it), or the answer is GROUP_AUTHORIZATION_FAILED.
pub(super) async fn call(
    kafka: &Kafka,
    caller: &Caller,
    group: Option<&str>,
    stream: &str,
    key: ApiKey,
    version: i16,
    body: Bytes,
) -> Result<Bytes, i16> {
    let op = match key {
        ApiKey::DeleteGroups => Operation::Delete,
        ApiKey::DescribeGroups | ApiKey::OffsetFetch => Operation::Describe,
        _ => Operation::Read,
    };
    if group.is_some_and(|g| !caller.grants.allows(op, Resource::Group(g))) {
        return Err(errors::GROUP_AUTHORIZATION_FAILED);
    }
    // JoinGroup and SyncGroup wait at the coordinator for the rest of the group by
    // design; they are long polls, bounded by the rebalance, not by the node timeout.
    let wait = match key {
        ApiKey::JoinGroup | ApiKey::SyncGroup => GROUP_WAIT,
        _ => std::time::Duration::ZERO,
    };
    let result = kafka
        .gw
        .routes
        .call_waiting(stream, false, wait, |mut c| {
            let req = GroupRequest {
                stream: stream.to_string(),
                api_key: i32::from(key as i16),
                api_version: i32::from(version),
                body: body.clone(),
                client_id: caller.client_id.clone(),
                client_host: caller.peer.ip().to_string(),
            };
            async move { c.group(req).await }
        })
        .await;
    match result {
        Ok(reply) => Ok(reply.body),
        Err(e) => {
            tracing::debug!(stream, error = %e, "group request not answered by a coordinator");
            Err(e.code().kafka(KafkaApi::Group).code())
        }
    }
}

pub(super) fn decode<T: Decodable>(mut body: Bytes, version: i16) -> Result<T, i16> {
    T::decode(&mut body, version).map_err(|_| errors::UNKNOWN_SERVER_ERROR)
}

pub(super) fn encode<T: Encodable>(m: &T, version: i16) -> Bytes {
    let mut buf = BytesMut::new();
    // Encoding a decoded request at its own version cannot fail.
    let _ = m.encode(&mut buf, version);
    buf.freeze()
}

/// A request for `group`, sent to its coordinator and its answer decoded.
pub(super) async fn call_group<Resp: Decodable>(
    kafka: &Kafka,
    caller: &Caller,
    group: &str,
    key: ApiKey,
    version: i16,
    body: Bytes,
) -> Result<Resp, i16> {
    let stream = offsets_stream(group);
    call(kafka, caller, Some(group), &stream, key, version, body)
        .await
        .and_then(|b| decode(b, version))
}

/// A request naming many groups, sent as one request per group (`one` encodes it) to
/// each group's coordinator: the answers' entries (`entries`), or `failed` for a group
/// whose coordinator did not answer.
pub(super) async fn per_group<Resp: Decodable, Entry>(
    kafka: &Kafka,
    caller: &Caller,
    (key, version): (ApiKey, i16),
    groups: &[GroupId],
    one: impl Fn(&GroupId) -> Bytes,
    entries: impl Fn(Resp) -> Vec<Entry>,
    failed: impl Fn(&GroupId, i16) -> Entry,
) -> Vec<Entry> {
    let mut out = vec![];
    for g in groups {
        match call_group::<Resp>(kafka, caller, &g.0, key, version, one(g)).await {
            Ok(resp) => out.extend(entries(resp)),
            Err(code) => out.push(failed(g, code)),
        }
    }
    out
}
