//! One transactional id's state and the rules that move it (KIP-98, with KIP-360's
//! retried `InitProducerId`), as Kafka's transaction coordinator applies them.
//!
//! Each request is a pure function from the current entry (if any) to either a Kafka
//! error code or what to do next: usually the next entry, which the coordinator appends
//! to the state stream and applies only once it is durable. Time is passed in as wall
//! milliseconds, because entries outlive the process that wrote them.

use kafka_protocol::ResponseError as Kafka;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Kafka error codes the coordinator answers with.
pub mod code {
    use super::Kafka;

    pub const NONE: i16 = 0;
    pub const INVALID_REQUEST: i16 = Kafka::InvalidRequest.code();
    pub const INVALID_TRANSACTION_TIMEOUT: i16 = Kafka::InvalidTransactionTimeout.code();
    pub const CONCURRENT_TRANSACTIONS: i16 = Kafka::ConcurrentTransactions.code();
    pub const PRODUCER_FENCED: i16 = Kafka::ProducerFenced.code();
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = Kafka::InvalidProducerIdMapping.code();
    pub const INVALID_TXN_STATE: i16 = Kafka::InvalidTxnState.code();
}

/// "No producer id" and "no epoch", as in Kafka's record batches.
pub const NO_PRODUCER_ID: i64 = -1;
pub const NO_EPOCH: i16 = -1;

/// Where a transactional id's current transaction stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TxnState {
    /// No transaction since the producer id or epoch was (re)initialised.
    Empty,
    /// Partitions have been added; the producer may write to them.
    Ongoing,
    /// Decided: markers are being written.
    PrepareCommit,
    PrepareAbort,
    /// Every marker of the last transaction is written.
    CompleteCommit,
    CompleteAbort,
}

impl TxnState {
    /// Kafka's name for the state (DescribeTransactions, logs).
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
        }
    }

    /// Whether the outcome is decided and markers remain to be written.
    pub fn is_prepared(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// One transactional id, as stored in the state stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnEntry {
    pub producer_id: i64,
    pub epoch: i16,
    /// The producer id and epoch before the last bump or rotation, so a producer whose
    /// `InitProducerId` answer was lost can retry it (KIP-360).
    pub last_producer_id: i64,
    pub last_epoch: i16,
    pub timeout_ms: u32,
    pub state: TxnState,
    /// Streams (`topic/partition`) of the ongoing or prepared transaction.
    pub partitions: BTreeSet<String>,
    /// When the ongoing transaction began; 0 when none has.
    pub started_ms: u64,
    pub updated_ms: u64,
}

/// Whether `epoch` leaves no room for another bump.
pub fn epoch_exhausted(epoch: i16) -> bool {
    epoch >= i16::MAX - 1
}

/// An `InitProducerId` request for a transactional id.
#[derive(Clone, Copy, Debug)]
pub struct InitRequest {
    pub timeout_ms: u32,
    /// The producer id and epoch the client holds (KIP-360), if it sent them.
    pub expected: Option<(i64, i16)>,
}

/// What an `InitProducerId` needs next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitStep {
    /// A producer id must be allocated; then call [`init_with_new_id`].
    AllocateProducerId,
    /// Append this entry, then answer with its producer id and epoch.
    Write(TxnEntry),
    /// An ongoing transaction must be aborted first, with the epoch bumped to fence the
    /// producer: append this entry (`PrepareAbort`), write its markers, complete it, and
    /// answer `CONCURRENT_TRANSACTIONS` so that the client retries.
    FenceAndAbort(TxnEntry),
}

