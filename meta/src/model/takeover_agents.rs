//! Which WAL takeovers an incarnation must run, read from the view: the decisions a
//! streamd's takeover loop acts on (FO-TKO-3, INV-8), kept here so that they are
//! tested as plain functions of the state rather than through live processes.

use super::rows::TakeoverState;
use super::state::State;
use weir_shared::ids::Incarnation;

impl State {
    /// Whether `me` stands in its own right: its node row is this incarnation's and is
    /// not fenced. A fenced or replaced incarnation takes nothing over: its proposals
    /// would be refused, and its claim on a dead node's WAL would stand in the way of
    /// the next agent.
    pub fn incarnation_stands(&self, me: &Incarnation) -> bool {
        self.nodes
            .get(&me.node)
            .is_some_and(|r| r.epoch == me.epoch && !r.fenced)
    }

    /// The dead incarnations whose pending takeover names `me` its agent, while `me`
    /// stands.
    pub fn takeovers_due(&self, me: &Incarnation) -> Vec<Incarnation> {
        if !self.incarnation_stands(me) {
            return Vec::new();
        }
        self.takeovers
            .values()
            .filter(|t| t.state == TakeoverState::Pending && t.agent.as_ref() == Some(me))
            .map(|t| t.dead.clone())
            .collect()
    }

    /// Whether `me` still stands and is the agent of a pending takeover of `dead`.
    pub fn is_takeover_agent(&self, me: &Incarnation, dead: &Incarnation) -> bool {
        self.incarnation_stands(me)
            && self
                .takeovers
                .get(&(dead.node.clone(), dead.epoch))
                .is_some_and(|t| t.state == TakeoverState::Pending && t.agent.as_ref() == Some(me))
    }

    /// Whether the takeover of `dead` is recovered by `me`: its WAL is then `me`'s to
    /// delete (a completion whose answer was lost shows here once applied).
    pub fn recovered_by(&self, me: &Incarnation, dead: &Incarnation) -> bool {
        self.takeovers
            .get(&(dead.node.clone(), dead.epoch))
            .is_some_and(|t| t.state == TakeoverState::Recovered && t.agent.as_ref() == Some(me))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::{NodeAddrs, NodeKind, NodeRow, TakeoverRow};
    use weir_shared::ids::{Epoch, NodeId};

    fn inc(node: &str, epoch: u64) -> Incarnation {
        Incarnation {
            node: NodeId::new(node),
            epoch: Epoch(epoch),
        }
    }

    fn node(state: &mut State, me: &Incarnation, fenced: bool) {
        state.nodes.insert(
            me.node.clone(),
            NodeRow {
                id: me.node.clone(),
                kind: NodeKind::Streamd,
                epoch: me.epoch,
                addrs: NodeAddrs::default(),
                heartbeats: 0,
                registered_index: 1,
                last_heartbeat_index: 1,
                fenced,
                fenced_index: fenced.then_some(2),
                cordon: None,
                terminating: false,
                drain_released: false,
            },
        );
    }

    fn takeover(state: &mut State, dead: &Incarnation, agent: &Incarnation, s: TakeoverState) {
        state.takeovers.insert(
            (dead.node.clone(), dead.epoch),
            TakeoverRow {
                dead: dead.clone(),
                agent: Some(agent.clone()),
                state: s,
            },
        );
    }

    /// One agent `a` (epoch 2) of two dead incarnations, one of them recovered already,
    /// and another agent's takeover.
    fn state() -> (State, Incarnation) {
        let mut s = State::default();
        let me = inc("a", 2);
        node(&mut s, &me, false);
        node(&mut s, &inc("b", 1), false);
        takeover(&mut s, &inc("x", 1), &me, TakeoverState::Pending);
        takeover(&mut s, &inc("y", 3), &me, TakeoverState::Recovered);
        takeover(&mut s, &inc("z", 1), &inc("b", 1), TakeoverState::Pending);
        (s, me)
    }

    // FO-TKO-3: an agent runs exactly its own pending takeovers.
    #[test]
    fn an_agent_runs_its_own_pending_takeovers_only() {
        let (s, me) = state();
        assert!(s.incarnation_stands(&me));
        assert_eq!(s.takeovers_due(&me), vec![inc("x", 1)]);
        assert!(s.is_takeover_agent(&me, &inc("x", 1)));
        // Recovered is not pending; another agent's is not this one's.
        assert!(!s.is_takeover_agent(&me, &inc("y", 3)));
        assert!(!s.is_takeover_agent(&me, &inc("z", 1)));
        assert!(!s.is_takeover_agent(&me, &inc("w", 1)), "no such takeover");
        assert_eq!(s.takeovers_due(&inc("b", 1)), vec![inc("z", 1)]);
        // Only a recovered takeover's WAL is its agent's to delete.
        assert!(s.recovered_by(&me, &inc("y", 3)));
        assert!(!s.recovered_by(&me, &inc("x", 1)), "still pending");
        assert!(!s.recovered_by(&inc("b", 1), &inc("y", 3)), "another agent's");
    }

    // INV-8: a fenced agent takes nothing over and stops being the agent of what it ran.
    #[test]
    fn a_fenced_agent_takes_nothing_over() {
        let (mut s, me) = state();
        node(&mut s, &me, true);
        assert!(!s.incarnation_stands(&me));
        assert!(s.takeovers_due(&me).is_empty());
        assert!(!s.is_takeover_agent(&me, &inc("x", 1)));
    }

    // INV-8: an incarnation replaced by a newer registration of its node is no agent,
    // nor is one the view does not know yet.
    #[test]
    fn a_replaced_or_unknown_incarnation_takes_nothing_over() {
        let (mut s, me) = state();
        node(&mut s, &inc("a", 3), false);
        assert!(!s.incarnation_stands(&me));
        assert!(s.takeovers_due(&me).is_empty());
        assert!(!s.is_takeover_agent(&me, &inc("x", 1)));
        let unknown = inc("c", 1);
        assert!(!s.incarnation_stands(&unknown));
    }
}
