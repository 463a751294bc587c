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

#[cfg(test)]
mod tests {
    use super::super::test_log::{op, Log};
    use crate::model::command::RejectCode;
    use crate::model::rows::*;
    use crate::model::Command;
    use weir_shared::ids::{Epoch, NodeId};

    // FO-TKO-3: a takeover's agent is a live streamd: not a gateway, not a fenced node.
    #[test]
    fn a_takeovers_agent_is_a_live_streamd() {
        let mut log = Log::new();
        for (name, kind) in [
            ("gw", NodeKind::Gatewayd),
            ("m", NodeKind::Streamd),
            ("k", NodeKind::Streamd),
            ("j", NodeKind::Streamd),
        ] {
            let register = Command::RegisterNode {
                node: NodeId::new(name),
                kind,
                addrs: NodeAddrs::default(),
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            };
            log.apply(op(), register).expect("register");
        }
        let fence = |name: &str| Command::FenceNode {
            node: NodeId::new(name),
            epoch: Epoch(1),
            seen_heartbeats: 0,
        };
        log.apply(op(), fence("n")).expect("fence n");
        log.apply(op(), fence("k")).expect("fence k");
        let begin = |agent: &str| Command::BeginTakeover {
            node: NodeId::new("n"),
            epoch: Epoch(1),
            agent: NodeId::new(agent),
        };
        assert_eq!(log.apply(op(), begin("gw")), Err(RejectCode::Conflict), "a gateway");
        assert_eq!(
            log.apply(op(), begin("k")),
            Err(RejectCode::Conflict),
            "a fenced streamd"
        );
        assert!(log.meta.state.takeovers.is_empty());
        log.apply(op(), begin("m")).expect("a live streamd");
        let key = (NodeId::new("n"), Epoch(1));
        let row = &log.meta.state.takeovers[&key];
        assert_eq!(row.agent.as_ref().map(|a| a.node.as_str()), Some("m"));
        // A takeover that recovered its WAL is not begun again, whoever a late proposal
        // names: it stays recovered by its agent.
        log.meta.state.takeovers.get_mut(&key).expect("row").state = TakeoverState::Recovered;
        log.apply(op(), begin("j")).expect("a late begin is harmless");
        let row = &log.meta.state.takeovers[&key];
        assert_eq!(row.state, TakeoverState::Recovered);
        assert_eq!(row.agent.as_ref().map(|a| a.node.as_str()), Some("m"));
    }
}
