//! The classic consumer-group membership protocol (JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup) as a state machine over one group. Time is passed in, and answers to
//! waiting members go out through oneshot channels, so the rules are testable alone.
//!
//! A rebalance completes as soon as every member has rejoined, except an empty group's
//! first: as Kafka's `group.initial.rebalance.delay.ms`, it waits the initial delay for
//! more members, each newcomer restarting the wait, up to the rebalance timeout.
//!
//! Static members (KIP-345, `group.instance.id`) keep their place across restarts: one
//! that rejoins without a member id takes over its instance's member and assignment, in
//! a stable group without a rebalance, and the member it replaced is fenced
//! (FENCED_INSTANCE_ID). A static member leaves only by LeaveGroup or by its session
//! running out; a rebalance does not wait for one past the rebalance timeout, and does
//! not drop it either.

mod rebalance;

use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
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
    pub const FENCED_INSTANCE_ID: i16 = Kafka::FencedInstanceId.code();
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
    /// JoinGroup v4+: a new dynamic member first gets an id and joins again with it
    /// (KIP-394). Static members are known by their instance id and skip that round.
    pub require_known_member_id: bool,
    /// Most members (and ids handed out to join) the group holds: Kafka's
    /// `group.max.size`, streamd's `--max-group-members` (issue 19).
    pub max_size: usize,
    /// Kafka's `group.initial.rebalance.delay.ms` (streamd's
    /// `--group-initial-rebalance-delay-ms`).
    pub initial_delay: Duration,
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
    /// Answers a join or sync this member still waits on with `error`.
    fn answer_waits(&mut self, error: i16) {
        if let Some(tx) = self.join.take() {
            let _ = tx.send(JoinOutcome {
                error,
                generation: -1,
                member_id: self.id.clone(),
                ..Default::default()
            });
        }
        if let Some(tx) = self.sync.take() {
            let _ = tx.send(SyncOutcome {
                error,
                ..Default::default()
            });
        }
    }

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
    /// Static members: group instance id → its current member id.
    statics: BTreeMap<String, String>,
    /// Members answered by the last join that have not sent SyncGroup yet, and until
    /// when they may: a member (a leader above all) that dies between the two would
    /// otherwise hold the group until its session ends (Kafka's pending-sync check).
    awaiting_sync: Option<(Instant, BTreeSet<String>)>,
    /// An empty group's first rebalance completes no sooner than the first instant,
    /// and no later than the second (the initial delay and its cap).
    initial_wait: Option<(Instant, Instant)>,
}

