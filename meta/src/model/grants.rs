//! What one caller may do (issue 59): the cluster's ACLs and the caller's token scopes
//! (the same bindings written short), judged by Kafka's rules. A deny that matches
//! wins; otherwise an allow that matches (or implies the operation) is needed; with
//! neither, the answer is no. The `admin` scope is Kafka's super user: every check
//! passes and no deny applies, so an operator can always undo an ACL. So does the
//! anonymous caller of a gateway without `--auth`, which authorizes nothing.

use super::acls::{AclBinding, Acls, Operation, Permission, ResourceType, CLUSTER_NAME};
use super::rows::TokenRow;
use super::scopes::Scopes;
use std::net::IpAddr;

/// A resource a request touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource<'a> {
    Topic(&'a str),
    Group(&'a str),
    TransactionalId(&'a str),
    Cluster,
}

impl Resource<'_> {
    fn parts(&self) -> (ResourceType, &str) {
        match *self {
            Resource::Topic(n) => (ResourceType::Topic, n),
            Resource::Group(n) => (ResourceType::Group, n),
            Resource::TransactionalId(n) => (ResourceType::TransactionalId, n),
            Resource::Cluster => (ResourceType::Cluster, CLUSTER_NAME),
        }
    }
}

impl std::fmt::Display for Resource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resource::Topic(n) => write!(f, "topic '{n}'"),
            Resource::Group(n) => write!(f, "group '{n}'"),
            Resource::TransactionalId(n) => write!(f, "transactional id '{n}'"),
            Resource::Cluster => f.write_str("the cluster"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Who {
    /// Every check passes: the `admin` scope, or a gateway without `--auth`.
    Super,
    /// Nothing passes: a connection not yet authenticated, or a token whose scopes no
    /// longer parse.
    Nobody,
    User {
        /// `User:<token name>`, as bindings name it.
        principal: String,
        /// The caller's address; `None` where it is not known (metad judging a
        /// gateway's proposal), where bindings for one host are left to the gateway.
        host: Option<IpAddr>,
        /// The token's scopes as allow bindings.
        scopes: Vec<AclBinding>,
    },
}

/// One caller's authority: who it is and the ACLs it is judged against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grants {
    who: Who,
    acls: Acls,
}

impl Grants {
    /// No access at all.
    pub fn nothing() -> Grants {
        Grants {
            who: Who::Nobody,
            acls: Acls::default(),
        }
    }

    /// Every access: what a request may do without `--auth`.
    pub fn everything() -> Grants {
        Grants {
            who: Who::Super,
            acls: Acls::default(),
        }
    }

    /// What `token` may do under `acls`, from an unknown host (see [`Grants::at`]).
    pub fn for_token(token: &TokenRow, acls: Acls) -> Grants {
        let who = match Scopes::parse(&token.scopes) {
            Err(_) => Who::Nobody,
            Ok(s) if s.is_admin() => Who::Super,
            Ok(s) => {
                let principal = principal_of(&token.name);
                Who::User {
                    scopes: s.bindings(&principal),
                    principal,
                    host: None,
                }
            }
        };
        Grants { who, acls }
    }

    /// The same caller, connected from `host`.
    pub fn at(mut self, host: IpAddr) -> Grants {
        if let Who::User { host: h, .. } = &mut self.who {
            *h = Some(host);
        }
        self
    }

    /// Judges later checks against `acls` (a connection follows the view's changes).
    pub fn set_acls(&mut self, acls: Acls) {
        self.acls = acls;
    }

    /// Whether this caller is a super user (the `admin` scope).
    pub fn is_super(&self) -> bool {
        self.who == Who::Super
    }

    /// Whether `op` on `resource` is allowed.
    pub fn allows(&self, op: Operation, resource: Resource<'_>) -> bool {
        let (rt, name) = resource.parts();
        self.judge(op, |b| b.covers(rt, name))
    }

    /// Whether `op` is allowed on every resource of type `rt` (a regex subscription,
    /// which may match any topic).
    pub fn allows_every(&self, op: Operation, rt: ResourceType) -> bool {
        match &self.who {
            Who::Super => true,
            Who::Nobody => false,
            Who::User { .. } => {
                !self
                    .bindings()
                    .any(|b| b.permission == Permission::Deny && b.resource_type == rt && denies(b.operation, op))
                    && self.bindings().any(|b| {
                        b.permission == Permission::Allow
                            && b.resource_type == rt
                            && b.covers_all()
                            && b.operation.allows(op)
                    })
            }
        }
    }

    /// Whether `op` is allowed on some resource of type `rt` (Kafka's
    /// authorization by resource type: an idempotent producer may write somewhere).
    pub fn allows_some(&self, op: Operation, rt: ResourceType) -> bool {
        match &self.who {
            Who::Super => true,
            Who::Nobody => false,
            Who::User { .. } => self.bindings().any(|b| {
                b.permission == Permission::Allow
                    && b.resource_type == rt
                    && b.operation.allows(op)
                    && !self.bindings().any(|d| {
                        d.permission == Permission::Deny
                            && d.resource_type == rt
                            && denies(d.operation, op)
                            && d.covers_all()
                    })
            }),
        }
    }

    /// Every binding that applies to this caller: its scopes, then the cluster's ACLs
    /// for its principal (or every user) and host.
    fn bindings(&self) -> impl Iterator<Item = &AclBinding> {
        let (principal, host, scopes): (&str, Option<IpAddr>, &[AclBinding]) = match &self.who {
            Who::User {
                principal,
                host,
                scopes,
            } => (principal, *host, scopes),
            _ => ("", None, &[]),
        };
        scopes.iter().chain(
            self.acls
                .iter()
                .filter(move |b| b.principal == principal || b.principal == "User:*")
                .filter(move |b| host_matches(b, host)),
        )
    }

    fn judge(&self, op: Operation, covers: impl Fn(&AclBinding) -> bool) -> bool {
        match &self.who {
            Who::Super => true,
            Who::Nobody => false,
            Who::User { .. } => {
                let mut allowed = false;
                for b in self.bindings().filter(|b| covers(b)) {
                    match b.permission {
                        Permission::Deny if denies(b.operation, op) => return false,
                        Permission::Allow if b.operation.allows(op) => allowed = true,
                        _ => {}
                    }
                }
                allowed
            }
        }
    }
}

/// A deny of `denied` denies `op`: its own operation, or every one for `All`.
fn denies(denied: Operation, op: Operation) -> bool {
    denied == op || denied == Operation::All
}

/// Whether binding `b` applies at `host`. Where the host is unknown, an allow for one
/// host counts (the gateway that knew the host checked it) and a deny for one host does
/// not (the gateway applied it).
fn host_matches(b: &AclBinding, host: Option<IpAddr>) -> bool {
    if b.host == "*" {
        return true;
    }
    match host {
        Some(ip) => b.host.parse::<IpAddr>().is_ok_and(|h| h == ip),
        None => b.permission == Permission::Allow,
    }
}

/// How bindings name the user of token `name`.
pub fn principal_of(name: &str) -> String {
    format!("User:{name}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::acls::PatternType;

    fn token(name: &str, scopes: &[&str]) -> TokenRow {
        TokenRow {
            name: name.into(),
            secret_sha256: "0".repeat(64),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            revoked: false,
            issued_index: 1,
            expires_at_ms: None,
            scram: None,
        }
    }

    fn acl(
        principal: &str,
        rt: ResourceType,
        pattern: (PatternType, &str),
        op: Operation,
        perm: Permission,
    ) -> AclBinding {
        AclBinding::from_any_host(principal, rt, pattern, op, perm)
    }

    fn table(bindings: Vec<AclBinding>) -> Acls {
        let mut acls = Acls::default();
        for b in bindings {
            acls.insert(b);
        }
        acls
    }

    #[test]
    fn scopes_are_allow_bindings_of_the_token() {
        let g = Grants::for_token(&token("t", &["read:orders-", "write:orders-eu"]), Acls::default());
        assert!(g.allows(Operation::Read, Resource::Topic("orders-us")));
        assert!(
            g.allows(Operation::Describe, Resource::Topic("orders-us")),
            "implied by read"
        );
        assert!(g.allows(Operation::Read, Resource::Group("orders-app")));
        assert!(!g.allows(Operation::Read, Resource::Topic("payments")));
        assert!(g.allows(Operation::Write, Resource::Topic("orders-eu")));
        assert!(g.allows(Operation::Write, Resource::TransactionalId("orders-eu-tx")));
        assert!(!g.allows(Operation::Write, Resource::Topic("orders-us")));
        assert!(!g.allows(Operation::Create, Resource::Topic("orders-eu")));
        assert!(g.allows(Operation::IdempotentWrite, Resource::Cluster));
        assert!(!g.allows(Operation::Alter, Resource::Cluster));
        assert!(!g.allows_every(Operation::Read, ResourceType::Topic));
        let legacy = Grants::for_token(&token("t", &[]), Acls::default());
        assert!(legacy.allows(Operation::Create, Resource::Topic("x")) && !legacy.is_super());
        assert!(legacy.allows_every(Operation::Read, ResourceType::Topic));
        let admin = Grants::for_token(&token("ops", &["admin"]), Acls::default());
        assert!(admin.is_super() && admin.allows(Operation::Alter, Resource::Cluster));
    }

    #[test]
    fn a_matching_deny_wins_over_any_allow() {
        let acls = table(vec![acl(
            "User:t",
            ResourceType::Topic,
            (PatternType::Literal, "orders"),
            Operation::Write,
            Permission::Deny,
        )]);
        let g = Grants::for_token(&token("t", &[]), acls.clone());
        assert!(!g.allows(Operation::Write, Resource::Topic("orders")));
        assert!(
            g.allows(Operation::Read, Resource::Topic("orders")),
            "a deny denies its own operation"
        );
        assert!(
            g.allows(Operation::Write, Resource::Topic("orders-eu")),
            "a literal names one topic"
        );
        // Another user is not denied; the admin scope is never denied.
        assert!(Grants::for_token(&token("u", &[]), acls.clone()).allows(Operation::Write, Resource::Topic("orders")));
        assert!(Grants::for_token(&token("ops", &["admin"]), acls).allows(Operation::Write, Resource::Topic("orders")));
    }

    #[test]
    fn an_acl_allows_what_no_scope_grants_and_every_user_binding_applies_to_all() {
        let acls = table(vec![
            acl(
                "User:*",
                ResourceType::Topic,
                (PatternType::Prefixed, "pub-"),
                Operation::Read,
                Permission::Allow,
            ),
            acl(
                "User:t",
                ResourceType::Cluster,
                (PatternType::Literal, CLUSTER_NAME),
                Operation::Alter,
                Permission::Allow,
            ),
        ]);
        let g = Grants::for_token(&token("t", &["write:x"]), acls);
        assert!(g.allows(Operation::Read, Resource::Topic("pub-news")));
        assert!(
            g.allows(Operation::Describe, Resource::Cluster),
            "describe is implied by alter"
        );
        assert!(!g.allows(Operation::Read, Resource::Topic("news")));
        assert!(g.allows_some(Operation::Read, ResourceType::Topic));
    }

    #[test]
    fn a_deny_for_all_operations_on_every_topic_stops_even_implied_ones() {
        let acls = table(vec![acl(
            "User:*",
            ResourceType::Topic,
            (PatternType::Literal, "*"),
            Operation::All,
            Permission::Deny,
        )]);
        let g = Grants::for_token(&token("t", &[]), acls);
        assert!(!g.allows(Operation::Describe, Resource::Topic("a")));
        assert!(!g.allows_some(Operation::Write, ResourceType::Topic));
        assert!(
            g.allows(Operation::Read, Resource::Group("a")),
            "groups are another resource type"
        );
    }

    #[test]
    fn host_bindings_apply_at_their_host() {
        let mut deny = acl(
            "User:t",
            ResourceType::Topic,
            (PatternType::Literal, "*"),
            Operation::Read,
            Permission::Deny,
        );
        deny.host = "10.0.0.9".into();
        let acls = table(vec![deny]);
        let g = Grants::for_token(&token("t", &[]), acls);
        let here: IpAddr = "10.0.0.9".parse().unwrap();
        let there: IpAddr = "10.0.0.1".parse().unwrap();
        assert!(!g.clone().at(here).allows(Operation::Read, Resource::Topic("a")));
        assert!(g.clone().at(there).allows(Operation::Read, Resource::Topic("a")));
        // Unknown host (metad): the gateway applied the host's deny.
        assert!(g.allows(Operation::Read, Resource::Topic("a")));
    }

    #[test]
    fn nobody_may_do_nothing_and_bad_scopes_grant_nothing() {
        assert!(!Grants::nothing().allows(Operation::Describe, Resource::Topic("a")));
        assert!(Grants::everything().allows(Operation::Alter, Resource::Cluster));
        let broken = Grants::for_token(&token("t", &["root"]), Acls::default());
        assert!(!broken.allows(Operation::Read, Resource::Topic("a")));
    }
}
