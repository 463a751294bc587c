//! The pure decisions of planned transfers and drain node (SD-DRN-1…13): which streams a
//! node holds in canonical order, where each goes, how much of the budget each unit
//! gets, and what a drain does next. metad's transfer runner does the IO.

use crate::model::rows::{NodeKind, StreamRow};
use crate::model::{check_destination, State};
use serde::Serialize;
use std::time::{Duration, Instant};
use weir_shared::ids::{Incarnation, NodeId, StreamId};

/// What a transfer is for; a label of `metad_transfers_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// An operator's drain node.
    Drain,
    /// A stopping node's drain of itself.
    Shutdown,
    /// An operator's transfer of one stream.
    Transfer,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::Drain => "drain",
            Reason::Shutdown => "shutdown",
            Reason::Transfer => "transfer",
        }
    }
}

/// A request's time budget, from its arrival.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    start: Instant,
    total: Duration,
}

impl Budget {
    pub fn new(total: Duration, start: Instant) -> Self {
        Self { start, total }
    }

    pub fn total(&self) -> Duration {
        self.total
    }

    fn left_at(&self, now: Instant) -> Duration {
        self.total.saturating_sub(now.saturating_duration_since(self.start))
    }

    /// SD-DRN-6: one unit's bound is the time left less 1/6 of the initial budget
    /// (kept for what follows the moves); none when nothing is left for another unit.
    pub fn unit_bound_at(&self, now: Instant) -> Option<Duration> {
        Some(self.left_at(now).saturating_sub(self.total / 6)).filter(|d| !d.is_zero())
    }
}

/// SD-DRN-6: preparation (the owner's close) gets at most 4/5 of a unit's bound;
/// activation uses the rest, up to the same unit deadline.
pub fn prepare_bound(unit: Duration) -> Duration {
    unit * 4 / 5
}

/// What happened to one stream.
#[derive(Clone, Debug, Serialize)]
pub struct Moved {
    pub stream: String,
    pub moved: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The committed end the stream closed at on its former owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Moved {
    /// Not moved (yet) toward `to`, without an error.
    pub fn toward(stream: &str, to: &NodeId, closed_at: Option<u64>) -> Self {
        Self {
            stream: stream.to_string(),
            moved: false,
            to: Some(to.to_string()),
            closed_at,
            error: None,
        }
    }

    pub fn failed(stream: &str, error: impl Into<String>) -> Self {
        Self {
            stream: stream.to_string(),
            moved: false,
            to: None,
            closed_at: None,
            error: Some(error.into()),
        }
    }
}

/// A drain's report: every stream it tried, in order, and whether it finished.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub node: String,
    /// The metad replica that ran the drain (OBS-10).
    pub leader: String,
    pub reason: Reason,
    pub cordoned: bool,
    pub streams: Vec<Moved>,
    /// True when every stream the node owned was tried and moved.
    pub finished: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// True when the budget ended before every stream was tried.
    pub timed_out: bool,
}

/// Who asked for a drain.
#[derive(Clone, Debug)]
pub enum Requester {
    /// An operator names the node; its cordon is an operator cordon.
    Operator(NodeId),
    /// A stopping node drains itself (`stopping_node_drain`, SD-DRN-10).
    Stopping(Incarnation),
}

