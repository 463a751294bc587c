//! One stream's transactions as its owner sees them (KIP-98): which producers have a
//! transaction open in it and from which offset, the last stable offset (LSO) that
//! `read_committed` readers stop at, and the aborted transactions they skip.
//!
//! The owner feeds it every batch it appends and every marker it writes, in offset
//! order, and a new owner replays the stored tail into it. Epochs are the producer's:
//! a marker or transactional batch with an epoch older than the open transaction's is
//! refused, so a fenced producer cannot write into, or end, its successor's transaction.

use crate::partition::marker::Marker;
use std::collections::{BTreeSet, HashMap};
use weir_shared::batch::BatchHeader;

/// A producer's transaction open in this stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenTxn {
    pub epoch: i16,
    pub first_offset: u64,
}

pub use weir_meta::model::{AbortedTxn, RangeTxns};

/// A transaction ended by a marker that no committed range summarises yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ended {
    producer_id: i64,
    first_offset: u64,
    marker: u64,
    commit: bool,
}

/// Why a transactional write or marker was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    #[error("producer {producer_id} epoch {epoch} is older than its transaction's epoch {current}")]
    InvalidProducerEpoch { producer_id: i64, epoch: i16, current: i16 },
}

/// Whether a batch is transactional data (not a marker).
pub fn is_transactional_data(h: &BatchHeader) -> bool {
    h.attributes & 0x10 != 0 && !h.is_control()
}

/// The transactions of one stream.
#[derive(Debug, Default)]
pub struct StreamTxns {
    open: HashMap<i64, OpenTxn>,
    /// `(first offset, producer)` of every open transaction: the least is the LSO.
    by_first: BTreeSet<(u64, i64)>,
    /// Transactions ended since the committed end, in marker order: what the next
    /// range summaries are made of, and the aborts of the data not yet uploaded. Kept
    /// until an upload commits past their markers ([`StreamTxns::forget_below`]).
    ended: Vec<Ended>,
}

impl StreamTxns {
    pub fn open(&self, producer_id: i64) -> Option<OpenTxn> {
        self.open.get(&producer_id).copied()
    }

