//! What a caller's certificate lets it ask of metad (D-21, issue 18). On an mTLS
//! cluster the caller's role and id come from its certificate: a streamd or gatewayd
//! proposes node commands only as itself, registers only itself, and a gatewayd
//! proposes as an operator only the user-level commands it serves on its users'
//! behalf. metad peers (forwarding for their callers, or running the failover loop) and
//! operator certificates may propose anything the state machine accepts. On a
//! plaintext cluster there is no caller and nothing to check here.

use tonic::Status;
use weir_meta::model::command::{Command, Proposal, Proposer};
use weir_meta::model::rows::{CordonBy, NodeKind};
use weir_shared::ids::Incarnation;
use weir_shared::peer::{Identity, Role};

/// Whether `caller` may propose `p`.
pub fn proposal(caller: Option<&Identity>, p: &Proposal) -> Result<(), Status> {
    let Some(who) = caller else { return Ok(()) };
    if matches!(who.role, Role::Metad | Role::Operator) {
        return Ok(());
    }
    // Registration names the node in the command, whoever proposes it.
    if let Command::RegisterNode { node, kind, .. } = &p.command {
        if node.as_str() == who.id && kind_of(who.role) == Some(*kind) {
            return Ok(());
        }
        return Err(denied(format!("{who} may not register node '{node}'")));
    }
    match &p.proposer {
        Proposer::Node(inc) if inc.node.as_str() != who.id => {
            Err(denied(format!("{who} may not propose as node '{}'", inc.node)))
        }
        // The state machine lets any live node propose privileged commands (fencing,
        // placement, takeovers); a node's certificate allows only what its role does.
        Proposer::Node(_) if node_command_of(who.role, &p.command) => Ok(()),
        Proposer::Operator { .. } if who.role == Role::Gatewayd && on_users_behalf(&p.command) => Ok(()),
        Proposer::Node(_) => Err(denied(format!("{who} may not propose {} as a node", p.command.kind()))),
        Proposer::Operator { .. } => Err(denied(format!(
            "{who} may not propose {} as an operator",
            p.command.kind()
        ))),
    }
}

/// What a node of `role` proposes as itself: its liveness, and for a streamd what it
/// does with the streams it owns (opening, commits, compaction, retention, takeovers of
/// a failed node's WAL, damage reports, a drain's cordon).
fn node_command_of(role: Role, c: &Command) -> bool {
    let liveness = matches!(c, Command::Heartbeat | Command::FenceSelf | Command::MarkTerminating);
    match role {
        Role::Gatewayd => liveness,
        Role::Streamd => {
            liveness
                || matches!(
                    c,
                    Command::OpenStream { .. }
                        | Command::CloseStream { .. }
                        | Command::CommitObjects { .. }
                        | Command::CompactObjects { .. }
                        | Command::CompactStreams { .. }
                        | Command::TrimStream { .. }
                        | Command::DestroyStream { .. }
                        | Command::CompleteTakeover { .. }
                        | Command::ReportDamage { .. }
                        | Command::Cordon {
                            by: CordonBy::Drain,
                            ..
                        }
                        | Command::Uncordon {
                            by: CordonBy::Drain,
                            ..
                        }
                )
        }
        Role::Metad | Role::Operator => true,
    }
}

/// Whether `caller` may ask for a drain: of node `node` (an operator's drain), or of
/// `requester` itself (a stopping node's own drain, SD-DRN-3).
pub fn drain(caller: Option<&Identity>, node: &str, requester: Option<&Incarnation>) -> Result<(), Status> {
    let Some(who) = caller else { return Ok(()) };
    match (who.role, requester) {
        (Role::Metad | Role::Operator, _) => Ok(()),
        (Role::Streamd, Some(r)) if r.node.as_str() == who.id => Ok(()),
        (Role::Streamd, Some(r)) => Err(denied(format!("{who} may not drain node '{}'", r.node))),
        // A user's drain through the HTTP API (`POST /v1/admin/nodes/{id}/drain`).
        (Role::Gatewayd, None) => Ok(()),
        _ => Err(denied(format!("{who} may not drain node '{node}'"))),
    }
}

fn kind_of(role: Role) -> Option<NodeKind> {
    match role {
        Role::Streamd => Some(NodeKind::Streamd),
        Role::Gatewayd => Some(NodeKind::Gatewayd),
        Role::Metad | Role::Operator => None,
    }
}

