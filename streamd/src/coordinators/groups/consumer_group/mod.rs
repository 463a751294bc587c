//! KIP-848's consumer group protocol (ConsumerGroupHeartbeat) as a state machine over
//! one group, beside the classic one in `membership/`. Time and the topics are passed
//! in, so the rules are testable alone.
//!
//! The coordinator owns the assignment. Every change of the members, their subscriptions
//! or the subscribed topics bumps the group epoch; at the next heartbeat the assignor
//! computes a target assignment for that epoch, and each member is moved toward its
//! target one heartbeat at a time, as Kafka's `CurrentAssignmentBuilder` does: a member
//! first gives up the partitions it must revoke (keeping its epoch until it reports them
//! gone), then takes the new epoch and every target partition no other member still
//! holds; partitions another member still holds follow once they are released.
//!
//! Membership lives in memory, as the classic groups' does: after the offsets stream
//! moves, members heartbeat to a coordinator that does not know them, are answered
//! UNKNOWN_MEMBER_ID, and join again (committed offsets move with the stream).

mod reconcile;
mod subscriptions;

use super::assignor::{self, Assignment};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use subscriptions::compile;
use uuid::Uuid;

/// Kafka error codes this protocol answers with.
pub mod code {
    use kafka_protocol::ResponseError as Kafka;

    pub const NONE: i16 = 0;
    pub const INVALID_REQUEST: i16 = Kafka::InvalidRequest.code();
    pub const UNKNOWN_MEMBER_ID: i16 = Kafka::UnknownMemberId.code();
    pub const FENCED_MEMBER_EPOCH: i16 = Kafka::FencedMemberEpoch.code();
    pub const STALE_MEMBER_EPOCH: i16 = Kafka::StaleMemberEpoch.code();
    pub const UNRELEASED_INSTANCE_ID: i16 = Kafka::UnreleasedInstanceId.code();
    pub const FENCED_INSTANCE_ID: i16 = Kafka::FencedInstanceId.code();
    pub const UNSUPPORTED_ASSIGNOR: i16 = Kafka::UnsupportedAssignor.code();
    pub const GROUP_MAX_SIZE_REACHED: i16 = Kafka::GroupMaxSizeReached.code();
    pub const INVALID_REGULAR_EXPRESSION: i16 = Kafka::InvalidRegularExpression.code();
    pub const UNSUPPORTED_VERSION: i16 = Kafka::UnsupportedVersion.code();
}

/// The member epoch a member sends to leave the group.
pub const LEAVE_EPOCH: i32 = -1;
/// The member epoch a static member sends to leave for now: its partitions wait for an
/// instance with its id until its session ends.
pub const LEAVE_STATIC_EPOCH: i32 = -2;

/// The coordinator's settings (Kafka's `group.consumer.*`).
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub heartbeat_interval: Duration,
    pub session_timeout: Duration,
    pub max_size: usize,
}

/// Topics as the coordinator sees them when a heartbeat arrives.
pub trait Topics {
    /// A topic's id and partition count.
    fn get(&self, name: &str) -> Option<(Uuid, u32)>;
    /// The names of the user topics `re` matches in full.
    fn matching(&self, re: &regex::Regex) -> Vec<String>;
    /// Moves whenever the topics may have changed (the view's applied index): the
    /// subscriptions are resolved again only then, or when they change.
    fn version(&self) -> u64;
}

/// One ConsumerGroupHeartbeat, its optional fields `None` when the member sent them as
/// unchanged.
#[derive(Clone, Debug, Default)]
pub struct Heartbeat {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout: Option<Duration>,
    pub subscribed_names: Option<Vec<String>>,
    /// `Some("")` clears a regex subscription.
    pub subscribed_regex: Option<String>,
    pub assignor: Option<String>,
    pub owned: Option<Assignment>,
    pub client_id: String,
    pub client_host: String,
}