/// The streams `owner` holds open, in canonical order: topics by (name, partition),
/// then HTTP streams by name (SD-DRN-1).
pub fn owned_streams(state: &State, owner: &Incarnation) -> Vec<(StreamId, String)> {
    let mut owned: Vec<&StreamRow> = state
        .streams
        .owned(owner)
        .map(|o| o.open.iter().filter_map(|id| state.streams.get(id)).collect())
        .unwrap_or_default();
    owned.sort_by(|a, b| {
        let key = |s: &StreamRow| {
            (
                s.topic.is_none(),
                s.topic.clone().unwrap_or_default(),
                s.partition,
                s.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    owned.into_iter().map(|s| (s.id, s.name.clone())).collect()
}

/// The least loaded node that may receive a stream, other than `source`.
pub fn choose_destination(state: &State, source: &NodeId) -> Option<NodeId> {
    choose_destinations(state, source, 1).and_then(|mut d| d.pop())
}

/// Destinations for `n` streams leaving `source`, each the least loaded node that may
/// receive one, counting those chosen before it; `None` when no node may.
pub fn choose_destinations(state: &State, source: &NodeId, n: usize) -> Option<Vec<NodeId>> {
    let load = state.streams.load_by_node();
    let mut candidates: std::collections::BTreeMap<NodeId, usize> = state
        .nodes
        .values()
        .filter(|n| n.kind == NodeKind::Streamd && &n.id != source && check_destination(state, &n.id).is_ok())
        .map(|n| (n.id.clone(), load.get(&n.id).copied().unwrap_or(0)))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (node, count) = candidates
            .iter_mut()
            .min_by_key(|(id, count)| (**count, (*id).clone()))
            .expect("checked non-empty");
        *count += 1;
        out.push(node.clone());
    }
    Some(out)
}

/// Streams a drain moves in one unit: one `BeginTransfers` entry, one close request to
/// the source, a few `CloseStreams` and `OpenStreams` entries. Each is unwritable for
/// about as long as its unit takes, so a unit stays small; a drain of many streams is
/// many units (D-23).
pub const DRAIN_BATCH: usize = 500;

/// One stream of a unit, and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub stream: StreamId,
    pub name: String,
    pub target: NodeId,
}

/// A drain in progress: the source incarnation and the streams still to try, in order.
#[derive(Clone, Debug)]
pub struct DrainPlan {
    pub owner: Incarnation,
    remaining: std::collections::VecDeque<(StreamId, String)>,
}

impl DrainPlan {
    /// The plan for `owner`'s streams as `state` shows them.
    pub fn new(state: &State, owner: Incarnation) -> Self {
        let remaining = owned_streams(state, &owner).into();
        Self { owner, remaining }
    }
}

/// What a drain does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Move the streams of `batch`, in canonical order, each to its target, within `unit`.
    Move { batch: Vec<Planned>, unit: Duration },
    /// Every stream of the plan was tried.
    Done,
    /// The drain stops here; the remaining streams are not tried.
    Stop(Stopped),
}

/// Why a drain stopped before trying every stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// SD-TRM-8: the source restarted or was fenced; the plan no longer holds.
    SourceChanged,
    /// SD-DRN-6: nothing is left of the budget for another unit.
    BudgetSpent,
    /// SD-DRN-13: no live schedulable node can take a stream.
    NoDestination,
}

impl Stopped {
    /// The report's account of the stop.
    pub fn message(&self, node: &NodeId) -> String {
        match self {
            Stopped::SourceChanged => {
                format!("node '{node}' restarted or was fenced during the drain; the plan was dropped")
            }
            Stopped::BudgetSpent => "the drain budget is spent; the remaining streams were not tried".into(),
            Stopped::NoDestination => "no live schedulable replacement node remains".into(),
        }
    }
}

