//! The owner's word on a partition, asked through the gateway's routes: what Fetch,
//! ListOffsets and OffsetForLeaderEpoch answer from.

use super::errors;
use super::Kafka;
use weir_proto::streamd::{StatusReply, StatusRequest};

/// The owner's word on `stream`: its offsets and leader epoch, or the Kafka error.
pub(super) async fn owner_status(kafka: &Kafka, stream: &str) -> Result<StatusReply, i16> {
    status(kafka, stream, false).await
}

/// The readable offsets of `stream`, as its reads see them: its owner's word or, while
/// a takeover recovers its dead owner, the agent's, whose end is the committed end
/// (issue 60). Not for OffsetForLeaderEpoch: a client would read that shorter end as
/// its log truncated.
pub(super) async fn readable_status(kafka: &Kafka, stream: &str) -> Result<StatusReply, i16> {
    status(kafka, stream, true).await
}

async fn status(kafka: &Kafka, stream: &str, recovering_ok: bool) -> Result<StatusReply, i16> {
    let ask = |mut c: weir_proto::streamd::streamd_client::StreamdClient<weir_shared::grpc::Channel>| {
        let req = StatusRequest {
            stream: stream.to_string(),
        };
        async move { c.status(req).await }
    };
    let routes = &kafka.gw.routes;
    let reply = match recovering_ok {
        true => routes.read_waiting(stream, std::time::Duration::ZERO, ask).await,
        false => routes.call(stream, true, ask).await,
    };
    reply.map_err(|e| errors::route(&e))
}
