//! The classic consumer-group membership protocol (JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup) as a state machine over one group. Time is passed in, and answers to
//! waiting members go out through oneshot channels, so the rules are testable alone.
//!
//! A rebalance completes as soon as every member has rejoined: there is no initial
//! delay (Kafka's `group.initial.rebalance.delay.ms`), so a first join answers at once.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Kafka error codes the membership protocol answers with.
pub mod code {
    use kafka_protocol::ResponseError as Kafka;

    pub const NONE: i16 = 0;
    pub const ILLEGAL_GENERATION: i16 = Kafka::IllegalGeneration.code();
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = Kafka::InconsistentGroupProtocol.code();
    pub const UNKNOWN_MEMBER_ID: i16 = Kafka::UnknownMemberId.code();
    pub const INVALID_SESSION_TIMEOUT: i16 = Kafka::InvalidSessionTimeout.code();
    pub const REBALANCE_IN_PROGRESS: i16 = Kafka::RebalanceInProgress.code();
    pub const MEMBER_ID_REQUIRED: i16 = Kafka::MemberIdRequired.code();
    pub const GROUP_MAX_SIZE_REACHED: i16 = Kafka::GroupMaxSizeReached.code();
}

/// Session timeouts a member may ask for (Kafka's broker defaults).
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(1_000);
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(30 * 60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance { since: Instant },
    CompletingRebalance,
    Stable,
}

