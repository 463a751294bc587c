//! Leader epochs on the Kafka side (issue 22): the epoch each partition is advertised
//! with, Kafka's check of a request's `current_leader_epoch`, and OffsetForLeaderEpoch,
//! all from this gateway's view (`weir_meta::model::leader_epochs` has the rules).

use super::errors;
use super::Kafka;
use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::{Grants, Resource};
use weir_meta::model::leader_epochs::{self, EpochEnd};
use weir_meta::model::State;

/// A partition's leader epoch in `state`, given the gateway changes it shows
/// (`leader_epochs::gateway_changes`); `None` when it has no such stream.
pub fn in_state(state: &State, gateways: u64, stream: &str) -> Option<i32> {
    let row = state.stream_by_name(stream)?;
    Some(leader_epochs::current(row, gateways))
}

/// A partition's leader epoch in this gateway's view.
pub fn of(kafka: &Kafka, stream: &str) -> Option<i32> {
    kafka
        .gw
        .routes
        .view()
        .with(|s| in_state(s, leader_epochs::gateway_changes(s), stream))
}

/// Kafka's check of a request's `current_leader_epoch` (−1: the client does not say):
/// an older one is FENCED_LEADER_EPOCH, so the client refreshes its metadata; a newer
/// one UNKNOWN_LEADER_EPOCH, as this gateway's view is behind and a retry will do.
pub fn check(client: i32, ours: i32) -> i16 {
    if client < 0 || client == ours {
        errors::NONE
    } else if client < ours {
        errors::FENCED_LEADER_EPOCH
    } else {
        errors::UNKNOWN_LEADER_EPOCH
    }
}

/// The check for one partition; unknown partitions are left to the request's own path.
pub fn check_partition(kafka: &Kafka, stream: &str, client: i32) -> i16 {
    if client < 0 {
        return errors::NONE;
    }
    of(kafka, stream).map_or(errors::NONE, |ours| check(client, ours))
}

/// The checks of many partitions, (stream, the client's epoch), from one read of the
/// view: a Fetch lists many partitions, and each would otherwise take the view's lock
/// and count the gateway changes again.
pub fn check_partitions(kafka: &Kafka, asked: &[(String, i32)]) -> Vec<i16> {
    if asked.iter().all(|(_, client)| *client < 0) {
        return vec![errors::NONE; asked.len()];
    }
    kafka.gw.routes.view().with(|s| {
        let gateways = leader_epochs::gateway_changes(s);
        asked
            .iter()
            .map(|(stream, client)| match in_state(s, gateways, stream) {
                Some(ours) if *client >= 0 => check(*client, ours),
                _ => errors::NONE,
            })
            .collect()
    })
}

/// OffsetForLeaderEpoch needs `read` on each topic, as Fetch does.
pub async fn offset_for_leader_epoch(
    kafka: &Kafka,
    grants: &Grants,
    r: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut topics = Vec::with_capacity(r.topics.len());
    for t in r.topics {
        let readable = grants.allows(Operation::Describe, Resource::Topic(t.topic.0.as_str()));
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let (code, epoch, end) = if readable {
                let stream = format!("{}/{}", t.topic.0, p.partition);
                end_offset(kafka, &stream, p.current_leader_epoch, p.leader_epoch).await
            } else {
                (errors::TOPIC_AUTHORIZATION_FAILED, -1, -1)
            };
            partitions.push(
                EpochEndOffset::default()
                    .with_partition(p.partition)
                    .with_error_code(code)
                    .with_leader_epoch(epoch)
                    .with_end_offset(end),
            );
        }
        topics.push(
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(partitions),
        );
    }
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

/// (error, epoch, end offset) for one partition.
async fn end_offset(kafka: &Kafka, stream: &str, current: i32, requested: i32) -> (i16, i32, i64) {
    let found: Option<(i32, EpochEnd)> = kafka.gw.routes.view().with(|s| {
        let row = s.stream_by_name(stream)?;
        let ours = leader_epochs::current(row, leader_epochs::gateway_changes(s));
        Some((ours, leader_epochs::end_of(&row.leader_epochs, requested)))
    });
    let Some((ours, end)) = found else {
        return (errors::UNKNOWN_TOPIC_OR_PARTITION, -1, -1);
    };
    let code = check(current, ours);
    if code != errors::NONE {
        return (code, -1, -1);
    }
    match end {
        EpochEnd::Undefined => (errors::NONE, -1, -1),
        EpochEnd::At { epoch, offset } => (errors::NONE, epoch, offset.0 as i64),
        // The log end, which only the owner knows.
        EpochEnd::LogEnd { epoch } => match super::owner::owner_status(kafka, stream).await {
            Ok(s) => (errors::NONE, epoch, s.end_offset as i64),
            Err(code) => (code, -1, -1),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Issue 22: Kafka's current_leader_epoch check.
    #[test]
    fn an_older_epoch_is_fenced_and_a_newer_one_unknown() {
        assert_eq!(check(-1, 7), errors::NONE, "−1: the client does not say");
        assert_eq!(check(7, 7), errors::NONE);
        assert_eq!(check(6, 7), errors::FENCED_LEADER_EPOCH);
        assert_eq!(check(8, 7), errors::UNKNOWN_LEADER_EPOCH);
    }
}
