//! What a caller's certificate lets it ask of metad (D-21, issue 18). On an mTLS
//! cluster the caller's role and id come from its certificate: a streamd or gatewayd
//! proposes node commands only as itself and registers only itself. A gatewayd
//! proposes user-level commands in the name of the user it authenticated, and those
//! are checked against that user's token ([`Users`]), so a gateway certificate alone
//! grants nothing a user could not do. metad peers (forwarding for their callers, or
//! running the failover loop) and operators (a certificate, or an admin token) may
//! propose anything the state machine accepts. On a plaintext cluster there is no
//! caller and nothing to check here.

use crate::store::ViewHub;
use std::collections::BTreeMap;
use std::sync::Arc;
use tonic::Status;
use weir_meta::model::acls::Acls;
use weir_meta::model::command::{Command, Proposal, Proposer};
use weir_meta::model::grants::Grants;
use weir_meta::model::names::{ANONYMOUS, OFFSETS_TOPIC, TXN_STATE_TOPIC};
use weir_meta::model::rows::{CordonBy, NodeKind, TokenRow};
use weir_meta::model::scopes::Scopes;
use weir_meta::model::user_commands::{needed, Need};
use weir_shared::ids::Incarnation;
use weir_shared::peer::{Identity, Role};

/// What metad knows of the users a gateway acts for: their tokens, the time their
/// expiry is judged at, and whether gateways without `--auth` may change metadata.
pub struct Users<'a> {
    pub tokens: &'a BTreeMap<String, TokenRow>,
    /// The cluster's ACLs, which a user's request is judged against with its scopes.
    pub acls: &'a Acls,
    pub now_ms: u64,
    pub allow_anonymous: bool,
}

impl Users<'_> {
    /// Whether user `principal` (a token's name) may have `need` met, or why not.
    fn may(&self, principal: &str, need: &Need<'_>) -> Result<(), String> {
        if principal == ANONYMOUS {
            return match self.allow_anonymous {
                true => Ok(()),
                false => Err("the gateway's users are anonymous (it runs without --auth); \
                     run it with --auth, or metad with --allow-anonymous-gateways"
                    .into()),
            };
        }
        let token = self
            .tokens
            .get(principal)
            .ok_or_else(|| format!("no token '{principal}'"))?;
        if let Some(why) = token.refusal(self.now_ms) {
            return Err(why);
        }
        match need.met_by(&Grants::for_token(token, self.acls.clone())) {
            true => Ok(()),
            false => Err(need.refusal(principal)),
        }
    }

    /// Why a gateway may not propose `c` for any user: an admin token reaches metad
    /// directly (`weir --token`) as an operator, so only operators issue or revoke
    /// one. A gateway that could would turn the name of an admin user it knows into
    /// operator rights.
    fn operators_only(&self, c: &Command) -> Option<String> {
        let admin = |scopes: &[String]| Scopes::parse(scopes).is_ok_and(|s| s.is_admin());
        match c {
            Command::IssueToken { scopes, .. } if admin(scopes) => {
                Some("an admin token is issued by an operator (weir tokens issue), not through a gateway".into())
            }
            Command::RevokeToken { name } if self.tokens.get(name).is_some_and(|t| admin(&t.scopes)) => {
                Some("an admin token is revoked by an operator (weir tokens revoke), not through a gateway".into())
            }
            // Setting an admin token's password through a gateway would log its setter
            // in as that admin (issue 59).
            Command::SetScramCredential { name, .. } if self.tokens.get(name).is_some_and(|t| admin(&t.scopes)) => {
                Some("an admin token's SCRAM credentials are set by an operator, not through a gateway".into())
            }
            _ => None,
        }
    }
}

/// Where metad finds its [`Users`]: the applied state's tokens, judged at the time of
/// the call.
#[derive(Clone)]
pub struct Directory {
    hub: Arc<ViewHub>,
    allow_anonymous: bool,
}

impl Directory {
    pub fn new(hub: Arc<ViewHub>, allow_anonymous: bool) -> Self {
        Directory { hub, allow_anonymous }
    }

