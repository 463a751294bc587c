//! The failover loop's decisions as pure functions of the state and the holder's own
//! observations, so they can be checked without a cluster.
//!
//! The clock is the holder's heartbeat count as applied in the log (FO-LIV-4): a node
//! is dead once the holder has heartbeated `ceil(timeout / interval)` times since it
//! last saw that node's count change. What the holder did not see (its own pause, a cut
//! link, an outage) adds no holder heartbeats, so it never counts (FO-LIV-7 to -9, INV-10).

use crate::model::rows::{NodeKind, NodeRow, TakeoverState};
use crate::model::{Command, State, StreamAt, MAX_BATCH};
use std::collections::{BTreeMap, HashMap};
use weir_shared::ids::{Incarnation, NodeId, StreamId};

/// The name of the lease that decides which metad runs the failover loop.
pub const FAILOVER_LEASE: &str = "failover";

/// What the holder saw of each incarnation: its heartbeat count, and the holder's own
/// count when that was first seen.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    seen: HashMap<Incarnation, (u64, u64)>,
    /// The holder's count when it first saw each fenced incarnation fenced: the row is
    /// reaped a retention later.
    fenced_since: HashMap<Incarnation, u64>,
}

impl Clock {
    /// Forgets everything: a new holder starts judging from scratch (FO-LIV-12).
    pub fn reset(&mut self) {
        self.seen.clear();
        self.fenced_since.clear();
    }

    /// Records `row` at holder count `mine`; returns the heartbeat count to fence it at
    /// when it has been silent for `threshold` holder heartbeats.
    pub fn observe(&mut self, row: &NodeRow, mine: u64, threshold: u64) -> Option<u64> {
        let entry = self.seen.entry(row.incarnation()).or_insert((row.heartbeats, mine));
        if entry.0 != row.heartbeats {
            *entry = (row.heartbeats, mine);
            return None;
        }
        (mine.saturating_sub(entry.1) >= threshold).then_some(row.heartbeats)
    }

    /// Drops incarnations that are gone or fenced.
    pub fn retain_live(&mut self, state: &State) {
        self.seen.retain(|inc, _| {
            state
                .nodes
                .get(&inc.node)
                .is_some_and(|r| r.epoch == inc.epoch && !r.fenced)
        });
    }
}

/// The live current incarnation of `node`, if any.
fn live(state: &State, inc: &Incarnation) -> bool {
    state
        .nodes
        .get(&inc.node)
        .is_some_and(|r| r.epoch == inc.epoch && r.is_live())
}

/// What the failover-lease holder `me` proposes on one tick: nothing at all unless it is
/// live itself (FO-LIV-11: a fenced holder runs no failover; its proposals would only be
/// refused), else the fences of silent nodes and the rows to reap when `judge` (once a
/// second, FO-LIV-3), and the next takeover steps. A row fenced for `reap_after` holder
/// heartbeats that nothing refers to any more is reaped.
pub fn holder_commands(
    state: &State,
    me: &Incarnation,
    clock: &mut Clock,
    judge: bool,
    reap_after: u64,
) -> Vec<Command> {
    if !live(state, me) {
        return Vec::new();
    }
    let mut commands = if judge {
        let mut judged = dead_nodes(state, me, clock);
        judged.extend(rows_to_reap(state, me, clock, reap_after));
        judged
    } else {
        Vec::new()
    };
    commands.extend(takeover_steps(state));
    commands
}

/// `ReapNode` for each fenced streamd or gatewayd row the holder has seen fenced for
/// `reap_after` of its own heartbeats, that holds no stream and has no takeover under way.
pub fn rows_to_reap(state: &State, me: &Incarnation, clock: &mut Clock, reap_after: u64) -> Vec<Command> {
    let Some(mine) = state
        .nodes
        .get(&me.node)
        .filter(|r| r.epoch == me.epoch && r.is_live())
        .map(|r| r.heartbeats)
    else {
        return Vec::new();
    };
    clock.fenced_since.retain(|inc, _| {
        state
            .nodes
            .get(&inc.node)
            .is_some_and(|r| r.epoch == inc.epoch && r.fenced)
    });
    let holding: std::collections::HashSet<&NodeId> =
        state.streams.owners().filter_map(|(o, _)| o.map(|o| &o.node)).collect();
    let mut out = Vec::new();
    for row in state.nodes.values().filter(|r| r.fenced && r.kind != NodeKind::Metad) {
        let since = *clock.fenced_since.entry(row.incarnation()).or_insert(mine);
        let busy = holding.contains(&row.id)
            || state
                .takeovers
                .values()
                .any(|t| t.dead.node == row.id && t.state == TakeoverState::Pending);
        if mine.saturating_sub(since) >= reap_after && !busy {
            out.push(Command::ReapNode {
                node: row.id.clone(),
                epoch: row.epoch,
            });
        }
    }
    out
}

/// FenceNode commands for every live node (other than `me`) silent for the threshold.
pub fn dead_nodes(state: &State, me: &Incarnation, clock: &mut Clock) -> Vec<Command> {
    let Some(settings) = state.settings else {
        return Vec::new();
    };
    let Some(my_row) = state.nodes.get(&me.node).filter(|r| r.epoch == me.epoch && r.is_live()) else {
        return Vec::new();
    };
    let mine = my_row.heartbeats;
    let threshold = settings.missed_heartbeats_threshold();
    clock.retain_live(state);
    state
        .nodes
        .values()
        .filter(|r| r.id != me.node && r.is_live())
        .filter_map(|r| {
            clock
                .observe(r, mine, threshold)
                .map(|seen_heartbeats| Command::FenceNode {
                    node: r.id.clone(),
                    epoch: r.epoch,
                    seen_heartbeats,
                })
        })
        .collect()
}

