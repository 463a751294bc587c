//! Kafka leader epochs for Weir's partitions (issue 22; KIP-101, KIP-320).
//!
//! Any gateway serves any partition, so a partition's "leader" is the live gateway its
//! name hashes to (gatewayd `kafka/brokers.rs`). It changes in two ways: the stream
//! moves to another streamd (an open at a new stream epoch), or a gateway joins or
//! leaves the live set. A partition's leader epoch is the sum of its stream epoch and
//! the count of those joins and leaves, which is derived from the node rows (each
//! gateway's registration epoch and whether it left), so every release of metad
//! computes it alike. Both only grow, so the sum grows with either and never repeats
//! or goes back for a stream (a recreated topic starts again, with a new topic id, as
//! in Kafka).
//!
//! An owner that stamps epochs opens with `stamps_leader_epochs`, and the open records
//! the epoch it starts and the offset it starts at, the committed end: whatever earlier
//! owners acknowledged is committed before a stream opens again. The owner stamps that
//! epoch into every batch it appends. OffsetForLeaderEpoch answers a recorded epoch
//! with the start of the next recorded one, or the log end for the last.
//!
//! Weir never truncates acknowledged records, so for any other epoch the answer is the
//! log end, never an earlier offset: a batch stamped by an owner of an older release
//! carries whatever its producer wrote (librdkafka writes 0), an epoch begun by a
//! gateway change alone stamps nothing, and a pruned epoch is no longer known. A client
//! is never told of a truncation that did not happen, nor answered UNDEFINED, which it
//! would take for one. The history is pruned below the log start and capped.

// The row type lives with the rows; its rules live here.
pub use super::rows::EpochStart;
use super::rows::{NodeKind, NodeRow, StreamRow};
use super::state::State;
use weir_shared::ids::{Offset, StreamEpoch};

/// Opens kept per stream, besides those pruned below the log start.
pub const MAX_KEPT: usize = 16;

/// How many times a gateway joined or left the live set (the Kafka brokers): each
/// incarnation joins once (its registration epoch counts them) and leaves once, when
/// it stops or is fenced, whichever comes first; with what reaped rows had counted.
pub fn gateway_changes(state: &State) -> u64 {
    state.counters.retired_gateway_changes
        + state
            .nodes
            .values()
            .filter(|n| n.kind == NodeKind::Gatewayd)
            .map(gateway_row_changes)
            .sum::<u64>()
}

/// What one gateway row counts in [`gateway_changes`].
pub fn gateway_row_changes(row: &NodeRow) -> u64 {
    (2 * row.epoch.0).saturating_sub(1) + u64::from(row.fenced || row.terminating)
}

/// The partition's leader epoch, given [`gateway_changes`].
pub fn current(row: &StreamRow, gateway_changes: u64) -> i32 {
    let sum = row.epoch.0.saturating_add(gateway_changes);
    i32::try_from(sum).unwrap_or(i32::MAX)
}

/// The leader epoch the owner at `stream_epoch` stamps into its batches; −1 (none) when
/// its open recorded none.
pub fn stamped_at(row: &StreamRow, stream_epoch: StreamEpoch) -> i32 {
    row.leader_epochs
        .iter()
        .rev()
        .find(|e| e.stream_epoch == stream_epoch)
        .map_or(-1, |e| e.leader_epoch)
}

/// Records the epoch an open (`row.epoch`, just incremented) starts.
pub fn record_open(row: &mut StreamRow, gateway_changes: u64) {
    let entry = EpochStart {
        leader_epoch: current(row, gateway_changes),
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
    // Every row of every view holds these: no spare capacity (a push reserves four).
    row.leader_epochs.shrink_to_fit();
}

/// Where the epoch an OffsetForLeaderEpoch asks about ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochEnd {
    /// Kafka's UNDEFINED answer (−1, −1), for an undefined epoch (−1).
    Undefined,
    /// The recorded `epoch` ends where the next recorded one starts.
    At { epoch: i32, offset: Offset },
    /// `epoch` ends at the log end: the last recorded one, or any epoch not recorded.
    LogEnd { epoch: i32 },
}