/// What a gateway proposes for the users it authenticated (HTTP API and Kafka):
/// streams, topics and their configs, tokens, producer ids, an operator's cordon.
fn on_users_behalf(c: &Command) -> bool {
    matches!(
        c,
        Command::CreateTopic { .. }
            | Command::DeleteTopic { .. }
            | Command::CreatePartitions { .. }
            | Command::CreateStream { .. }
            | Command::DeleteStream { .. }
            | Command::AlterConfig { .. }
            | Command::IssueToken { .. }
            | Command::RevokeToken { .. }
            | Command::AllocateProducerIds { .. }
            | Command::Cordon {
                by: CordonBy::Operator,
                ..
            }
            | Command::Uncordon {
                by: CordonBy::Operator,
                ..
            }
    )
}

fn denied(why: String) -> Status {
    Status::permission_denied(why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_shared::ids::{Epoch, NodeId};

    fn who(role: Role, id: &str) -> Identity {
        Identity { role, id: id.into() }
    }

    fn as_node(node: &str, command: Command) -> Proposal {
        Proposal {
            proposer: Proposer::Node(Incarnation {
                node: NodeId::new(node),
                epoch: Epoch(1),
            }),
            command,
        }
    }

    fn as_operator(command: Command) -> Proposal {
        Proposal {
            proposer: Proposer::Operator { principal: "x".into() },
            command,
        }
    }

    #[test]
    fn a_node_proposes_only_as_itself_and_a_gateway_only_for_its_users() {
        let s1 = who(Role::Streamd, "s1");
        let gw = who(Role::Gatewayd, "gw");
        assert!(proposal(Some(&s1), &as_node("s1", Command::Heartbeat)).is_ok());
        let err = proposal(Some(&s1), &as_node("s2", Command::Heartbeat)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert_eq!(err.message(), "streamd 's1' may not propose as node 's2'");
        assert!(proposal(Some(&gw), &as_node("s1", Command::FenceSelf)).is_err());
        assert!(proposal(Some(&gw), &as_node("gw", Command::FenceSelf)).is_ok());
        // A live node's privileges in the state machine are not its certificate's.
        let fence_s2 = Command::FenceNode {
            node: NodeId::new("s2"),
            epoch: Epoch(1),
            seen_heartbeats: 3,
        };
        let err = proposal(Some(&gw), &as_node("gw", fence_s2.clone())).unwrap_err();
        assert_eq!(err.message(), "gatewayd 'gw' may not propose fence_node as a node");
        assert!(proposal(Some(&s1), &as_node("s1", fence_s2)).is_err());
        // Registration is checked whoever the proposer claims to be.
        let register = |node: &str, kind| Command::RegisterNode {
            node: NodeId::new(node),
            kind,
            addrs: Default::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        assert!(proposal(Some(&s1), &as_node("s1", register("s2", NodeKind::Streamd))).is_err());
        assert!(proposal(Some(&s1), &as_operator(register("s2", NodeKind::Streamd))).is_err());
        assert!(proposal(Some(&s1), &as_operator(register("s1", NodeKind::Gatewayd))).is_err());
        assert!(proposal(Some(&s1), &as_operator(register("s1", NodeKind::Streamd))).is_ok());
        let fence = Command::FenceNode {
            node: NodeId::new("s2"),
            epoch: Epoch(1),
            seen_heartbeats: 3,
        };
        assert!(proposal(Some(&gw), &as_operator(fence.clone())).is_err());
        assert!(proposal(Some(&s1), &as_operator(fence.clone())).is_err());
        assert!(proposal(Some(&who(Role::Operator, "ops")), &as_operator(fence.clone())).is_ok());
        assert!(proposal(Some(&who(Role::Metad, "1")), &as_node("s2", Command::Heartbeat)).is_ok());
        assert!(
            proposal(None, &as_operator(fence)).is_ok(),
            "plaintext: nothing to check"
        );
        let cordon = Command::Cordon {
            node: NodeId::new("s1"),
            by: CordonBy::Operator,
        };
        assert!(proposal(Some(&gw), &as_operator(cordon)).is_ok());
        assert!(proposal(Some(&s1), &as_operator(Command::RevokeToken { name: "t".into() })).is_err());
    }

    // SD-DRN-10: a node's own drain acts for the node its certificate names.
    #[test]
    fn a_streamd_drains_only_itself() {
        let me = Incarnation {
            node: NodeId::new("s1"),
            epoch: Epoch(3),
        };
        let other = Incarnation {
            node: NodeId::new("s2"),
            epoch: Epoch(3),
        };
        let s1 = who(Role::Streamd, "s1");
        assert!(drain(Some(&s1), "", Some(&me)).is_ok());
        assert!(drain(Some(&s1), "", Some(&other)).is_err());
        assert!(drain(Some(&s1), "s2", None).is_err());
        assert!(drain(Some(&who(Role::Gatewayd, "gw")), "s2", None).is_ok());
        assert!(drain(Some(&who(Role::Gatewayd, "gw")), "", Some(&me)).is_err());
    }
}