impl GroupState {
    /// The state name DescribeGroups and ListGroups report.
    pub fn name(&self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance { .. } => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// What a JoinGroup answers.
#[derive(Clone, Debug, Default)]
pub struct JoinOutcome {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Only the leader gets the members and their metadata.
    pub members: Vec<(String, Option<String>, Bytes)>,
}

/// What a SyncGroup answers.
#[derive(Clone, Debug, Default)]
pub struct SyncOutcome {
    pub error: i16,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub assignment: Bytes,
}

/// An answer now, or one that arrives when the rebalance moves on.
pub enum Answer<T> {
    Now(T),
    Later(oneshot::Receiver<T>),
}

pub struct JoinArgs {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a new member first gets an id and joins again with it (KIP-394).
    pub require_known_member_id: bool,
    /// Most members (and ids handed out to join) the group holds: Kafka's
    /// `group.max.size`, streamd's `--max-group-members` (issue 19).
    pub max_size: usize,
}

pub struct Member {
    pub id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    last_seen: Instant,
    join: Option<oneshot::Sender<JoinOutcome>>,
    sync: Option<oneshot::Sender<SyncOutcome>>,
}

impl Member {
    /// The metadata this member gave for `protocol`.
    pub fn metadata(&self, protocol: Option<&str>) -> Bytes {
        protocol
            .and_then(|p| self.protocols.iter().find(|(n, _)| n == p))
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

/// One group's membership.
pub struct Group {
    pub id: String,
    pub phase: GroupState,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub members: BTreeMap<String, Member>,
    /// Ids handed out by MEMBER_ID_REQUIRED that have not joined yet, until when they
    /// may (the session timeout of the join that got them).
    pending: BTreeMap<String, Instant>,
}

fn new_member_id(client_id: &str) -> String {
    format!(
        "{client_id}-{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

impl Group {
    pub fn new(id: &str) -> Self {
        Self {
            id: id.to_string(),
            phase: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: BTreeMap::new(),
        }
    }

    fn join_error(error: i16, member_id: &str) -> Answer<JoinOutcome> {
        Answer::Now(JoinOutcome {
            error,
            generation: -1,
            member_id: member_id.to_string(),
            ..Default::default()
        })
    }

    pub fn join(&mut self, args: JoinArgs, now: Instant) -> Answer<JoinOutcome> {
        if args.session_timeout < MIN_SESSION_TIMEOUT || args.session_timeout > MAX_SESSION_TIMEOUT {
            return Self::join_error(code::INVALID_SESSION_TIMEOUT, &args.member_id);
        }
        if args.protocols.is_empty()
            || (!self.members.is_empty() && self.protocol_type.as_deref() != Some(args.protocol_type.as_str()))
            || (!self.members.is_empty()
                && !self
                    .common_protocols()
                    .iter()
                    .any(|p| args.protocols.iter().any(|(n, _)| n == p)))
        {
            return Self::join_error(code::INCONSISTENT_GROUP_PROTOCOL, &args.member_id);
        }
        let member_id = if args.member_id.is_empty() {
            if self.members.len() + self.pending.len() >= args.max_size {
                crate::metrics::metrics().group_members_refused.inc();
                return Self::join_error(code::GROUP_MAX_SIZE_REACHED, "");
            }
            let id = new_member_id(&args.client_id);
            if args.require_known_member_id {
                self.pending.insert(id.clone(), now + args.session_timeout);
                return Self::join_error(code::MEMBER_ID_REQUIRED, &id);
            }
            id
        } else if self.members.contains_key(&args.member_id) || self.pending.remove(&args.member_id).is_some() {
            args.member_id.clone()
        } else {
            return Self::join_error(code::UNKNOWN_MEMBER_ID, &args.member_id);
        };

        let (tx, rx) = oneshot::channel();
        let existing = self.members.remove(&member_id);
        let unchanged = existing.as_ref().is_some_and(|m| m.protocols == args.protocols);
        let assignment = existing.as_ref().map(|m| m.assignment.clone()).unwrap_or_default();
        self.members.insert(
            member_id.clone(),
            Member {
                id: member_id.clone(),
                group_instance_id: args.group_instance_id,
                client_id: args.client_id,
                client_host: args.client_host,
                session_timeout: args.session_timeout,
                rebalance_timeout: args.rebalance_timeout,
                protocols: args.protocols,
                assignment,
                last_seen: now,
                join: Some(tx),
                sync: None,
            },
        );
        if self.members.len() == 1 || self.protocol_type.is_none() {
            self.protocol_type = Some(args.protocol_type);
        }
        let is_leader = self.leader.as_deref() == Some(member_id.as_str());
        if self.phase == GroupState::Stable && unchanged && !is_leader {
            // A follower rejoining with the same metadata gets the current generation.
            let outcome = self.join_outcome(&member_id);
            if let Some(m) = self.members.get_mut(&member_id) {
                m.join = None;
            }
            return Answer::Now(outcome);
        }
        self.prepare_rebalance(now);
        self.try_complete_join(now);
        Answer::Later(rx)
    }

    pub fn sync(
        &mut self,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
        now: Instant,
    ) -> Answer<SyncOutcome> {
        let error = |e| {
            Answer::Now(SyncOutcome {
                error: e,
                ..Default::default()
            })
        };
        if !self.members.contains_key(member_id) {
            return error(code::UNKNOWN_MEMBER_ID);
        }
        if generation != self.generation {
            return error(code::ILLEGAL_GENERATION);
        }
        let ok = |assignment: Bytes, g: &Group| SyncOutcome {
            error: code::NONE,
            protocol_type: g.protocol_type.clone(),
            protocol: g.protocol.clone(),
            assignment,
        };
        match self.phase {
            GroupState::Empty => error(code::UNKNOWN_MEMBER_ID),
            GroupState::PreparingRebalance { .. } => error(code::REBALANCE_IN_PROGRESS),
            GroupState::Stable => {
                let m = self.members.get_mut(member_id).expect("checked above");
                m.last_seen = now;
                let a = m.assignment.clone();
                Answer::Now(ok(a, self))
            }
            GroupState::CompletingRebalance => {
                if self.leader.as_deref() == Some(member_id) {
                    let mut given: BTreeMap<String, Bytes> = assignments.into_iter().collect();
                    for m in self.members.values_mut() {
                        m.assignment = given.remove(&m.id).unwrap_or_default();
                    }
                    self.phase = GroupState::Stable;
                    let (pt, p) = (self.protocol_type.clone(), self.protocol.clone());
                    for m in self.members.values_mut() {
                        if let Some(tx) = m.sync.take() {
                            let _ = tx.send(SyncOutcome {
                                error: code::NONE,
                                protocol_type: pt.clone(),
                                protocol: p.clone(),
                                assignment: m.assignment.clone(),
                            });
                        }
                    }
                    let m = self.members.get_mut(member_id).expect("checked above");
                    m.last_seen = now;
                    let a = m.assignment.clone();
                    Answer::Now(ok(a, self))
                } else {
                    let (tx, rx) = oneshot::channel();
                    let m = self.members.get_mut(member_id).expect("checked above");
                    m.last_seen = now;
                    m.sync = Some(tx);
                    Answer::Later(rx)
                }
            }
        }
    }

    pub fn heartbeat(&mut self, member_id: &str, generation: i32, now: Instant) -> i16 {
        let Some(m) = self.members.get_mut(member_id) else {
            return code::UNKNOWN_MEMBER_ID;
        };
        m.last_seen = now;
        if generation != self.generation {
            return code::ILLEGAL_GENERATION;
        }
        match self.phase {
            GroupState::PreparingRebalance { .. } => code::REBALANCE_IN_PROGRESS,
            GroupState::Empty => code::UNKNOWN_MEMBER_ID,
            _ => code::NONE,
        }
    }

    /// Removes a member; the rest rebalance.
    pub fn leave(&mut self, member_id: &str, now: Instant) -> i16 {
        if !self.remove(member_id) {
            return code::UNKNOWN_MEMBER_ID;
        }
        self.after_removal(now);
        code::NONE
    }

    /// Checks an offset commit's membership: generation −1 with no member id commits
    /// for an empty group only (a standalone consumer or an admin tool). As in Kafka,
    /// members commit while a rebalance is being prepared (clients commit on revoke,
    /// before they rejoin), but not between the join and the assignment.
    pub fn check_commit(&mut self, member_id: &str, generation: i32, now: Instant) -> i16 {
        if generation < 0 && member_id.is_empty() {
            return if self.members.is_empty() {
                code::NONE
            } else {
                code::ILLEGAL_GENERATION
            };
        }
        let Some(m) = self.members.get_mut(member_id) else {
            return code::UNKNOWN_MEMBER_ID;
        };
        m.last_seen = now;
        if generation != self.generation {
            return code::ILLEGAL_GENERATION;
        }
        if self.phase == GroupState::CompletingRebalance {
            return code::REBALANCE_IN_PROGRESS;
        }
        code::NONE
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
        if let GroupState::PreparingRebalance { since } = self.phase {
            let timeout = self
                .members
                .values()
                .map(|m| m.rebalance_timeout)
                .max()
                .unwrap_or_default();
            if now.duration_since(since) >= timeout {
                let late: Vec<String> = self
                    .members
                    .values()
                    .filter(|m| m.join.is_none())
                    .map(|m| m.id.clone())
                    .collect();
                for id in &late {
                    self.remove(id);
                }
                self.try_complete_join(now);
                if self.members.is_empty() {
                    self.become_empty();
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Removes a member; a join or sync it still waits on is answered UNKNOWN_MEMBER_ID.
    fn remove(&mut self, member_id: &str) -> bool {
        let Some(mut m) = self.members.remove(member_id) else {
            return false;
        };
        if let Some(tx) = m.join.take() {
            let _ = tx.send(JoinOutcome {
                error: code::UNKNOWN_MEMBER_ID,
                generation: -1,
                member_id: member_id.to_string(),
                ..Default::default()
            });
        }
        if let Some(tx) = m.sync.take() {
            let _ = tx.send(SyncOutcome {
                error: code::UNKNOWN_MEMBER_ID,
                ..Default::default()
            });
        }
        true
    }

    fn after_removal(&mut self, now: Instant) {
        if self.members.is_empty() {
            self.become_empty();
        } else {
            self.prepare_rebalance(now);
            self.try_complete_join(now);
        }
    }

    fn become_empty(&mut self) {
        if self.phase != GroupState::Empty {
            self.generation += 1;
        }
        self.phase = GroupState::Empty;
        self.leader = None;
        self.protocol = None;
    }

    fn prepare_rebalance(&mut self, now: Instant) {
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
        self.phase = GroupState::PreparingRebalance { since: now };
    }

    /// Protocols every member supports, in the leader's (or first member's) order.
    fn common_protocols(&self) -> Vec<String> {
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

    fn try_complete_join(&mut self, now: Instant) {
        if !matches!(self.phase, GroupState::PreparingRebalance { .. })
            || self.members.is_empty()
            || self.members.values().any(|m| m.join.is_none())
        {
            return;
        }
        self.generation += 1;
        self.protocol = self.common_protocols().into_iter().next();
        if !self.leader.as_ref().is_some_and(|l| self.members.contains_key(l)) {
            self.leader = self.members.keys().next().cloned();
        }
        self.phase = GroupState::CompletingRebalance;
        // A member's session restarts when its join completes: waiting for slower
        // members does not count against it.
        for m in self.members.values_mut() {
            m.last_seen = now;
        }
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let outcome = self.join_outcome(&id);
            if let Some(tx) = self.members.get_mut(&id).and_then(|m| m.join.take()) {
                let _ = tx.send(outcome);
            }
        }
    }

    fn join_outcome(&self, member_id: &str) -> JoinOutcome {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(member: &str) -> JoinArgs {
        JoinArgs {
            member_id: member.into(),
            group_instance_id: None,
            client_id: "c".into(),
            client_host: "h".into(),
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(30),
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"m"))],
            require_known_member_id: true,
            max_size: 1000,
        }
    }

    // Issue 19: a group admits at most max_size members, ids handed out included.
    #[test]
    fn a_full_group_refuses_a_new_member() {
        let t = Instant::now();
        let mut g = Group::new("g");
        let small = |m: &str| JoinArgs { max_size: 2, ..args(m) };
        let first = now(g.join(small(""), t));
        assert_eq!(first.error, code::MEMBER_ID_REQUIRED);
        let second = now(g.join(small(""), t));
        assert_eq!(second.error, code::MEMBER_ID_REQUIRED);
        assert_eq!(now(g.join(small(""), t)).error, code::GROUP_MAX_SIZE_REACHED);
        // The ids handed out still join.
        drop(now_or_wait(g.join(small(&first.member_id), t)));
    }

    /// A join without the MEMBER_ID_REQUIRED round trip.
    fn direct(member: &str) -> JoinArgs {
        let mut a = args(member);
        a.require_known_member_id = false;
        a
    }

    /// A group with one member `a`, stable; and a second member joining (waiting).
    fn stable_then_second_joins(t: Instant) -> (Group, JoinOutcome, oneshot::Receiver<JoinOutcome>) {
        let mut g = Group::new("g");
        let a = now_or_wait(g.join(direct(""), t)).try_recv().expect("joined");
        now(g.sync(&a.member_id, a.generation, vec![], t));
        let b_rx = now_or_wait(g.join(direct(""), t));
        (g, a, b_rx)
    }

    fn now_or_wait<T>(a: Answer<T>) -> oneshot::Receiver<T> {
        match a {
            Answer::Later(rx) => rx,
            Answer::Now(_) => panic!("expected to wait"),
        }
    }

    fn now<T>(a: Answer<T>) -> T {
        match a {
            Answer::Now(t) => t,
            Answer::Later(_) => panic!("expected an answer now"),
        }
    }

    #[test]
    fn first_join_needs_an_id_then_completes_without_delay() {
        let t = Instant::now();
        let mut g = Group::new("g");
        let first = now(g.join(args(""), t));
        assert_eq!(first.error, code::MEMBER_ID_REQUIRED);
        let mut rx = now_or_wait(g.join(args(&first.member_id), t));
        let joined = rx.try_recv().expect("answered at once");
        assert_eq!(joined.error, code::NONE);
        assert_eq!(joined.generation, 1);
        assert_eq!(joined.leader, first.member_id);
        assert_eq!(joined.members.len(), 1);
        let synced = now(g.sync(&first.member_id, 1, vec![(first.member_id.clone(), "a".into())], t));
        assert_eq!(synced.assignment, Bytes::from("a"));
        assert_eq!(g.phase, GroupState::Stable);
    }

    #[test]
    fn a_second_member_rebalances_the_group_and_both_get_assignments() {
        let t = Instant::now();
        let mut g = Group::new("g");
        let mut a_args = args("");
        a_args.require_known_member_id = false;
        let mut rx = now_or_wait(g.join(a_args, t));
        let a = rx.try_recv().expect("joined");
        now(g.sync(&a.member_id, a.generation, vec![], t));
        let mut b_args = args("");
        b_args.require_known_member_id = false;
        let mut b_rx = now_or_wait(g.join(b_args, t));
        assert!(b_rx.try_recv().is_err(), "waits for the leader to rejoin");
        assert_eq!(g.heartbeat(&a.member_id, a.generation, t), code::REBALANCE_IN_PROGRESS);
        let mut a_rx = now_or_wait(g.join(args(&a.member_id), t));
        let a2 = a_rx.try_recv().expect("rebalance completed");
        let b = b_rx.try_recv().expect("rebalance completed");
        assert_eq!((a2.generation, b.generation), (2, 2));
        assert_eq!(a2.members.len(), 2, "the leader sees every member");
        assert!(b.members.is_empty());
        let mut b_sync = now_or_wait(g.sync(&b.member_id, 2, vec![], t));
        let a_sync = now(g.sync(
            &a.member_id,
            2,
            vec![(a.member_id.clone(), "pa".into()), (b.member_id.clone(), "pb".into())],
            t,
        ));
        assert_eq!(a_sync.assignment, Bytes::from("pa"));
        assert_eq!(b_sync.try_recv().expect("assigned").assignment, Bytes::from("pb"));
        assert_eq!(g.check_commit(&b.member_id, 2, t), code::NONE);
        assert_eq!(g.check_commit(&b.member_id, 1, t), code::ILLEGAL_GENERATION);
    }

    #[test]
    fn an_expired_member_is_removed_and_the_rest_rebalance() {
        let t = Instant::now();
        let mut g = Group::new("g");
        let mut a_args = args("");
        a_args.require_known_member_id = false;
        let a = now_or_wait(g.join(a_args, t)).try_recv().expect("joined");
        now(g.sync(&a.member_id, a.generation, vec![], t));
        g.tick(t + Duration::from_secs(11));
        assert!(g.is_empty());
        assert_eq!(g.phase, GroupState::Empty);
        assert_eq!(g.heartbeat(&a.member_id, a.generation, t), code::UNKNOWN_MEMBER_ID);
        assert_eq!(
            g.check_commit("", -1, t),
            code::NONE,
            "an empty group takes simple commits"
        );
    }

    #[test]
    fn unknown_members_and_bad_timeouts_are_refused() {
        let t = Instant::now();
        let mut g = Group::new("g");
        assert_eq!(now(g.join(args("nobody"), t)).error, code::UNKNOWN_MEMBER_ID);
        let mut a = args("");
        a.session_timeout = Duration::from_millis(10);
        assert_eq!(now(g.join(a, t)).error, code::INVALID_SESSION_TIMEOUT);
        assert_eq!(g.leave("nobody", t), code::UNKNOWN_MEMBER_ID);
    }

    #[test]
    fn members_commit_while_a_rebalance_is_prepared_and_waiting_does_not_expire_them() {
        let t = Instant::now();
        let (mut g, a, mut b_rx) = stable_then_second_joins(t);
        // a learns of the rebalance and commits on revoke before rejoining.
        assert_eq!(g.check_commit(&a.member_id, a.generation, t), code::NONE);
        // a rejoins late, after b waited longer than its session: b is not expired.
        let late = t + Duration::from_secs(9);
        let _a_rx = now_or_wait(g.join(args(&a.member_id), late));
        let b = b_rx.try_recv().expect("rebalance completed");
        g.tick(late + Duration::from_secs(5));
        assert!(
            g.members.contains_key(&b.member_id),
            "the session restarted at the join"
        );
        // Between the join and the assignment, commits wait for the new generation.
        assert_eq!(
            g.check_commit(&b.member_id, b.generation, late),
            code::REBALANCE_IN_PROGRESS
        );
    }

    #[test]
    fn a_removed_member_still_waiting_is_told_so() {
        let t = Instant::now();
        let (mut g, a, mut b_rx) = stable_then_second_joins(t);
        assert!(b_rx.try_recv().is_err(), "waits for a to rejoin");
        let b_id = g.members.keys().find(|k| **k != a.member_id).cloned().expect("b");
        assert_eq!(g.leave(&b_id, t), code::NONE);
        assert_eq!(b_rx.try_recv().expect("answered").error, code::UNKNOWN_MEMBER_ID);
    }
}
