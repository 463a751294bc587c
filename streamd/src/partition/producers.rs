//! Per-stream idempotent-producer state, as Kafka keeps it: for each producer id its
//! epoch and the sequence ranges and offsets of its last few batches. A retried batch
//! is recognised and answered with its original offsets; a gap or reordering in a
//! producer's sequence is refused. The state is rebuilt from the stream's stored
//! batches when a stream is opened, so it survives moves and failover.
//!
//! HTTP appends with an idempotency key use the same mechanism, through the producer
//! id the gateway derives from the key (`weir_shared::batch::idempotency_producer_id`).
//!
//! Transaction markers fence (issue 23): a marker's epoch becomes its producer's epoch
//! here, so a zombie's late write at an older epoch is refused, as after Kafka's
//! abort-on-timeout. A marker at a newer epoch leaves no sequence to continue from;
//! the producer's next batch at that epoch is taken at any sequence (KIP-360).

use std::collections::{HashMap, VecDeque};
use weir_shared::batch::BatchHeader;

/// Batches remembered per producer: Kafka's `max.in.flight.requests.per.connection` bound.
const BATCHES_PER_PRODUCER: usize = 5;

/// One remembered batch of a producer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SeqBatch {
    first_seq: i32,
    last_seq: i32,
    base_offset: u64,
    end_offset: u64,
}

#[derive(Clone, Debug, Default)]
struct Producer {
    epoch: i16,
    batches: VecDeque<SeqBatch>,
    /// End offset of the producer's last marker: it is remembered at least as long as
    /// that marker's data is, so the fence holds while the marker is retained.
    marker_end: u64,
}

impl Producer {
    fn last_offset(&self) -> u64 {
        self.batches.back().map_or(0, |b| b.end_offset).max(self.marker_end)
    }
}

/// Why a batch was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    #[error("producer {producer_id} epoch {epoch} is older than its current epoch {current}")]
    InvalidProducerEpoch { producer_id: i64, epoch: i16, current: i16 },
    #[error("producer {producer_id} sent sequence {got}, expected {expected}")]
    OutOfOrder { producer_id: i64, expected: i32, got: i32 },
    #[error("a retried append mixes batches already appended with new ones")]
    PartialRetry,
}

/// What checking an append's batches decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Append the batches.
    Append,
    /// Every batch was appended before: answer with these `(base, end)` offsets.
    Duplicate(Vec<(u64, u64)>),
}

/// The producers of one stream.
#[derive(Debug)]
pub struct ProducerTable {
    producers: HashMap<i64, Producer>,
    max_producers: usize,
}

impl Default for ProducerTable {
    fn default() -> Self {
        Self::new(100_000)
    }
}

fn last_seq(h: &BatchHeader) -> i32 {
    // Sequences wrap at i32::MAX, as in Kafka.
    ((h.base_sequence as i64 + h.last_offset_delta as i64) % (i32::MAX as i64 + 1)) as i32
}

