//! Placement of closed streams as pure decisions: every closed stream without a live
//! owner goes to the least loaded schedulable streamd, once the restart grace is over.
//! metad's placement loop proposes each decision as a `PlaceStream` CAS that refuses a
//! stream already placed on a live node, so a stale or doubled decision is harmless.

use crate::model::rows::NodeKind;
use crate::model::State;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use weir_shared::ids::{NodeId, StreamId};

/// Whether metad replica `metad` may place streams: only while its own row is live
/// (FO-LIV-11). A replica fenced by a peer, or not yet registered, places nothing; its
/// proposals would only be refused or race the live holder's.
pub fn may_place(state: &State, metad: &NodeId) -> bool {
    state.nodes.get(metad).is_some_and(|n| n.is_live())
}

/// The placements to make now, at most `limit`: (stream, node), balancing by
/// owned-stream count. Visits the nodes and the owners of streams (incarnations), and
/// of the streams only the orphans: closed streams placed nowhere or on an
/// incarnation that is not live (D-23).
pub fn plan(state: &State, limit: usize) -> Vec<(StreamId, NodeId)> {
    let mut load: BTreeMap<NodeId, usize> = state
        .nodes
        .values()
        .filter(|n| n.kind == NodeKind::Streamd && n.is_schedulable())
        .map(|n| {
            (
                n.id.clone(),
                state.streams.owned(&n.incarnation()).map_or(0, |o| o.load()),
            )
        })
        .collect();
    if load.is_empty() {
        return Vec::new();
    }
    let mut orphans: Vec<StreamId> = state
        .streams
        .owners()
        .filter(|(owner, _)| !owner.is_some_and(|o| state.is_live(o)))
        .flat_map(|(_, owned)| owned.closed.iter().copied())
        .collect();
    // Oldest first, whoever held them, so the order does not depend on the owners.
    orphans.sort_unstable();
    orphans.truncate(limit);
    let mut out = Vec::with_capacity(orphans.len());
    for stream in orphans {
        let (node, count) = load
            .iter_mut()
            .min_by_key(|(id, count)| (**count, (*id).clone()))
            .expect("checked non-empty");
        *count += 1;
        out.push((stream, node.clone()));
    }
    debug_assert!(out.iter().all(|(_, n)| state.nodes[n].is_schedulable()));
    out
}

/// How long after this process starts placement waits for registered nodes to return.
pub const RESTART_GRACE: Duration = Duration::from_secs(10);

/// RR-GRC-1, RR-GRC-2: which registered streamd nodes this process has seen heartbeat
/// since it started, kept whether or not it leads, and dropped after the grace.
#[derive(Debug)]
pub struct RestartGrace {
    /// When this process started; the grace runs from here.
    started: Instant,
    /// Heartbeat count of each incarnation when first observed, and whether it has moved.
    observed: BTreeMap<(NodeId, weir_shared::ids::Epoch), (u64, bool)>,
    /// The applied index first seen: a node registered after it is back by definition.
    start_index: Option<u64>,
    over: bool,
}

