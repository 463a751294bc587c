//! Damaged streams (issue 20): a streamd that finds committed data failing its checks
//! reports it, and the stream stays marked, with reads past the damage refused, until an
//! operator restores the data or trims past it. The operator's command is the audit
//! record in the log.

use super::{reject, Txn};
use crate::model::command::{Applied, DamageRemedy, Outcome, Proposer, RejectCode};
use crate::model::rows::*;
use crate::model::state::{Row, RowKey};
use weir_shared::ids::{Offset, StreamId};

impl Txn<'_> {
    /// Marks `id` damaged in `from..until`. The mark starts at the earliest damage
    /// reported and ends past the last: reopening a stream compares the mark's end with
    /// the committed end, so a report must never shorten it, or offsets of records lost
    /// before their commit would be handed out again. A report within the mark changes
    /// nothing; damage wholly below the start offset is already gone.
    pub(super) fn report_damage(
        &mut self,
        proposer: &Proposer,
        id: StreamId,
        from: Offset,
        until: Offset,
        what: &str,
    ) -> Outcome {
        let finder = self.node_proposer(proposer)?.clone();
        let row = self.stream(id)?;
        if row.state == StreamState::Deleted {
            return Err(reject(
                RejectCode::NotFound,
                format!("stream '{}' is deleted", row.name),
            ));
        }
        if from >= until {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("damaged range {from}..{until} of stream '{}' is empty", row.name),
            ));
        }
        if until <= row.start_offset || row.damage.as_ref().is_some_and(|d| d.from <= from && until <= d.until) {
            return Ok(Applied::Done);
        }
        let mut row = row.clone();
        row.damage = Some(Box::new(match row.damage.take() {
            // The earliest report names the damage; a later one only reaches further.
            Some(d) if d.from <= from => StreamDamage { until, ..*d },
            earlier => StreamDamage {
                from,
                until: earlier.map_or(until, |d| d.until.max(until)),
                what: what.to_string(),
                found_by: finder.to_string(),
            },
        }));
        self.state.set_row(&RowKey::Stream(id), Some(Row::Stream(row)));
        self.touch(RowKey::Stream(id));
        Ok(Applied::Done)
    }

    /// Clears `id`'s damage by the operator's `remedy`: the data was restored, or the
    /// start moves past the damage (a trim, which drops the ranges below it). Records
    /// lost before they were committed (WAL damage) cannot be restored; trimming past
    /// them also moves the committed end, so their offsets are never handed out again.
    pub(super) fn resolve_damage(&mut self, proposer: &Proposer, id: StreamId, remedy: DamageRemedy) -> Outcome {
        if let Proposer::Node(who) = proposer {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("only an operator may resolve damage, not node '{}'", who.node),
            ));
        }
        let row = self.stream(id)?;
        let Some(damage) = row.damage.clone() else {
            return Err(reject(
                RejectCode::Conflict,
                format!("stream '{}' is not damaged", row.name),
            ));
        };
        let uncommitted = damage.until > row.committed_end;
        let outcome = match remedy {
            DamageRemedy::Restored if uncommitted => {
                return Err(reject(
                    RejectCode::Conflict,
                    format!(
                        "stream '{}' lost records {}..{} that were never committed, so there is no object to restore; trim past them instead",
                        row.name, damage.from, damage.until
                    ),
                ))
            }
            DamageRemedy::Restored => Applied::Done,
            DamageRemedy::TrimPast if uncommitted && row.state == StreamState::Open => {
                return Err(reject(
                    RejectCode::Conflict,
                    format!(
                        "stream '{}' is still being recovered from its dead owner's WAL; trim once that has finished",
                        row.name
                    ),
                ))
            }
            DamageRemedy::TrimPast => {
                if uncommitted {
                    // The lost offsets are skipped, never handed out again: the stream
                    // goes on from the end of the damage, with nothing below it.
                    self.state
                        .streams
                        .update(&id, |row| row.committed_end = damage.until)
                        .expect("checked above");
                }
                self.trim_stream(proposer, id, damage.until)?
            }
        };
        let mut row = self.stream(id)?.clone();
        row.damage = None;
        self.state.set_row(&RowKey::Stream(id), Some(Row::Stream(row)));
        self.touch(RowKey::Stream(id));
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_log::{node, op, Log};
    use crate::model::command::{Applied, DamageRemedy, RejectCode};
    use crate::model::index::IndexRead;
    use crate::model::Command;
    use weir_shared::ids::{Offset, StreamId};

    fn report(from: u64, until: u64) -> Command {
        Command::ReportDamage {
            stream: StreamId(0),
            from: Offset(from),
            until: Offset(until),
            what: format!("object data/x range {from}..{until} fails its checksum"),
        }
    }

    fn resolve(remedy: DamageRemedy) -> Command {
        Command::ResolveDamage {
            stream: StreamId(0),
            remedy,
        }
    }

    // Issue 20, defect 5: damage is terminal and visible until an operator acts.
    #[test]
    fn the_earliest_damage_is_kept_and_only_a_node_reports_it() {
        let mut log = Log::new();
        log.commit("data/1", &[(0, 10, 100)]);
        log.commit("data/2", &[(0, 10, 100)]);
        assert_eq!(log.apply(op(), report(10, 20)), Err(RejectCode::InvalidArgument));
        assert_eq!(log.apply(node(), report(10, 10)), Err(RejectCode::InvalidArgument));
        assert_eq!(log.apply(node(), report(10, 20)), Ok(Applied::Done));
        let damage = log.row(0).damage.clone().expect("marked");
        assert_eq!((damage.from, damage.until), (Offset(10), Offset(20)));
        assert_eq!(damage.found_by, "(n, 1)");
        // A report within the mark changes nothing; one reaching further extends it; an
        // earlier one moves its start; none shortens it.
        let range = |log: &Log| log.row(0).damage.as_ref().map(|d| (d.from.0, d.until.0));
        log.apply(node(), report(15, 20)).expect("within");
        assert_eq!(range(&log), Some((10, 20)));
        log.apply(node(), report(15, 25)).expect("further");
        assert_eq!(range(&log), Some((10, 25)));
        assert_eq!(log.row(0).damage.as_ref().map(|d| d.found_by.as_str()), Some("(n, 1)"));
        log.apply(node(), report(0, 10)).expect("earlier");
        assert_eq!(range(&log), Some((0, 25)), "the end of the later loss is kept");
        assert!(log.row(1).damage.is_none(), "another stream is untouched");
    }

    #[test]
    fn restoring_clears_the_mark_and_trimming_moves_the_start_past_the_damage() {
        let mut log = Log::new();
        log.commit("data/1", &[(0, 10, 100)]);
        log.commit("data/2", &[(0, 10, 100)]);
        assert_eq!(
            log.apply(op(), resolve(DamageRemedy::Restored)),
            Err(RejectCode::Conflict)
        );
        log.apply(node(), report(10, 20)).expect("report");
        assert_eq!(
            log.apply(node(), resolve(DamageRemedy::TrimPast)),
            Err(RejectCode::InvalidArgument),
            "only an operator resolves damage"
        );
        log.apply(op(), resolve(DamageRemedy::Restored)).expect("restored");
        assert!(log.row(0).damage.is_none());
        assert_eq!(log.row(0).start_offset, Offset(0), "a restore trims nothing");

        log.apply(node(), report(0, 10)).expect("report again");
        assert_eq!(
            log.apply(op(), resolve(DamageRemedy::TrimPast)),
            Ok(Applied::Trimmed { start: Offset(10) })
        );
        assert!(log.row(0).damage.is_none());
        assert_eq!(log.row(0).start_offset, Offset(10));
        // The damaged range left the index: nothing below the start is readable.
        assert_eq!(log.meta.index.ranges_from(StreamId(0), Offset(0), 10).len(), 1);
        // Damage wholly below the start is already gone.
        assert_eq!(log.apply(node(), report(0, 10)), Ok(Applied::Done));
        assert!(log.row(0).damage.is_none());
    }

    #[test]
    fn records_lost_before_their_commit_keep_the_stream_closed_until_trimmed_past() {
        let mut log = Log::new();
        log.commit("data/1", &[(0, 10, 100)]);
        log.close(0);
        // A takeover found offsets 10..15 acknowledged but lost to WAL damage.
        log.apply(node(), report(10, 15)).expect("report");
        log.place_on_n(0);
        let open = Log::open_by_n(0);
        assert_eq!(
            log.apply(node(), open.clone()),
            Err(RejectCode::Conflict),
            "reopening would reuse offsets"
        );
        assert_eq!(
            log.apply(op(), resolve(DamageRemedy::Restored)),
            Err(RejectCode::Conflict)
        );
        assert_eq!(
            log.apply(op(), resolve(DamageRemedy::TrimPast)),
            Ok(Applied::Trimmed { start: Offset(15) })
        );
        assert_eq!(
            (log.row(0).start_offset, log.row(0).committed_end),
            (Offset(15), Offset(15))
        );
        assert!(matches!(
            log.apply(node(), open),
            Ok(Applied::StreamOpened {
                committed_end: Offset(15),
                ..
            })
        ));
    }

    /// A loss past the committed end on a stream still open (its dead owner's takeover
    /// still recovering it) is not trimmed past yet: the offsets may still be recovered.
    #[test]
    fn an_uncommitted_loss_is_not_trimmed_past_while_the_stream_is_open() {
        let mut log = Log::new();
        log.commit("data/1", &[(0, 10, 100)]);
        log.apply(node(), report(10, 15)).expect("report");
        assert_eq!(
            log.apply(op(), resolve(DamageRemedy::TrimPast)),
            Err(RejectCode::Conflict)
        );
        assert_eq!(
            (log.row(0).start_offset, log.row(0).committed_end),
            (Offset(0), Offset(10))
        );
        log.close(0);
        assert_eq!(
            log.apply(op(), resolve(DamageRemedy::TrimPast)),
            Ok(Applied::Trimmed { start: Offset(15) })
        );
    }

    /// Damage already marked, then a takeover finds later records lost before their
    /// commit: the stream stays closed until trimmed past the later loss, so its
    /// offsets are never handed out again.
    #[test]
    fn a_later_loss_keeps_the_stream_closed_past_it() {
        let mut log = Log::new();
        log.commit("data/1", &[(0, 12, 100)]);
        log.apply(node(), report(5, 8)).expect("damage in committed data");
        log.close(0);
        log.apply(node(), report(12, 20)).expect("a later loss");
        log.place_on_n(0);
        let open = Log::open_by_n(0);
        assert_eq!(log.apply(node(), open.clone()), Err(RejectCode::Conflict));
        assert_eq!(
            log.apply(op(), resolve(DamageRemedy::TrimPast)),
            Ok(Applied::Trimmed { start: Offset(20) })
        );
        assert!(matches!(
            log.apply(node(), open),
            Ok(Applied::StreamOpened {
                committed_end: Offset(20),
                ..
            })
        ));
    }
}
