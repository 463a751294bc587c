//! Nodes: cluster settings, registration at a new epoch, heartbeats, fencing, the
//! terminating mark and cordons (FO-LIV, FO-FEN, SD-CRD, D-4).

use super::{reject, validate_name, Txn};
use crate::model::command::{Applied, Outcome, Proposer, RejectCode, Rejection};
use crate::model::rows::*;
use crate::model::state::RowKey;
use weir_shared::ids::{Epoch, NodeId};

impl Txn<'_> {
    pub(super) fn init_cluster(&mut self, proposer: &Proposer, settings: ClusterSettings) -> Outcome {
        self.privileged(proposer)?;
        if let Err(e) =
            weir_shared::config::check_heartbeat_timing(settings.heartbeat_interval_sec, settings.node_timeout_sec)
        {
            return Err(reject(RejectCode::InvalidArgument, e.message));
        }
        match self.state.settings {
            Some(current) if current == settings => Ok(Applied::Done),
            Some(current) => Err(reject(
                RejectCode::Conflict,
                format!(
                    "cluster already initialized with --heartbeat-interval-sec {} and --node-timeout-sec {}",
                    current.heartbeat_interval_sec, current.node_timeout_sec
                ),
            )),
            None => {
                self.state.settings = Some(settings);
                self.touch(RowKey::Settings);
                Ok(Applied::Done)
            }
        }
    }

    pub(super) fn register(
        &mut self,
        node: &NodeId,
        kind: NodeKind,
        addrs: &NodeAddrs,
        heartbeat_interval_sec: u64,
        node_timeout_sec: u64,
    ) -> Outcome {
        validate_name("node", node.as_str())?;
        let Some(settings) = self.state.settings else {
            return Err(reject(RejectCode::NotReady, "cluster settings are not initialized yet"));
        };
        // FO-LIV-14: one clock for the whole cluster.
        if settings.heartbeat_interval_sec != heartbeat_interval_sec || settings.node_timeout_sec != node_timeout_sec {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!(
                    "node '{node}' runs --heartbeat-interval-sec {heartbeat_interval_sec} and --node-timeout-sec {node_timeout_sec}, \
                     but the cluster runs --heartbeat-interval-sec {} and --node-timeout-sec {}",
                    settings.heartbeat_interval_sec, settings.node_timeout_sec
                ),
            ));
        }
        let previous = self.state.nodes.get(node);
        if let Some(prev) = previous {
            if prev.kind != kind {
                return Err(reject(
                    RejectCode::Conflict,
                    format!("node id '{node}' is registered as {:?}, not {kind:?}", prev.kind),
                ));
            }
        }
        // FO-LIV-10: strictly above every earlier epoch of this id, a reaped row's too.
        let floor = Epoch(self.state.counters.reaped_epoch_floor);
        let epoch = previous.map_or(floor.next(), |p| p.epoch.next());
        let row = NodeRow {
            id: node.clone(),
            kind,
            epoch,
            addrs: addrs.clone(),
            heartbeats: 0,
            registered_index: self.index,
            last_heartbeat_index: self.index,
            fenced: false,
            fenced_index: None,
            // An operator's cordon survives restarts; so does a drain's until it releases it.
            cordon: previous.and_then(|p| p.cordon),
            terminating: false,
            drain_released: false,
        };
        self.state.nodes.insert(node.clone(), row);
        self.touch(RowKey::Node(node.clone()));
        Ok(Applied::Registered { epoch })
    }

    /// Removes a fenced node row nothing refers to any more, with its takeover rows.
    pub(super) fn reap_node(&mut self, proposer: &Proposer, node: &NodeId, epoch: Epoch) -> Outcome {
        self.privileged(proposer)?;
        let row = self.node_row(node)?;
        if row.epoch != epoch || !row.fenced {
            return Err(reject(
                RejectCode::Conflict,
                format!(
                    "node '{node}' is at epoch {}, fenced {}; only a fenced row is reaped",
                    row.epoch, row.fenced
                ),
            ));
        }
        if row.kind == NodeKind::Metad {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("node '{node}' is a metad replica; its row stays"),
            ));
        }
        // As many owners as incarnations holding streams, not as many as streams.
        if let Some(owner) = self
            .state
            .streams
            .owners()
            .find_map(|(o, _)| o.filter(|o| &o.node == node))
        {
            return Err(reject(
                RejectCode::Conflict,
                format!("node '{node}' still holds streams (as {owner})"),
            ));
        }
        let takeovers: Vec<(NodeId, Epoch)> = self
            .state
            .takeovers
            .range((node.clone(), Epoch(0))..=(node.clone(), Epoch(u64::MAX)))
            .map(|(k, _)| k.clone())
            .collect();
        if takeovers
            .iter()
            .any(|k| self.state.takeovers[k].state == TakeoverState::Pending)
        {
            return Err(reject(
                RejectCode::Conflict,
                format!("a takeover of node '{node}' is under way"),
            ));
        }
        let changes = (row.kind == NodeKind::Gatewayd).then(|| crate::model::leader_epochs::gateway_row_changes(row));
        let counters = &mut self.state.counters;
        counters.reaped_epoch_floor = counters.reaped_epoch_floor.max(epoch.0);
        counters.retired_gateway_changes += changes.unwrap_or(0);
        self.touch(RowKey::Counters);
        self.state.nodes.remove(node);
        self.touch(RowKey::Node(node.clone()));
        for (dead, at) in takeovers {
            self.state.takeovers.remove(&(dead.clone(), at));
            self.touch(RowKey::Takeover(dead, at));
        }
        Ok(Applied::Done)
    }

    pub(super) fn heartbeat(&mut self, proposer: &Proposer) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let index = self.index;
        let row = self.state.nodes.get_mut(&who.node).expect("checked live");
        row.heartbeats += 1;
        row.last_heartbeat_index = index;
        self.touch(RowKey::Node(who.node));
        Ok(Applied::Done)
    }

    /// FO-FEN-1, FO-FEN-2, INV-4: applies only on an exact match of an unfenced row.
    pub(super) fn fence_node(
        &mut self,
        proposer: &Proposer,
        node: &NodeId,
        epoch: Epoch,
        seen_heartbeats: u64,
    ) -> Outcome {
        self.privileged(proposer)?;
        let row = self.node_row(node)?;
        if row.epoch != epoch || row.heartbeats != seen_heartbeats || row.fenced {
            return Err(reject(
                RejectCode::Conflict,
                format!(
                    "node '{node}' is at epoch {} with {} heartbeats (fenced: {}), not epoch {epoch} with {seen_heartbeats}",
                    row.epoch, row.heartbeats, row.fenced
                ),
            ));
        }
        self.set_fenced(node);
        Ok(Applied::Done)
    }

    /// FO-FEN-3: unconditional on the count, but only for the current incarnation (FO-FEN-4).
    pub(super) fn fence_self(&mut self, proposer: &Proposer) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        self.set_fenced(&who.node);
        Ok(Applied::Done)
    }

    pub(super) fn set_fenced(&mut self, node: &NodeId) {
        let index = self.index;
        let row = self.state.nodes.get_mut(node).expect("caller checked the row");
        row.fenced = true;
        row.fenced_index = Some(index);
        self.touch(RowKey::Node(node.clone()));
    }

    pub(super) fn mark_terminating(&mut self, proposer: &Proposer) -> Outcome {
        let who = self.node_proposer(proposer)?.clone();
        let row = self.state.nodes.get_mut(&who.node).expect("checked live");
        if !row.terminating {
            row.terminating = true;
            self.touch(RowKey::Node(who.node));
        }
        Ok(Applied::Done)
    }

    pub(super) fn cordon(&mut self, proposer: &Proposer, node: &NodeId, by: CordonBy) -> Outcome {
        self.check_cordon_proposer(proposer, node, by)?;
        let row = self.node_row(node)?;
        if by == CordonBy::Drain && row.drain_released {
            // The stopping node gave up on its drain and released the cordon: this is
            // that drain's request arriving late (SD-REL-1).
            return Err(reject(
                RejectCode::Conflict,
                format!("node '{node}' released its drain cordon; this incarnation is not drained again"),
            ));
        }
        match (row.cordon, by) {
            // Already cordoned: an operator's cordon is remembered, never downgraded.
            (Some(CordonBy::Operator), _) | (Some(CordonBy::Drain), CordonBy::Drain) => Ok(Applied::Done),
            _ => {
                self.state.nodes.get_mut(node).expect("checked").cordon = Some(by);
                self.touch(RowKey::Node(node.clone()));
                Ok(Applied::Done)
            }
        }
    }

    pub(super) fn uncordon(&mut self, proposer: &Proposer, node: &NodeId, by: CordonBy) -> Outcome {
        self.check_cordon_proposer(proposer, node, by)?;
        let row = self.node_row(node)?;
        let release = by == CordonBy::Drain && !row.drain_released;
        let clear = match (row.cordon, by) {
            // A drain releases only the cordon it set (SD-REL).
            (Some(CordonBy::Operator), CordonBy::Drain) | (None, _) => false,
            _ => true,
        };
        if release || clear {
            let row = self.state.nodes.get_mut(node).expect("checked");
            if clear {
                row.cordon = None;
            }
            row.drain_released |= release;
            self.touch(RowKey::Node(node.clone()));
        }
        Ok(Applied::Done)
    }

    /// Operators cordon any node; a node sets or releases only its own drain cordon (SD-DRN-10).
    pub(super) fn check_cordon_proposer(
        &self,
        proposer: &Proposer,
        node: &NodeId,
        by: CordonBy,
    ) -> Result<(), Rejection> {
        match (proposer, by) {
            (Proposer::Operator { .. }, CordonBy::Operator) => Ok(()),
            (Proposer::Node(who), CordonBy::Drain) if &who.node == node => self.live_node(who).map(|_| ()),
            (Proposer::Node(who), CordonBy::Drain) => Err(reject(
                RejectCode::InvalidArgument,
                format!("node '{}' may drain only itself, not '{node}'", who.node),
            )),
            (_, CordonBy::Operator) => Err(reject(
                RejectCode::InvalidArgument,
                "only an operator sets or clears an operator cordon",
            )),
            (Proposer::Operator { .. }, CordonBy::Drain) => Err(reject(
                RejectCode::InvalidArgument,
                "a drain cordon is set only by the draining node",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_log::{node, op, Log};
    use crate::model::command::RejectCode;
    use crate::model::rows::*;
    use crate::model::Command;
    use weir_shared::ids::NodeId;

    // FO-LIV-14: one clock for the whole cluster. Initialising again with the same
    // settings is harmless, with others a conflict; a node whose heartbeat interval or
    // node timeout differs (either one alone) does not register.
    #[test]
    fn the_cluster_keeps_one_clock() {
        let mut log = Log::new();
        let init = |heartbeat_interval_sec, node_timeout_sec| Command::InitCluster {
            settings: ClusterSettings {
                heartbeat_interval_sec,
                node_timeout_sec,
            },
        };
        assert_eq!(log.apply(op(), init(1, 3)), Ok(crate::model::command::Applied::Done));
        assert_eq!(log.apply(op(), init(1, 4)), Err(RejectCode::Conflict));
        assert_eq!(log.apply(op(), init(2, 3)), Err(RejectCode::Conflict));
        let register = |heartbeat_interval_sec, node_timeout_sec| Command::RegisterNode {
            node: NodeId::new("m"),
            kind: NodeKind::Streamd,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec,
            node_timeout_sec,
        };
        assert_eq!(log.apply(op(), register(1, 4)), Err(RejectCode::InvalidArgument));
        assert_eq!(log.apply(op(), register(2, 3)), Err(RejectCode::InvalidArgument));
        assert!(!log.meta.state.nodes.contains_key(&NodeId::new("m")));
        assert!(log.apply(op(), register(1, 3)).is_ok());
    }

    // A fenced row is reaped only once no takeover of it is pending: the takeover's
    // agent still needs the row; a finished takeover goes with it.
    #[test]
    fn a_fenced_row_is_reaped_only_once_its_takeover_is_over() {
        use weir_shared::ids::{Epoch, Incarnation};
        let mut log = Log::new();
        let m = NodeId::new("m");
        log.apply(
            op(),
            Command::RegisterNode {
                node: m.clone(),
                kind: NodeKind::Streamd,
                addrs: NodeAddrs::default(),
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            },
        )
        .expect("register m");
        let epoch = log.meta.state.nodes[&m].epoch;
        log.apply(
            op(),
            Command::FenceNode {
                node: m.clone(),
                epoch,
                seen_heartbeats: 0,
            },
        )
        .expect("fence m");
        let key = (m.clone(), epoch);
        log.meta.state.takeovers.insert(
            key.clone(),
            TakeoverRow {
                dead: Incarnation { node: m.clone(), epoch },
                agent: Some(Incarnation {
                    node: NodeId::new("n"),
                    epoch: Epoch(1),
                }),
                state: TakeoverState::Pending,
            },
        );
        let reap = Command::ReapNode { node: m.clone(), epoch };
        assert_eq!(log.apply(op(), reap.clone()), Err(RejectCode::Conflict));
        assert!(log.meta.state.nodes.contains_key(&m));
        log.meta.state.takeovers.get_mut(&key).expect("row").state = TakeoverState::Done;
        assert!(log.apply(op(), reap).is_ok());
        assert!(!log.meta.state.nodes.contains_key(&m));
        assert!(
            !log.meta.state.takeovers.contains_key(&key),
            "its takeover rows go with it"
        );
    }

    fn cordon(by: CordonBy) -> Command {
        Command::Cordon {
            node: NodeId::new("n"),
            by,
        }
    }

    fn uncordon(by: CordonBy) -> Command {
        Command::Uncordon {
            node: NodeId::new("n"),
            by,
        }
    }

    fn row(log: &Log) -> NodeRow {
        log.meta.state.nodes[&NodeId::new("n")].clone()
    }

    /// SD-REL-1, SD-REL-4: a stopping node that released its drain cordon (its drain
    /// request unanswered) is not cordoned again when that request reaches the leader
    /// late; the next incarnation may drain again.
    #[test]
    fn a_drain_arriving_after_its_cordon_was_released_cordons_nothing() {
        let mut log = Log::new();
        log.apply(node(), uncordon(CordonBy::Drain))
            .expect("release of a cordon never set");
        assert_eq!(row(&log).cordon, None);
        assert!(row(&log).drain_released);
        assert_eq!(log.apply(node(), cordon(CordonBy::Drain)), Err(RejectCode::Conflict));
        // SD-REL-4: the release sent for an unanswered drain request still holds: the request,
        // arriving after it, leaves no cordon behind.
        assert_eq!(row(&log).cordon, None, "the late drain cordoned nothing");
        // An operator's cordon is another matter.
        log.apply(op(), cordon(CordonBy::Operator)).expect("operator cordon");
        assert_eq!(row(&log).cordon, Some(CordonBy::Operator));
        log.apply(op(), uncordon(CordonBy::Operator))
            .expect("operator uncordon");
        log.register_n().expect("re-register");
        assert!(!row(&log).drain_released, "a new incarnation starts afresh");
    }

    /// Issue 22: a gateway joining and leaving (stopping or fenced) each raise every
    /// partition's leader epoch once; its heartbeats and streamd changes do not. The
    /// count is derived from the node rows, which every release applies alike.
    #[test]
    fn every_change_to_the_live_gateways_raises_the_leader_epochs() {
        use crate::model::command::Proposer;
        use crate::model::leader_epochs::{current, gateway_changes};
        use weir_shared::ids::{Epoch, Incarnation};
        let mut log = Log::new();
        let changes = |log: &Log| gateway_changes(&log.meta.state);
        let epoch_of_a = |log: &Log| current(log.row(0), changes(log));
        let before = epoch_of_a(&log);
        let register = Command::RegisterNode {
            node: NodeId::new("gw"),
            kind: NodeKind::Gatewayd,
            addrs: NodeAddrs::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        log.apply(op(), register.clone()).expect("register gateway");
        let joined = changes(&log);
        assert!(epoch_of_a(&log) > before);
        let gw = |epoch| {
            Proposer::Node(Incarnation {
                node: NodeId::new("gw"),
                epoch: Epoch(epoch),
            })
        };
        log.apply(gw(1), Command::Heartbeat).expect("heartbeat");
        log.register_n().expect("a streamd registers again");
        assert_eq!(
            changes(&log),
            joined,
            "heartbeats and streamd changes are not gateway changes"
        );
        log.apply(gw(1), Command::MarkTerminating).expect("terminating");
        assert_eq!(changes(&log), joined + 1, "a stopping gateway leaves the brokers");
        log.apply(gw(1), Command::FenceSelf).expect("fence self");
        assert_eq!(changes(&log), joined + 1, "it left once");
        log.apply(op(), register).expect("the gateway returns");
        assert_eq!(changes(&log), joined + 2, "and joins again");
        assert_eq!(epoch_of_a(&log), before + i32::try_from(joined + 2).unwrap());
    }

    /// SD-DRN-10, SD-REL: an operator's cordon outranks a drain's: a drain neither
    /// downgrades nor releases it, and releasing a drain sets no release mark on an
    /// operator's uncordon. A node drains only itself; an operator sets no drain cordon.
    #[test]
    fn an_operators_cordon_outranks_a_drain_and_a_node_drains_only_itself() {
        use crate::model::command::Proposer;
        use weir_shared::ids::Incarnation;
        let mut log = Log::new();
        log.apply(op(), cordon(CordonBy::Operator)).expect("operator cordon");
        log.apply(node(), cordon(CordonBy::Drain))
            .expect("drain on a cordoned node");
        assert_eq!(row(&log).cordon, Some(CordonBy::Operator), "not downgraded");
        log.apply(node(), uncordon(CordonBy::Drain)).expect("drain released");
        assert_eq!(
            row(&log).cordon,
            Some(CordonBy::Operator),
            "a drain releases only its own"
        );
        log.register_n().expect("a new incarnation");
        log.apply(op(), uncordon(CordonBy::Operator))
            .expect("operator uncordon");
        assert_eq!(row(&log).cordon, None);
        assert!(!row(&log).drain_released, "an operator's uncordon is no drain release");
        let Ok(crate::model::command::Applied::Registered { epoch }) = log.apply(
            op(),
            Command::RegisterNode {
                node: NodeId::new("m"),
                kind: NodeKind::Streamd,
                addrs: NodeAddrs::default(),
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            },
        ) else {
            panic!("register m")
        };
        let m = Proposer::Node(Incarnation {
            node: NodeId::new("m"),
            epoch,
        });
        assert_eq!(log.apply(m, cordon(CordonBy::Drain)), Err(RejectCode::InvalidArgument));
        assert_eq!(
            log.apply(op(), cordon(CordonBy::Drain)),
            Err(RejectCode::InvalidArgument)
        );
        assert_eq!(row(&log).cordon, None);
    }

    /// A drain cordon set and released in order, as a completed stop does.
    #[test]
    fn a_drain_cordon_is_set_then_released_by_its_node() {
        let mut log = Log::new();
        log.apply(node(), cordon(CordonBy::Drain)).expect("drain cordon");
        assert_eq!(row(&log).cordon, Some(CordonBy::Drain));
        log.apply(node(), uncordon(CordonBy::Drain)).expect("release");
        assert_eq!(row(&log).cordon, None);
        assert!(row(&log).drain_released);
    }
}