/// Decides an `InitProducerId` for an existing id, or a new one (`entry` is `None`).
pub fn init(entry: Option<&TxnEntry>, req: InitRequest, max_timeout_ms: u32, now: u64) -> Result<InitStep, i16> {
    if req.timeout_ms == 0 || req.timeout_ms > max_timeout_ms {
        return Err(code::INVALID_TRANSACTION_TIMEOUT);
    }
    let Some(e) = entry else {
        return Ok(InitStep::AllocateProducerId);
    };
    if let Some((pid, epoch)) = req.expected {
        // A client that holds ids is fenced unless they are the current ones, or the
        // ones just rotated away from (a retry whose answer was lost).
        let valid =
            e.epoch == NO_EPOCH || pid == e.producer_id || (pid == e.last_producer_id && epoch_exhausted(epoch));
        if !valid {
            return Err(code::PRODUCER_FENCED);
        }
    }
    match e.state {
        TxnState::PrepareCommit | TxnState::PrepareAbort => Err(code::CONCURRENT_TRANSACTIONS),
        TxnState::Ongoing => Ok(InitStep::FenceAndAbort(fence(e, now)?)),
        TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
            if epoch_exhausted(e.epoch) && req.expected.is_none_or(|(_, epoch)| epoch == e.epoch) {
                return Ok(InitStep::AllocateProducerId);
            }
            bump(e, req, now).map(InitStep::Write)
        }
    }
}

/// Finishes an `InitProducerId` that needed a fresh producer id: a new entry, or the
/// existing one rotated to `producer_id` at epoch 0.
pub fn init_with_new_id(entry: Option<&TxnEntry>, producer_id: i64, req: InitRequest, now: u64) -> TxnEntry {
    let (last_producer_id, last_epoch) = match entry {
        // A rotation remembers the old epoch only for a client that sent it, so that
        // its retry is recognised.
        Some(e) if req.expected.is_some() => (e.producer_id, e.epoch),
        Some(e) => (e.producer_id, NO_EPOCH),
        None => (NO_PRODUCER_ID, NO_EPOCH),
    };
    TxnEntry {
        producer_id,
        epoch: 0,
        last_producer_id,
        last_epoch,
        timeout_ms: req.timeout_ms,
        state: TxnState::Empty,
        partitions: BTreeSet::new(),
        started_ms: 0,
        updated_ms: now,
    }
}

/// Bumps the epoch of an idle id.
fn bump(e: &TxnEntry, req: InitRequest, now: u64) -> Result<TxnEntry, i16> {
    let (epoch, last_epoch) = match req.expected {
        // The bump this client asked for was made, and its answer lost: answer it again.
        Some((_, expected)) if e.epoch != NO_EPOCH && expected != e.epoch && expected == e.last_epoch => {
            (e.epoch, e.last_epoch)
        }
        Some((_, expected)) if e.epoch != NO_EPOCH && expected != e.epoch => return Err(code::PRODUCER_FENCED),
        expected => {
            // An exhausted epoch rotates before it gets here (`init`); never wrap.
            let next = e.epoch.checked_add(1).ok_or(code::PRODUCER_FENCED)?;
            (next, if expected.is_some() { e.epoch } else { NO_EPOCH })
        }
    };
    let bumped = TxnEntry {
        epoch,
        last_epoch,
        ..e.clone()
    };
    Ok(idle(bumped, req.timeout_ms, now))
}

/// `e` with no transaction begun: what an `InitProducerId` leaves.
fn idle(e: TxnEntry, timeout_ms: u32, now: u64) -> TxnEntry {
    TxnEntry {
        timeout_ms,
        state: TxnState::Empty,
        partitions: BTreeSet::new(),
        started_ms: 0,
        updated_ms: now,
        ..e
    }
}

/// Aborts an ongoing transaction under a bumped epoch, so the producer that began it
/// can no longer write or end it (a new `InitProducerId`, or the timeout).
fn fence(e: &TxnEntry, now: u64) -> Result<TxnEntry, i16> {
    if e.epoch == i16::MAX {
        // Not reachable: an exhausted epoch rotates before a transaction can begin.
        return Err(code::INVALID_TXN_STATE);
    }
    Ok(TxnEntry {
        epoch: e.epoch + 1,
        last_epoch: NO_EPOCH,
        state: TxnState::PrepareAbort,
        updated_ms: now,
        ..e.clone()
    })
}

/// Checks that a request comes from the id's current producer.
fn current(entry: Option<&TxnEntry>, producer_id: i64, epoch: i16) -> Result<&TxnEntry, i16> {
    let e = entry.ok_or(code::INVALID_PRODUCER_ID_MAPPING)?;
    if e.producer_id != producer_id {
        return Err(code::INVALID_PRODUCER_ID_MAPPING);
    }
    if e.epoch != epoch {
        return Err(code::PRODUCER_FENCED);
    }
    Ok(e)
}