/// A fresh member id, prefixed as Kafka's are: by the instance id for a static member,
/// else by the client id.
fn new_member_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>())
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
            statics: BTreeMap::new(),
            awaiting_sync: None,
            initial_wait: None,
        }
    }

    /// KIP-345: a request naming `instance` whose member is not `member_id` comes from
    /// a replaced (or duplicate) instance.
    fn fenced(&self, member_id: &str, instance: Option<&str>) -> bool {
        instance
            .and_then(|i| self.statics.get(i))
            .is_some_and(|current| current != member_id)
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
        tracing::debug!(
            group = %self.id,
            member = %args.member_id,
            instance = args.group_instance_id.as_deref(),
            phase = ?self.phase,
            members = self.members.len(),
            "JoinGroup"
        );
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
        if let Some(instance) = args.group_instance_id.clone() {
            if self.fenced(&args.member_id, Some(&instance)) {
                if args.member_id.is_empty() {
                    let old = self.statics[&instance].clone();
                    return self.rejoin_static(old, instance, args, now);
                }
                return Self::join_error(code::FENCED_INSTANCE_ID, &args.member_id);
            }
        }
        let member_id = if args.member_id.is_empty() {
            if self.members.len() + self.pending.len() >= args.max_size {
                crate::metrics::metrics().group_members_refused.inc();
                return Self::join_error(code::GROUP_MAX_SIZE_REACHED, "");
            }
            let id = new_member_id(args.group_instance_id.as_deref().unwrap_or(&args.client_id));
            if args.require_known_member_id && args.group_instance_id.is_none() {
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
        // A member that changed (or dropped) its instance id no longer holds the old one.
        if let Some(old) = existing.as_ref().and_then(|m| m.group_instance_id.as_ref()) {
            if args.group_instance_id.as_ref() != Some(old) && self.statics.get(old) == Some(&member_id) {
                self.statics.remove(old);
            }
        }
        if let Some(instance) = &args.group_instance_id {
            self.statics.insert(instance.clone(), member_id.clone());
        }
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
        let first_rebalance = self.phase == GroupState::Empty && self.members.len() == 1;
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
        self.delay_initial_rebalance(now, first_rebalance, args.initial_delay, args.rebalance_timeout);
        self.try_complete_join(now, false);
        Answer::Later(rx)
    }

    /// A static member rejoining without its member id (a restarted process) takes over
    /// `old`'s place under a new id; whatever `old` still waits on is fenced. In a
    /// stable group whose protocol stays the same, it gets the current generation and
    /// its old assignment at once: no rebalance. As Kafka's coordinator does before
    /// JoinGroup v9, the answer names the previous leader id, so a restarted leader does
    /// not run an assignment a stable group would not hand out.
    fn rejoin_static(&mut self, old: String, instance: String, args: JoinArgs, now: Instant) -> Answer<JoinOutcome> {
        let Some(mut previous) = self.members.remove(&old) else {
            self.statics.remove(&instance);
            return Self::join_error(code::UNKNOWN_MEMBER_ID, "");
        };
        previous.answer_waits(code::FENCED_INSTANCE_ID);
        if let Some((_, waiting)) = &mut self.awaiting_sync {
            waiting.remove(&old);
        }
        let member_id = new_member_id(&instance);
        tracing::info!(group = %self.id, instance = %instance, old_member = %old, member = %member_id, "static member rejoined and replaces its previous member id");
        let previous_leader = self.leader.clone().unwrap_or_default();
        if self.leader.as_deref() == Some(old.as_str()) {
            self.leader = Some(member_id.clone());
        }
        self.statics.insert(instance, member_id.clone());
        let (tx, rx) = oneshot::channel();
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
                assignment: previous.assignment,
                last_seen: now,
                join: Some(tx),
                sync: None,
            },
        );
        match self.phase {
            GroupState::Stable if self.common_protocols().first() == self.protocol.as_ref() => {
                if let Some(m) = self.members.get_mut(&member_id) {
                    m.join = None;
                }
                let mut outcome = self.join_outcome(&member_id);
                outcome.leader = previous_leader;
                outcome.members.clear();
                Answer::Now(outcome)
            }
            // A new protocol, or a leader that may already be assigning to the old
            // member id: rebalance. A rebalance under way takes the new id as joined.
            _ => {
                self.prepare_rebalance(now);
                self.try_complete_join(now, false);
                Answer::Later(rx)
            }
        }
    }

    pub fn sync(
        &mut self,
        member_id: &str,
        instance: Option<&str>,
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
        if self.fenced(member_id, instance) {
            return error(code::FENCED_INSTANCE_ID);
        }
        if !self.members.contains_key(member_id) {
            return error(code::UNKNOWN_MEMBER_ID);
        }
        if generation != self.generation {
            return error(code::ILLEGAL_GENERATION);
        }
        if let Some((_, waiting)) = &mut self.awaiting_sync {
            waiting.remove(member_id);
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

    pub fn heartbeat(&mut self, member_id: &str, instance: Option<&str>, generation: i32, now: Instant) -> i16 {
        if self.fenced(member_id, instance) {
            return code::FENCED_INSTANCE_ID;
        }
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

    /// Removes a member, named by its member id or (LeaveGroup v3+, a static member)
    /// its instance id; the rest rebalance.
    pub fn leave(&mut self, member_id: &str, instance: Option<&str>, now: Instant) -> i16 {
        let member_id = match instance {
            Some(i) => match self.statics.get(i) {
                None => return code::UNKNOWN_MEMBER_ID,
                Some(current) if !member_id.is_empty() && current != member_id => return code::FENCED_INSTANCE_ID,
                Some(current) => current.clone(),
            },
            None => member_id.to_string(),
        };
        if !self.remove(&member_id) {
            return code::UNKNOWN_MEMBER_ID;
        }
        self.after_removal(now);
        code::NONE
    }

    /// Checks an offset commit's membership: generation −1 with no member id commits
    /// for an empty group only (a standalone consumer or an admin tool). As in Kafka,
    /// members commit while a rebalance is being prepared (clients commit on revoke,
    /// before they rejoin), but not between the join and the assignment.
    pub fn check_commit(&mut self, member_id: &str, instance: Option<&str>, generation: i32, now: Instant) -> i16 {
        if self.fenced(member_id, instance) {
            return code::FENCED_INSTANCE_ID;
        }
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

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
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
            initial_delay: Duration::ZERO,
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
        now(g.sync(&a.member_id, None, a.generation, vec![], t));
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
        let synced = now(g.sync(
            &first.member_id,
            None,
            1,
            vec![(first.member_id.clone(), "a".into())],
            t,
        ));
        assert_eq!(synced.assignment, Bytes::from("a"));
        assert_eq!(g.phase, GroupState::Stable);
    }

    // Issue 59 (librdkafka 0113): with `group.initial.rebalance.delay.ms`, members that
    // join an empty group within the delay of each other share its first rebalance,
    // each newcomer restarting the wait, capped by the rebalance timeout.
    #[test]
    fn an_empty_groups_first_rebalance_waits_for_members_joining_together() {
        let t = Instant::now();
        let delay = Duration::from_secs(3);
        let mut g = Group::new("g");
        let delayed = |m: &str| JoinArgs {
            require_known_member_id: false,
            initial_delay: delay,
            ..args(m)
        };
        let mut a_rx = now_or_wait(g.join(delayed(""), t));
        g.tick(t + Duration::from_secs(2));
        assert!(a_rx.try_recv().is_err(), "the first join waits the delay");
        let mut b_rx = now_or_wait(g.join(delayed(""), t + Duration::from_secs(2)));
        g.tick(t + Duration::from_secs(4));
        assert!(a_rx.try_recv().is_err(), "a newcomer restarts the wait");
        g.tick(t + Duration::from_secs(5));
        let (a, b) = (a_rx.try_recv().expect("joined"), b_rx.try_recv().expect("joined"));
        assert_eq!((a.generation, b.generation), (1, 1), "one rebalance for both");
        assert_eq!(a.members.len() + b.members.len(), 2, "the leader sees both");

        // Newcomers keep the wait going no longer than the rebalance timeout (30 s).
        let mut g = Group::new("h");
        let mut first = now_or_wait(g.join(delayed(""), t));
        let mut others = vec![];
        for s in (2..40).step_by(2) {
            let at = t + Duration::from_secs(s);
            others.push(now_or_wait(g.join(delayed(""), at)));
            g.tick(at);
            if first.try_recv().is_ok() {
                assert!(s >= 30, "completed at {s} s, before the cap");
                return;
            }
        }
        panic!("the first rebalance never completed");
    }

    #[test]
    fn a_second_member_rebalances_the_group_and_both_get_assignments() {
        let t = Instant::now();
        let mut g = Group::new("g");
        let mut a_args = args("");
        a_args.require_known_member_id = false;
        let mut rx = now_or_wait(g.join(a_args, t));
        let a = rx.try_recv().expect("joined");
        now(g.sync(&a.member_id, None, a.generation, vec![], t));
        let mut b_args = args("");
        b_args.require_known_member_id = false;
        let mut b_rx = now_or_wait(g.join(b_args, t));
        assert!(b_rx.try_recv().is_err(), "waits for the leader to rejoin");
        assert_eq!(
            g.heartbeat(&a.member_id, None, a.generation, t),
            code::REBALANCE_IN_PROGRESS
        );
        let mut a_rx = now_or_wait(g.join(args(&a.member_id), t));
        let a2 = a_rx.try_recv().expect("rebalance completed");
        let b = b_rx.try_recv().expect("rebalance completed");
        assert_eq!((a2.generation, b.generation), (2, 2));
        assert_eq!(a2.members.len(), 2, "the leader sees every member");
        assert!(b.members.is_empty());
        let mut b_sync = now_or_wait(g.sync(&b.member_id, None, 2, vec![], t));
        let a_sync = now(g.sync(
            &a.member_id,
            None,
            2,
            vec![(a.member_id.clone(), "pa".into()), (b.member_id.clone(), "pb".into())],
            t,
        ));
        assert_eq!(a_sync.assignment, Bytes::from("pa"));
        assert_eq!(b_sync.try_recv().expect("assigned").assignment, Bytes::from("pb"));
        assert_eq!(g.check_commit(&b.member_id, None, 2, t), code::NONE);
        assert_eq!(g.check_commit(&b.member_id, None, 1, t), code::ILLEGAL_GENERATION);
    }

    #[test]
    fn an_expired_member_is_removed_and_the_rest_rebalance() {
        let t = Instant::now();
        let mut g = Group::new("g");
        let mut a_args = args("");
        a_args.require_known_member_id = false;
        let a = now_or_wait(g.join(a_args, t)).try_recv().expect("joined");
        now(g.sync(&a.member_id, None, a.generation, vec![], t));
        g.tick(t + Duration::from_secs(11));
        assert!(g.is_empty());
        assert_eq!(g.phase, GroupState::Empty);
        assert_eq!(
            g.heartbeat(&a.member_id, None, a.generation, t),
            code::UNKNOWN_MEMBER_ID
        );
        assert_eq!(
            g.check_commit("", None, -1, t),
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
        assert_eq!(g.leave("nobody", None, t), code::UNKNOWN_MEMBER_ID);
    }

    #[test]
    fn members_commit_while_a_rebalance_is_prepared_and_waiting_does_not_expire_them() {
        let t = Instant::now();
        let (mut g, a, mut b_rx) = stable_then_second_joins(t);
        // a learns of the rebalance and commits on revoke before rejoining.
        assert_eq!(g.check_commit(&a.member_id, None, a.generation, t), code::NONE);
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
            g.check_commit(&b.member_id, None, b.generation, late),
            code::REBALANCE_IN_PROGRESS
        );
    }

    #[test]
    fn a_removed_member_still_waiting_is_told_so() {
        let t = Instant::now();
        let (mut g, a, mut b_rx) = stable_then_second_joins(t);
        assert!(b_rx.try_recv().is_err(), "waits for a to rejoin");
        let b_id = g.members.keys().find(|k| **k != a.member_id).cloned().expect("b");
        assert_eq!(g.leave(&b_id, None, t), code::NONE);
        assert_eq!(b_rx.try_recv().expect("answered").error, code::UNKNOWN_MEMBER_ID);
    }
    fn static_args(member: &str, instance: &str) -> JoinArgs {
        JoinArgs {
            group_instance_id: Some(instance.into()),
            ..args(member)
        }
    }

    /// A stable group of static `a` (instance "i-a", the leader) and dynamic `b`,
    /// assigned "pa" and "pb".
    fn stable_static_and_dynamic(t: Instant) -> (Group, String, String) {
        let mut g = Group::new("g");
        let a = now_or_wait(g.join(static_args("", "i-a"), t))
            .try_recv()
            .expect("static members skip MEMBER_ID_REQUIRED");
        assert!(a.member_id.starts_with("i-a-"), "{}", a.member_id);
        now(g.sync(&a.member_id, Some("i-a"), a.generation, vec![], t));
        let mut b_rx = now_or_wait(g.join(direct(""), t));
        let mut a_rx = now_or_wait(g.join(static_args(&a.member_id, "i-a"), t));
        let (a, b) = (a_rx.try_recv().expect("a joined"), b_rx.try_recv().expect("b joined"));
        assert_eq!(a.leader, a.member_id);
        let mut b_sync = now_or_wait(g.sync(&b.member_id, None, b.generation, vec![], t));
        let plan = vec![(a.member_id.clone(), "pa".into()), (b.member_id.clone(), "pb".into())];
        now(g.sync(&a.member_id, Some("i-a"), a.generation, plan, t));
        assert_eq!(b_sync.try_recv().expect("assigned").assignment, Bytes::from("pb"));
        (g, a.member_id, b.member_id)
    }

    // Issue 22 (KIP-345): a restarted static member gets its assignment back with no
    // rebalance, and the member id it replaced is fenced everywhere.
    #[test]
    fn a_restarted_static_member_keeps_its_assignment_without_a_rebalance() {
        let t = Instant::now();
        let (mut g, old_a, b) = stable_static_and_dynamic(t);
        let generation = g.generation;
        let back = now(g.join(static_args("", "i-a"), t));
        assert_eq!(back.error, code::NONE);
        assert_ne!(back.member_id, old_a, "a new member id");
        assert_eq!(back.generation, generation, "no new generation");
        assert_eq!(
            back.leader, old_a,
            "the old leader id: the restarted leader runs no assignment"
        );
        assert!(back.members.is_empty());
        assert_eq!(g.phase, GroupState::Stable);
        assert_eq!(g.heartbeat(&b, None, generation, t), code::NONE, "b sees no rebalance");
        let synced = now(g.sync(&back.member_id, Some("i-a"), generation, vec![], t));
        assert_eq!(synced.assignment, Bytes::from("pa"));
        assert_eq!(g.leader.as_deref(), Some(back.member_id.as_str()));
        // The replaced process (or a duplicate) is fenced.
        assert_eq!(
            g.heartbeat(&old_a, Some("i-a"), generation, t),
            code::FENCED_INSTANCE_ID
        );
        assert_eq!(
            g.check_commit(&old_a, Some("i-a"), generation, t),
            code::FENCED_INSTANCE_ID
        );
        let fenced = now(g.sync(&old_a, Some("i-a"), generation, vec![], t));
        assert_eq!(fenced.error, code::FENCED_INSTANCE_ID);
        assert_eq!(
            now(g.join(static_args(&old_a, "i-a"), t)).error,
            code::FENCED_INSTANCE_ID
        );
        assert_eq!(g.leave(&old_a, Some("i-a"), t), code::FENCED_INSTANCE_ID);
        assert_eq!(g.members.len(), 2);
        // LeaveGroup by instance id alone (an admin removing the member) rebalances.
        assert_eq!(g.leave("", Some("i-a"), t), code::NONE);
        assert_eq!(g.leave("", Some("i-a"), t), code::UNKNOWN_MEMBER_ID);
        assert!(matches!(g.phase, GroupState::PreparingRebalance { .. }));
    }

    // Issue 22 (KIP-345): a rebalance does not wait for an absent static member past its
    // timeout, nor drop it; its session does.
    #[test]
    fn an_absent_static_member_stays_through_a_rebalance_until_its_session_ends() {
        let t = Instant::now();
        let (mut g, a, b) = stable_static_and_dynamic(t);
        let mut c_rx = now_or_wait(g.join(direct(""), t));
        let mut b_rx = now_or_wait(g.join(direct(&b), t));
        // a (the leader) is down and does not rejoin. Its session (60 s here) outlasts
        // the rebalance timeout (30 s), so the rebalance ends first.
        g.members.get_mut(&a).expect("a").session_timeout = Duration::from_secs(60);
        g.tick(t + Duration::from_secs(31));
        let (b2, c) = (b_rx.try_recv().expect("b joined"), c_rx.try_recv().expect("c joined"));
        assert_eq!(g.phase, GroupState::CompletingRebalance);
        assert!(g.members.contains_key(&a), "the static member stays");
        let leader = if b2.leader == b2.member_id { &b2 } else { &c };
        assert_eq!(leader.members.len(), 3, "the leader assigns to all three");
        assert_ne!(b2.leader, a, "a leader that rejoined");
        for m in [&b2, &c] {
            assert_eq!(
                g.heartbeat(&m.member_id, None, m.generation, t + Duration::from_secs(55)),
                code::NONE
            );
        }
        g.tick(t + Duration::from_secs(61));
        assert!(
            !g.members.contains_key(&a),
            "its session ran out, not restarted by a join it missed"
        );
        assert!(matches!(g.phase, GroupState::PreparingRebalance { .. }));
        assert_eq!(
            g.leave("", Some("i-a"), t),
            code::UNKNOWN_MEMBER_ID,
            "its instance is forgotten"
        );
    }

    // Issue 22 (KIP-345): an instance that rejoins while its old member id waits on a
    // rebalance fences that wait and takes its place in the rebalance.
    #[test]
    fn a_duplicate_instance_fences_the_member_waiting_in_a_rebalance() {
        let t = Instant::now();
        let (mut g, a, b) = stable_static_and_dynamic(t);
        let mut old_join = now_or_wait(g.join(static_args(&a, "i-a"), t));
        // A second process with the same instance id.
        let mut new_join = now_or_wait(g.join(static_args("", "i-a"), t));
        assert_eq!(old_join.try_recv().expect("answered").error, code::FENCED_INSTANCE_ID);
        let mut b_rx = now_or_wait(g.join(direct(&b), t));
        let joined = new_join.try_recv().expect("the rebalance completed");
        assert_eq!(joined.error, code::NONE);
        assert_eq!(
            joined.leader, joined.member_id,
            "the leader's place passed to the new member id"
        );
        assert_eq!(joined.members.len(), 2);
        assert_eq!(b_rx.try_recv().expect("b joined").generation, joined.generation);
    }

    // Issue 22: a leader that joined but dies before SyncGroup does not hold the group
    // for its whole session: members that have not synced within the rebalance timeout
    // are removed and the rest rebalance (Kafka's pending-sync expiry).
    #[test]
    fn members_that_do_not_sync_within_the_rebalance_timeout_are_removed() {
        let t = Instant::now();
        let mut g = Group::new("g");
        // Sessions far longer than the rebalance timeout (30 s), as static members' are.
        let long = |member: &str, instance: &str| JoinArgs {
            session_timeout: Duration::from_secs(600),
            ..static_args(member, instance)
        };
        let a = now_or_wait(g.join(long("", "i-a"), t)).try_recv().expect("a joined");
        now(g.sync(&a.member_id, Some("i-a"), a.generation, vec![], t));
        let mut b_rx = now_or_wait(g.join(long("", "i-b"), t));
        let _a2 = now_or_wait(g.join(long(&a.member_id, "i-a"), t));
        let b = b_rx.try_recv().expect("b joined");
        assert_eq!(b.leader, a.member_id);
        assert_eq!(g.phase, GroupState::CompletingRebalance);
        // b waits for its assignment; the leader a never sends SyncGroup.
        let mut b_sync = now_or_wait(g.sync(&b.member_id, Some("i-b"), b.generation, vec![], t));
        g.tick(t + Duration::from_secs(29));
        assert!(b_sync.try_recv().is_err(), "still within the rebalance timeout");
        g.tick(t + Duration::from_secs(31));
        assert!(
            !g.members.contains_key(&a.member_id),
            "the leader that never synced is removed"
        );
        assert!(g.members.contains_key(&b.member_id), "b synced: it stays");
        assert_eq!(b_sync.try_recv().expect("answered").error, code::REBALANCE_IN_PROGRESS);
    }
}
