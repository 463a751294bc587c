//! What a token may do (issue 18): its scopes, each optionally limited to names that
//! start with a prefix (`read:orders-`). The names are streams, Kafka topics (and so
//! their partitions' streams `topic/N`) and consumer group ids.
//!
//! - `read`: read records (HTTP reads, SSE, Kafka Fetch and ListOffsets), describe
//!   streams, topics and configs, and consume in groups.
//! - `write`: append (HTTP appends, Kafka Produce, producer ids).
//! - `manage`: create, delete, configure and trim streams and topics.
//! - `admin`: everything, on every name, and the admin endpoints (tokens, nodes).
//!
//! A token issued without scopes may read, write and manage every name, but not use
//! the admin endpoints: what tokens could do before scopes existed. Scopes are
//! shorthand for ACLs (issue 59): [`Scopes::bindings`] spells out the bindings.

use super::acls::{AclBinding, Operation, PatternType, Permission, ResourceType, CLUSTER_NAME};
use std::fmt;

/// One kind of access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    Manage,
    Admin,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::Manage => "manage",
            Access::Admin => "admin",
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One scope: an access on the names that start with `prefix` (every name when empty).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Grant {
    access: Access,
    prefix: String,
}

/// A token's scopes, parsed: shorthand for allow bindings of its user (issue 59), so a
/// scope and an ACL are judged alike ([`super::grants::Grants`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scopes(Vec<Grant>);

impl Scopes {
    /// Parses scopes as stored in a token row; the error names the first bad one.
    pub fn parse(scopes: &[String]) -> Result<Scopes, String> {
        if scopes.is_empty() {
            return Ok(Scopes(
                [Access::Read, Access::Write, Access::Manage]
                    .into_iter()
                    .map(|access| Grant {
                        access,
                        prefix: String::new(),
                    })
                    .collect(),
            ));
        }
        scopes
            .iter()
            .map(|s| parse_one(s))
            .collect::<Result<_, _>>()
            .map(Scopes)
    }

    /// Whether these include `admin`, Kafka's super user.
    pub fn is_admin(&self) -> bool {
        self.0.iter().any(|g| g.access == Access::Admin)
    }

    /// The allow bindings these scopes stand for, for `principal`:
    /// - `read:P`: read topics (and so describe them and their configs) and groups;
    /// - `write:P`: write topics and transactional ids, and idempotent producer ids;
    /// - `manage:P`: create, delete, alter and configure topics, delete groups;
    ///
    /// each on the names starting with `P` (every name without one).
    pub fn bindings(&self, principal: &str) -> Vec<AclBinding> {
        use Operation::*;
        use ResourceType::*;
        let mut out = Vec::new();
        for g in &self.0 {
            let on: &[(ResourceType, Operation)] = match g.access {
                Access::Read => &[(Topic, Read), (Topic, DescribeConfigs), (Group, Read)],
                Access::Write => &[(Topic, Write), (TransactionalId, Write), (Cluster, IdempotentWrite)],
                Access::Manage => &[
                    (Topic, Create),
                    (Topic, Delete),
                    (Topic, Alter),
                    (Topic, AlterConfigs),
                    (Group, Delete),
                ],
                Access::Admin => &[],
            };
            for &(rt, op) in on {
                let (pattern_type, resource_name) = match (rt, g.prefix.as_str()) {
                    (Cluster, _) => (PatternType::Literal, CLUSTER_NAME.to_string()),
                    (_, "") => (PatternType::Literal, "*".to_string()),
                    (_, p) => (PatternType::Prefixed, p.to_string()),
                };
                out.push(AclBinding::from_any_host(
                    principal,
                    rt,
                    (pattern_type, &resource_name),
                    op,
                    Permission::Allow,
                ));
            }
        }
        out
    }
}

fn parse_one(scope: &str) -> Result<Grant, String> {
    let (access, prefix) = match scope.split_once(':') {
        Some((a, p)) => (a, p),
        None => (scope, ""),
    };
    let access = match access {
        "read" => Access::Read,
        "write" => Access::Write,
        "manage" => Access::Manage,
        "admin" => Access::Admin,
        _ => {
            return Err(format!(
                "unknown scope '{scope}'; scopes are read, write, manage and admin, \
                 the first three optionally limited to a name prefix (read:orders-)"
            ))
        }
    };
    if access == Access::Admin && scope.contains(':') {
        return Err(format!("scope '{scope}': admin covers every name and takes no prefix"));
    }
    if scope.contains(':') && prefix.is_empty() {
        return Err(format!("scope '{scope}': the prefix after ':' is empty"));
    }
    Ok(Grant {
        access,
        prefix: prefix.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_stands_for_allow_bindings_on_names_with_its_prefix() {
        let scopes = Scopes::parse(&["read:orders-".to_string(), "write".to_string()]).unwrap();
        assert!(!scopes.is_admin());
        let b = scopes.bindings("User:t");
        let has = |rt, p, name: &str, op| {
            b.iter().any(|x| {
                x.resource_type == rt
                    && x.pattern_type == p
                    && x.resource_name == name
                    && x.operation == op
                    && x.principal == "User:t"
                    && x.permission == Permission::Allow
            })
        };
        assert!(has(
            ResourceType::Topic,
            PatternType::Prefixed,
            "orders-",
            Operation::Read
        ));
        assert!(has(
            ResourceType::Group,
            PatternType::Prefixed,
            "orders-",
            Operation::Read
        ));
        assert!(has(ResourceType::Topic, PatternType::Literal, "*", Operation::Write));
        assert!(has(
            ResourceType::Cluster,
            PatternType::Literal,
            CLUSTER_NAME,
            Operation::IdempotentWrite
        ));
        assert!(!has(ResourceType::Topic, PatternType::Literal, "*", Operation::Create));
        assert!(Scopes::parse(&["admin".to_string()]).unwrap().is_admin());
        assert_eq!(
            Scopes::parse(&[]).unwrap().bindings("User:t").len(),
            11,
            "read, write and manage"
        );
    }

    #[test]
    fn bad_scopes_are_refused_with_why() {
        for (bad, why) in [
            ("root", "unknown scope 'root'"),
            ("admin:x", "admin covers every name"),
            ("read:", "prefix after ':' is empty"),
        ] {
            let err = Scopes::parse(&[bad.to_string()]).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
