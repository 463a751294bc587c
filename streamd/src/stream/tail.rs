//! What a stream's new owner rebuilds from the stored tail of the stream before it
//! takes appends (a move, a failover, a WAL takeover): the idempotent producers'
//! recent batches, and the transactions open in the stream with the aborts behind them
//! (issue 23). Both are fed the same batches in offset order; a marker (a control
//! batch) ends its producer's transaction and fences that producer's older epochs.

use crate::partition::marker::{self, Marker};
use crate::partition::producers::ProducerTable;
use crate::partition::txns::StreamTxns;
use weir_shared::batch::BatchHeader;

/// A stream's state rebuilt from its tail.
#[derive(Debug, Default)]
pub struct TailState {
    pub producers: ProducerTable,
    pub txns: StreamTxns,
}

impl TailState {
    /// Replays stored batches, each with its header (`base_offset` as stored), in
    /// offset order.
    pub fn replay<'a>(&mut self, batches: impl IntoIterator<Item = (&'a BatchHeader, &'a [u8])>) {
        for (h, bytes) in batches {
            let base = h.base_offset as u64;
            let end = base + h.offset_count();
            if h.is_control() {
                // A control batch of another kind (or one that does not decode) ends nothing.
                if let Some(m) = marker::decode(bytes) {
                    self.record_marker(&m, base, end);
                }
                continue;
            }
            self.producers.record(std::slice::from_ref(h), &[(base, end)]);
            self.txns.record_batches(std::slice::from_ref(h), &[(base, end)]);
        }
    }

    /// Records a marker stored at `[base, end)`.
    pub fn record_marker(&mut self, m: &Marker, base: u64, end: u64) {
        self.producers.record_marker(m.producer_id, m.epoch, end);
        self.txns.record_marker(m, base);
    }

    /// Forgets what lies below `start` (trimmed data).
    pub fn forget_below(&mut self, start: u64) {
        self.producers.expire_below(start);
        self.txns.forget_below(start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::txns::AbortedTxn;
    use bytes::Bytes;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
    use weir_shared::batch::{set_base_offset, split_batches};

    /// One stored batch of one record at `offset`.
    fn data(pid: i64, epoch: i16, seq: i32, transactional: bool, offset: u64) -> Bytes {
        let record = Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: pid,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: seq,
            timestamp: 0,
            key: None,
            value: Some(Bytes::from_static(b"v")),
            headers: IndexMap::new(),
        };
        let mut buf = bytes::BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &[record],
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        set_base_offset(&mut buf, offset as i64);
        buf.freeze()
    }

    fn stored_marker(pid: i64, epoch: i16, commit: bool, offset: u64) -> Bytes {
        let m = Marker {
            producer_id: pid,
            epoch,
            commit,
            coordinator_epoch: 3,
        };
        let mut buf = bytes::BytesMut::from(&marker::encode(&m, 0).unwrap()[..]);
        set_base_offset(&mut buf, offset as i64);
        buf.freeze()
    }

    fn replay(stored: &[Bytes]) -> TailState {
        let all: Vec<u8> = stored.iter().flat_map(|b| b.iter().copied()).collect();
        let parsed = split_batches(&all).unwrap();
        let mut tail = TailState::default();
        tail.replay(parsed.iter().map(|(h, b)| (h, *b)));
        tail
    }

    // Issue 23: a new owner finds the transactions open in the tail, the aborts behind
    // them, and producers fenced by their markers.
    #[test]
    fn a_replayed_tail_rebuilds_open_transactions_aborts_and_fences() {
        let tail = replay(&[
            data(1, 0, 0, true, 0),        // producer 1's transaction opens at 0
            data(2, 5, 0, true, 1),        // producer 2's at 1
            data(3, 0, 0, false, 2),       // plain idempotent data
            stored_marker(2, 5, false, 3), // producer 2 aborts: 1..=3 is skipped
            data(1, 0, 1, true, 4),        // producer 1 goes on
            stored_marker(4, 9, false, 5), // a marker ending nothing still fences 4
            data(2, 5, 1, true, 6),        // producer 2's next transaction opens at 6
            stored_marker(1, 0, true, 7),  // producer 1 commits
        ]);
        assert_eq!(tail.txns.open(1), None);
        assert_eq!(tail.txns.open(2).map(|t| t.first_offset), Some(6));
        // Open from 6: stable below it.
        assert_eq!(tail.txns.lso(8), 6);
        assert_eq!(
            tail.txns.aborted_overlapping(0, 8),
            vec![AbortedTxn {
                producer_id: 2,
                first_offset: 1,
                last_offset: 3,
            }]
        );
        // Producer 4 is known only by its marker, and fenced below epoch 9.
        assert!(tail.producers.check_marker(4, 8).is_err());
        assert!(tail.producers.check_marker(4, 9).is_ok());
        // Producer 1's sequence goes on after its commit marker.
        let h = split_batches(&data(1, 0, 1, true, 0)).unwrap()[0].0;
        assert_eq!(
            tail.producers.check(&[h]),
            Ok(crate::partition::producers::Decision::Duplicate(vec![(4, 5)]))
        );
    }

    #[test]
    fn forgetting_below_the_start_drops_old_aborts_and_producers() {
        let mut tail = replay(&[
            data(2, 0, 0, true, 0),
            stored_marker(2, 0, false, 1),
            data(3, 0, 0, true, 2),
            stored_marker(3, 0, false, 3),
        ]);
        assert_eq!(tail.txns.aborted_overlapping(0, 4).len(), 2);
        tail.forget_below(2);
        assert_eq!(tail.txns.aborted_overlapping(0, 4).len(), 1);
        assert_eq!(tail.producers.len(), 1);
    }
}