/// The drain's next step at `now`, taking it off the plan (SD-DRN-1, -6, -13, SD-TRM-8):
/// the next at most `batch` streams in canonical order, as one unit.
pub fn next_step(state: &State, plan: &mut DrainPlan, budget: &Budget, now: Instant, batch: usize) -> Step {
    if plan.remaining.is_empty() {
        return Step::Done;
    }
    let owner = &plan.owner;
    let same_source = state
        .nodes
        .get(&owner.node)
        .is_some_and(|n| n.epoch == owner.epoch && n.is_live());
    if !same_source {
        return Step::Stop(Stopped::SourceChanged);
    }
    let Some(unit) = budget.unit_bound_at(now) else {
        return Step::Stop(Stopped::BudgetSpent);
    };
    let n = batch.clamp(1, plan.remaining.len());
    let Some(targets) = choose_destinations(state, &owner.node, n) else {
        return Step::Stop(Stopped::NoDestination);
    };
    let batch = plan
        .remaining
        .drain(..n)
        .zip(targets)
        .map(|((stream, name), target)| Planned { stream, name, target })
        .collect();
    Step::Move { batch, unit }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Applied, ClusterSettings, Command, CordonBy, NodeAddrs, Proposal, Proposer};

    /// The `reason` label of `weir_metad_transfers_total` and of the drain log lines,
    /// as docs/operations/shutdown.md lists it for dashboards and alerts.
    #[test]
    fn reasons_carry_their_documented_labels() {
        for (reason, label) in [
            (Reason::Drain, "drain"),
            (Reason::Shutdown, "shutdown"),
            (Reason::Transfer, "transfer"),
        ] {
            assert_eq!(reason.label(), label);
        }
    }

    /// SD-DRN-6: with a 30 s budget, a unit is bounded by 30 − 5 = 25 s and its
    /// preparation by 4/5 of that, 20 s; later units get what is left less the reserve.
    #[test]
    fn unit_bounds_follow_the_budget() {
        let start = Instant::now();
        let budget = Budget::new(Duration::from_secs(30), start);
        // The whole budget, as the `drain started` line reports it.
        assert_eq!(budget.total(), Duration::from_secs(30));
        let unit = budget.unit_bound_at(start).unwrap();
        // SD-DRN-6: a unit's bound is the time left less 1/6 of the initial budget.
        assert_eq!(unit, Duration::from_secs(25));
        // SD-DRN-6: preparation gets 4/5 of the unit's bound.
        assert_eq!(prepare_bound(unit), Duration::from_secs(20));
        assert_eq!(
            budget.unit_bound_at(start + Duration::from_secs(10)),
            Some(Duration::from_secs(15))
        );
        assert_eq!(budget.unit_bound_at(start + Duration::from_secs(25)), None);
        assert_eq!(budget.unit_bound_at(start + Duration::from_secs(40)), None);
    }

    struct Log {
        state: State,
        index: u64,
    }

    impl Log {
        fn op(&mut self, proposer: Proposer, command: Command) -> Applied {
            self.index += 1;
            let proposal = Proposal { proposer, command };
            self.state
                .apply(self.index, &proposal, &crate::model::MemIndex::default())
                .outcome
                .expect("applies")
        }

        fn operator(&mut self, command: Command) -> Applied {
            self.op(Proposer::Operator { principal: "t".into() }, command)
        }

        fn register(&mut self, name: &str) -> Incarnation {
            let Applied::Registered { epoch } = self.operator(Command::RegisterNode {
                node: NodeId::new(name),
                kind: NodeKind::Streamd,
                addrs: NodeAddrs::default(),
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            }) else {
                panic!("registered")
            };
            Incarnation {
                node: NodeId::new(name),
                epoch,
            }
        }

        /// A stream opened on `owner`.
        fn open(&mut self, name: &str, owner: &Incarnation) {
            let Applied::StreamCreated { stream } = self.operator(Command::CreateStream {
                name: name.into(),
                config: Default::default(),
            }) else {
                panic!("created")
            };
            self.operator(Command::PlaceStream {
                stream,
                node: owner.node.clone(),
            });
            self.op(Proposer::Node(owner.clone()), Command::open(stream));
        }
    }

    fn cluster() -> (Log, Incarnation, Incarnation) {
        let mut log = Log {
            state: State::default(),
            index: 0,
        };
        log.operator(Command::InitCluster {
            settings: ClusterSettings {
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            },
        });
        let a = log.register("a");
        let b = log.register("b");
        for name in ["s2", "s1"] {
            log.open(name, &a);
        }
        (log, a, b)
    }

    /// SD-DRN-1: streams in canonical order, each to a schedulable node, then done.
    #[test]
    fn a_drain_moves_each_stream_in_order_and_then_is_done() {
        let (log, a, b) = cluster();
        let start = Instant::now();
        let budget = Budget::new(Duration::from_secs(60), start);
        let mut plan = DrainPlan::new(&log.state, a);
        let mut moved = Vec::new();
        loop {
            match next_step(&log.state, &mut plan, &budget, start, 1) {
                Step::Move { batch, unit } => {
                    assert_eq!(batch.len(), 1);
                    // SD-DRN-1: each stream goes to another eligible node.
                    assert_eq!(batch[0].target, b.node);
                    assert_eq!(unit, Duration::from_secs(50));
                    moved.push(batch[0].name.clone());
                }
                Step::Done => break,
                other => panic!("{other:?}"),
            }
        }
        // SD-DRN-1: every stream is moved, in canonical order (s2 was created first).
        assert_eq!(moved, ["s1", "s2"]);
    }

    /// D-23: a unit takes up to the batch's size of streams in canonical order, and
    /// spreads them over the destinations by load.
    #[test]
    fn a_drain_moves_its_streams_in_batches_spread_by_load() {
        let (mut log, a, b) = cluster();
        let c = log.register("c");
        for name in ["s4", "s3", "s5"] {
            log.open(name, &a);
        }
        log.open("on-b", &b);
        let start = Instant::now();
        let budget = Budget::new(Duration::from_secs(60), start);
        let mut plan = DrainPlan::new(&log.state, a);
        let Step::Move { batch, .. } = next_step(&log.state, &mut plan, &budget, start, 4) else {
            panic!("a batch")
        };
        let names: Vec<&str> = batch.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["s1", "s2", "s3", "s4"]);
        let targets: Vec<&NodeId> = batch.iter().map(|p| &p.target).collect();
        assert_eq!(targets, [&c.node, &b.node, &c.node, &b.node], "b had one already");
        let Step::Move { batch, .. } = next_step(&log.state, &mut plan, &budget, start, 4) else {
            panic!("the rest")
        };
        assert_eq!(batch.len(), 1);
        assert_eq!(next_step(&log.state, &mut plan, &budget, start, 4), Step::Done);
    }

    /// SD-DRN-6, SD-DRN-13, SD-TRM-8: the drain stops when the budget is spent, when no
    /// node can take a stream, or when the source is no longer the incarnation planned.
    #[test]
    fn a_drain_stops_for_budget_destination_or_source() {
        let (mut log, a, b) = cluster();
        let start = Instant::now();
        let budget = Budget::new(Duration::from_secs(60), start);
        let mut plan = DrainPlan::new(&log.state, a.clone());
        // The stopping node's own question: is there a replacement for its streams?
        assert_eq!(choose_destination(&log.state, &a.node), Some(b.node.clone()));
        // SD-DRN-6: 10 s left of 60 is no more than the 10 s reserve: no budget for a unit.
        assert_eq!(
            next_step(&log.state, &mut plan, &budget, start + Duration::from_secs(50), 1),
            Step::Stop(Stopped::BudgetSpent)
        );
        log.operator(Command::Cordon {
            node: b.node.clone(),
            by: CordonBy::Operator,
        });
        // FO-TKO-15: a cordoned node is no drain destination.
        assert_eq!(
            next_step(&log.state, &mut plan, &budget, start, 1),
            Step::Stop(Stopped::NoDestination)
        );
        assert_eq!(choose_destination(&log.state, &a.node), None);
        log.register("a");
        // SD-TRM-8: the source's restart (a new epoch) invalidates the plan.
        assert_eq!(
            next_step(&log.state, &mut plan, &budget, start, 1),
            Step::Stop(Stopped::SourceChanged)
        );
        // The drain's report says why it stopped, in the words operators read.
        assert_eq!(
            Stopped::SourceChanged.message(&a.node),
            "node 'a' restarted or was fenced during the drain; the plan was dropped"
        );
        assert_eq!(
            Stopped::BudgetSpent.message(&a.node),
            "the drain budget is spent; the remaining streams were not tried"
        );
        assert_eq!(
            Stopped::NoDestination.message(&a.node),
            "no live schedulable replacement node remains"
        );
    }

    /// D-23: a drain's plan visits the rows of the streams its source owns, not those
    /// of the 100,000 others.
    #[test]
    fn a_drain_plan_among_100_000_streams_visits_only_the_sources() {
        let (mut s, _) = crate::crowd::open_on_one_node(100_000);
        let b = crate::crowd::register(&mut s, "b");
        for id in [3, 5] {
            s.streams.update(&StreamId(id), |r| r.owner = Some(b.clone()));
        }
        let before = s.streams.visits();
        let owned: Vec<String> = owned_streams(&s, &b).into_iter().map(|(_, name)| name).collect();
        assert_eq!(owned, ["s3", "s5"]);
        assert!(
            s.streams.visits() - before <= 2,
            "visited {} rows",
            s.streams.visits() - before
        );
    }
}