/// `AddPartitionsToTxn` (and `AddOffsetsToTxn`, with the group's offsets stream): the
/// entry to append, or `None` when every partition is already in the transaction.
pub fn add_partitions(
    entry: Option<&TxnEntry>,
    producer_id: i64,
    epoch: i16,
    partitions: &[String],
    now: u64,
) -> Result<Option<TxnEntry>, i16> {
    let e = current(entry, producer_id, epoch)?;
    match e.state {
        TxnState::PrepareCommit | TxnState::PrepareAbort => Err(code::CONCURRENT_TRANSACTIONS),
        TxnState::Ongoing if partitions.iter().all(|p| e.partitions.contains(p)) => Ok(None),
        state => {
            let mut next = e.clone();
            if state != TxnState::Ongoing {
                next.started_ms = now;
                next.partitions.clear();
            }
            next.partitions.extend(partitions.iter().cloned());
            next.state = TxnState::Ongoing;
            next.updated_ms = now;
            Ok(Some(next))
        }
    }
}

/// What an `EndTxn` needs next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndStep {
    /// Append this entry (`PrepareCommit` or `PrepareAbort`) and answer once it is
    /// durable; then write the markers and complete.
    Prepare(TxnEntry),
    /// A retry of an end already completed: answer success.
    AlreadyDone,
}

/// Decides a client's `EndTxn`.
pub fn end(entry: Option<&TxnEntry>, producer_id: i64, epoch: i16, commit: bool, now: u64) -> Result<EndStep, i16> {
    let e = current(entry, producer_id, epoch)?;
    let asked_prepare = if commit {
        TxnState::PrepareCommit
    } else {
        TxnState::PrepareAbort
    };
    let asked_complete = if commit {
        TxnState::CompleteCommit
    } else {
        TxnState::CompleteAbort
    };
    match e.state {
        TxnState::Ongoing => Ok(EndStep::Prepare(TxnEntry {
            state: asked_prepare,
            updated_ms: now,
            ..e.clone()
        })),
        s if s == asked_complete => Ok(EndStep::AlreadyDone),
        s if s == asked_prepare => Err(code::CONCURRENT_TRANSACTIONS),
        _ => Err(code::INVALID_TXN_STATE),
    }
}

/// The entry once every marker of a prepared transaction is written.
pub fn complete(e: &TxnEntry, now: u64) -> Option<TxnEntry> {
    let state = match e.state {
        TxnState::PrepareCommit => TxnState::CompleteCommit,
        TxnState::PrepareAbort => TxnState::CompleteAbort,
        _ => return None,
    };
    Some(TxnEntry {
        state,
        partitions: BTreeSet::new(),
        updated_ms: now,
        ..e.clone()
    })
}

/// An ongoing transaction past its timeout: the entry that aborts it under a bumped
/// epoch (fencing its producer), else `None`.
pub fn abort_if_timed_out(e: &TxnEntry, now: u64) -> Option<TxnEntry> {
    let deadline = e.started_ms.saturating_add(u64::from(e.timeout_ms));
    if e.state != TxnState::Ongoing || now <= deadline {
        return None;
    }
    fence(e, now).ok()
}

