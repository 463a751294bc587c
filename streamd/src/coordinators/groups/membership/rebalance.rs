//! How a classic group's rebalance moves on: the initial delay, sessions and deadlines
//! running out (`tick`), members removed, and the join phase completed. Apart from
//! `mod.rs`, which answers the members' requests, so each half reads alone.

use super::{code, Group, GroupState, JoinOutcome, Member, SyncOutcome};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

impl Group {
    /// Starts (for an empty group's first join) or extends (for a newcomer during it)
    /// the initial rebalance's wait for more members.
    pub(super) fn delay_initial_rebalance(
        &mut self,
        now: Instant,
        first: bool,
        delay: Duration,
        rebalance_timeout: Duration,
    ) {
        if delay.is_zero() {
            return;
        }
        if first {
            self.initial_wait = Some((now + delay, now + rebalance_timeout.max(delay)));
        } else if let Some((until, cap)) = &mut self.initial_wait {
            *until = (now + delay).min(*cap);
        }
    }

    /// Expires members whose session ran out and ends a rebalance whose time is up.
    pub fn tick(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .members
            .values()
            // Members waiting for a join or an assignment are answered by the rebalance,
            // and their heartbeats queue behind that wait on their connection.
            .filter(|m| m.join.is_none() && m.sync.is_none() && now.duration_since(m.last_seen) > m.session_timeout)
            .map(|m| m.id.clone())
            .collect();
        for id in &expired {
            tracing::info!(group = %self.id, member = %id, "group member's session expired");
            self.remove(id);
        }
        self.pending.retain(|_, until| *until > now);
        if !expired.is_empty() {
            self.after_removal(now);
        }
        let unsynced = match &self.awaiting_sync {
            Some((until, waiting))
                if now >= *until && matches!(self.phase, GroupState::CompletingRebalance | GroupState::Stable) =>
            {
                waiting.iter().cloned().collect()
            }
            _ => vec![],
        };
        if !unsynced.is_empty() {
            self.awaiting_sync = None;
            for id in &unsynced {
                tracing::info!(group = %self.id, member = %id, "group member did not sync within the rebalance timeout");
                self.remove(id);
            }
            self.after_removal(now);
        }
        if self.initial_wait.is_some_and(|(until, _)| now >= until) {
            self.try_complete_join(now, false);
        }
        if let GroupState::PreparingRebalance { since } = self.phase {
            let timeout = self
                .members
                .values()
                .map(|m| m.rebalance_timeout)
                .max()
                .unwrap_or_default();
            if now.duration_since(since) >= timeout {
                // Late dynamic members are dropped; late static members stay, with the
                // metadata they last gave, until their sessions run out.
                let late: Vec<String> = self
                    .members
                    .values()
                    .filter(|m| m.join.is_none() && m.group_instance_id.is_none())
                    .map(|m| m.id.clone())
                    .collect();
                for id in &late {
                    self.remove(id);
                }
                if self.members.is_empty() {
                    self.become_empty();
                } else if self.members.values().any(|m| m.join.is_some()) {
                    self.try_complete_join(now, true);
                } else {
                    // Nobody rejoined: wait another round for sessions to decide.
                    self.phase = GroupState::PreparingRebalance { since: now };
                }
            }
        }
    }

    /// Removes a member; a join or sync it still waits on is answered UNKNOWN_MEMBER_ID.
    pub(super) fn remove(&mut self, member_id: &str) -> bool {
        let Some(mut m) = self.members.remove(member_id) else {
            return false;
        };
        if let Some(i) = &m.group_instance_id {
            if self.statics.get(i).is_some_and(|current| current == member_id) {
                self.statics.remove(i);
            }
        }
        m.answer_waits(code::UNKNOWN_MEMBER_ID);
        true
    }

    pub(super) fn after_removal(&mut self, now: Instant) {
        if self.members.is_empty() {
            self.become_empty();
        } else {
            self.prepare_rebalance(now);
            self.try_complete_join(now, false);
        }
    }

    fn become_empty(&mut self) {
        self.awaiting_sync = None;
        self.initial_wait = None;
        if self.phase != GroupState::Empty {
            self.generation += 1;
        }
        self.phase = GroupState::Empty;
        self.leader = None;
        self.protocol = None;
    }

    pub(super) fn prepare_rebalance(&mut self, now: Instant) {
        if matches!(self.phase, GroupState::PreparingRebalance { .. }) {
            return;
        }
        // Members waiting for an assignment learn that a new rebalance began.
        for m in self.members.values_mut() {
            if let Some(tx) = m.sync.take() {
                let _ = tx.send(SyncOutcome {
                    error: code::REBALANCE_IN_PROGRESS,
                    ..Default::default()
                });
            }
        }
        self.awaiting_sync = None;
        self.phase = GroupState::PreparingRebalance { since: now };
    }

    /// Protocols every member supports, in the leader's (or first member's) order.
    pub(super) fn common_protocols(&self) -> Vec<String> {
        let first = self
            .leader
            .as_ref()
            .and_then(|l| self.members.get(l))
            .or_else(|| self.members.values().next());
        let Some(first) = first else { return vec![] };
        first
            .protocols
            .iter()
            .map(|(n, _)| n.clone())
            .filter(|n| self.members.values().all(|m| m.protocols.iter().any(|(p, _)| p == n)))
            .collect()
    }

    /// Completes the join phase once every member rejoined, or, when `forced` (the
    /// rebalance timed out), with those that did: the leader is one that rejoined.
    pub(super) fn try_complete_join(&mut self, now: Instant, forced: bool) {
        let joined = |m: &Member| m.join.is_some();
        if !forced && self.initial_wait.is_some_and(|(until, _)| now < until) {
            return;
        }
        if !matches!(self.phase, GroupState::PreparingRebalance { .. })
            || !self.members.values().any(joined)
            || (!forced && !self.members.values().all(joined))
        {
            return;
        }
        self.initial_wait = None;
        self.generation += 1;
        self.protocol = self.common_protocols().into_iter().next();
        if !self
            .leader
            .as_ref()
            .and_then(|l| self.members.get(l))
            .is_some_and(joined)
        {
            self.leader = self.members.values().find(|m| joined(m)).map(|m| m.id.clone());
        }
        self.phase = GroupState::CompletingRebalance;
        // A member's session restarts when its join completes: waiting for slower
        // members does not count against it. An absent static member's does not.
        for m in self.members.values_mut().filter(|m| m.join.is_some()) {
            m.last_seen = now;
        }
        let joined_ids: BTreeSet<String> = self
            .members
            .values()
            .filter(|m| joined(m))
            .map(|m| m.id.clone())
            .collect();
        let timeout = self
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default();
        tracing::debug!(group = %self.id, generation = self.generation, members = ?joined_ids, "join phase completed");
        self.awaiting_sync = Some((now + timeout, joined_ids));
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let outcome = self.join_outcome(&id);
            if let Some(tx) = self.members.get_mut(&id).and_then(|m| m.join.take()) {
                let _ = tx.send(outcome);
            }
        }
    }

    pub(super) fn join_outcome(&self, member_id: &str) -> JoinOutcome {
        let leader = self.leader.clone().unwrap_or_default();
        let members = if leader == member_id {
            self.members
                .values()
                .map(|m| {
                    (
                        m.id.clone(),
                        m.group_instance_id.clone(),
                        m.metadata(self.protocol.as_deref()),
                    )
                })
                .collect()
        } else {
            vec![]
        };
        JoinOutcome {
            error: code::NONE,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol: self.protocol.clone(),
            leader,
            member_id: member_id.to_string(),
            members,
        }
    }
}