/// The streamd to recover a dead incarnation's WAL: its own newer incarnation when it
/// is back (FO-TKO-3), else the live streamd owning the fewest streams.
pub fn choose_agent(state: &State, dead: &Incarnation) -> Option<NodeId> {
    let streamd = |r: &&NodeRow| r.kind == NodeKind::Streamd && r.is_live();
    if let Some(own) = state.nodes.get(&dead.node).filter(streamd) {
        if own.epoch > dead.epoch {
            return Some(own.id.clone());
        }
    }
    let load = state.streams.load_by_node();
    state
        .nodes
        .values()
        .filter(streamd)
        .min_by_key(|r| (!r.is_schedulable(), load.get(&r.id).copied().unwrap_or(0), r.id.clone()))
        .map(|r| r.id.clone())
}

/// The takeover steps to take now (FO-TKO-1 to FO-TKO-10), each one idempotent:
/// destroy deleted streams no live node holds;
/// record a takeover (or a new agent for one whose agent died) for every dead
/// incarnation that still owns open streams, and close the open streams of every
/// incarnation whose takeover has recovered its WAL, so placement moves them.
pub fn takeover_steps(state: &State) -> Vec<Command> {
    // Only owners that are not live are visited: as many as dead incarnations still
    // holding streams, and of each only the streams the steps act on.
    let mut open_by_dead: BTreeMap<Incarnation, Vec<(StreamId, weir_shared::ids::StreamEpoch)>> = BTreeMap::new();
    let mut out = Vec::new();
    for (owner, owned) in state.streams.owners() {
        if owner.is_some_and(|o| live(state, o)) {
            continue;
        }
        // FO-TKO: a deleted stream without a live owner is destroyed; its data needs no recovery.
        out.extend(owned.deleted.iter().map(|&stream| Command::DestroyStream { stream }));
        if let (Some(owner), false) = (owner, owned.open.is_empty()) {
            let streams = owned
                .open
                .iter()
                .filter_map(|id| state.streams.get(id).map(|s| (s.id, s.epoch)))
                .collect();
            open_by_dead.insert(owner.clone(), streams);
        }
    }
    for (dead, streams) in open_by_dead {
        match state.takeovers.get(&(dead.node.clone(), dead.epoch)) {
            // Closed in batches: the streams of a recovered node move in a few entries.
            Some(t) if t.state != TakeoverState::Pending => {
                out.extend(streams.chunks(MAX_BATCH).map(|chunk| {
                    Command::CloseStreams {
                        streams: chunk
                            .iter()
                            .map(|&(stream, stream_epoch)| StreamAt { stream, stream_epoch })
                            .collect(),
                    }
                }));
            }
            Some(t) if t.agent.as_ref().is_some_and(|a| live(state, a)) => {}
            _ => {
                if let Some(agent) = choose_agent(state, &dead) {
                    out.push(Command::BeginTakeover {
                        node: dead.node.clone(),
                        epoch: dead.epoch,
                        agent,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::{ClusterSettings, StreamState, TakeoverRow};
    use crate::model::{Applied, NodeAddrs, Proposal, Proposer};
    use weir_shared::ids::Epoch;

    fn op() -> Proposer {
        Proposer::Operator { principal: "t".into() }
    }

    struct World {
        s: State,
        i: u64,
    }

    impl World {
        fn new(timeout: u64) -> Self {
            let mut w = World {
                s: State::default(),
                i: 0,
            };
            w.apply(
                op(),
                Command::InitCluster {
                    settings: ClusterSettings {
                        heartbeat_interval_sec: 5,
                        node_timeout_sec: timeout,
                    },
                },
            )
            .expect("init");
            w
        }

        fn apply(&mut self, proposer: Proposer, command: Command) -> crate::model::Outcome {
            self.i += 1;
            self.s
                .apply(
                    self.i,
                    &Proposal { proposer, command },
                    &crate::model::MemIndex::default(),
                )
                .outcome
        }

        fn register(&mut self, name: &str, kind: NodeKind) -> Incarnation {
            let r = self.apply(
                op(),
                Command::RegisterNode {
                    node: NodeId::new(name),
                    kind,
                    addrs: NodeAddrs::default(),
                    heartbeat_interval_sec: 5,
                    node_timeout_sec: self.s.settings.expect("init").node_timeout_sec,
                },
            );
            let Ok(Applied::Registered { epoch }) = r else {
                panic!("{r:?}")
            };
            Incarnation {
                node: NodeId::new(name),
                epoch,
            }
        }

        fn beat(&mut self, who: &Incarnation) {
            self.apply(Proposer::Node(who.clone()), Command::Heartbeat)
                .expect("heartbeat");
        }

        /// The operator fences `who`, as the holder does a silent node.
        fn fence(&mut self, who: &Incarnation) {
            let fence = Command::FenceNode {
                node: who.node.clone(),
                epoch: who.epoch,
                seen_heartbeats: 0,
            };
            self.apply(op(), fence).expect("fenced");
        }
    }

    /// FO-LIV-4, FO-LIV-5: dead after exactly ceil(timeout / interval) holder heartbeats.
    #[test]
    fn a_silent_node_is_dead_after_the_rounded_up_threshold() {
        for (timeout, threshold) in [(30, 6), (31, 7)] {
            let mut w = World::new(timeout);
            let holder = w.register("metad-1", NodeKind::Metad);
            let node = w.register("s1", NodeKind::Streamd);
            let mut clock = Clock::default();
            assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
            for beat in 1..=threshold {
                w.beat(&holder);
                let fences = dead_nodes(&w.s, &holder, &mut clock);
                if beat < threshold {
                    // FO-LIV-4, FO-LIV-5: no fence before ceil(timeout / interval) holder heartbeats.
                    assert!(fences.is_empty(), "timeout {timeout}: no fence after {beat}");
                } else {
                    // FO-LIV-4, FO-LIV-5: the fence at exactly the threshold: 6 for 30 s, 7 for 31 s.
                    assert_eq!(
                        fences,
                        vec![Command::FenceNode {
                            node: node.node.clone(),
                            epoch: node.epoch,
                            seen_heartbeats: 0
                        }]
                    );
                }
            }
        }
    }

    /// FO-LIV-6: a node that heartbeats is never judged dead.
    #[test]
    fn a_heartbeating_node_stays_alive() {
        let mut w = World::new(30);
        let holder = w.register("metad-1", NodeKind::Metad);
        let node = w.register("s1", NodeKind::Streamd);
        let mut clock = Clock::default();
        for _ in 0..50 {
            w.beat(&holder);
            w.beat(&holder);
            w.beat(&node);
            // FO-LIV-6: only a node that stops heartbeating is fenced: each of its heartbeats
            // restarts its count, so 100 holder heartbeats (16 thresholds) fence nothing.
            assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        }
    }

    /// FO-LIV-7, INV-10: holder heartbeats that never land stop the clock.
    #[test]
    fn no_holder_heartbeats_means_no_fence() {
        let mut w = World::new(30);
        let holder = w.register("metad-1", NodeKind::Metad);
        w.register("s1", NodeKind::Streamd);
        let mut clock = Clock::default();
        for _ in 0..100 {
            // FO-LIV-7, INV-10: a paused holder lands no heartbeats, so however many ticks it
            // runs, its clock stands still and it plans no fence.
            assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        }
    }

    /// FO-LIV-12: a replica that becomes the holder starts its clock afresh: heartbeats
    /// it counted before, while it was not judging, never count against a node. Only
    /// `threshold` of its own heartbeats after the takeover fence a silent node.
    #[test]
    fn a_new_holder_judges_only_what_it_saw_after_taking_over() {
        let mut w = World::new(30);
        let holder = w.register("metad-2", NodeKind::Metad);
        let node = w.register("s1", NodeKind::Streamd);
        let threshold = w.s.settings.expect("init").missed_heartbeats_threshold();
        let mut clock = Clock::default();
        // Seen once while contending, then beats it did not judge by (another held the lease).
        assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        for _ in 0..threshold {
            w.beat(&holder);
        }
        // It takes the lease (the failover loop resets the clock here).
        clock.reset();
        for beat in 1..=threshold {
            let fences = dead_nodes(&w.s, &holder, &mut clock);
            // FO-LIV-12: the threshold heartbeats it landed before taking over count for nothing.
            assert!(fences.is_empty(), "fenced after {beat} observed heartbeats: {fences:?}");
            w.beat(&holder);
        }
        // FO-LIV-12: the fence comes only with threshold heartbeats it saw as the holder.
        assert_eq!(
            dead_nodes(&w.s, &holder, &mut clock),
            vec![Command::FenceNode {
                node: node.node.clone(),
                epoch: node.epoch,
                seen_heartbeats: 0
            }],
            "threshold observed heartbeats after the takeover"
        );
    }

    /// FO-LIV-11, INV-8: a fenced holder judges nobody, though its own count says a
    /// silent node is past the threshold (the same holder unfenced would fence it).
    #[test]
    fn a_fenced_holder_does_nothing() {
        let mut w = World::new(30);
        let holder = w.register("metad-1", NodeKind::Metad);
        w.register("s1", NodeKind::Streamd);
        let mut clock = Clock::default();
        assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty(), "the clock starts");
        let threshold = w.s.settings.expect("init").missed_heartbeats_threshold();
        for _ in 0..threshold {
            w.beat(&holder);
        }
        let mut unfenced = clock.clone();
        assert_eq!(
            dead_nodes(&w.s, &holder, &mut unfenced).len(),
            1,
            "s1 is past the threshold"
        );
        w.apply(Proposer::Node(holder.clone()), Command::FenceSelf)
            .expect("fence");
        for _ in 0..10 {
            // FO-LIV-11, INV-8: fenced, the holder plans no FenceNode for the node past its threshold.
            assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        }
    }

    /// FO-LIV-11: a fenced holder proposes no takeover step either, though a stream is
    /// open on a dead node and a live holder would begin its takeover.
    #[test]
    fn a_fenced_holder_proposes_no_takeover() {
        let mut w = World::new(30);
        let holder = w.register("metad-1", NodeKind::Metad);
        let a = w.register("a", NodeKind::Streamd);
        w.register("b", NodeKind::Streamd);
        let Ok(Applied::StreamCreated { stream }) = w.apply(
            op(),
            Command::CreateStream {
                name: "s".into(),
                config: Default::default(),
            },
        ) else {
            panic!()
        };
        w.apply(
            op(),
            Command::PlaceStream {
                stream,
                node: a.node.clone(),
            },
        )
        .expect("place");
        w.apply(Proposer::Node(a.clone()), Command::open(stream)).expect("open");
        w.apply(Proposer::Node(a.clone()), Command::FenceSelf).expect("fence");
        let mut clock = Clock::default();
        let live = holder_commands(&w.s, &holder, &mut clock, true, u64::MAX);
        assert!(
            matches!(&live[..], [Command::BeginTakeover { .. }]),
            "a live holder begins the takeover: {live:?}"
        );
        w.apply(Proposer::Node(holder.clone()), Command::FenceSelf)
            .expect("fence the holder");
        // FO-LIV-11: fenced, the holder proposes no takeover step, leader or not.
        assert!(holder_commands(&w.s, &holder, &mut clock, true, u64::MAX).is_empty());
        assert!(holder_commands(&w.s, &holder, &mut clock, false, u64::MAX).is_empty());
    }

    /// FO-TKO-3: the recovery agent of a dead incarnation is its own node's newer
    /// incarnation when that is back (a row at the same epoch is not newer), else the
    /// live streamd with the fewest streams, schedulable ones first; never a gateway, a
    /// metad or a fenced streamd (issue 61: mutants of these decisions survived).
    #[test]
    fn the_agent_is_the_nodes_newer_incarnation_else_a_live_schedulable_streamd() {
        let mut w = World::new(30);
        w.register("a-gateway", NodeKind::Gatewayd);
        w.register("a-metad", NodeKind::Metad);
        let dead = w.register("dead", NodeKind::Streamd);
        let cordoned = w.register("b-cordoned", NodeKind::Streamd);
        let fenced = w.register("a-fenced", NodeKind::Streamd);
        let free = w.register("c-free", NodeKind::Streamd);
        w.fence(&fenced);
        w.apply(
            op(),
            Command::Cordon {
                node: cordoned.node.clone(),
                by: crate::model::rows::CordonBy::Operator,
            },
        )
        .expect("cordoned");
        // FO-TKO-3: the node's row at the same epoch is not a newer incarnation.
        assert_eq!(choose_agent(&w.s, &dead), Some(free.node.clone()), "not itself");
        w.fence(&dead);
        // FO-TKO-3: neither gateway, metad, fenced nor cordoned: the live schedulable streamd.
        assert_eq!(choose_agent(&w.s, &dead), Some(free.node.clone()));
        // Once the node is back as a newer incarnation, that incarnation recovers it.
        let back = w.register("dead", NodeKind::Streamd);
        assert!(back.epoch > dead.epoch);
        // FO-TKO-3: its own newer incarnation.
        assert_eq!(
            choose_agent(&w.s, &dead),
            Some(dead.node.clone()),
            "its own new incarnation"
        );
        // With the schedulable one gone, a cordoned streamd still recovers other WALs.
        w.fence(&free);
        w.fence(&back);
        assert_eq!(choose_agent(&w.s, &free), Some(cordoned.node.clone()));
    }

    /// The clock forgets incarnations that are fenced or replaced, so what it holds
    /// stays as large as the live nodes (issue 61: with the forgetting removed every
    /// decision was the same, so no test saw it).
    #[test]
    fn the_clock_forgets_fenced_and_replaced_incarnations() {
        let mut w = World::new(30);
        let holder = w.register("metad-1", NodeKind::Metad);
        let fenced = w.register("s1", NodeKind::Streamd);
        let replaced = w.register("s2", NodeKind::Streamd);
        let mut clock = Clock::default();
        assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        assert!(clock.seen.contains_key(&fenced) && clock.seen.contains_key(&replaced));
        w.fence(&fenced);
        let again = w.register("s2", NodeKind::Streamd);
        assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        assert!(!clock.seen.contains_key(&fenced), "a fenced incarnation is forgotten");
        assert!(
            !clock.seen.contains_key(&replaced),
            "a replaced incarnation is forgotten"
        );
        assert!(clock.seen.contains_key(&again));
    }

    /// Only fenced streamd and gateway rows are reaped: not a live row holding nothing,
    /// not a fenced metad's; and a fenced holder reaps nothing (issue 61: mutants of
    /// these conditions survived).
    #[test]
    fn only_fenced_data_rows_are_reaped_and_only_by_a_live_holder() {
        let mut w = World::new(30);
        let holder = w.register("metad-1", NodeKind::Metad);
        let peer = w.register("metad-2", NodeKind::Metad);
        w.register("idle", NodeKind::Streamd);
        let gone = w.register("gone", NodeKind::Streamd);
        w.fence(&peer);
        w.fence(&gone);
        let mut clock = Clock::default();
        for _ in 0..3 {
            rows_to_reap(&w.s, &holder, &mut clock, 3);
            w.beat(&holder);
        }
        let reap_gone = vec![Command::ReapNode {
            node: gone.node.clone(),
            epoch: gone.epoch,
        }];
        assert_eq!(rows_to_reap(&w.s, &holder, &mut clock, 3), reap_gone);
        w.apply(Proposer::Node(holder.clone()), Command::FenceSelf)
            .expect("fence the holder");
        assert!(
            rows_to_reap(&w.s, &holder, &mut clock, 3).is_empty(),
            "a fenced holder reaps nothing"
        );
    }

    /// A fenced row whose WAL takeover is still pending stays (its agent reads the
    /// row's epoch); another node's pending takeover, or its own finished one, does not
    /// hold it (issue 61: mutants of this condition survived).
    #[test]
    fn a_fenced_row_stays_while_its_own_takeover_is_pending() {
        let mut w = World::new(30);
        let holder = w.register("metad-1", NodeKind::Metad);
        let pending = w.register("pending", NodeKind::Streamd);
        let done = w.register("done", NodeKind::Streamd);
        for dead in [&pending, &done] {
            w.fence(dead);
        }
        let takeover = |dead: &Incarnation, state| TakeoverRow {
            dead: dead.clone(),
            agent: Some(holder.clone()),
            state,
        };
        w.s.takeovers.insert(
            (pending.node.clone(), pending.epoch),
            takeover(&pending, TakeoverState::Pending),
        );
        w.s.takeovers
            .insert((done.node.clone(), done.epoch), takeover(&done, TakeoverState::Done));
        let mut clock = Clock::default();
        for _ in 0..3 {
            rows_to_reap(&w.s, &holder, &mut clock, 3);
            w.beat(&holder);
        }
        assert_eq!(
            rows_to_reap(&w.s, &holder, &mut clock, 3),
            vec![Command::ReapNode {
                node: done.node.clone(),
                epoch: done.epoch,
            }],
            "only the row whose takeover finished is reaped"
        );
    }

    /// The reap clock forgets a fenced incarnation once its row moves on: after the
    /// node registers again and is fenced again, only the new incarnation is timed
    /// (issue 61: a mutant that kept the old entry survived).
    #[test]
    fn a_replaced_fenced_incarnation_leaves_the_reap_clock() {
        let mut w = World::new(30);
        let holder = w.register("metad-1", NodeKind::Metad);
        let first = w.register("x", NodeKind::Streamd);
        w.fence(&first);
        let mut clock = Clock::default();
        rows_to_reap(&w.s, &holder, &mut clock, 3);
        assert!(clock.fenced_since.contains_key(&first));
        let second = w.register("x", NodeKind::Streamd);
        assert_ne!(first, second);
        w.fence(&second);
        rows_to_reap(&w.s, &holder, &mut clock, 3);
        assert_eq!(clock.fenced_since.keys().collect::<Vec<_>>(), vec![&second]);
    }

    /// FO-LIV-10: a re-registered node's clock restarts.
    #[test]
    fn re_registration_restarts_the_clock() {
        let mut w = World::new(10);
        let holder = w.register("metad-1", NodeKind::Metad);
        w.register("s1", NodeKind::Streamd);
        let mut clock = Clock::default();
        dead_nodes(&w.s, &holder, &mut clock);
        w.beat(&holder);
        dead_nodes(&w.s, &holder, &mut clock);
        let again = w.register("s1", NodeKind::Streamd);
        w.beat(&holder);
        // FO-LIV-10: s1 is silent for the threshold (2 holder heartbeats), but one of them came
        // before its re-registration and does not count.
        assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        // Two holder heartbeats (10 s / 5 s) after it was first seen at its new epoch.
        w.beat(&holder);
        assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        w.beat(&holder);
        let fences = dead_nodes(&w.s, &holder, &mut clock);
        // FO-LIV-10: fenced a full timeout after the re-registration, at its new epoch.
        assert_eq!(fences.len(), 1);
        assert!(matches!(&fences[0], Command::FenceNode { epoch, .. } if *epoch == again.epoch));
    }

    /// FO-TKO-1 to FO-TKO-3: a dead owner's open streams get a takeover by its own new
    /// incarnation when back, else by the least loaded live streamd; once recovered,
    /// they are closed (FO-TKO-9).
    #[test]
    fn takeover_steps_follow_the_takeover_row() {
        let mut w = World::new(30);
        let a = w.register("a", NodeKind::Streamd);
        let b = w.register("b", NodeKind::Streamd);
        let Ok(Applied::StreamCreated { stream }) = w.apply(
            op(),
            Command::CreateStream {
                name: "s".into(),
                config: Default::default(),
            },
        ) else {
            panic!()
        };
        w.apply(
            op(),
            Command::PlaceStream {
                stream,
                node: a.node.clone(),
            },
        )
        .expect("place");
        w.apply(Proposer::Node(a.clone()), Command::open(stream)).expect("open");
        assert!(takeover_steps(&w.s).is_empty(), "a live owner needs nothing");

        w.apply(Proposer::Node(a.clone()), Command::FenceSelf).expect("fence");
        assert_eq!(
            takeover_steps(&w.s),
            vec![Command::BeginTakeover {
                node: a.node.clone(),
                epoch: a.epoch,
                agent: b.node.clone()
            }]
        );
        // The dead node is back at a new epoch: it recovers its own WAL.
        let a2 = w.register("a", NodeKind::Streamd);
        assert!(matches!(&takeover_steps(&w.s)[0], Command::BeginTakeover { agent, .. } if *agent == a2.node));
        w.apply(
            Proposer::Node(b.clone()),
            Command::BeginTakeover {
                node: a.node.clone(),
                epoch: a.epoch,
                agent: a2.node.clone(),
            },
        )
        .expect("begin");
        assert!(takeover_steps(&w.s).is_empty(), "a live agent is working on it");
        // A state with takeover rows survives the stored format (snapshots, watches).
        let back: State = crate::model::codec::decode(&crate::model::codec::encode(&w.s)).expect("round trip");
        assert_eq!(back.takeovers, w.s.takeovers);
        // The agent commits the 5 records `a` acknowledged (offsets 0 to 4) from its WAL.
        let recovered = crate::model::command::CommitRange {
            stream,
            stream_epoch: w.s.streams.get(&stream).expect("row").epoch,
            start: weir_shared::ids::Offset(0),
            end: weir_shared::ids::Offset(5),
            pos: 0,
            len: 100,
            crc: 0,
            max_timestamp: 1,
            txns: Default::default(),
        };
        let commit = Command::CommitObjects {
            key: weir_shared::ids::ObjectKey("recovered".into()),
            size: 100,
            ranges: vec![recovered],
        };
        w.apply(Proposer::Node(a2.clone()), commit).expect("the agent commits");
        w.apply(
            Proposer::Node(a2.clone()),
            Command::CompleteTakeover {
                node: a.node.clone(),
                epoch: Epoch(a.epoch.0),
            },
        )
        .expect("complete");
        let steps = takeover_steps(&w.s);
        assert!(
            matches!(&steps[..], [Command::CloseStreams { streams }] if streams[0].stream == stream && streams.len() == 1)
        );
        w.apply(Proposer::Node(b.clone()), steps[0].clone()).expect("close");
        // FO-TKO-9: step 3 leaves the stream closed, owned by no one, its committed end
        // one past the highest acknowledged offset, for placement to open elsewhere.
        let row = w.s.streams.get(&stream).expect("row");
        assert_eq!(row.state, crate::model::rows::StreamState::Closed);
        assert_eq!(row.committed_end, weir_shared::ids::Offset(5));
        assert!(row.owner.is_none(), "{:?}", row.owner);
        assert!(takeover_steps(&w.s).is_empty());
        // A deleted stream whose owner is dead is destroyed.
        w.apply(
            op(),
            Command::PlaceStream {
                stream,
                node: a2.node.clone(),
            },
        )
        .expect("place");
        w.apply(Proposer::Node(a2.clone()), Command::open(stream))
            .expect("open");
        w.apply(
            op(),
            Command::DeleteStream {
                name: "s".into(),
                id: None,
            },
        )
        .expect("delete");
        assert!(takeover_steps(&w.s).is_empty(), "its live owner destroys it");
        w.apply(Proposer::Node(a2.clone()), Command::FenceSelf).expect("fence");
        // FO-TKO-5: a deleted stream of a fenced owner is destroyed, with no takeover or placement.
        assert_eq!(takeover_steps(&w.s), vec![Command::DestroyStream { stream }]);
    }

    /// RR-WAL-8: a completed takeover is recorded against the dead
    /// incarnation `(node, epoch)`, not the holder. Reapplied (a restarted holder
    /// replaying its steps, or a state restored from a snapshot), it is a no-op: no
    /// second takeover is begun, the new owner's stream is not closed again, and what
    /// the new owner committed since stays.
    #[test]
    fn rr_wal_8_a_completed_takeover_reapplied_changes_nothing() {
        use crate::model::command::CommitRange;
        use weir_shared::ids::{ObjectKey, Offset};
        let mut w = World::new(30);
        let a = w.register("a", NodeKind::Streamd);
        let b = w.register("b", NodeKind::Streamd);
        let Ok(Applied::StreamCreated { stream }) = w.apply(
            op(),
            Command::CreateStream {
                name: "s".into(),
                config: Default::default(),
            },
        ) else {
            panic!()
        };
        let place = |node: &Incarnation| Command::PlaceStream {
            stream,
            node: node.node.clone(),
        };
        w.apply(op(), place(&a)).expect("place");
        w.apply(Proposer::Node(a.clone()), Command::open(stream)).expect("open");
        w.apply(Proposer::Node(a.clone()), Command::FenceSelf).expect("fence");
        let begin = Command::BeginTakeover {
            node: a.node.clone(),
            epoch: a.epoch,
            agent: b.node.clone(),
        };
        let complete = Command::CompleteTakeover {
            node: a.node.clone(),
            epoch: a.epoch,
        };
        w.apply(op(), begin.clone()).expect("begin");
        w.apply(Proposer::Node(b.clone()), complete.clone()).expect("complete");
        let steps = takeover_steps(&w.s);
        assert!(matches!(&steps[..], [Command::CloseStreams { .. }]), "{steps:?}");
        w.apply(op(), steps[0].clone()).expect("close");
        w.apply(op(), place(&b)).expect("place on b");
        let Ok(Applied::StreamOpened { stream_epoch, .. }) = w.apply(Proposer::Node(b.clone()), Command::open(stream))
        else {
            panic!("b opens it")
        };
        // The new owner commits records of its own.
        let commit = Command::CommitObjects {
            key: ObjectKey("data/b/1.wdo".into()),
            size: 10,
            ranges: vec![CommitRange {
                stream,
                stream_epoch,
                start: Offset(0),
                end: Offset(5),
                pos: 0,
                len: 10,
                crc: 0,
                max_timestamp: 0,
                txns: Default::default(),
            }],
        };
        w.apply(Proposer::Node(b.clone()), commit).expect("commit");
        let before = (w.s.streams[&stream].clone(), w.s.takeovers.clone());
        assert_eq!(before.0.committed_end, Offset(5));
        assert!(takeover_steps(&w.s).is_empty(), "nothing left to do");
        // A restarted holder replays what it did; a restored snapshot recomputes steps.
        w.apply(op(), begin).expect("a repeated begin is harmless");
        w.apply(Proposer::Node(b.clone()), complete)
            .expect("a repeated completion is harmless");
        // RR-WAL-8: reapplied, the completed takeover keeps the new owner's commits and row.
        assert_eq!((w.s.streams[&stream].clone(), w.s.takeovers.clone()), before);
        let restored: State = crate::model::codec::decode(&crate::model::codec::encode(&w.s)).expect("round trip");
        // RR-WAL-8: a restored snapshot knows the takeover is done and plans no second one.
        assert!(
            takeover_steps(&restored).is_empty(),
            "no second takeover after a restore"
        );
        assert_eq!(
            restored.takeovers[&(a.node.clone(), a.epoch)].state,
            TakeoverState::Recovered
        );
    }

    /// What one streamd does in one tick of a simulated world.
    #[derive(Clone, Copy, Debug)]
    enum Act {
        /// Heartbeats (and serves).
        Alive,
        /// Silent this tick (SIGSTOP, a slow link).
        Pause,
        /// Crashes: silent until it returns.
        Crash,
        /// Comes back at a new epoch (a restart).
        Return,
    }

    fn arb_act() -> impl proptest::strategy::Strategy<Value = Act> {
        use proptest::prelude::*;
        prop_oneof![10 => Just(Act::Alive), 3 => Just(Act::Pause), 1 => Just(Act::Crash), 1 => Just(Act::Return)]
    }

    const STREAMD: [&str; 3] = ["s0", "s1", "s2"];

    /// One node process: its incarnation while running, and how long the holder has not
    /// seen it heartbeat.
    struct Process {
        running: Option<Incarnation>,
        silent_ticks: u64,
    }

    /// Runs a world through `schedule` and then through calm ticks, with the pure planner
    /// as the failover holder, placement as the leader and nodes opening what is placed on
    /// them; checks FO-LIV-4..6 on the way and that every stream ends up open on a live
    /// node (FO-TKO, INV-7).
    fn run_world(schedule: &[[Act; 3]]) -> Result<(), proptest::test_runner::TestCaseError> {
        use proptest::prop_assert;
        let mut w = World {
            s: State::default(),
            i: 0,
        };
        w.apply(
            op(),
            Command::InitCluster {
                settings: ClusterSettings {
                    heartbeat_interval_sec: 1,
                    node_timeout_sec: 3,
                },
            },
        )
        .expect("init");
        let threshold = w.s.settings.expect("init").missed_heartbeats_threshold();
        let register = |w: &mut World, name: &str| -> Incarnation {
            let r = w.apply(
                op(),
                Command::RegisterNode {
                    node: NodeId::new(name),
                    kind: NodeKind::Streamd,
                    addrs: NodeAddrs::default(),
                    heartbeat_interval_sec: 1,
                    node_timeout_sec: 3,
                },
            );
            let Ok(Applied::Registered { epoch }) = r else {
                panic!("{r:?}")
            };
            Incarnation {
                node: NodeId::new(name),
                epoch,
            }
        };
        let holder = {
            let r = w.apply(
                op(),
                Command::RegisterNode {
                    node: NodeId::new("metad-1"),
                    kind: NodeKind::Metad,
                    addrs: NodeAddrs::default(),
                    heartbeat_interval_sec: 1,
                    node_timeout_sec: 3,
                },
            );
            let Ok(Applied::Registered { epoch }) = r else {
                panic!("{r:?}")
            };
            Incarnation {
                node: NodeId::new("metad-1"),
                epoch,
            }
        };
        let mut procs: Vec<Process> = STREAMD
            .iter()
            .map(|n| Process {
                running: Some(register(&mut w, n)),
                silent_ticks: 0,
            })
            .collect();
        for k in 0..4 {
            w.apply(
                op(),
                Command::CreateStream {
                    name: format!("st{k}"),
                    config: Default::default(),
                },
            )
            .expect("create");
        }
        let mut clock = Clock::default();
        // Calm: crashed processes come back, everything heartbeats.
        let calm = [Act::Return; 3];
        let ticks = schedule
            .iter()
            .chain(std::iter::repeat_n(&calm, 12 + 3 * threshold as usize));
        for acts in ticks {
            // The holder's clock advances once a tick.
            w.beat(&holder);
            for (idx, (p, act)) in procs.iter_mut().zip(acts).enumerate() {
                match act {
                    Act::Crash => p.running = None,
                    Act::Return if p.running.is_none() => p.running = Some(register(&mut w, STREAMD[idx])),
                    _ => {}
                }
            }
            for (idx, (p, act)) in procs.iter_mut().zip(acts).enumerate() {
                // A process whose incarnation is fenced exits and is restarted (D-5).
                if let Some(me) = &p.running {
                    if w.s.nodes[&me.node].fenced {
                        p.running = Some(register(&mut w, STREAMD[idx]));
                        p.silent_ticks = 0;
                    }
                }
                match (&p.running, act) {
                    (Some(me), Act::Alive | Act::Return) => {
                        let me = me.clone();
                        w.beat(&me);
                        p.silent_ticks = 0;
                    }
                    _ => p.silent_ticks += 1,
                }
            }
            // The holder judges and acts (FO-LIV-3), then the agents and placement.
            for c in dead_nodes(&w.s, &holder, &mut clock) {
                let _ = w.apply(Proposer::Node(holder.clone()), c);
            }
            for c in takeover_steps(&w.s) {
                let _ = w.apply(Proposer::Node(holder.clone()), c);
            }
            let pending: Vec<(Incarnation, Incarnation)> =
                w.s.takeovers
                    .values()
                    .filter(|t| t.state == TakeoverState::Pending)
                    .filter_map(|t| Some((t.dead.clone(), t.agent.clone()?)))
                    .collect();
            for (dead, agent) in pending {
                let agent_runs = procs
                    .iter()
                    .any(|p| p.running.as_ref() == Some(&agent) && p.silent_ticks == 0);
                if agent_runs {
                    let _ = w.apply(
                        Proposer::Node(agent),
                        Command::CompleteTakeover {
                            node: dead.node,
                            epoch: dead.epoch,
                        },
                    );
                }
            }
            let placements: Vec<_> = crate::placement::plan(&w.s, MAX_BATCH)
                .into_iter()
                .map(|(stream, node)| crate::model::Placement { stream, node })
                .collect();
            if !placements.is_empty() {
                let _ = w.apply(op(), Command::PlaceStreams { placements });
            }
            for p in &procs {
                let Some(me) = p.running.clone().filter(|_| p.silent_ticks == 0) else {
                    continue;
                };
                let placed: Vec<StreamId> =
                    w.s.streams
                        .owned(&me)
                        .map(|o| o.closed.iter().copied().collect())
                        .unwrap_or_default();
                if !placed.is_empty() {
                    let open = Command::OpenStreams {
                        streams: placed,
                        stamps_leader_epochs: false,
                    };
                    let _ = w.apply(Proposer::Node(me.clone()), open);
                }
            }
            for p in &procs {
                let Some(me) = &p.running else { continue };
                let row = &w.s.nodes[&me.node];
                if row.epoch != me.epoch {
                    continue;
                }
                // FO-LIV-6: a node silent for less than the threshold is never judged dead.
                if p.silent_ticks < threshold {
                    prop_assert!(!row.fenced, "{me} was fenced after {} silent ticks", p.silent_ticks);
                }
                // FO-LIV-4/5: silent past the threshold means fenced (one tick more for a
                // node first seen while already silent).
                if p.silent_ticks > threshold {
                    prop_assert!(row.fenced, "{me} silent for {} ticks is not fenced", p.silent_ticks);
                }
            }
        }
        // Once calm, every stream is open on a live incarnation.
        for s in w.s.streams.values() {
            let owner = s.owner.as_ref();
            let live = owner.is_some_and(|o| {
                w.s.nodes
                    .get(&o.node)
                    .is_some_and(|n| n.epoch == o.epoch && n.is_live())
            });
            prop_assert!(
                s.state == StreamState::Open && live,
                "{} is {:?} on {:?}",
                s.name,
                s.state,
                owner
            );
        }
        Ok(())
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 256, ..Default::default() })]

        /// FO-LIV-4..6, FO-TKO-1..10: in a world where nodes pause, crash and return at
        /// random, the planner fences exactly the silent ones, takeovers recover their
        /// streams, and once the world calms down every stream is open on a live node.
        #[test]
        fn a_world_of_pausing_crashing_and_returning_nodes_converges(
            schedule in proptest::collection::vec([arb_act(), arb_act(), arb_act()], 1..40)
        ) {
            run_world(&schedule)?;
        }
    }

    /// D-23: with 100,000 streams on a live node and one on a node just fenced, the
    /// takeover steps visit that one stream's row, not the others.
    #[test]
    fn takeover_steps_among_100_000_streams_visit_only_the_dead_owners() {
        let (mut s, a) = crate::crowd::open_on_one_node(100_000);
        let b = crate::crowd::register(&mut s, "b");
        s.streams.update(&StreamId(7), |r| r.owner = Some(b.clone()));
        crate::crowd::apply(
            &mut s,
            Command::FenceNode {
                node: b.node.clone(),
                epoch: b.epoch,
                seen_heartbeats: 0,
            },
        )
        .expect("fenced");
        let before = s.streams.visits();
        let steps = takeover_steps(&s);
        assert!(
            matches!(&steps[..], [Command::BeginTakeover { node, agent, .. }] if *node == b.node && *agent == a.node),
            "{steps:?}"
        );
        assert!(
            s.streams.visits() - before <= 1,
            "visited {} rows",
            s.streams.visits() - before
        );
    }

    /// Issue 57: a fenced row that holds nothing leaves the view once the holder has
    /// seen it fenced for the retention (in its own heartbeats), with its takeover
    /// rows; one holding a stream stays. The id registers again above its old epoch.
    #[test]
    fn a_row_fenced_for_the_retention_and_holding_nothing_is_reaped() {
        let mut w = World::new(30);
        let holder = w.register("metad-1", NodeKind::Metad);
        let gone = w.register("gone", NodeKind::Gatewayd);
        let keeps = w.register("keeps", NodeKind::Streamd);
        let stream = StreamId(0);
        w.apply(
            op(),
            Command::CreateStream {
                name: "s".into(),
                config: Default::default(),
            },
        )
        .expect("created");
        w.apply(
            op(),
            Command::PlaceStream {
                stream,
                node: keeps.node.clone(),
            },
        )
        .expect("placed");
        w.fence(&gone);
        w.fence(&keeps);
        let mut clock = Clock::default();
        for beat in 0..3 {
            let steps = rows_to_reap(&w.s, &holder, &mut clock, 3);
            assert!(steps.is_empty(), "not before the retention ({beat} beats): {steps:?}");
            w.beat(&holder);
        }
        let steps = rows_to_reap(&w.s, &holder, &mut clock, 3);
        assert_eq!(
            steps,
            vec![Command::ReapNode {
                node: gone.node.clone(),
                epoch: gone.epoch
            }],
            "the row holding a stream stays"
        );
        let changes = crate::model::leader_epochs::gateway_changes(&w.s);
        for step in steps {
            w.apply(Proposer::Node(holder.clone()), step).expect("reaped");
        }
        assert!(!w.s.nodes.contains_key(&gone.node));
        assert_eq!(
            crate::model::leader_epochs::gateway_changes(&w.s),
            changes,
            "a reaped gateway's changes still count"
        );
        let refused = w.apply(
            Proposer::Node(holder.clone()),
            Command::ReapNode {
                node: keeps.node.clone(),
                epoch: keeps.epoch,
            },
        );
        assert!(refused.is_err(), "it holds a stream");
        let again = w.register("gone", NodeKind::Gatewayd);
        assert!(again.epoch > gone.epoch, "{} after {}", again.epoch, gone.epoch);
    }
}
