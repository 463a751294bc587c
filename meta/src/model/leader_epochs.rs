//! Kafka leader epochs for Weir's partitions (issue 22; KIP-101, KIP-320).
//!
//! Any gateway serves any partition, so a partition's "leader" is the live gateway its
//! name hashes to (gatewayd `kafka/brokers.rs`). It changes in two ways: the stream
//! moves to another streamd (an open at a new stream epoch), or the set of live
//! gateways changes. A partition's leader epoch is the sum of its stream epoch and the
//! cluster's count of gateway-set changes: both only grow, so the sum grows with either
//! and never repeats or goes back.
//!
//! Each open records the leader epoch it starts and the offset it starts at, the
//! committed end: whatever earlier owners acknowledged is committed before a stream
//! opens again. The owner stamps that epoch into every batch it appends, and
//! OffsetForLeaderEpoch answers from the history: an epoch ends where the next recorded
//! one starts. Epochs begun by a gateway change alone append nothing of their own, so
//! they share the span of the open before them.
//!
//! The history is pruned below the log start and capped. For an epoch older than what
//! is kept, the answer is the first kept start, which is past every record stamped with
//! that epoch, so a client is never told of a truncation that did not happen.

use super::rows::{Counters, StreamRow};
use serde::{Deserialize, Serialize};
use weir_shared::ids::{Offset, StreamEpoch};

/// Opens kept per stream, besides those pruned below the log start.
pub const MAX_KEPT: usize = 16;

/// Where one open's leader epoch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStart {
    pub leader_epoch: i32,
    pub stream_epoch: StreamEpoch,
    pub start: Offset,
}

/// The partition's leader epoch as of this state.
pub fn current(row: &StreamRow, counters: &Counters) -> i32 {
    let sum = row.epoch.0.saturating_add(counters.gateway_changes);
    i32::try_from(sum).unwrap_or(i32::MAX)
}

/// The leader epoch the owner at `stream_epoch` stamps into its batches; −1 (none) when
/// the open was recorded before histories existed.
pub fn stamped_at(row: &StreamRow, stream_epoch: StreamEpoch) -> i32 {
    row.leader_epochs
        .iter()
        .rev()
        .find(|e| e.stream_epoch == stream_epoch)
        .map_or(-1, |e| e.leader_epoch)
}

/// Records the epoch an open (`row.epoch`, just incremented) starts.
pub fn record_open(row: &mut StreamRow, counters: &Counters) {
    let entry = EpochStart {
        leader_epoch: current(row, counters),
        stream_epoch: row.epoch,
        start: row.committed_end,
    };
    // As Kafka's epoch cache: an epoch that ended where it began holds no records, and
    // nothing may start after the new one.
    row.leader_epochs.retain(|e| e.start < entry.start);
    row.leader_epochs.push(entry);
    prune(row);
}

/// Drops what no answer needs: epochs wholly below the log start (the next one starts
/// at or before it), then the oldest past [`MAX_KEPT`].
pub fn prune(row: &mut StreamRow) {
    let log_start = row.start_offset;
    let below = row
        .leader_epochs
        .windows(2)
        .take_while(|w| w[1].start <= log_start)
        .count();
    row.leader_epochs.drain(..below);
    let over = row.leader_epochs.len().saturating_sub(MAX_KEPT);
    row.leader_epochs.drain(..over);
}

/// Where the epoch an OffsetForLeaderEpoch asks about ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochEnd {
    /// Kafka's UNDEFINED answer (−1, −1): the epoch is unknown or above the current one.
    Undefined,
    /// `epoch` (the largest known at or below the one asked about) ends at `offset`.
    At { epoch: i32, offset: Offset },
    /// The epoch asked about is in the current span: `epoch` ends at the log end.
    Current { epoch: i32 },
}