/// Whether an idle id has gone unused past `expiration_ms` (Kafka's
/// `transactional.id.expiration.ms`) and may be forgotten, so the table does not grow
/// with every id ever used.
pub fn expired(e: &TxnEntry, expiration_ms: u64, now: u64) -> bool {
    matches!(
        e.state,
        TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
    ) && now.saturating_sub(e.updated_ms) > expiration_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u32 = 900_000;

    fn req(expected: Option<(i64, i16)>) -> InitRequest {
        InitRequest {
            timeout_ms: 60_000,
            expected,
        }
    }

    /// A new id: allocate, then epoch 0.
    fn fresh() -> TxnEntry {
        assert_eq!(init(None, req(None), MAX, 1), Ok(InitStep::AllocateProducerId));
        init_with_new_id(None, 7, req(None), 1)
    }

    fn write(step: Result<InitStep, i16>) -> TxnEntry {
        match step {
            Ok(InitStep::Write(e)) => e,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    fn ongoing(e: &TxnEntry, parts: &[&str], now: u64) -> TxnEntry {
        let parts: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
        add_partitions(Some(e), e.producer_id, e.epoch, &parts, now)
            .expect("add")
            .expect("a change")
    }

    #[test]
    fn a_new_id_starts_at_epoch_0_and_each_init_bumps_it() {
        let e = fresh();
        assert_eq!((e.producer_id, e.epoch, e.state), (7, 0, TxnState::Empty));
        let e = write(init(Some(&e), req(None), MAX, 2));
        assert_eq!((e.producer_id, e.epoch, e.last_epoch), (7, 1, NO_EPOCH));
        // A client holding the current ids bumps too, and the old epoch is remembered.
        let e = write(init(Some(&e), req(Some((7, 1))), MAX, 3));
        assert_eq!((e.epoch, e.last_epoch), (2, 1));
    }

    #[test]
    fn a_timeout_beyond_the_maximum_is_refused() {
        let r = InitRequest {
            timeout_ms: MAX + 1,
            expected: None,
        };
        assert_eq!(init(None, r, MAX, 1), Err(code::INVALID_TRANSACTION_TIMEOUT));
    }

    #[test]
    fn a_retried_bump_whose_answer_was_lost_gets_the_same_epoch() {
        let e = write(init(Some(&fresh()), req(Some((7, 0))), MAX, 2));
        assert_eq!((e.epoch, e.last_epoch), (1, 0));
        // The client did not see epoch 1 and retries with 0.
        let again = write(init(Some(&e), req(Some((7, 0))), MAX, 3));
        assert_eq!((again.epoch, again.last_epoch), (1, 0));
        // An epoch that is neither current nor the last is fenced.
        let mut older = e.clone();
        older.epoch = 5;
        older.last_epoch = 4;
        assert_eq!(
            init(Some(&older), req(Some((7, 2))), MAX, 4),
            Err(code::PRODUCER_FENCED)
        );
        // So is another producer id.
        assert_eq!(init(Some(&e), req(Some((8, 1))), MAX, 4), Err(code::PRODUCER_FENCED));
    }

    #[test]
    fn an_init_during_a_transaction_aborts_it_under_a_bumped_epoch() {
        let e = ongoing(&fresh(), &["t/0"], 5);
        let Ok(InitStep::FenceAndAbort(fenced)) = init(Some(&e), req(None), MAX, 6) else {
            panic!("expected a fence");
        };
        assert_eq!((fenced.epoch, fenced.state), (1, TxnState::PrepareAbort));
        assert_eq!(
            fenced.partitions, e.partitions,
            "the abort's markers go to every partition"
        );
        // The zombie, still at epoch 0, can neither add nor end.
        assert_eq!(
            add_partitions(Some(&fenced), 7, 0, &["t/1".into()], 7),
            Err(code::PRODUCER_FENCED)
        );
        assert_eq!(end(Some(&fenced), 7, 0, true, 7), Err(code::PRODUCER_FENCED));
        // While the abort completes, a retried init waits.
        assert_eq!(
            init(Some(&fenced), req(None), MAX, 7),
            Err(code::CONCURRENT_TRANSACTIONS)
        );
        // Once complete, the retry bumps again: the client gets epoch 2.
        let done = complete(&fenced, 8).expect("complete");
        assert_eq!(done.state, TxnState::CompleteAbort);
        assert!(done.partitions.is_empty());
        assert_eq!(write(init(Some(&done), req(None), MAX, 9)).epoch, 2);
    }

    #[test]
    fn an_exhausted_epoch_rotates_to_a_new_producer_id() {
        let mut e = fresh();
        e.epoch = i16::MAX - 1;
        assert_eq!(init(Some(&e), req(None), MAX, 2), Ok(InitStep::AllocateProducerId));
        let rotated = init_with_new_id(Some(&e), 9, req(None), 2);
        assert_eq!((rotated.producer_id, rotated.epoch), (9, 0));
        assert_eq!((rotated.last_producer_id, rotated.last_epoch), (7, NO_EPOCH));
        // A client that sent its ids has them remembered, and its retry is recognised
        // rather than fenced.
        let rotated = init_with_new_id(Some(&e), 9, req(Some((7, i16::MAX - 1))), 2);
        assert_eq!((rotated.last_producer_id, rotated.last_epoch), (7, i16::MAX - 1));
        assert!(init(Some(&rotated), req(Some((7, i16::MAX - 1))), MAX, 3).is_ok());
    }

    #[test]
    fn partitions_are_added_until_the_transaction_ends() {
        let e = fresh();
        let a = ongoing(&e, &["t/0"], 10);
        assert_eq!((a.state, a.started_ms), (TxnState::Ongoing, 10));
        // Adding what is there already writes nothing.
        assert_eq!(add_partitions(Some(&a), 7, 0, &["t/0".into()], 11), Ok(None));
        let b = ongoing(&a, &["t/1", "u/0"], 12);
        assert_eq!(b.partitions.len(), 3);
        assert_eq!(b.started_ms, 10, "the transaction began with its first partition");
        // Unknown ids and producer ids are not mapped; an old epoch is fenced.
        assert_eq!(
            add_partitions(None, 7, 0, &["t/0".into()], 1),
            Err(code::INVALID_PRODUCER_ID_MAPPING)
        );
        assert_eq!(
            add_partitions(Some(&b), 8, 0, &["t/0".into()], 1),
            Err(code::INVALID_PRODUCER_ID_MAPPING)
        );
        let Ok(EndStep::Prepare(p)) = end(Some(&b), 7, 0, true, 13) else {
            panic!("expected a prepare");
        };
        assert_eq!(p.state, TxnState::PrepareCommit);
        assert_eq!(
            add_partitions(Some(&p), 7, 0, &["t/9".into()], 14),
            Err(code::CONCURRENT_TRANSACTIONS)
        );
        // The next transaction starts with only its own partitions.
        let done = complete(&p, 15).expect("complete");
        let next = ongoing(&done, &["u/1"], 16);
        assert_eq!(next.partitions.iter().collect::<Vec<_>>(), ["u/1"]);
        assert_eq!(next.started_ms, 16);
    }

    #[test]
    fn end_is_answered_as_kafka_answers_retries_and_contradictions() {
        let e = ongoing(&fresh(), &["t/0"], 1);
        let Ok(EndStep::Prepare(commit)) = end(Some(&e), 7, 0, true, 2) else {
            panic!("expected a prepare");
        };
        // A retried commit while markers are written waits; an abort contradicts it.
        assert_eq!(end(Some(&commit), 7, 0, true, 3), Err(code::CONCURRENT_TRANSACTIONS));
        assert_eq!(end(Some(&commit), 7, 0, false, 3), Err(code::INVALID_TXN_STATE));
        let done = complete(&commit, 4).expect("complete");
        assert_eq!(end(Some(&done), 7, 0, true, 5), Ok(EndStep::AlreadyDone));
        assert_eq!(end(Some(&done), 7, 0, false, 5), Err(code::INVALID_TXN_STATE));
        // Nothing to end before a partition was added.
        assert_eq!(end(Some(&fresh()), 7, 0, true, 5), Err(code::INVALID_TXN_STATE));
        assert!(complete(&done, 6).is_none(), "only a prepared transaction completes");
    }

    #[test]
    fn an_ongoing_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() {
        let e = ongoing(&fresh(), &["t/0"], 1_000);
        assert_eq!(
            abort_if_timed_out(&e, 61_000),
            None,
            "exactly at the deadline is in time"
        );
        let aborted = abort_if_timed_out(&e, 61_001).expect("timed out");
        assert_eq!((aborted.state, aborted.epoch), (TxnState::PrepareAbort, 1));
        assert_eq!(end(Some(&aborted), 7, 0, true, 61_002), Err(code::PRODUCER_FENCED));
        assert_eq!(abort_if_timed_out(&aborted, 1_000_000), None, "only ongoing ones");
    }

    #[test]
    fn only_idle_ids_expire() {
        let e = fresh();
        assert!(!expired(&e, 100, 101));
        assert!(expired(&e, 100, 102));
        let busy = ongoing(&e, &["t/0"], 1);
        assert!(!expired(&busy, 100, 1_000_000));
    }
}
