//! Leases: compare-and-set acquisition and renewal; a lease decides who runs a loop,
//! never whether what it does is correct (INV-8, INV-9).

use super::{reject, Txn};
use crate::model::command::{Applied, Outcome, Proposer, RejectCode};
use crate::model::rows::*;
use crate::model::state::RowKey;
use weir_shared::ids::Incarnation;

impl Txn<'_> {
    pub(super) fn acquire_lease(&mut self, proposer: &Proposer, name: &str, expected: Option<&Incarnation>) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let index = self.index;
        let current = self.state.leases.get(name);
        let holder = current.map(|l| &l.holder);
        if holder == Some(&who) {
            return self.renew_lease(proposer, name);
        }
        if holder != expected {
            return Err(reject(
                RejectCode::Conflict,
                format!(
                    "lease '{name}' is held by {}",
                    holder.map_or("nobody".into(), |h| h.to_string())
                ),
            ));
        }
        let generation = current.map_or(1, |l| l.generation + 1);
        self.state.leases.insert(
            name.to_string(),
            LeaseRow {
                name: name.to_string(),
                holder: who,
                generation,
                acquired_index: index,
                renewed_index: index,
            },
        );
        self.touch(RowKey::Lease(name.to_string()));
        Ok(Applied::LeaseHeld { generation })
    }

    pub(super) fn renew_lease(&mut self, proposer: &Proposer, name: &str) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let index = self.index;
        match self.state.leases.get_mut(name) {
            Some(lease) if lease.holder == who => {
                lease.renewed_index = index;
                let generation = lease.generation;
                self.touch(RowKey::Lease(name.to_string()));
                Ok(Applied::LeaseHeld { generation })
            }
            Some(lease) => Err(reject(
                RejectCode::Conflict,
                format!("lease '{name}' is held by {}", lease.holder),
            )),
            None => Err(reject(RejectCode::NotFound, format!("lease '{name}' is not held"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_log::{node, op, Log};
    use crate::model::command::{Applied, Proposer, RejectCode};
    use crate::model::rows::{NodeAddrs, NodeKind};
    use crate::model::Command;
    use weir_shared::ids::{Epoch, Incarnation, NodeId};

    /// The log of `test_log` with a second streamd, `m`; its incarnation.
    fn with_m() -> (Log, Incarnation) {
        let mut log = Log::new();
        let register = Command::RegisterNode {
            node: NodeId::new("m"),
            kind: NodeKind::Streamd,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        let Ok(Applied::Registered { epoch }) = log.apply(op(), register) else {
            panic!("register m")
        };
        (
            log,
            Incarnation {
                node: NodeId::new("m"),
                epoch,
            },
        )
    }

    fn n() -> Incarnation {
        Incarnation {
            node: NodeId::new("n"),
            epoch: Epoch(1),
        }
    }

    fn acquire(expected: Option<Incarnation>) -> Command {
        Command::AcquireLease {
            name: "failover".into(),
            expected,
        }
    }

    fn renew() -> Command {
        Command::RenewLease {
            name: "failover".into(),
        }
    }

    // INV-9: a lease changes hands only by a compare-and-set on its holder; each new
    // holder gets the next generation, and a renewal keeps it.
    #[test]
    fn a_lease_changes_hands_only_from_the_holder_its_taker_expected() {
        let (mut log, m) = with_m();
        let held = |generation| Ok(Applied::LeaseHeld { generation });
        assert_eq!(log.apply(node(), renew()), Err(RejectCode::NotFound), "not held yet");
        assert_eq!(log.apply(node(), acquire(None)), held(1));
        let row = log.meta.state.leases["failover"].clone();
        assert_eq!((row.holder.clone(), row.acquired_index), (n(), row.renewed_index));
        // Another node expecting nobody, or itself, does not take it.
        let by_m = Proposer::Node(m.clone());
        assert_eq!(log.apply(by_m.clone(), acquire(None)), Err(RejectCode::Conflict));
        assert_eq!(
            log.apply(by_m.clone(), acquire(Some(m.clone()))),
            Err(RejectCode::Conflict)
        );
        assert_eq!(
            log.apply(by_m.clone(), renew()),
            Err(RejectCode::Conflict),
            "not m's to renew"
        );
        assert_eq!(log.meta.state.leases["failover"], row, "refusals change nothing");
        // The holder renews (or acquires again): same generation, a later renewal.
        assert_eq!(log.apply(node(), renew()), held(1));
        assert_eq!(log.apply(node(), acquire(None)), held(1));
        let renewed = log.meta.state.leases["failover"].clone();
        assert!(renewed.renewed_index > row.renewed_index);
        assert_eq!(renewed.acquired_index, row.acquired_index);
        // Expecting the current holder, m takes it over at the next generation.
        assert_eq!(log.apply(by_m.clone(), acquire(Some(n()))), held(2));
        assert_eq!(log.meta.state.leases["failover"].holder, m);
        assert_eq!(log.apply(node(), renew()), Err(RejectCode::Conflict), "n lost it");
        assert_eq!(log.apply(node(), acquire(Some(m))), held(3));
    }
}