fn next_seq(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

fn is_idempotent(h: &BatchHeader) -> bool {
    h.producer_id >= 0 && h.base_sequence >= 0 && !h.is_control()
}

impl ProducerTable {
    /// A table that forgets the least recently active producers beyond `max_producers`.
    pub fn new(max_producers: usize) -> Self {
        Self {
            producers: HashMap::new(),
            max_producers: max_producers.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// Every remembered producer as (id, epoch, last sequence or −1), by id.
    pub fn describe(&self) -> Vec<(i64, i16, i32)> {
        let mut out: Vec<(i64, i16, i32)> = self
            .producers
            .iter()
            .map(|(id, p)| (*id, p.epoch, p.batches.back().map_or(-1, |b| b.last_seq)))
            .collect();
        out.sort_unstable();
        out
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Checks an append's batches in order without changing the table.
    pub fn check(&self, headers: &[BatchHeader]) -> Result<Decision, SequenceError> {
        // Batches of one append are checked against the state the earlier ones leave.
        let mut scratch: HashMap<i64, Producer> = HashMap::new();
        let mut duplicates = Vec::new();
        for h in headers {
            if !is_idempotent(h) {
                continue;
            }
            let current = scratch
                .get(&h.producer_id)
                .or_else(|| self.producers.get(&h.producer_id))
                .cloned();
            let Some(p) = current else {
                // Unknown producer (new, or its state aged out): accept, as Kafka does since KIP-360.
                scratch.insert(h.producer_id, provisional(h));
                continue;
            };
            if h.producer_epoch < p.epoch {
                return Err(SequenceError::InvalidProducerEpoch {
                    producer_id: h.producer_id,
                    epoch: h.producer_epoch,
                    current: p.epoch,
                });
            }
            if h.producer_epoch == p.epoch && p.batches.is_empty() {
                // Only a marker was seen at this epoch: no sequence to continue from.
                scratch.insert(h.producer_id, provisional(h));
                continue;
            }
            if h.producer_epoch > p.epoch {
                if h.base_sequence != 0 {
                    return Err(SequenceError::OutOfOrder {
                        producer_id: h.producer_id,
                        expected: 0,
                        got: h.base_sequence,
                    });
                }
                scratch.insert(h.producer_id, provisional(h));
                continue;
            }
            let last = last_seq(h);
            if let Some(dup) = p
                .batches
                .iter()
                .find(|b| b.first_seq == h.base_sequence && b.last_seq == last)
            {
                duplicates.push((dup.base_offset, dup.end_offset));
                continue;
            }
            let expected = p.batches.back().map_or(0, |b| next_seq(b.last_seq));
            if h.base_sequence != expected {
                return Err(SequenceError::OutOfOrder {
                    producer_id: h.producer_id,
                    expected,
                    got: h.base_sequence,
                });
            }
            let mut next = p;
            next.batches.push_back(SeqBatch {
                first_seq: h.base_sequence,
                last_seq: last,
                base_offset: 0,
                end_offset: 0,
            });
            scratch.insert(h.producer_id, next);
        }
        match duplicates.len() {
            0 => Ok(Decision::Append),
            n if n == headers.len() => Ok(Decision::Duplicate(duplicates)),
            // A retry that is partly new cannot be answered with one set of offsets.
            _ => Err(SequenceError::PartialRetry),
        }
    }

    /// The epoch this stream last saw of `producer_id`, if it remembers the producer.
    pub fn epoch_of(&self, producer_id: i64) -> Option<i16> {
        self.producers.get(&producer_id).map(|p| p.epoch)
    }

    /// Checks a transaction marker for `producer_id` at `epoch` before it is written:
    /// a marker older than the producer's epoch here is refused.
    pub fn check_marker(&self, producer_id: i64, epoch: i16) -> Result<(), SequenceError> {
        match self.producers.get(&producer_id) {
            Some(p) if epoch < p.epoch => Err(SequenceError::InvalidProducerEpoch {
                producer_id,
                epoch,
                current: p.epoch,
            }),
            _ => Ok(()),
        }
    }

    /// Records a marker written at `[base, end)`: its epoch fences older ones. At a
    /// newer epoch the producer's sequences start again.
    pub fn record_marker(&mut self, producer_id: i64, epoch: i16, end: u64) {
        let p = self.producers.entry(producer_id).or_insert_with(|| Producer {
            epoch,
            ..Producer::default()
        });
        if epoch > p.epoch {
            p.epoch = epoch;
            p.batches.clear();
        }
        p.marker_end = p.marker_end.max(end);
        if self.producers.len() > self.max_producers {
            self.evict();
        }
    }

    /// Forgets producers whose every remembered batch lies below `start`: their data
    /// was trimmed, as Kafka evicts producers below the log start offset. Returns how many.
    pub fn expire_below(&mut self, start: u64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, p| p.last_offset() > start);
        before - self.producers.len()
    }

    /// Records batches appended at `offsets` (`(base, end)` per batch).
    pub fn record(&mut self, headers: &[BatchHeader], offsets: &[(u64, u64)]) {
        for (h, &(base, end)) in headers.iter().zip(offsets) {
            if !is_idempotent(h) {
                continue;
            }
            let p = self.producers.entry(h.producer_id).or_default();
            if h.producer_epoch != p.epoch {
                p.epoch = h.producer_epoch;
                p.batches.clear();
            }
            p.batches.push_back(SeqBatch {
                first_seq: h.base_sequence,
                last_seq: last_seq(h),
                base_offset: base,
                end_offset: end,
            });
            while p.batches.len() > BATCHES_PER_PRODUCER {
                p.batches.pop_front();
            }
        }
        if self.producers.len() > self.max_producers {
            self.evict();
        }
    }

    /// Forgets the least recently active tenth of the table.
    fn evict(&mut self) {
        let mut by_age: Vec<(u64, i64)> = self.producers.iter().map(|(id, p)| (p.last_offset(), *id)).collect();
        by_age.sort_unstable();
        let drop = (self.producers.len() - self.max_producers) + self.max_producers / 10;
        for (_, id) in by_age.into_iter().take(drop) {
            self.producers.remove(&id);
        }
    }
}

fn provisional(h: &BatchHeader) -> Producer {
    Producer {
        epoch: h.producer_epoch,
        batches: VecDeque::from([SeqBatch {
            first_seq: h.base_sequence,
            last_seq: last_seq(h),
            base_offset: 0,
            end_offset: 0,
        }]),
        marker_end: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pid: i64, epoch: i16, seq: i32, count: i32) -> BatchHeader {
        BatchHeader {
            base_offset: 0,
            total_len: 61,
            attributes: 0,
            last_offset_delta: count - 1,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            record_count: count,
        }
    }

    fn append(t: &mut ProducerTable, h: BatchHeader, base: u64) -> Result<Decision, SequenceError> {
        let d = t.check(&[h])?;
        if d == Decision::Append {
            t.record(&[h], &[(base, base + h.offset_count())]);
        }
        Ok(d)
    }

    #[test]
    fn a_retried_batch_is_answered_with_its_first_offsets() {
        let mut t = ProducerTable::default();
        assert_eq!(append(&mut t, header(7, 0, 0, 3), 0), Ok(Decision::Append));
        assert_eq!(append(&mut t, header(7, 0, 3, 2), 3), Ok(Decision::Append));
        assert_eq!(
            append(&mut t, header(7, 0, 0, 3), 99),
            Ok(Decision::Duplicate(vec![(0, 3)]))
        );
        assert_eq!(
            append(&mut t, header(7, 0, 3, 2), 99),
            Ok(Decision::Duplicate(vec![(3, 5)]))
        );
    }

    #[test]
    fn producers_whose_batches_were_all_trimmed_expire() {
        let mut t = ProducerTable::default();
        append(&mut t, header(1, 0, 0, 3), 0).expect("p1");
        append(&mut t, header(2, 0, 0, 2), 3).expect("p2");
        append(&mut t, header(1, 0, 3, 1), 5).expect("p1 again");
        // Offsets below 5 are trimmed: producer 2 (3..5) is gone, producer 1 (last 5..6) stays.
        assert_eq!(t.expire_below(5), 1);
        assert_eq!(t.len(), 1);
        // Producer 2's retry is now an unknown producer's batch, as after Kafka's eviction.
        assert_eq!(append(&mut t, header(2, 0, 0, 2), 6), Ok(Decision::Append));
        assert_eq!(
            append(&mut t, header(1, 0, 3, 1), 99),
            Ok(Decision::Duplicate(vec![(5, 6)]))
        );
    }

    #[test]
    fn gaps_and_old_epochs_are_refused() {
        let mut t = ProducerTable::default();
        append(&mut t, header(7, 1, 0, 1), 0).expect("first");
        assert!(matches!(
            append(&mut t, header(7, 1, 5, 1), 1),
            Err(SequenceError::OutOfOrder {
                expected: 1,
                got: 5,
                ..
            })
        ));
        assert!(matches!(
            append(&mut t, header(7, 0, 1, 1), 1),
            Err(SequenceError::InvalidProducerEpoch { .. })
        ));
        // A new epoch starts again at sequence 0.
        assert_eq!(append(&mut t, header(7, 2, 0, 1), 1), Ok(Decision::Append));
    }

    // Issue 23: a marker's epoch fences the producer's older epochs here; one at a newer
    // epoch leaves no sequence to continue from; a marker older than the producer's
    // epoch is refused.
    #[test]
    fn a_marker_fences_older_epochs_of_its_producer() {
        let mut t = ProducerTable::default();
        append(&mut t, header(7, 1, 0, 2), 0).expect("first");
        // A marker at the same epoch leaves the sequence where it was.
        assert_eq!(t.check_marker(7, 1), Ok(()));
        t.record_marker(7, 1, 3);
        assert!(matches!(
            append(&mut t, header(7, 1, 5, 1), 3),
            Err(SequenceError::OutOfOrder { expected: 2, .. })
        ));
        assert_eq!(append(&mut t, header(7, 1, 2, 1), 3), Ok(Decision::Append));
        // An abort at a bumped epoch (the coordinator's timeout) fences epoch 1.
        t.record_marker(7, 2, 5);
        assert!(matches!(
            append(&mut t, header(7, 1, 3, 1), 5),
            Err(SequenceError::InvalidProducerEpoch { current: 2, .. })
        ));
        assert!(matches!(
            t.check_marker(7, 1),
            Err(SequenceError::InvalidProducerEpoch { current: 2, .. })
        ));
        // At the marker's epoch no sequence is known; the next epoch starts at 0.
        assert_eq!(append(&mut t, header(7, 2, 9, 1), 5), Ok(Decision::Append));
        assert!(matches!(
            append(&mut t, header(7, 3, 4, 1), 6),
            Err(SequenceError::OutOfOrder { expected: 0, .. })
        ));
        // A producer known only by its marker is fenced too, and kept while the
        // marker is: trimming below it does not forget it.
        let mut t = ProducerTable::default();
        t.record_marker(8, 4, 10);
        assert_eq!(t.expire_below(9), 0);
        assert!(matches!(
            append(&mut t, header(8, 3, 0, 1), 10),
            Err(SequenceError::InvalidProducerEpoch { current: 4, .. })
        ));
        assert_eq!(t.expire_below(10), 1);
    }

    #[test]
    fn non_idempotent_batches_are_not_tracked() {
        let mut t = ProducerTable::default();
        assert_eq!(append(&mut t, header(-1, -1, -1, 1), 0), Ok(Decision::Append));
        assert_eq!(append(&mut t, header(-1, -1, -1, 1), 1), Ok(Decision::Append));
        assert!(t.is_empty());
    }

    #[test]
    fn sequences_wrap_at_i32_max() {
        let mut t = ProducerTable::default();
        append(&mut t, header(3, 0, i32::MAX, 1), 0).expect("first");
        assert_eq!(append(&mut t, header(3, 0, 0, 1), 1), Ok(Decision::Append));
    }

    #[test]
    fn the_table_forgets_the_least_recent_producers() {
        let mut t = ProducerTable::new(10);
        for pid in 0..20 {
            append(&mut t, header(pid, 0, 0, 1), pid as u64).expect("append");
        }
        assert!(t.len() <= 10);
        // The most recent producer is still known.
        assert_eq!(
            append(&mut t, header(19, 0, 0, 1), 100),
            Ok(Decision::Duplicate(vec![(19, 20)]))
        );
    }
}
