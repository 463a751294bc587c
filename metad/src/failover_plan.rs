//! The failover loop's decisions as pure functions of the state and the holder's own
//! observations, so they can be checked without a cluster.
//!
//! The clock is the holder's heartbeat count as applied in the log (FO-LIV-4): a node
//! is dead once the holder has heartbeated `ceil(timeout / interval)` times since it
//! last saw that node's count change. What the holder did not see (its own pause, a cut
//! link, an outage) adds no holder heartbeats, so it never counts (FO-LIV-7 to -9, INV-10).

use crate::model::rows::{NodeKind, NodeRow, StreamState, TakeoverState};
use crate::model::{Command, State};
use std::collections::{BTreeMap, HashMap};
use weir_shared::ids::{Incarnation, NodeId, StreamId};

/// The name of the lease that decides which metad runs the failover loop.
pub const FAILOVER_LEASE: &str = "failover";

/// What the holder saw of each incarnation: its heartbeat count, and the holder's own
/// count when that was first seen.
#[derive(Debug, Default)]
pub struct Clock {
    seen: HashMap<Incarnation, (u64, u64)>,
}

impl Clock {
    /// Forgets everything: a new holder starts judging from scratch (FO-LIV-12).
    pub fn reset(&mut self) {
        self.seen.clear();
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
    let load = crate::model::rows::streams_per_owner(&state.streams);
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
    let mut open_by_dead: BTreeMap<Incarnation, Vec<(StreamId, weir_shared::ids::StreamEpoch)>> = BTreeMap::new();
    for s in state.streams.values() {
        if let (Some(owner), StreamState::Open) = (&s.owner, s.state) {
            if !live(state, owner) {
                open_by_dead.entry(owner.clone()).or_default().push((s.id, s.epoch));
            }
        }
    }
    // FO-TKO: a deleted stream without a live owner is destroyed; its data needs no recovery.
    let mut out: Vec<Command> = state
        .streams
        .values()
        .filter(|s| s.state == StreamState::Deleted && !s.owner.as_ref().is_some_and(|o| live(state, o)))
        .map(|s| Command::DestroyStream { stream: s.id })
        .collect();
    for (dead, streams) in open_by_dead {
        match state.takeovers.get(&(dead.node.clone(), dead.epoch)) {
            Some(t) if t.state != TakeoverState::Pending => {
                out.extend(
                    streams
                        .into_iter()
                        .map(|(stream, stream_epoch)| Command::CloseStream { stream, stream_epoch }),
                );
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
    use crate::model::rows::ClusterSettings;
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
            self.s.apply(self.i, &Proposal { proposer, command }).0
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
                    assert!(fences.is_empty(), "timeout {timeout}: no fence after {beat}");
                } else {
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

    /// FO-LIV-6, FO-LIV-12: a node that heartbeats is never judged dead.
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
            assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        }
    }

    /// FO-LIV-11, INV-8: a fenced holder judges nobody.
    #[test]
    fn a_fenced_holder_does_nothing() {
        let mut w = World::new(30);
        let holder = w.register("metad-1", NodeKind::Metad);
        w.register("s1", NodeKind::Streamd);
        w.apply(Proposer::Node(holder.clone()), Command::FenceSelf)
            .expect("fence");
        let mut clock = Clock::default();
        for _ in 0..10 {
            assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        }
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
        assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        // Two holder heartbeats (10 s / 5 s) after it was first seen at its new epoch.
        w.beat(&holder);
        assert!(dead_nodes(&w.s, &holder, &mut clock).is_empty());
        w.beat(&holder);
        let fences = dead_nodes(&w.s, &holder, &mut clock);
        assert_eq!(fences.len(), 1);
        assert!(matches!(&fences[0], Command::FenceNode { epoch, .. } if *epoch == again.epoch));
    }

    /// FO-TKO-1 to FO-TKO-3: a dead owner's open streams get a takeover by its own new
    /// incarnation when back, else by the least loaded live streamd; once recovered,
    /// they are closed.
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
        w.apply(Proposer::Node(a.clone()), Command::OpenStream { stream })
            .expect("open");
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
        w.apply(
            Proposer::Node(a2.clone()),
            Command::CompleteTakeover {
                node: a.node.clone(),
                epoch: Epoch(a.epoch.0),
            },
        )
        .expect("complete");
        let steps = takeover_steps(&w.s);
        assert!(matches!(&steps[..], [Command::CloseStream { stream: s, .. }] if *s == stream));
        w.apply(Proposer::Node(b.clone()), steps[0].clone()).expect("close");
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
        w.apply(Proposer::Node(a2.clone()), Command::OpenStream { stream })
            .expect("open");
        w.apply(op(), Command::DeleteStream { name: "s".into() })
            .expect("delete");
        assert!(takeover_steps(&w.s).is_empty(), "its live owner destroys it");
        w.apply(Proposer::Node(a2.clone()), Command::FenceSelf).expect("fence");
        assert_eq!(takeover_steps(&w.s), vec![Command::DestroyStream { stream }]);
    }
}
