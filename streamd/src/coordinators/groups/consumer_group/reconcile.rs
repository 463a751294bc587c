//! The group's assignment: the assignor's target for the group epoch, and each member
//! moved toward its target one heartbeat at a time (Kafka's `CurrentAssignmentBuilder`);
//! apart from `mod.rs`, which keeps the membership and a heartbeat's checks.

use super::{ConsumerGroup, MemberState};
use crate::coordinators::groups::assignor::{self, Assignment, Subscriber};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;
use uuid::Uuid;

fn count(a: &Assignment) -> usize {
    a.values().map(BTreeSet::len).sum()
}

/// Whether any partition of `a` is in `b`.
fn overlaps(a: &Assignment, b: &Assignment) -> bool {
    a.iter()
        .any(|(t, ps)| b.get(t).is_some_and(|other| !ps.is_disjoint(other)))
}

fn insert(a: &mut Assignment, t: Uuid, p: i32) {
    a.entry(t).or_default().insert(p);
}

impl ConsumerGroup {
    /// The group's assignor: the one most members name (the earlier in
    /// [`assignor::ASSIGNORS`] on a tie), or the default.
    pub fn assignor_name(&self) -> String {
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = m.assignor.as_deref() {
                *votes.entry(a).or_default() += 1;
            }
        }
        votes
            .iter()
            .max_by_key(|(name, n)| {
                (
                    **n,
                    std::cmp::Reverse(assignor::ASSIGNORS.iter().position(|a| a == *name)),
                )
            })
            .map_or(assignor::ASSIGNORS[0], |(name, _)| *name)
            .to_string()
    }

    /// Runs the group's assignor for the current epoch.
    pub(super) fn compute_target(&mut self) {
        let name = self.assignor_name();
        let sizes: BTreeMap<Uuid, u32> = self.resolved.values().copied().collect();
        let empty = Assignment::new();
        let subscribers: Vec<Subscriber<'_>> = self
            .members
            .values()
            .map(|m| Subscriber {
                id: &m.id,
                topics: self.subscribed_ids(m),
                current: self.target.get(&m.id).unwrap_or(&empty),
            })
            .collect();
        self.target = assignor::assign(&name, &subscribers, &sizes);
        self.assignment_epoch = self.epoch;
        tracing::debug!(group = %self.id, epoch = self.epoch, assignor = %name, members = self.members.len(), "computed the target assignment");
    }

    /// Moves one member toward its target (Kafka's `CurrentAssignmentBuilder`).
    pub(super) fn reconcile(&mut self, member_id: &str, owned: Option<&Assignment>, now: Instant) {
        let target = self.target.get(member_id).cloned().unwrap_or_default();
        let target_epoch = self.assignment_epoch;
        // Partitions other members still hold (assigned or not yet revoked).
        let mut held = Assignment::new();
        for (id, m) in &self.members {
            if id != member_id {
                for (t, ps) in m.assigned.iter().chain(&m.pending_revocation) {
                    held.entry(*t).or_default().extend(ps);
                }
            }
        }
        let m = self.members.get_mut(member_id).expect("reconciled members exist");
        let owns = |revoking: &Assignment| owned.is_none_or(|o| overlaps(o, revoking));
        let start_epoch = match m.state {
            MemberState::Stable if m.epoch == target_epoch => return,
            MemberState::UnrevokedPartitions if owns(&m.pending_revocation) => return,
            _ => m.epoch,
        };
        let (mut keep, mut revoke, mut add) = (Assignment::new(), Assignment::new(), Assignment::new());
        let mut unreleased = false;
        for (t, ps) in &m.assigned {
            for &p in ps {
                if target.get(t).is_some_and(|s| s.contains(&p)) {
                    insert(&mut keep, *t, p);
                } else {
                    insert(&mut revoke, *t, p);
                }
            }
        }
        for (t, ps) in &target {
            for &p in ps {
                if keep.get(t).is_some_and(|s| s.contains(&p)) {
                    continue;
                }
                if held.get(t).is_some_and(|s| s.contains(&p)) {
                    unreleased = true;
                } else {
                    insert(&mut add, *t, p);
                }
            }
        }
        let epoch_before = m.epoch;
        if count(&revoke) > 0 && owns(&revoke) {
            // Revoke first, at the current epoch; the rest follows once it is done.
            m.assigned = keep;
            m.pending_revocation = revoke;
            m.state = MemberState::UnrevokedPartitions;
            m.previous_epoch = start_epoch;
            m.epoch = start_epoch;
            m.revoke_by = Some(now + m.rebalance_timeout);
            return;
        }
        for (t, ps) in add {
            keep.entry(t).or_default().extend(ps);
        }
        m.assigned = keep;
        m.pending_revocation.clear();
        m.revoke_by = None;
        m.state = if unreleased {
            MemberState::UnreleasedPartitions
        } else {
            MemberState::Stable
        };
        if m.epoch != target_epoch {
            m.previous_epoch = epoch_before;
            m.epoch = target_epoch;
        }
    }
}