    /// The producers (with epochs) whose transactional batches in `headers` start a
    /// transaction in this stream, or continue it at a newer epoch: the owner checks
    /// each with the coordinator before admitting them (KIP-890), so a late write after
    /// its transaction ended cannot open one no coordinator knows about.
    pub fn unverified(&self, headers: &[BatchHeader]) -> Result<Vec<(i64, i16)>, TxnError> {
        let mut out: Vec<(i64, i16)> = Vec::new();
        for h in headers.iter().filter(|h| is_transactional_data(h)) {
            match self.open.get(&h.producer_id) {
                Some(t) if h.producer_epoch < t.epoch => {
                    return Err(TxnError::InvalidProducerEpoch {
                        producer_id: h.producer_id,
                        epoch: h.producer_epoch,
                        current: t.epoch,
                    })
                }
                Some(t) if h.producer_epoch == t.epoch => {}
                _ => {
                    if !out.contains(&(h.producer_id, h.producer_epoch)) {
                        out.push((h.producer_id, h.producer_epoch));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Records batches appended at `offsets` (`(base, end)` per batch): a producer's
    /// first transactional batch opens its transaction here.
    pub fn record_batches(&mut self, headers: &[BatchHeader], offsets: &[(u64, u64)]) {
        for (h, &(base, _)) in headers.iter().zip(offsets) {
            if !is_transactional_data(h) {
                continue;
            }
            match self.open.get_mut(&h.producer_id) {
                Some(t) => t.epoch = t.epoch.max(h.producer_epoch),
                None => {
                    self.open.insert(
                        h.producer_id,
                        OpenTxn {
                            epoch: h.producer_epoch,
                            first_offset: base,
                        },
                    );
                    self.by_first.insert((base, h.producer_id));
                }
            }
        }
    }

    /// Checks a marker before it is written: `Ok(true)` when it ends a transaction
    /// open here and must be appended, `Ok(false)` when there is none to end (a
    /// retried marker: already written).
    pub fn check_marker(&self, marker: &Marker) -> Result<bool, TxnError> {
        match self.open.get(&marker.producer_id) {
            Some(t) if marker.epoch < t.epoch => Err(TxnError::InvalidProducerEpoch {
                producer_id: marker.producer_id,
                epoch: marker.epoch,
                current: t.epoch,
            }),
            Some(_) => Ok(true),
            None => Ok(false),
        }
    }

    /// Records a marker appended at `offset`: it ends its producer's transaction, and
    /// an abort is remembered for readers.
    pub fn record_marker(&mut self, marker: &Marker, offset: u64) {
        let Some(t) = self.open.remove(&marker.producer_id) else {
            return;
        };
        self.by_first.remove(&(t.first_offset, marker.producer_id));
        self.ended.push(Ended {
            producer_id: marker.producer_id,
            first_offset: t.first_offset,
            marker: offset,
            commit: marker.commit,
        });
    }

    /// The last stable offset when the stream ended at `x` (at or past the committed
    /// end): the first offset of the oldest transaction open there, none when none
    /// was. A transaction counts as open there until its marker, so a marker admitted
    /// but not yet durable does not move it.
    pub fn lso_at(&self, x: u64) -> Option<u64> {
        let open = self.by_first.first().map(|(first, _)| *first).filter(|f| *f < x);
        let ended = self
            .ended
            .iter()
            .filter(|e| e.first_offset < x && x <= e.marker)
            .map(|e| e.first_offset)
            .min();
        open.into_iter().chain(ended).min()
    }

    /// The last stable offset of a stream whose durable end is `end`: below it every
    /// transaction is decided, and `read_committed` readers read no further.
    pub fn lso(&self, end: u64) -> u64 {
        self.lso_at(end).unwrap_or(end)
    }

    fn aborts(&self) -> impl Iterator<Item = AbortedTxn> + '_ {
        self.ended.iter().filter(|e| !e.commit).map(|e| AbortedTxn {
            producer_id: e.producer_id,
            first_offset: e.first_offset,
            last_offset: e.marker,
        })
    }

    /// Aborted transactions with data in `[from, to)` whose markers no committed range
    /// holds yet, which a `read_committed` read of that range must be told about.
    pub fn aborted_overlapping(&self, from: u64, to: u64) -> Vec<AbortedTxn> {
        self.aborts()
            .filter(|a| a.last_offset >= from && a.first_offset < to)
            .collect()
    }

    /// The summary of the range `[from, end)` an upload commits: the LSO at its end and
    /// the aborts whose markers it holds.
    pub fn summary(&self, from: u64, end: u64) -> RangeTxns {
        RangeTxns {
            lso_at_end: self.lso_at(end),
            aborted: self.aborts().filter(|a| (from..end).contains(&a.last_offset)).collect(),
        }
    }

    /// Forgets the ended transactions whose markers lie below `end`: a committed range
    /// summarises them (or they were trimmed).
    pub fn forget_below(&mut self, end: u64) {
        self.ended.retain(|e| e.marker >= end);
    }

    /// Replays one stored batch, decoding it when it is a marker (a control batch of
    /// another kind, or one that does not decode, ends nothing).
    pub fn replay_stored(&mut self, h: &BatchHeader, bytes: &[u8]) {
        let marker = if h.is_control() {
            match super::marker::decode(bytes) {
                Some(m) => Some(m),
                None => return,
            }
        } else {
            None
        };
        self.replay(h, h.base_offset as u64, marker.as_ref());
    }

    /// Replays one stored batch (a new owner rebuilding the state from the tail):
    /// `marker` is the decoded marker when the batch is a control batch.
    pub fn replay(&mut self, h: &BatchHeader, base: u64, marker: Option<&Marker>) {
        match marker {
            Some(m) => self.record_marker(m, base),
            None => self.record_batches(std::slice::from_ref(h), &[(base, base + h.offset_count())]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(pid: i64, epoch: i16, transactional: bool) -> BatchHeader {
        BatchHeader {
            base_offset: 0,
            total_len: 61,
            attributes: if transactional { 0x10 } else { 0 },
            last_offset_delta: 0,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: 0,
            record_count: 1,
        }
    }

    fn marker(pid: i64, epoch: i16, commit: bool) -> Marker {
        Marker {
            producer_id: pid,
            epoch,
            commit,
            coordinator_epoch: 0,
        }
    }

    fn append(t: &mut StreamTxns, h: BatchHeader, at: u64) {
        t.record_batches(&[h], &[(at, at + 1)]);
    }

    #[test]
    fn the_lso_is_the_first_offset_of_the_oldest_open_transaction() {
        let mut t = StreamTxns::default();
        assert_eq!(t.lso(10), 10);
        append(&mut t, batch(1, 0, false), 10);
        assert_eq!(t.lso(11), 11, "plain batches are decided at once");
        append(&mut t, batch(7, 0, true), 11);
        append(&mut t, batch(8, 0, true), 12);
        append(&mut t, batch(7, 0, true), 13);
        assert_eq!(t.lso(14), 11);
        t.record_marker(&marker(7, 0, true), 14);
        assert_eq!(t.lso(15), 12, "the other transaction holds it now");
        t.record_marker(&marker(8, 0, true), 15);
        assert_eq!(t.lso(16), 16);
        assert!(t.aborted_overlapping(0, 100).is_empty(), "commits are not remembered");
    }

    #[test]
    fn an_abort_is_remembered_from_its_first_batch_to_its_marker() {
        let mut t = StreamTxns::default();
        append(&mut t, batch(7, 0, true), 5);
        append(&mut t, batch(7, 0, true), 9);
        t.record_marker(&marker(7, 0, false), 12);
        let a = AbortedTxn {
            producer_id: 7,
            first_offset: 5,
            last_offset: 12,
        };
        assert_eq!(t.aborted_overlapping(0, 6), vec![a]);
        assert_eq!(t.aborted_overlapping(12, 20), vec![a], "a read starting at the marker");
        assert!(t.aborted_overlapping(0, 5).is_empty(), "a read ending before it");
        assert!(t.aborted_overlapping(13, 20).is_empty(), "a read after the marker");
        t.forget_below(12);
        assert_eq!(t.aborted_overlapping(0, 20).len(), 1);
        t.forget_below(13);
        assert!(t.aborted_overlapping(0, 20).is_empty());
    }

    // Issue 23: the summary an upload commits with its range, and the LSO at any end
    // at or past the committed end, marker not yet uploaded included.
    #[test]
    fn a_range_summary_holds_its_aborts_and_the_lso_at_its_end() {
        let mut t = StreamTxns::default();
        append(&mut t, batch(7, 0, true), 0); // 7 opens at 0
        append(&mut t, batch(8, 0, true), 1); // 8 opens at 1
        t.record_marker(&marker(7, 0, false), 2); // 7 aborts at 2
        append(&mut t, batch(9, 0, true), 3); // 9 opens at 3
        t.record_marker(&marker(8, 0, true), 4); // 8 commits at 4
        let abort7 = AbortedTxn {
            producer_id: 7,
            first_offset: 0,
            last_offset: 2,
        };
        // A range ending at 2 ends before 7's marker: 7 is still open there.
        assert_eq!(
            t.summary(0, 2),
            RangeTxns {
                lso_at_end: Some(0),
                aborted: vec![]
            }
        );
        assert_eq!(
            t.summary(0, 3),
            RangeTxns {
                lso_at_end: Some(1),
                aborted: vec![abort7]
            }
        );
        assert_eq!(t.summary(3, 5).lso_at_end, Some(3), "9 is still open");
        assert!(t.summary(3, 5).aborted.is_empty(), "7's marker is in the earlier range");
        // Until 9's marker, the LSO stays at 3 however far the stream goes.
        assert_eq!(t.lso(100), 3);
        t.record_marker(&marker(9, 0, true), 5);
        assert_eq!(t.lso(5), 3, "the marker at 5 is not durable yet");
        assert_eq!(t.lso(6), 6);
        assert_eq!(t.summary(5, 6).lso_at_end, None);
        // Committed through 3: what the index now holds is forgotten here.
        t.forget_below(3);
        assert!(t.aborted_overlapping(0, 10).is_empty());
        assert_eq!(t.summary(3, 6).lso_at_end, None);
        assert_eq!(t.lso_at(5), Some(3), "9's record stays until its marker is committed");
    }

    #[test]
    fn only_a_producers_first_write_in_a_transaction_needs_verifying() {
        let mut t = StreamTxns::default();
        let first = [
            batch(7, 0, true),
            batch(7, 0, true),
            batch(8, 2, true),
            batch(9, 0, false),
        ];
        assert_eq!(t.unverified(&first), Ok(vec![(7, 0), (8, 2)]));
        t.record_batches(&first, &[(0, 1), (1, 2), (2, 3), (3, 4)]);
        assert_eq!(t.unverified(&[batch(7, 0, true)]), Ok(vec![]));
        // A newer epoch (the producer was re-initialised) is checked again; an older
        // one is a zombie's.
        assert_eq!(t.unverified(&[batch(8, 3, true)]), Ok(vec![(8, 3)]));
        assert!(matches!(
            t.unverified(&[batch(8, 1, true)]),
            Err(TxnError::InvalidProducerEpoch { current: 2, .. })
        ));
    }

    #[test]
    fn a_marker_ends_only_a_transaction_at_its_epoch_or_older() {
        let mut t = StreamTxns::default();
        append(&mut t, batch(7, 3, true), 0);
        assert!(matches!(
            t.check_marker(&marker(7, 2, true)),
            Err(TxnError::InvalidProducerEpoch { .. })
        ));
        // The coordinator fenced the producer (epoch 4) and aborts its transaction.
        assert_eq!(t.check_marker(&marker(7, 4, false)), Ok(true));
        t.record_marker(&marker(7, 4, false), 1);
        // A retried marker finds nothing open: already written.
        assert_eq!(t.check_marker(&marker(7, 4, false)), Ok(false));
        assert_eq!(t.open(7), None);
    }

    #[test]
    fn replaying_the_stored_batches_rebuilds_the_same_state() {
        let mut live = StreamTxns::default();
        let mut stored: Vec<(BatchHeader, u64, Option<Marker>)> = Vec::new();
        let mut at = 0;
        for i in 0..30i64 {
            let pid = i % 4;
            let h = batch(pid, 0, pid != 3);
            append(&mut live, h, at);
            stored.push((h, at, None));
            at += 1;
            if i % 5 == 4 {
                let m = marker(pid, 0, i % 10 == 4);
                if live.check_marker(&m) == Ok(true) {
                    live.record_marker(&m, at);
                    stored.push((h, at, Some(m)));
                    at += 1;
                }
            }
        }
        let mut rebuilt = StreamTxns::default();
        for (h, base, m) in &stored {
            rebuilt.replay(h, *base, m.as_ref());
        }
        assert_eq!(rebuilt.open, live.open);
        assert_eq!(rebuilt.ended, live.ended);
        assert_eq!(rebuilt.lso(at), live.lso(at));
        assert!(live.lso(at) < at, "the run leaves transactions open");
        assert!(live.ended.iter().any(|e| !e.commit));
    }
}