impl RestartGrace {
    /// A grace that started at `started` (this process's start).
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            observed: BTreeMap::new(),
            start_index: None,
            over: false,
        }
    }

    /// Records what `state` shows at `now`; true while placement should still wait.
    pub fn defer(&mut self, state: &State, now: Instant) -> bool {
        if self.over {
            return false;
        }
        let start_index = *self.start_index.get_or_insert(state.applied_index);
        let mut waiting = false;
        for n in state
            .nodes
            .values()
            .filter(|n| n.kind == NodeKind::Streamd && n.is_live() && n.registered_index <= start_index)
        {
            let entry = self
                .observed
                .entry((n.id.clone(), n.epoch))
                .or_insert((n.heartbeats, false));
            if n.heartbeats != entry.0 {
                entry.1 = true;
            }
            waiting |= !entry.1;
        }
        if !waiting || now.saturating_duration_since(self.started) >= RESTART_GRACE {
            if waiting {
                tracing::info!("restart grace over; placing streams of nodes that did not return");
            }
            self.over = true;
            self.observed.clear();
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::ClusterSettings;
    use crate::model::{Applied, Command, NodeAddrs, Proposal, Proposer};
    use proptest::prelude::*;

    fn op() -> Proposer {
        Proposer::Operator { principal: "t".into() }
    }

    /// A state to apply commands to, one log index each, as a replica would.
    struct Log {
        s: State,
        i: u64,
    }

    impl Log {
        /// An initialised cluster.
        fn new() -> Self {
            let mut log = Log {
                s: State::default(),
                i: 0,
            };
            let settings = ClusterSettings {
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            };
            log.apply(op(), Command::InitCluster { settings }).unwrap();
            log
        }

        fn apply(&mut self, p: Proposer, c: Command) -> Result<Applied, crate::model::Rejection> {
            self.i += 1;
            let proposal = Proposal {
                proposer: p,
                command: c,
            };
            self.s
                .apply(self.i, &proposal, &crate::model::MemIndex::default())
                .outcome
        }

        /// Registers streamd `node`; its new incarnation.
        fn register(&mut self, node: &str) -> weir_shared::ids::Incarnation {
            let register = Command::RegisterNode {
                node: NodeId::new(node),
                kind: NodeKind::Streamd,
                addrs: NodeAddrs::default(),
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            };
            let Ok(Applied::Registered { epoch }) = self.apply(op(), register) else {
                panic!("registered")
            };
            weir_shared::ids::Incarnation {
                node: NodeId::new(node),
                epoch,
            }
        }
    }

    // FO-LIV-11: a metad replica places streams only while its own row is live: not
    // before it registers, and not once a peer has fenced it, until it registers again.
    #[test]
    fn fo_liv_11_a_fenced_metad_places_nothing() {
        let mut s = State::default();
        let mut i = 0;
        let mut next = |s: &mut State, c: Command| {
            i += 1;
            s.apply(
                i,
                &Proposal {
                    proposer: op(),
                    command: c,
                },
                &crate::model::MemIndex::default(),
            )
            .outcome
        };
        next(
            &mut s,
            Command::InitCluster {
                settings: ClusterSettings {
                    heartbeat_interval_sec: 1,
                    node_timeout_sec: 3,
                },
            },
        )
        .unwrap();
        let me = NodeId::new("metad-1");
        assert!(!may_place(&s, &me), "not registered yet");
        let register = Command::RegisterNode {
            node: me.clone(),
            kind: NodeKind::Metad,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        let Ok(Applied::Registered { epoch }) = next(&mut s, register.clone()) else {
            panic!("registered")
        };
        assert!(may_place(&s, &me));
        next(
            &mut s,
            Command::FenceNode {
                node: me.clone(),
                epoch,
                seen_heartbeats: 0,
            },
        )
        .unwrap();
        // FO-LIV-11: once a peer has fenced its row, the replica places nothing.
        assert!(!may_place(&s, &me), "fenced by a peer");
        next(&mut s, register).unwrap();
        assert!(may_place(&s, &me), "live again once registered again");
    }

    proptest! {
        /// Every orphaned closed stream is placed on a schedulable streamd (never a
        /// cordoned or terminating one, SD-CRD-1, SD-TRM-4), and loads end up within one
        /// of each other when all streams are orphans.
        #[test]
        fn plan_places_every_orphan_on_a_schedulable_node_evenly(nodes in 1usize..5, streams in 0usize..40, cordoned in 0usize..5, terminating in 0usize..5) {
            let mut s = State::default();
            let i = std::cell::Cell::new(0u64);
            let next_by = |s: &mut State, p: Proposer, c: Command| { i.set(i.get() + 1); s.apply(i.get(), &Proposal { proposer: p, command: c }, &crate::model::MemIndex::default()).outcome };
            let next = |s: &mut State, c: Command| next_by(s, op(), c);
            next(&mut s, Command::InitCluster { settings: ClusterSettings { heartbeat_interval_sec: 1, node_timeout_sec: 3 } }).unwrap();
            let mut incarnations = Vec::new();
            for n in 0..nodes {
                let node = NodeId::new(format!("n{n}"));
                let registered = next(&mut s, Command::RegisterNode { node: node.clone(), kind: NodeKind::Streamd, addrs: NodeAddrs::default(), heartbeat_interval_sec: 1, node_timeout_sec: 3 });
                let Ok(Applied::Registered { epoch }) = registered else { panic!("registered") };
                incarnations.push(weir_shared::ids::Incarnation { node, epoch });
            }
            if terminating < nodes {
                next_by(&mut s, Proposer::Node(incarnations[terminating].clone()), Command::MarkTerminating).unwrap();
            }
            if cordoned < nodes {
                next(&mut s, Command::Cordon { node: NodeId::new(format!("n{cordoned}")), by: crate::model::CordonBy::Operator }).unwrap();
            }
            for k in 0..streams {
                let r = next(&mut s, Command::CreateStream { name: format!("s{k}"), config: Default::default() });
                let created = matches!(r, Ok(Applied::StreamCreated { .. }));
                prop_assert!(created);
            }
            let decisions = plan(&s, usize::MAX);
            let schedulable = s.nodes.values().filter(|n| n.is_schedulable()).count();
            if schedulable == 0 {
                prop_assert!(decisions.is_empty());
                return Ok(());
            }
            prop_assert_eq!(decisions.len(), streams);
            let mut load: BTreeMap<NodeId, usize> = BTreeMap::new();
            for (stream, node) in &decisions {
                // FO-TKO-15: no placement lands on a cordoned or terminating node.
                prop_assert!(s.nodes[node].is_schedulable());
                *load.entry(node.clone()).or_default() += 1;
                let r = next(&mut s, Command::PlaceStream { stream: *stream, node: node.clone() });
                prop_assert!(r.is_ok(), "{:?}", r);
            }
            if streams >= schedulable {
                let max = load.values().max().copied().unwrap_or(0);
                let min = load.values().min().copied().unwrap_or(0);
                prop_assert!(max - min <= 1 && load.len() == schedulable);
            }
            // Once placed, nothing is left to place.
            prop_assert!(plan(&s, usize::MAX).is_empty());
        }
    }

    /// RR-GRC-1: after a restart, placement waits for registered nodes to heartbeat;
    /// a node registered after the process started counts as back.
    #[test]
    fn restart_grace_waits_for_returning_nodes_only() {
        let mut s = State::default();
        let mut i = 0;
        let mut next = |s: &mut State, p: Proposer, c: Command| {
            i += 1;
            s.apply(
                i,
                &Proposal {
                    proposer: p,
                    command: c,
                },
                &crate::model::MemIndex::default(),
            )
            .outcome
        };
        next(
            &mut s,
            op(),
            Command::InitCluster {
                settings: ClusterSettings {
                    heartbeat_interval_sec: 1,
                    node_timeout_sec: 3,
                },
            },
        )
        .unwrap();
        let register = |name: &str| Command::RegisterNode {
            node: NodeId::new(name),
            kind: NodeKind::Streamd,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        let Ok(Applied::Registered { epoch }) = next(&mut s, op(), register("old")) else {
            panic!()
        };
        let start = Instant::now();
        let mut grace = RestartGrace::new(start);
        // RR-GRC-1: placement waits while a node registered before the restart is not seen back.
        assert!(
            grace.defer(&s, start),
            "the old node has not heartbeated since the restart"
        );
        next(&mut s, op(), register("new")).unwrap();
        // RR-GRC-1: only nodes registered before the restart are waited for.
        assert!(
            grace.defer(&s, start),
            "a new node does not end the wait for the old one"
        );
        let old = weir_shared::ids::Incarnation {
            node: NodeId::new("old"),
            epoch,
        };
        next(&mut s, Proposer::Node(old), Command::Heartbeat).unwrap();
        // RR-GRC-1: its first heartbeat since the restart ends the wait before the 10 s are up.
        assert!(!grace.defer(&s, start), "every registered node is back");
        assert!(!grace.defer(&s, start), "the grace is over for good");
    }

    /// RR-GRC-2: a node that does not return ends the wait once the grace has passed.
    #[test]
    fn restart_grace_ends_when_its_time_is_up() {
        let mut s = State::default();
        for (i, command) in [
            Command::InitCluster {
                settings: ClusterSettings {
                    heartbeat_interval_sec: 1,
                    node_timeout_sec: 3,
                },
            },
            Command::RegisterNode {
                node: NodeId::new("gone"),
                kind: NodeKind::Streamd,
                addrs: NodeAddrs::default(),
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            },
        ]
        .into_iter()
        .enumerate()
        {
            s.apply(
                i as u64 + 1,
                &Proposal {
                    proposer: op(),
                    command,
                },
                &crate::model::MemIndex::default(),
            )
            .outcome
            .unwrap();
        }
        let start = Instant::now();
        let mut grace = RestartGrace::new(start);
        assert!(grace.defer(&s, start + RESTART_GRACE - Duration::from_millis(1)));
        assert!(!grace.defer(&s, start + RESTART_GRACE));
        assert!(!grace.defer(&s, start), "over for good, whatever the clock says");
    }

    /// FO-TKO-3: closed streams go to the least loaded live node at that moment, ties
    /// broken by node id: with B, C and D owning 2, 5 and 5 streams, ten orphans go
    /// B, B, B (to 5 each), then round the three in id order.
    #[test]
    fn orphans_go_to_the_least_loaded_node_ties_by_id() {
        let mut log = Log::new();
        let mut created = 0;
        for (node, owned) in [("b", 2), ("c", 5), ("d", 5)] {
            let me = log.register(node);
            for _ in 0..owned {
                created += 1;
                let Ok(Applied::StreamCreated { stream }) = log.apply(
                    op(),
                    Command::CreateStream {
                        name: format!("s{created}"),
                        config: Default::default(),
                    },
                ) else {
                    panic!("created")
                };
                log.apply(
                    op(),
                    Command::PlaceStream {
                        stream,
                        node: NodeId::new(node),
                    },
                )
                .unwrap();
                log.apply(Proposer::Node(me.clone()), Command::open(stream)).unwrap();
            }
        }
        for k in 0..10 {
            log.apply(
                op(),
                Command::CreateStream {
                    name: format!("orphan{k}"),
                    config: Default::default(),
                },
            )
            .unwrap();
        }
        let targets: Vec<String> = plan(&log.s, usize::MAX)
            .into_iter()
            .map(|(_, n)| n.to_string())
            .collect();
        // FO-TKO-3: each to the least loaded node at that moment, ties broken by node id.
        assert_eq!(targets, ["b", "b", "b", "b", "c", "d", "b", "c", "d", "b"]);
    }

    // SD-TRM-4: a terminating streamd gets no new placement and is no transfer
    // destination, and that is all it changes: it stays live and keeps serving the
    // streams it has open (nothing moves them off it for being terminating).
    #[test]
    fn sd_trm_4_terminating_only_removes_a_node_from_placements_and_transfers() {
        let mut log = Log::new();
        let me: BTreeMap<&str, _> = ["a", "b", "c"].into_iter().map(|n| (n, log.register(n))).collect();
        // `a` owns two open streams and is terminating; six orphans would reach it too.
        let mut owned = Vec::new();
        for k in 0..2 {
            let create = Command::CreateStream {
                name: format!("kept{k}"),
                config: Default::default(),
            };
            let Ok(Applied::StreamCreated { stream }) = log.apply(op(), create) else {
                panic!("created")
            };
            log.apply(
                op(),
                Command::PlaceStream {
                    stream,
                    node: NodeId::new("a"),
                },
            )
            .unwrap();
            log.apply(Proposer::Node(me["a"].clone()), Command::open(stream))
                .unwrap();
            owned.push(stream);
        }
        log.apply(Proposer::Node(me["a"].clone()), Command::MarkTerminating)
            .unwrap();
        for k in 0..6 {
            let create = Command::CreateStream {
                name: format!("orphan{k}"),
                config: Default::default(),
            };
            log.apply(op(), create).unwrap();
        }
        let decisions = plan(&log.s, usize::MAX);
        let targets: Vec<&str> = decisions.iter().map(|(_, n)| n.as_str()).collect();
        // SD-TRM-4: every orphan is placed, none on the terminating node.
        assert_eq!(targets.len(), 6, "{targets:?}");
        assert!(targets.iter().all(|n| *n != "a"), "{targets:?}");
        // SD-TRM-4: nor is it a destination of a drain of `b`.
        let destinations = crate::drain_plan::choose_destinations(&log.s, &NodeId::new("b"), 3).expect("c may receive");
        assert!(destinations.iter().all(|n| n.as_str() == "c"), "{destinations:?}");
        // SD-TRM-4: and only that: it is live, and its open streams stay its own and open.
        let a = &log.s.nodes[&NodeId::new("a")];
        assert!(a.terminating && a.is_live());
        for stream in owned {
            let row = log.s.streams.get(&stream).expect("row");
            assert_eq!(row.state, crate::model::rows::StreamState::Open);
            assert_eq!(row.owner.as_ref(), Some(&me["a"]));
            assert!(decisions.iter().all(|(d, _)| *d != stream), "placement leaves it alone");
        }
    }

    /// D-23: among 100,000 streams open on a live node, the plan visits no row to find
    /// the one orphan and place it: its cost follows the orphans, not the streams.
    #[test]
    fn a_plan_among_100_000_streams_visits_only_its_orphans() {
        let (mut s, _) = crate::crowd::open_on_one_node(100_000);
        crate::crowd::register(&mut s, "b");
        let Ok(Applied::StreamCreated { stream }) = crate::crowd::apply(
            &mut s,
            Command::CreateStream {
                name: "orphan".into(),
                config: Default::default(),
            },
        ) else {
            panic!("created")
        };
        let before = s.streams.visits();
        let decisions = plan(&s, usize::MAX);
        assert_eq!(decisions, vec![(stream, NodeId::new("b"))], "to the less loaded node");
        assert!(
            s.streams.visits() - before <= 1,
            "visited {} rows",
            s.streams.visits() - before
        );
    }
}
