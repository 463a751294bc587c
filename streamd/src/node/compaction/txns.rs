//! Carrying the source ranges' transaction summaries (issue 23) into the pieces a
//! compaction window is cut into. A piece ending where a source range ends takes that
//! range's LSO; one cut inside a range takes a bound no higher than the exact LSO
//! there (readers and new owners then only look further back than they must): the
//! lower of the LSO at the range's start and the oldest transaction the window itself
//! saw open, since a transaction open at the cut was either open at the range's start
//! or began after it.

use crate::partition::txns::StreamTxns;
use weir_meta::model::{AbortedTxn, ObjectRange, RangeTxns};
use weir_shared::batch::BatchHeader;

pub(super) struct SummaryCutter {
    /// The window's batches so far, from its start.
    seen: StreamTxns,
    /// The LSO at the start of the current source range (a lower bound).
    at_range_start: Option<u64>,
    /// The current source range's end and LSO there.
    range: Option<(u64, Option<u64>)>,
    /// Aborts of the source ranges begun, not yet in a piece.
    aborts: Vec<AbortedTxn>,
}

fn lower(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    a.into_iter().chain(b).min()
}

impl SummaryCutter {
    /// `before`: the LSO at the end of the range before the window.
    pub fn new(before: Option<u64>) -> Self {
        Self {
            seen: StreamTxns::default(),
            at_range_start: before,
            range: None,
            aborts: Vec::new(),
        }
    }

    /// A source range begins.
    pub fn begin_range(&mut self, r: &ObjectRange) {
        if let Some((_, lso)) = self.range {
            self.at_range_start = lso;
        }
        self.range = Some((r.end.0, r.txns.lso_at_end));
        self.aborts.extend(r.txns.aborted.iter().copied());
    }

    /// One batch of the current source range, in offset order.
    pub fn batch(&mut self, h: &BatchHeader, bytes: &[u8]) {
        self.seen.replay_stored(h, bytes);
    }

    /// The summary of a piece `[start, end)` cut after the batches seen so far.
    pub fn cut(&mut self, start: u64, end: u64) -> RangeTxns {
        let lso_at_end = match self.range {
            Some((range_end, lso)) if range_end == end => lso,
            _ => lower(self.at_range_start, self.seen.lso_at(end)),
        };
        let (aborted, later): (Vec<_>, Vec<_>) = self.aborts.iter().partition(|a| a.last_offset < end);
        self.aborts = later;
        debug_assert!(aborted.iter().all(|a| a.last_offset >= start));
        RangeTxns { lso_at_end, aborted }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_shared::ids::{ObjectKey, Offset};

    fn range(start: u64, end: u64, lso_at_end: Option<u64>, aborted: Vec<AbortedTxn>) -> ObjectRange {
        ObjectRange {
            key: ObjectKey(format!("data/{start}")),
            start: Offset(start),
            end: Offset(end),
            pos: 0,
            len: end - start,
            crc: 0,
            max_timestamp: 0,
            txns: RangeTxns { lso_at_end, aborted },
        }
    }

    fn data(pid: i64, transactional: bool, at: u64) -> BatchHeader {
        BatchHeader {
            base_offset: at as i64,
            total_len: 61,
            attributes: if transactional { 0x10 } else { 0 },
            last_offset_delta: 0,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: pid,
            producer_epoch: 0,
            base_sequence: 0,
            record_count: 1,
        }
    }

    // Issue 23: compaction keeps every abort, each in the piece holding its marker, and
    // never states an LSO above the exact one.
    #[test]
    fn pieces_keep_their_aborts_and_an_lso_no_higher_than_the_exact_one() {
        let abort = |pid, first, last| AbortedTxn {
            producer_id: pid,
            first_offset: first,
            last_offset: last,
        };
        // Before the window, producer 1's transaction is open from 2. The window is
        // two ranges: [10, 20) where producer 5 opens at 12 and producer 1 aborts at 15
        // (so at its end only 5 is open), and [20, 30) where 5 aborts at 25.
        let mut c = SummaryCutter::new(Some(2));
        let first = range(10, 20, Some(12), vec![abort(1, 2, 15)]);
        c.begin_range(&first);
        c.batch(&data(9, false, 10), &[]);
        c.batch(&data(5, true, 12), &[]);
        // A cut at 14, inside the first range: 1 is open there (from 2).
        let piece = c.cut(10, 14);
        assert_eq!(piece.lso_at_end, Some(2));
        assert!(piece.aborted.is_empty(), "1's marker at 15 is in a later piece");
        // A cut at the first range's end takes its LSO exactly.
        assert_eq!(
            c.cut(14, 20),
            RangeTxns {
                lso_at_end: Some(12),
                aborted: vec![abort(1, 2, 15)]
            }
        );
        let second = range(20, 30, None, vec![abort(5, 12, 25)]);
        c.begin_range(&second);
        c.batch(&data(7, true, 21), &[]);
        // Inside the second range: 5 (from 12, open at its start) and 7 (from 21).
        assert_eq!(c.cut(20, 23).lso_at_end, Some(12));
        assert_eq!(
            c.cut(23, 30),
            RangeTxns {
                lso_at_end: None,
                aborted: vec![abort(5, 12, 25)]
            }
        );
    }

    #[test]
    fn a_window_with_nothing_open_cuts_pieces_with_none() {
        let mut c = SummaryCutter::new(None);
        c.begin_range(&range(0, 10, None, vec![]));
        c.batch(&data(3, false, 0), &[]);
        assert_eq!(c.cut(0, 5), RangeTxns::default());
        c.batch(&data(4, true, 5), &[]);
        assert_eq!(c.cut(5, 7).lso_at_end, Some(5), "a transaction the window saw begin");
    }
}