/// What a heartbeat answers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    pub error: i16,
    pub message: Option<String>,
    pub member_id: String,
    pub member_epoch: i32,
    /// The member's partitions, when it should (re)learn them.
    pub assignment: Option<Assignment>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    Stable,
    /// Waits for the member to report that it gave up `pending_revocation`.
    UnrevokedPartitions,
    /// Waits for other members to release partitions of its target.
    UnreleasedPartitions,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Stable => "stable",
            MemberState::UnrevokedPartitions => "unrevoked_partitions",
            MemberState::UnreleasedPartitions => "unreleased_partitions",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_names: Vec<String>,
    pub subscribed_regex: Option<String>,
    /// `subscribed_regex`, compiled once.
    matcher: Option<regex::Regex>,
    pub assignor: Option<String>,
    pub rebalance_timeout: Duration,
    pub epoch: i32,
    pub previous_epoch: i32,
    pub state: MemberState,
    pub assigned: Assignment,
    pub pending_revocation: Assignment,
    last_seen: Instant,
    /// Until when the member may take to revoke (its rebalance timeout).
    revoke_by: Option<Instant>,
}

/// One KIP-848 group.
pub struct ConsumerGroup {
    pub id: String,
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, Member>,
    /// The target assignment of `assignment_epoch`, by member.
    pub target: BTreeMap<String, Assignment>,
    /// Static members: instance id → member id.
    statics: BTreeMap<String, String>,
    /// The subscribed topics as they were when the group epoch last moved: a topic that
    /// appears, goes or grows moves it again.
    resolved: BTreeMap<String, (Uuid, u32)>,
    /// The topics' version `resolved` was made at; `None` after the subscriptions changed.
    resolved_at: Option<u64>,
}

fn new_member_id() -> String {
    Uuid::from_u128(rand::random()).to_string()
}

fn error(error: i16, member_id: &str, message: impl Into<String>) -> Answer {
    Answer {
        error,
        message: Some(message.into()),
        member_id: member_id.to_string(),
        member_epoch: -1,
        assignment: None,
    }
}

fn is_subset(a: &Assignment, b: &Assignment) -> bool {
    a.iter()
        .all(|(t, ps)| ps.is_empty() || b.get(t).is_some_and(|other| ps.is_subset(other)))
}

