//! WAL takeovers of fenced or replaced incarnations (FO-TKO): recorded with an agent,
//! reassigned when the agent dies, completed by the agent.

use super::{reject, Txn};
use crate::model::command::{Applied, Outcome, Proposer, RejectCode};
use crate::model::rows::*;
use crate::model::state::RowKey;
use weir_shared::ids::{Epoch, Incarnation, NodeId};

impl Txn<'_> {
    pub(super) fn begin_takeover(
        &mut self,
        proposer: &Proposer,
        node: &NodeId,
        epoch: Epoch,
        agent: &NodeId,
    ) -> Outcome {
        self.privileged(proposer)?;
        let dead = Incarnation {
            node: node.clone(),
            epoch,
        };
        if self.incarnation_live(&dead) {
            return Err(reject(
                RejectCode::Conflict,
                format!("{dead} is live; only a fenced or replaced incarnation is taken over"),
            ));
        }
        // Only a WAL that may hold acknowledged records of open streams is taken over:
        // a late proposal for an incarnation whose streams all moved (its row perhaps
        // reaped since) starts nothing.
        let key = (node.clone(), epoch);
        let holds_open = self.state.streams.owned(&dead).is_some_and(|o| !o.open.is_empty());
        if !holds_open && !self.state.takeovers.contains_key(&key) {
            return Err(reject(
                RejectCode::Conflict,
                format!("{dead} holds no open stream; there is nothing to recover"),
            ));
        }
        let agent_row = self.node_row(agent)?;
        if agent_row.kind != NodeKind::Streamd || !agent_row.is_live() {
            return Err(reject(
                RejectCode::Conflict,
                format!("agent '{agent}' is not a live streamd"),
            ));
        }
        let agent = agent_row.incarnation();
        match self.state.takeovers.get(&key) {
            Some(t) if t.state != TakeoverState::Pending => Ok(Applied::Done),
            Some(t) if t.agent.as_ref() == Some(&agent) => Ok(Applied::Done),
            _ => {
                self.state.takeovers.insert(
                    key,
                    TakeoverRow {
                        dead,
                        agent: Some(agent),
                        state: TakeoverState::Pending,
                    },
                );
                self.touch(RowKey::Takeover(node.clone(), epoch));
                Ok(Applied::Done)
            }
        }
    }

    pub(super) fn complete_takeover(&mut self, proposer: &Proposer, node: &NodeId, epoch: Epoch) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let key = (node.clone(), epoch);
        let takeover = self
            .state
            .takeovers
            .get_mut(&key)
            .ok_or_else(|| reject(RejectCode::NotFound, format!("no takeover of ({node}, {epoch})")))?;
        if takeover.agent.as_ref() != Some(&who) {
            return Err(reject(
                RejectCode::NotOwner,
                format!("{who} is not the agent of the takeover of ({node}, {epoch})"),
            ));
        }
        if takeover.state == TakeoverState::Pending {
            takeover.state = TakeoverState::Recovered;
            self.touch(RowKey::Takeover(node.clone(), epoch));
        }
        Ok(Applied::Done)
    }
}
