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