impl ConsumerGroup {
    pub fn new(id: &str) -> Self {
        Self {
            id: id.to_string(),
            epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            statics: BTreeMap::new(),
            resolved: BTreeMap::new(),
            resolved_at: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The state name ListGroups and ConsumerGroupDescribe report.
    pub fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.assignment_epoch != self.epoch {
            "Assigning"
        } else if self
            .members
            .values()
            .any(|m| m.epoch != self.assignment_epoch || m.state != MemberState::Stable)
        {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    pub fn heartbeat(&mut self, hb: Heartbeat, topics: &dyn Topics, settings: Settings, now: Instant) -> Answer {
        if hb.member_epoch == LEAVE_EPOCH || hb.member_epoch == LEAVE_STATIC_EPOCH {
            return self.leave(&hb);
        }
        if let Some(a) = hb.assignor.as_deref().filter(|a| !assignor::is_known(a)) {
            return error(
                code::UNSUPPORTED_ASSIGNOR,
                &hb.member_id,
                format!("assignor '{a}' is not one of {:?}", assignor::ASSIGNORS),
            );
        }
        if let Some(re) = hb.subscribed_regex.as_deref().filter(|r| !r.is_empty()) {
            if let Err(e) = compile(re) {
                return error(code::INVALID_REGULAR_EXPRESSION, &hb.member_id, e);
            }
        }
        let mut bump = false;
        let member_id = if hb.member_epoch == 0 {
            match self.join(&hb, settings) {
                Ok((id, new)) => {
                    bump |= new;
                    id
                }
                Err(answer) => return answer,
            }
        } else {
            // A static member is known by its instance first, as Kafka checks: a process
            // whose instance another member took over is fenced.
            if let Some(i) = &hb.instance_id {
                match self.statics.get(i) {
                    None => {
                        return error(
                            code::UNKNOWN_MEMBER_ID,
                            &hb.member_id,
                            format!("Instance id {i} is unknown."),
                        )
                    }
                    Some(holder) if *holder != hb.member_id => {
                        return error(
                            code::FENCED_INSTANCE_ID,
                            &hb.member_id,
                            "another member holds this group.instance.id",
                        )
                    }
                    Some(_) => {}
                }
            }
            let Some(m) = self.members.get(&hb.member_id) else {
                return error(
                    code::UNKNOWN_MEMBER_ID,
                    &hb.member_id,
                    "the member is not in the group (it left, was removed, or the coordinator moved); join again with epoch 0",
                );
            };
            if let Some(e) = epoch_error(m, hb.member_epoch, hb.owned.as_ref()) {
                return e;
            }
            hb.member_id.clone()
        };
        let m = self.members.get_mut(&member_id).expect("joined or known");
        m.last_seen = now;
        bump |= m.update(&hb);
        // The subscribed topics now: one appearing, going or growing moves the epoch.
        if bump || self.resolved_at != Some(topics.version()) {
            let resolved = self.resolve(topics);
            self.resolved_at = Some(topics.version());
            if resolved != self.resolved {
                self.resolved = resolved;
                bump = true;
            }
        }
        if bump {
            self.epoch += 1;
        }
        if self.assignment_epoch != self.epoch {
            self.compute_target();
        }
        let before = self.members[&member_id].assigned.clone();
        self.reconcile(&member_id, hb.owned.as_ref(), now);
        let m = &self.members[&member_id];
        let full = hb.member_epoch == 0
            || (hb.rebalance_timeout.is_some()
                && (hb.subscribed_names.is_some() || hb.subscribed_regex.is_some())
                && hb.owned.is_some());
        Answer {
            error: code::NONE,
            message: None,
            member_id: member_id.clone(),
            member_epoch: m.epoch,
            assignment: (full || m.assigned != before).then(|| m.assigned.clone()),
        }
    }

    /// A join (epoch 0): a new member, a static member taking over its instance's place,
    /// or a member that lost its partitions starting over. The id, and whether the
    /// membership changed.
    fn join(&mut self, hb: &Heartbeat, settings: Settings) -> Result<(String, bool), Answer> {
        let id = if hb.member_id.is_empty() {
            new_member_id()
        } else {
            hb.member_id.clone()
        };
        if hb.subscribed_names.is_none() && hb.subscribed_regex.is_none() {
            return Err(error(
                code::INVALID_REQUEST,
                &id,
                "SubscribedTopicNames or SubscribedTopicRegex must be set when joining",
            ));
        }
        if let Some(instance) = &hb.instance_id {
            if let Some(holder) = self.statics.get(instance).cloned().filter(|h| *h != id) {
                let old = &self.members[&holder];
                if old.epoch != LEAVE_STATIC_EPOCH {
                    return Err(error(
                        code::UNRELEASED_INSTANCE_ID,
                        &id,
                        format!("group.instance.id '{instance}' is still held by member {holder}"),
                    ));
                }
                // The instance restarted: the new member takes its place, its partitions
                // and its epoch, with no rebalance.
                let mut m = self.members.remove(&holder).expect("a static holder is a member");
                m.id = id.clone();
                if let Some(t) = self.target.remove(&holder) {
                    self.target.insert(id.clone(), t);
                }
                m.epoch = 0;
                self.statics.insert(instance.clone(), id.clone());
                self.members.insert(id.clone(), m);
                return Ok((id, false));
            }
        }
        if let Some(m) = self.members.get_mut(&id) {
            // A member that was fenced joins again under its id: it gave up every
            // partition, so they are free for its target (or others) at once.
            m.assigned.clear();
            m.pending_revocation.clear();
            m.state = MemberState::Stable;
            m.previous_epoch = m.epoch;
            m.epoch = 0;
            m.revoke_by = None;
            return Ok((id, false));
        }
        if self.members.len() >= settings.max_size {
            crate::metrics::metrics().group_members_refused.inc();
            return Err(error(
                code::GROUP_MAX_SIZE_REACHED,
                &id,
                format!("the group holds its most members ({})", settings.max_size),
            ));
        }
        if let Some(instance) = &hb.instance_id {
            self.statics.insert(instance.clone(), id.clone());
        }
        self.members.insert(
            id.clone(),
            Member {
                id: id.clone(),
                instance_id: hb.instance_id.clone(),
                rack_id: None,
                client_id: hb.client_id.clone(),
                client_host: hb.client_host.clone(),
                subscribed_names: vec![],
                subscribed_regex: None,
                matcher: None,
                assignor: None,
                rebalance_timeout: Duration::from_secs(300),
                epoch: 0,
                previous_epoch: -1,
                state: MemberState::Stable,
                assigned: Assignment::new(),
                pending_revocation: Assignment::new(),
                last_seen: Instant::now(),
                revoke_by: None,
            },
        );
        Ok((id, true))
    }

    /// Epoch −1 leaves; a static member's −2 leaves for now, keeping its partitions for
    /// its instance until its session ends. The epoch is not checked (Kafka's rule).
    fn leave(&mut self, hb: &Heartbeat) -> Answer {
        let member_id = match &hb.instance_id {
            Some(instance) => match self.statics.get(instance) {
                Some(holder) if *holder == hb.member_id => holder.clone(),
                Some(_) => {
                    return error(
                        code::FENCED_INSTANCE_ID,
                        &hb.member_id,
                        "another member holds this group.instance.id",
                    )
                }
                None => {
                    return error(
                        code::UNKNOWN_MEMBER_ID,
                        &hb.member_id,
                        format!("Instance id {instance} is unknown."),
                    )
                }
            },
            None => hb.member_id.clone(),
        };
        let Some(m) = self.members.get_mut(&member_id) else {
            return error(code::UNKNOWN_MEMBER_ID, &hb.member_id, "the member is not in the group");
        };
        if hb.member_epoch == LEAVE_STATIC_EPOCH {
            if m.epoch != LEAVE_STATIC_EPOCH {
                m.previous_epoch = m.epoch;
                m.epoch = LEAVE_STATIC_EPOCH;
            }
            m.pending_revocation.clear();
            m.state = MemberState::Stable;
            m.revoke_by = None;
            tracing::info!(group = %self.id, member = %member_id, "static member left for now; its partitions wait for its instance");
        } else {
            self.remove(&member_id);
            tracing::info!(group = %self.id, member = %member_id, epoch = self.epoch, "member left the consumer group");
        }
        Answer {
            error: code::NONE,
            message: None,
            member_id,
            member_epoch: hb.member_epoch,
            assignment: None,
        }
    }

    /// Removes a member: its partitions are free at once, and the group epoch moves.
    fn remove(&mut self, member_id: &str) {
        if let Some(m) = self.members.remove(member_id) {
            if let Some(i) = m.instance_id {
                if self.statics.get(&i).map(String::as_str) == Some(member_id) {
                    self.statics.remove(&i);
                }
            }
            self.target.remove(member_id);
            self.resolved_at = None;
            self.epoch += 1;
        }
    }

    /// Removes members whose session ran out, and members that did not revoke within
    /// their rebalance timeout.
    pub fn tick(&mut self, session_timeout: Duration, now: Instant) {
        let gone: Vec<(String, &'static str)> = self
            .members
            .values()
            .filter_map(|m| {
                if now.saturating_duration_since(m.last_seen) > session_timeout {
                    Some((m.id.clone(), "its session timed out"))
                } else if m.revoke_by.is_some_and(|by| now > by) {
                    Some((
                        m.id.clone(),
                        "it did not revoke partitions within its rebalance timeout",
                    ))
                } else {
                    None
                }
            })
            .collect();
        for (id, why) in gone {
            self.remove(&id);
            tracing::info!(group = %self.id, member = %id, epoch = self.epoch, "removed a consumer group member: {why}");
        }
    }

    /// Checks an OffsetCommit's (v9+) or OffsetFetch's member and epoch, as Kafka's
    /// consumer groups do: an unknown member is UNKNOWN_MEMBER_ID, another epoch
    /// STALE_MEMBER_EPOCH. Epoch −1 without a member id commits to an empty group only.
    pub fn check_member(&self, member_id: &str, epoch: i32, commit_version: Option<i16>) -> i16 {
        if epoch < 0 && member_id.is_empty() {
            return if commit_version.is_none() || self.members.is_empty() {
                code::NONE
            } else {
                code::UNKNOWN_MEMBER_ID
            };
        }
        let Some(m) = self.members.get(member_id) else {
            return code::UNKNOWN_MEMBER_ID;
        };
        if commit_version.is_some_and(|v| v < 9) {
            return code::UNSUPPORTED_VERSION;
        }
        if epoch != m.epoch {
            return code::STALE_MEMBER_EPOCH;
        }
        code::NONE
    }
}

/// A heartbeat's epoch against the member's: a newer one is fenced, and an older one is
/// taken only when it is the previous epoch and the member owns no more than it is
/// assigned (the answer that moved it on was lost).
fn epoch_error(m: &Member, epoch: i32, owned: Option<&Assignment>) -> Option<Answer> {
    let lost_answer = epoch == m.previous_epoch && owned.is_some_and(|o| is_subset(o, &m.assigned));
    if epoch == m.epoch || (epoch < m.epoch && lost_answer) {
        return None;
    }
    Some(error(
        code::FENCED_MEMBER_EPOCH,
        &m.id,
        format!(
            "member epoch {epoch} is not the coordinator's {}; the member must give up its partitions and join again",
            m.epoch
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Catalog(BTreeMap<String, (Uuid, u32)>);

    impl Topics for Catalog {
        fn get(&self, name: &str) -> Option<(Uuid, u32)> {
            self.0.get(name).copied()
        }
        fn matching(&self, re: &regex::Regex) -> Vec<String> {
            self.0.keys().filter(|n| re.is_match(n)).cloned().collect()
        }
        fn version(&self) -> u64 {
            self.0.values().map(|(_, n)| u64::from(*n)).sum::<u64>() + self.0.len() as u64
        }
    }

    const SETTINGS: Settings = Settings {
        heartbeat_interval: Duration::from_secs(5),
        session_timeout: Duration::from_secs(45),
        max_size: 10,
    };

    fn topic() -> Uuid {
        Uuid::from_bytes([7; 16])
    }

    fn catalog() -> Catalog {
        Catalog(BTreeMap::from([("t".to_string(), (topic(), 4))]))
    }

    fn join(id: &str) -> Heartbeat {
        Heartbeat {
            member_id: id.into(),
            member_epoch: 0,
            rebalance_timeout: Some(Duration::from_secs(30)),
            subscribed_names: Some(vec!["t".into()]),
            owned: Some(Assignment::new()),
            ..Default::default()
        }
    }

    /// A plain heartbeat at `epoch` reporting `owned` partitions of the topic.
    fn beat(id: &str, epoch: i32, owned: &[i32]) -> Heartbeat {
        Heartbeat {
            member_id: id.into(),
            member_epoch: epoch,
            owned: Some(parts(owned)),
            ..Default::default()
        }
    }

    fn parts(ps: &[i32]) -> Assignment {
        if ps.is_empty() {
            return Assignment::new();
        }
        Assignment::from([(topic(), ps.iter().copied().collect())])
    }

    fn got(a: &Answer) -> Vec<i32> {
        let assigned = a.assignment.as_ref().expect("an assignment");
        assigned
            .get(&topic())
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// A group where `a` holds all four partitions at epoch 1.
    fn one_member(t: Instant) -> ConsumerGroup {
        let mut g = ConsumerGroup::new("g");
        let a = g.heartbeat(join("a"), &catalog(), SETTINGS, t);
        assert_eq!((a.error, a.member_epoch), (code::NONE, 1));
        assert_eq!(got(&a), vec![0, 1, 2, 3]);
        g
    }

    // Issue 22 (KIP-848): a second member joins; the first revokes before the second
    // gets anything, and both end stable at the new epoch with two partitions each.
    #[test]
    fn a_joining_member_gets_partitions_only_after_the_holder_revokes_them() {
        let t = Instant::now();
        let mut g = one_member(t);
        let b = g.heartbeat(join("b"), &catalog(), SETTINGS, t);
        assert_eq!(b.member_epoch, 2, "b takes the new epoch at once");
        assert!(got(&b).is_empty(), "its partitions are still a's");
        assert_eq!(g.members["b"].state, MemberState::UnreleasedPartitions);
        assert_eq!(g.state_name(), "Reconciling");

        let a = g.heartbeat(beat("a", 1, &[0, 1, 2, 3]), &catalog(), SETTINGS, t);
        assert_eq!(a.member_epoch, 1, "a keeps its epoch until it revokes");
        let kept = got(&a);
        assert_eq!(kept.len(), 2);
        assert_eq!(g.members["a"].state, MemberState::UnrevokedPartitions);
        // Still reporting the revoked partitions: nothing moves.
        let again = g.heartbeat(beat("a", 1, &[0, 1, 2, 3]), &catalog(), SETTINGS, t);
        assert_eq!((again.member_epoch, again.assignment), (1, None));
        let b = g.heartbeat(beat("b", 2, &[]), &catalog(), SETTINGS, t);
        assert_eq!(b.assignment, None, "nothing released yet");

        let a = g.heartbeat(beat("a", 1, &kept), &catalog(), SETTINGS, t);
        assert_eq!(a.member_epoch, 2, "revoked: a moves to the new epoch");
        let b = g.heartbeat(beat("b", 2, &[]), &catalog(), SETTINGS, t);
        let b_parts = got(&b);
        assert_eq!(b_parts.len(), 2);
        assert!(b_parts.iter().all(|p| !kept.contains(p)));
        assert_eq!(g.state_name(), "Stable");
    }

    // Issue 22 (KIP-848): a member that leaves frees its partitions at once; the others
    // take them at their next heartbeat, and the departed id is unknown afterwards.
    #[test]
    fn a_leaving_member_frees_its_partitions_for_the_rest() {
        let t = Instant::now();
        let mut g = one_member(t);
        g.heartbeat(join("b"), &catalog(), SETTINGS, t);
        let a = g.heartbeat(beat("a", 1, &[0, 1, 2, 3]), &catalog(), SETTINGS, t);
        let kept = got(&a);
        g.heartbeat(beat("a", 1, &kept), &catalog(), SETTINGS, t);
        let b = g.heartbeat(beat("b", 2, &[]), &catalog(), SETTINGS, t);
        let b_parts = got(&b);
        let left = g.heartbeat(beat("b", LEAVE_EPOCH, &[]), &catalog(), SETTINGS, t);
        assert_eq!((left.error, left.member_epoch), (code::NONE, LEAVE_EPOCH));
        let a = g.heartbeat(beat("a", 2, &kept), &catalog(), SETTINGS, t);
        assert_eq!(a.member_epoch, 3, "b's leave bumped the epoch");
        assert_eq!(got(&a), vec![0, 1, 2, 3]);
        assert!(b_parts.iter().all(|p| got(&a).contains(p)));
        let gone = g.heartbeat(beat("b", 2, &b_parts), &catalog(), SETTINGS, t);
        assert_eq!(gone.error, code::UNKNOWN_MEMBER_ID);
    }

    // Issue 22 (KIP-848): epochs fence zombies; the previous epoch is taken when only
    // the answer that moved the member on was lost; a fenced member rejoins with 0.
    #[test]
    fn member_epochs_fence_stale_heartbeats_and_forgive_a_lost_answer() {
        let t = Instant::now();
        let mut g = one_member(t);
        g.heartbeat(join("b"), &catalog(), SETTINGS, t);
        let a = g.heartbeat(beat("a", 1, &[0, 1, 2, 3]), &catalog(), SETTINGS, t);
        let kept = got(&a);
        let moved = g.heartbeat(beat("a", 1, &kept), &catalog(), SETTINGS, t);
        assert_eq!(moved.member_epoch, 2);
        // That answer was lost: a sends epoch 1 again with what it owns.
        let retry = g.heartbeat(beat("a", 1, &kept), &catalog(), SETTINGS, t);
        assert_eq!((retry.error, retry.member_epoch), (code::NONE, 2));
        // A newer epoch, or an old one owning more than assigned, is fenced.
        assert_eq!(
            g.heartbeat(beat("a", 3, &kept), &catalog(), SETTINGS, t).error,
            code::FENCED_MEMBER_EPOCH
        );
        assert_eq!(
            g.heartbeat(beat("a", 1, &[0, 1, 2, 3]), &catalog(), SETTINGS, t).error,
            code::FENCED_MEMBER_EPOCH
        );
        assert_eq!(
            g.heartbeat(beat("nobody", 2, &[]), &catalog(), SETTINGS, t).error,
            code::UNKNOWN_MEMBER_ID
        );
        // Fenced, a gives up its partitions and joins again under its id.
        let back = g.heartbeat(join("a"), &catalog(), SETTINGS, t);
        assert_eq!((back.error, back.member_epoch), (code::NONE, 2));
        assert_eq!(got(&back), kept, "its target partitions are free again at once");
    }

    // Issue 22 (KIP-848 with KIP-345): a static member that leaves with -2 keeps its
    // partitions for its instance; the restarted instance takes them back under a new
    // member id without a new group epoch, while a live instance id is refused.
    #[test]
    fn a_restarted_static_member_takes_its_partitions_back() {
        let t = Instant::now();
        let mut g = ConsumerGroup::new("g");
        let statik = |id: &str| Heartbeat {
            instance_id: Some("i-1".into()),
            ..join(id)
        };
        let a = g.heartbeat(statik("a"), &catalog(), SETTINGS, t);
        assert_eq!(got(&a), vec![0, 1, 2, 3]);
        let dup = g.heartbeat(statik("a2"), &catalog(), SETTINGS, t);
        assert_eq!(dup.error, code::UNRELEASED_INSTANCE_ID);
        let left = Heartbeat {
            instance_id: Some("i-1".into()),
            ..beat("a", LEAVE_STATIC_EPOCH, &[])
        };
        assert_eq!(
            g.heartbeat(left, &catalog(), SETTINGS, t).member_epoch,
            LEAVE_STATIC_EPOCH
        );
        let epoch = g.epoch;
        let b = g.heartbeat(join("b"), &catalog(), SETTINGS, t);
        assert!(got(&b).is_empty(), "the absent static member's partitions wait for it");
        let a2 = g.heartbeat(statik("a2"), &catalog(), SETTINGS, t);
        assert_eq!(a2.error, code::NONE);
        assert!(!got(&a2).is_empty());
        assert!(g.epoch == epoch + 1, "only b's join moved the group epoch");
        assert!(!g.members.contains_key("a"));
        let old = Heartbeat {
            instance_id: Some("i-1".into()),
            ..beat("a", 1, &[])
        };
        assert_eq!(
            g.heartbeat(old, &catalog(), SETTINGS, t).error,
            code::FENCED_INSTANCE_ID,
            "the replaced process is fenced"
        );
    }

    // Issue 22 (KIP-848): a member whose session runs out is removed, and one that does
    // not revoke within its rebalance timeout is too.
    #[test]
    fn sessions_and_rebalance_timeouts_remove_members() {
        let t = Instant::now();
        let mut g = one_member(t);
        g.heartbeat(join("b"), &catalog(), SETTINGS, t);
        g.heartbeat(beat("a", 1, &[0, 1, 2, 3]), &catalog(), SETTINGS, t);
        assert_eq!(g.members["a"].state, MemberState::UnrevokedPartitions);
        // b keeps heartbeating; a neither revokes nor goes silent past its session.
        let later = t + Duration::from_secs(31);
        g.heartbeat(beat("b", 2, &[]), &catalog(), SETTINGS, later);
        g.heartbeat(beat("a", 1, &[0, 1, 2, 3]), &catalog(), SETTINGS, later);
        g.tick(SETTINGS.session_timeout, later);
        assert!(!g.members.contains_key("a"), "a did not revoke within 30 s");
        let b = g.heartbeat(beat("b", 2, &[]), &catalog(), SETTINGS, later);
        assert_eq!(got(&b), vec![0, 1, 2, 3]);
        g.tick(SETTINGS.session_timeout, later + Duration::from_secs(46));
        assert!(g.is_empty(), "b's session ran out");
    }

    // Issue 22 (KIP-848): commits and offset fetches name the member and its epoch.
    #[test]
    fn offset_commits_check_the_member_epoch() {
        let t = Instant::now();
        let g = one_member(t);
        assert_eq!(g.check_member("a", 1, Some(9)), code::NONE);
        assert_eq!(g.check_member("a", 0, Some(9)), code::STALE_MEMBER_EPOCH);
        assert_eq!(g.check_member("a", 1, Some(8)), code::UNSUPPORTED_VERSION);
        assert_eq!(g.check_member("x", 1, Some(9)), code::UNKNOWN_MEMBER_ID);
        assert_eq!(
            g.check_member("", -1, Some(9)),
            code::UNKNOWN_MEMBER_ID,
            "no simple commit to a group with members"
        );
        assert_eq!(g.check_member("", -1, None), code::NONE, "an admin's offset fetch");
        assert_eq!(ConsumerGroup::new("e").check_member("", -1, Some(9)), code::NONE);
    }

    // Issue 22 (KIP-848): a topic that appears (by name or regex) or grows moves the
    // group epoch and is assigned; bad assignors and regexes are refused.
    #[test]
    fn new_topics_are_assigned_and_bad_subscriptions_refused() {
        let t = Instant::now();
        let mut g = ConsumerGroup::new("g");
        let later = Uuid::from_bytes([9; 16]);
        let hb = Heartbeat {
            subscribed_names: Some(vec!["later".into()]),
            subscribed_regex: Some("t.*".into()),
            ..join("a")
        };
        let a = g.heartbeat(hb, &catalog(), SETTINGS, t);
        assert_eq!(got(&a), vec![0, 1, 2, 3], "the regex matched t");
        let mut grown = catalog();
        grown.0.insert("later".into(), (later, 2));
        grown.0.insert("t".into(), (topic(), 6));
        let a = g.heartbeat(beat("a", 1, &[0, 1, 2, 3]), &grown, SETTINGS, t);
        assert_eq!(a.member_epoch, 2);
        let assigned = a.assignment.expect("changed");
        assert_eq!(assigned[&topic()].len(), 6);
        assert_eq!(assigned[&later].len(), 2);
        let bad = Heartbeat {
            assignor: Some("sticky".into()),
            ..join("b")
        };
        assert_eq!(g.heartbeat(bad, &grown, SETTINGS, t).error, code::UNSUPPORTED_ASSIGNOR);
        let bad = Heartbeat {
            subscribed_regex: Some("(".into()),
            ..join("b")
        };
        assert_eq!(
            g.heartbeat(bad, &grown, SETTINGS, t).error,
            code::INVALID_REGULAR_EXPRESSION
        );
    }
}