/// The answer for `requested` from a stream's history.
pub fn end_of(history: &[EpochStart], requested: i32) -> EpochEnd {
    if requested < 0 {
        return EpochEnd::Undefined;
    }
    let Some(at) = history.iter().position(|e| e.leader_epoch == requested) else {
        return EpochEnd::LogEnd { epoch: requested };
    };
    match history.get(at + 1) {
        Some(next) => EpochEnd::At {
            epoch: requested,
            offset: next.start,
        },
        None => EpochEnd::LogEnd { epoch: requested },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::StreamConfig;
    use weir_shared::ids::StreamId;

    fn row() -> StreamRow {
        StreamRow::new(StreamId(1), "t/0".into(), Some(("t", 0)), &StreamConfig::default())
    }

    fn open(row: &mut StreamRow, gateways: u64, committed_end: u64) {
        row.committed_end = Offset(committed_end);
        row.epoch = row.epoch.next();
        record_open(row, gateways);
    }

    // Issue 22: the epoch grows with every open and every gateway change, never back.
    #[test]
    fn the_leader_epoch_grows_with_opens_and_gateway_changes() {
        let mut r = row();
        open(&mut r, 1, 0);
        let first = current(&r, 1);
        let second = current(&r, 2);
        open(&mut r, 2, 10);
        let third = current(&r, 2);
        assert!(first < second && second < third, "{first} {second} {third}");
        assert_eq!(stamped_at(&r, r.epoch), third, "the owner stamps what the open started");
        assert_eq!(stamped_at(&r, StreamEpoch(99)), -1);
    }

    // Issue 22: OffsetForLeaderEpoch across two moves and a gateway change; anything
    // not recorded ends at the log end, never earlier.
    #[test]
    fn a_recorded_epoch_ends_where_the_next_starts_and_any_other_at_the_log_end() {
        let mut r = row();
        open(&mut r, 0, 0); // epoch 1 from 0
        open(&mut r, 0, 5); // epoch 2 from 5
        open(&mut r, 3, 9); // epochs 3..=5 begun by gateway changes alone; 6 from 9
        let h = &r.leader_epochs;
        assert_eq!(
            end_of(h, 1),
            EpochEnd::At {
                epoch: 1,
                offset: Offset(5)
            }
        );
        assert_eq!(
            end_of(h, 2),
            EpochEnd::At {
                epoch: 2,
                offset: Offset(9)
            }
        );
        assert_eq!(end_of(h, 6), EpochEnd::LogEnd { epoch: 6 });
        // Begun by a gateway change, above the current epoch, or a producer's own value
        // (librdkafka writes 0) in a batch an older owner did not stamp: never earlier
        // than the log end, so nothing reads as truncated.
        for other in [0, 4, 7, 1000] {
            assert_eq!(end_of(h, other), EpochEnd::LogEnd { epoch: other });
        }
        assert_eq!(end_of(h, -1), EpochEnd::Undefined);
    }

    // Issue 22: an empty epoch is replaced, the history stays bounded, and what is
    // dropped ends at the log end.
    #[test]
    fn the_history_is_pruned_below_the_log_start_and_capped() {
        let mut r = row();
        open(&mut r, 0, 0);
        open(&mut r, 0, 0);
        assert_eq!(r.leader_epochs.len(), 1, "an epoch that appended nothing is dropped");
        assert_eq!(r.leader_epochs[0].leader_epoch, 2);
        for end in 1..=40 {
            open(&mut r, 0, end * 10);
        }
        assert_eq!(r.leader_epochs.len(), MAX_KEPT);
        assert_eq!(end_of(&r.leader_epochs, 3), EpochEnd::LogEnd { epoch: 3 }, "dropped");
        r.start_offset = Offset(395);
        prune(&mut r);
        assert_eq!(
            r.leader_epochs.iter().map(|e| e.start.0).collect::<Vec<_>>(),
            [390, 400],
            "the epoch holding the log start is kept"
        );
    }
}