/// Kafka's lookup (`LeaderEpochFileCache.endOffsetFor`) over a stream's history.
pub fn end_of(history: &[EpochStart], current: i32, requested: i32) -> EpochEnd {
    if requested < 0 || requested > current {
        return EpochEnd::Undefined;
    }
    let floor = history.iter().rev().find(|e| e.leader_epoch <= requested);
    let next = history.iter().find(|e| e.leader_epoch > requested);
    match (floor, next) {
        (floor, None) => EpochEnd::Current {
            epoch: floor.map_or(requested, |e| e.leader_epoch),
        },
        // Older than anything kept: it ended no later than the first kept start.
        (None, Some(next)) => EpochEnd::At {
            epoch: requested,
            offset: next.start,
        },
        (Some(floor), Some(next)) => EpochEnd::At {
            epoch: floor.leader_epoch,
            offset: next.start,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::{StreamConfig, StreamState};
    use weir_shared::ids::StreamId;

    fn row() -> StreamRow {
        StreamRow {
            id: StreamId(1),
            name: "t/0".into(),
            topic: Some("t".into()),
            partition: Some(0),
            state: StreamState::Closed,
            owner: None,
            epoch: StreamEpoch(0),
            transfer_target: None,
            transfer_target_epoch: None,
            transfer_op: None,
            start_offset: Offset(0),
            committed_end: Offset(0),
            commits: 0,
            bytes: 0,
            config: StreamConfig::default(),
            damage: None,
            leader_epochs: vec![],
        }
    }

    fn open(row: &mut StreamRow, counters: &Counters, committed_end: u64) {
        row.committed_end = Offset(committed_end);
        row.epoch = row.epoch.next();
        record_open(row, counters);
    }

    // Issue 22: the epoch grows with every open and every gateway change, never back.
    #[test]
    fn the_leader_epoch_grows_with_opens_and_gateway_changes() {
        let mut r = row();
        let mut c = Counters::default();
        open(&mut r, &c, 0);
        let first = current(&r, &c);
        c.gateway_changes += 1;
        let second = current(&r, &c);
        open(&mut r, &c, 10);
        let third = current(&r, &c);
        assert!(first < second && second < third, "{first} {second} {third}");
        assert_eq!(stamped_at(&r, r.epoch), third, "the owner stamps what the open started");
        assert_eq!(stamped_at(&r, StreamEpoch(99)), -1);
    }

    // Issue 22: OffsetForLeaderEpoch across two moves and a gateway change.
    #[test]
    fn an_epoch_ends_where_the_next_recorded_one_starts() {
        let mut r = row();
        let mut c = Counters::default();
        open(&mut r, &c, 0); // epoch 1 from 0
        open(&mut r, &c, 5); // epoch 2 from 5
        c.gateway_changes += 3; // epochs 3..=5 append nothing of their own
        open(&mut r, &c, 9); // epoch 6 from 9
        let now = current(&r, &c);
        assert_eq!(now, 6);
        let h = &r.leader_epochs;
        assert_eq!(
            end_of(h, now, 1),
            EpochEnd::At {
                epoch: 1,
                offset: Offset(5)
            }
        );
        assert_eq!(
            end_of(h, now, 2),
            EpochEnd::At {
                epoch: 2,
                offset: Offset(9)
            }
        );
        assert_eq!(
            end_of(h, now, 4),
            EpochEnd::At {
                epoch: 2,
                offset: Offset(9)
            }
        );
        assert_eq!(end_of(h, now, 6), EpochEnd::Current { epoch: 6 });
        assert_eq!(end_of(h, now, 7), EpochEnd::Undefined);
        assert_eq!(end_of(h, now, -1), EpochEnd::Undefined);
        // A producer's own value (librdkafka writes 0) is below every open: its end is
        // the first start, so nothing it could stamp reads as truncated.
        assert_eq!(
            end_of(h, now, 0),
            EpochEnd::At {
                epoch: 0,
                offset: Offset(0)
            }
        );
        c.gateway_changes += 1;
        assert_eq!(end_of(h, current(&r, &c), 7), EpochEnd::Current { epoch: 6 });
        assert_eq!(end_of(&[], 4, 2), EpochEnd::Current { epoch: 2 });
    }

    // Issue 22: an empty epoch is replaced, the history stays bounded, and what is
    // dropped answers no earlier than its records.
    #[test]
    fn the_history_is_pruned_below_the_log_start_and_capped() {
        let mut r = row();
        let c = Counters::default();
        open(&mut r, &c, 0);
        open(&mut r, &c, 0);
        assert_eq!(r.leader_epochs.len(), 1, "an epoch that appended nothing is dropped");
        assert_eq!(r.leader_epochs[0].leader_epoch, 2);
        for end in 1..=40 {
            open(&mut r, &c, end * 10);
        }
        assert_eq!(r.leader_epochs.len(), MAX_KEPT);
        let first = r.leader_epochs[0];
        let now = current(&r, &c);
        assert_eq!(
            end_of(&r.leader_epochs, now, 3),
            EpochEnd::At {
                epoch: 3,
                offset: first.start
            },
            "a dropped epoch ends no earlier than the first kept start"
        );
        r.start_offset = Offset(395);
        prune(&mut r);
        assert_eq!(
            r.leader_epochs.iter().map(|e| e.start.0).collect::<Vec<_>>(),
            [390, 400],
            "the epoch holding the log start is kept"
        );
    }
}
