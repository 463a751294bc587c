//! The owner's word on a partition, asked through the gateway's routes: what Fetch,
//! ListOffsets and OffsetForLeaderEpoch answer from.

use super::errors;
use super::Kafka;
use weir_proto::streamd::{StatusReply, StatusRequest};

/// The owner's word on `stream`: its offsets and leader epoch, or the Kafka error.
pub(super) async fn owner_status(kafka: &Kafka, stream: &str) -> Result<StatusReply, i16> {
    kafka
        .gw
        .routes
        .call(stream, true, |mut c| {
            let req = StatusRequest {
                stream: stream.to_string(),
            };
            async move { c.status(req).await }
        })
        .await
        .map_err(|e| errors::route(&e))
}