    pub fn with<R>(&self, f: impl FnOnce(&Users<'_>) -> R) -> R {
        let now_ms = weir_meta::model::rows::now_ms();
        self.hub.with_state(|s| {
            f(&Users {
                tokens: &s.tokens,
                acls: &s.acls,
                now_ms,
                allow_anonymous: self.allow_anonymous,
            })
        })
    }
}

/// Whether `caller` may propose `p`.
pub fn proposal(caller: Option<&Identity>, p: &Proposal, users: &Users<'_>) -> Result<(), Status> {
    let Some(who) = caller else { return Ok(()) };
    match (who.role, &p.proposer) {
        (Role::Metad, _) => return Ok(()),
        // An operator (a certificate, or an admin token) acts as itself, never as a
        // node: a node's commits, takeovers and liveness are its own.
        (Role::Operator, Proposer::Node(inc)) => {
            return Err(denied(format!("{who} may not propose as node '{}'", inc.node)));
        }
        (Role::Operator, Proposer::Operator { .. }) => return Ok(()),
        _ => {}
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
        Proposer::Operator { principal } if who.role == Role::Gatewayd => match needed(&p.command) {
            Some(need) => users
                .may(principal, &need)
                .and_then(|()| users.operators_only(&p.command).map_or(Ok(()), Err))
                .map_err(|why| {
                    denied(format!(
                        "{who} may not propose {} for user '{principal}': {why}",
                        p.command.kind()
                    ))
                }),
            None => Err(denied(format!(
                "{who} may not propose {} as an operator",
                p.command.kind()
            ))),
        },
        Proposer::Node(_) => Err(denied(format!("{who} may not propose {} as a node", p.command.kind()))),
        Proposer::Operator { .. } => Err(denied(format!(
            "{who} may not propose {} as an operator",
            p.command.kind()
        ))),
    }
}

/// What a node of `role` proposes as itself: its liveness, and for a streamd what it
/// does with the streams it owns (opening, commits, compaction, retention, takeovers of
/// a failed node's WAL, damage reports, a drain's cordon); for a gatewayd, creating the
/// internal topics its group and transaction coordinators need.
fn node_command_of(role: Role, c: &Command) -> bool {
    let liveness = matches!(c, Command::Heartbeat | Command::FenceSelf | Command::MarkTerminating);
    match role {
        Role::Gatewayd => {
            liveness
                || matches!(c, Command::CreateTopic { name, .. } | Command::CreatePartitions { name, .. }
                    if name == OFFSETS_TOPIC || name == TXN_STATE_TOPIC)
        }
        Role::Streamd => {
            liveness
                || matches!(
                    c,
                    Command::OpenStream { .. }
                        | Command::OpenStreams { .. }
                        | Command::CloseStream { .. }
                        | Command::CloseStreams { .. }
                        | Command::CommitObjects { .. }
                        | Command::CompactObjects { .. }
                        | Command::CompactStreams { .. }
                        | Command::TrimStream { .. }
                        | Command::DestroyStream { .. }
                        | Command::ForgetReleased { .. }
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

/// Whether `caller` may ask for a drain: of node `node` (an operator's drain, or a
/// user's through a gateway, who needs the `admin` scope), or of `requester` itself (a
/// stopping node's own drain, SD-DRN-3).
pub fn drain(
    caller: Option<&Identity>,
    node: &str,
    requester: Option<&Incarnation>,
    principal: &str,
    users: &Users<'_>,
) -> Result<(), Status> {
    let Some(who) = caller else { return Ok(()) };
    match (who.role, requester) {
        (Role::Metad | Role::Operator, _) => Ok(()),
        (Role::Streamd, Some(r)) if r.node.as_str() == who.id => Ok(()),
        (Role::Streamd, Some(r)) => Err(denied(format!("{who} may not drain node '{}'", r.node))),
        // A user's drain through the HTTP API (`POST /admin/nodes/{id}/drain`).
        (Role::Gatewayd, None) => admin_user(who, principal, users, &format!("drain node '{node}'")),
        _ => Err(denied(format!("{who} may not drain node '{node}'"))),
    }
}

/// Whether `caller` may move a stream by planned transfer: an operator, a metad peer,
/// or a gateway for a user with the `admin` scope; never a node.
pub fn transfer(caller: Option<&Identity>, stream: &str, principal: &str, users: &Users<'_>) -> Result<(), Status> {
    let Some(who) = caller else { return Ok(()) };
    match who.role {
        Role::Metad | Role::Operator => Ok(()),
        Role::Gatewayd => admin_user(who, principal, users, &format!("move stream '{stream}'")),
        Role::Streamd => Err(denied(format!("{who} may not call Transfer"))),
    }
}

/// A gateway's admin action for user `principal`, who needs the `admin` scope.
fn admin_user(who: &Identity, principal: &str, users: &Users<'_>, what: &str) -> Result<(), Status> {
    users
        .may(principal, &Need::Admin)
        .map_err(|why| denied(format!("{who} may not {what} for user '{principal}': {why}")))
}

fn kind_of(role: Role) -> Option<NodeKind> {
    match role {
        Role::Streamd => Some(NodeKind::Streamd),
        Role::Gatewayd => Some(NodeKind::Gatewayd),
        Role::Metad | Role::Operator => None,
    }
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
        as_user("x", command)
    }

    fn as_user(principal: &str, command: Command) -> Proposal {
        Proposal {
            proposer: Proposer::Operator {
                principal: principal.into(),
            },
            command,
        }
    }

    fn token(name: &str, scopes: &[&str], revoked: bool, expires_at_ms: Option<u64>) -> (String, TokenRow) {
        let row = TokenRow {
            name: name.into(),
            secret_sha256: String::new(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            revoked,
            issued_index: 1,
            expires_at_ms,
            scram: None,
        };
        (name.to_string(), row)
    }

    /// Users: `ops` (admin), `orders` (manage:orders-), `reader` (read), `gone`
    /// (revoked) and `late` (expired at 1,000 ms; the time is 2,000 ms).
    fn tokens() -> BTreeMap<String, TokenRow> {
        [
            token("ops", &["admin"], false, None),
            token("orders", &["manage:orders-", "write:orders-"], false, None),
            token("reader", &["read"], false, None),
            token("gone", &["admin"], true, None),
            token("late", &["admin"], false, Some(1_000)),
        ]
        .into_iter()
        .collect()
    }

    fn users(tokens: &BTreeMap<String, TokenRow>, allow_anonymous: bool) -> Users<'_> {
        Users {
            tokens,
            acls: Box::leak(Box::default()),
            now_ms: 2_000,
            allow_anonymous,
        }
    }

    fn proposal_as(caller: Option<&Identity>, p: &Proposal) -> Result<(), Status> {
        proposal(caller, p, &users(&tokens(), false))
    }

    #[test]
    fn a_node_proposes_only_as_itself_and_a_gateway_only_for_its_users() {
        let s1 = who(Role::Streamd, "s1");
        let gw = who(Role::Gatewayd, "gw");
        assert!(proposal_as(Some(&s1), &as_node("s1", Command::Heartbeat)).is_ok());
        let err = proposal_as(Some(&s1), &as_node("s2", Command::Heartbeat)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert_eq!(err.message(), "streamd 's1' may not propose as node 's2'");
        assert!(proposal_as(Some(&gw), &as_node("s1", Command::FenceSelf)).is_err());
        assert!(proposal_as(Some(&gw), &as_node("gw", Command::FenceSelf)).is_ok());
        // A live node's privileges in the state machine are not its certificate's.
        let fence_s2 = Command::FenceNode {
            node: NodeId::new("s2"),
            epoch: Epoch(1),
            seen_heartbeats: 3,
        };
        let err = proposal_as(Some(&gw), &as_node("gw", fence_s2.clone())).unwrap_err();
        assert_eq!(err.message(), "gatewayd 'gw' may not propose fence_node as a node");
        assert!(proposal_as(Some(&s1), &as_node("s1", fence_s2)).is_err());
        // Registration is checked whoever the proposer claims to be.
        let register = |node: &str, kind| Command::RegisterNode {
            node: NodeId::new(node),
            kind,
            addrs: Default::default(),
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        assert!(proposal_as(Some(&s1), &as_node("s1", register("s2", NodeKind::Streamd))).is_err());
        assert!(proposal_as(Some(&s1), &as_operator(register("s2", NodeKind::Streamd))).is_err());
        assert!(proposal_as(Some(&s1), &as_operator(register("s1", NodeKind::Gatewayd))).is_err());
        assert!(proposal_as(Some(&s1), &as_operator(register("s1", NodeKind::Streamd))).is_ok());
        let fence = Command::FenceNode {
            node: NodeId::new("s2"),
            epoch: Epoch(1),
            seen_heartbeats: 3,
        };
        assert!(proposal_as(Some(&gw), &as_operator(fence.clone())).is_err());
        assert!(proposal_as(Some(&s1), &as_operator(fence.clone())).is_err());
        assert!(proposal_as(Some(&who(Role::Operator, "ops")), &as_operator(fence.clone())).is_ok());
        assert!(proposal_as(Some(&who(Role::Metad, "1")), &as_node("s2", Command::Heartbeat)).is_ok());
        assert!(
            proposal_as(None, &as_operator(fence)).is_ok(),
            "plaintext: nothing to check"
        );
        let cordon = Command::Cordon {
            node: NodeId::new("s1"),
            by: CordonBy::Operator,
        };
        assert!(proposal_as(Some(&gw), &as_user("ops", cordon)).is_ok());
        assert!(proposal_as(Some(&s1), &as_operator(Command::RevokeToken { name: "t".into() })).is_err());
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
        let tokens = tokens();
        let users = users(&tokens, false);
        // SD-DRN-10: a streamd's certificate drains that node, with no user credential...
        assert!(drain(Some(&s1), "", Some(&me), "", &users).is_ok());
        // SD-DRN-10: ...and no other node, whether as the requester or named with a user.
        assert!(drain(Some(&s1), "", Some(&other), "", &users).is_err());
        assert!(drain(Some(&s1), "s2", None, "ops", &users).is_err());
        let gw = who(Role::Gatewayd, "gw");
        assert!(drain(Some(&gw), "s2", None, "ops", &users).is_ok());
        // SD-DRN-10: a gateway's certificate cannot make a stopping node's drain.
        assert!(drain(Some(&gw), "", Some(&me), "ops", &users).is_err());
    }

    // Issue 18: a gateway proposes user-level commands in its user's name, and metad
    // checks that user's token: its scopes, prefix, revocation and expiry. A gateway
    // without --auth acts for `anonymous`, refused unless metad allows it.
    #[test]
    fn a_gateway_acts_only_as_its_users_tokens_allow() {
        let gw = who(Role::Gatewayd, "gw");
        let tokens = tokens();
        let strict = users(&tokens, false);
        let create = |name: &str| Command::CreateTopic {
            name: name.into(),
            partitions: 1,
            config: Default::default(),
        };
        let may = |principal: &str, c: Command| proposal(Some(&gw), &as_user(principal, c), &strict);
        assert!(may("orders", create("orders-eu")).is_ok());
        assert!(may("ops", create("payments")).is_ok());
        let err = may("orders", create("payments")).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            err.message(),
            "gatewayd 'gw' may not propose create_topic for user 'orders': \
             user 'orders' may not create topic 'payments'"
        );
        // Issue 59: the cluster's ACLs are judged with the scopes: a deny takes away
        // what a scope grants, an allow grants what none does.
        let mut acls = weir_meta::model::acls::Acls::default();
        use weir_meta::model::acls::{AclBinding, Operation, PatternType, ResourceType};
        let binding = |name: &str, permission| {
            let topic = (PatternType::Literal, name);
            AclBinding::from_any_host("User:orders", ResourceType::Topic, topic, Operation::Create, permission)
        };
        acls.insert(binding("orders-eu", weir_meta::model::acls::Permission::Deny));
        acls.insert(binding("payments", weir_meta::model::acls::Permission::Allow));
        let judged = Users {
            acls: &acls,
            ..users(&tokens, false)
        };
        let may_now = |principal: &str, c: Command| proposal(Some(&gw), &as_user(principal, c), &judged);
        assert!(may_now("orders", create("orders-eu")).is_err());
        assert!(may_now("orders", create("orders-us")).is_ok());
        assert!(may_now("orders", create("payments")).is_ok());
        assert!(may("reader", create("orders-eu")).is_err());
        assert!(may("orders", Command::RevokeToken { name: "ops".into() }).is_err());
        assert!(may("ops", Command::RevokeToken { name: "orders".into() }).is_ok());
        assert!(may("orders", Command::AllocateProducerIds { count: 1 }).is_ok());
        assert!(may("reader", Command::AllocateProducerIds { count: 1 }).is_err());
        for refused in ["gone", "late", "nobody"] {
            assert!(may(refused, create("orders-eu")).is_err(), "{refused}");
        }
        let err = may(ANONYMOUS, create("orders-eu")).unwrap_err();
        assert!(
            err.message().contains("--allow-anonymous-gateways"),
            "{}",
            err.message()
        );
        let lax = users(&tokens, true);
        assert!(proposal(Some(&gw), &as_user(ANONYMOUS, create("x")), &lax).is_ok());
        // Commands no user proposes stay refused whoever the user is.
        let place = Command::PlaceStream {
            stream: weir_shared::ids::StreamId(1),
            node: NodeId::new("s1"),
        };
        assert!(proposal(Some(&gw), &as_user("ops", place), &lax).is_err());
        // As itself, a gateway creates only the internal offsets and transaction-state topics.
        assert!(proposal(Some(&gw), &as_node("gw", create(OFFSETS_TOPIC)), &strict).is_ok());
        assert!(proposal(Some(&gw), &as_node("gw", create(TXN_STATE_TOPIC)), &strict).is_ok());
        assert!(proposal(Some(&gw), &as_node("gw", create("orders-eu")), &strict).is_err());
        // Drains and transfers through a gateway need an admin user.
        assert!(transfer(Some(&gw), "t/0", "ops", &strict).is_ok());
        assert!(transfer(Some(&gw), "t/0", "orders", &strict).is_err());
        assert!(transfer(Some(&who(Role::Streamd, "s1")), "t/0", "ops", &strict).is_err());
        assert!(drain(Some(&gw), "s1", None, "reader", &strict).is_err());
        assert!(drain(Some(&gw), "s1", None, ANONYMOUS, &lax).is_ok());
        // Only operators issue or revoke admin tokens: an admin token reaches metad
        // directly, so a gateway naming an admin user must not mint one.
        let issue = |scopes: &[&str]| Command::IssueToken {
            name: "new".into(),
            secret_sha256: String::new(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            expires_at_ms: None,
            scram: None,
        };
        assert!(may("ops", issue(&["read", "manage:x"])).is_ok());
        let err = may("ops", issue(&["read", "admin"])).unwrap_err();
        assert!(err.message().contains("issued by an operator"), "{}", err.message());
        let err = may("ops", Command::RevokeToken { name: "ops".into() }).unwrap_err();
        assert!(err.message().contains("revoked by an operator"), "{}", err.message());
        // Issue 59: an admin user sets other users' SCRAM credentials through a gateway,
        // never an admin token's (that would log its setter in as that admin); a user
        // without the admin scope sets none.
        let set_scram = |name: &str| Command::SetScramCredential {
            name: name.into(),
            mechanism: "SCRAM-SHA-256".into(),
            scram: None,
        };
        assert!(may("ops", set_scram("orders")).is_ok());
        let err = may("ops", set_scram("ops")).unwrap_err();
        assert!(err.message().contains("set by an operator"), "{}", err.message());
        assert!(may("orders", set_scram("reader")).is_err());
        let ops = who(Role::Operator, "alice");
        assert!(proposal(Some(&ops), &as_operator(issue(&["admin"])), &strict).is_ok());
        // An operator acts as itself, never as a node.
        let err = proposal(Some(&ops), &as_node("s1", Command::Heartbeat), &strict).unwrap_err();
        assert_eq!(err.message(), "operator 'alice' may not propose as node 's1'");
    }
}
