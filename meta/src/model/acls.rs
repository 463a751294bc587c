//! Access control lists (issue 59): Kafka's model of who may do what, kept in the
//! metadata log and enforced on Kafka and HTTP alike. A binding allows or denies one
//! operation on a resource pattern (a topic, group, transactional id or the cluster,
//! named literally or by prefix) to a principal (`User:<token>`, or `User:*` for all)
//! from a host (`*`, or one address). A token's scopes are the same bindings written
//! short ([`super::scopes::Scopes::bindings`]); the rules that judge them are in
//! [`super::grants`].

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

/// The one cluster resource's name, as Kafka spells it.
pub const CLUSTER_NAME: &str = "kafka-cluster";

/// What a binding names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceType {
    Topic,
    Group,
    Cluster,
    TransactionalId,
}

impl ResourceType {
    pub const ALL: [ResourceType; 4] = [
        ResourceType::Topic,
        ResourceType::Group,
        ResourceType::Cluster,
        ResourceType::TransactionalId,
    ];

    /// Kafka's `ResourceType` code.
    pub fn code(self) -> i8 {
        match self {
            ResourceType::Topic => 2,
            ResourceType::Group => 3,
            ResourceType::Cluster => 4,
            ResourceType::TransactionalId => 5,
        }
    }

    pub fn from_code(code: i8) -> Option<ResourceType> {
        ResourceType::ALL.into_iter().find(|t| t.code() == code)
    }
}

/// How a binding's resource name matches names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PatternType {
    /// The name itself; `*` is every name.
    Literal,
    /// Every name that starts with it.
    Prefixed,
}

impl PatternType {
    pub fn code(self) -> i8 {
        match self {
            PatternType::Literal => 3,
            PatternType::Prefixed => 4,
        }
    }

    pub fn from_code(code: i8) -> Option<PatternType> {
        [PatternType::Literal, PatternType::Prefixed]
            .into_iter()
            .find(|p| p.code() == code)
    }
}

/// An operation, as Kafka's `AclOperation` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
}

impl Operation {
    const ALL_OPS: [Operation; 11] = [
        Operation::All,
        Operation::Read,
        Operation::Write,
        Operation::Create,
        Operation::Delete,
        Operation::Alter,
        Operation::Describe,
        Operation::ClusterAction,
        Operation::DescribeConfigs,
        Operation::AlterConfigs,
        Operation::IdempotentWrite,
    ];

    /// Kafka's `AclOperation` code.
    pub fn code(self) -> i8 {
        match self {
            Operation::All => 2,
            Operation::Read => 3,
            Operation::Write => 4,
            Operation::Create => 5,
            Operation::Delete => 6,
            Operation::Alter => 7,
            Operation::Describe => 8,
            Operation::ClusterAction => 9,
            Operation::DescribeConfigs => 10,
            Operation::AlterConfigs => 11,
            Operation::IdempotentWrite => 12,
        }
    }

    pub fn from_code(code: i8) -> Option<Operation> {
        Operation::ALL_OPS.into_iter().find(|o| o.code() == code)
    }

    /// Whether an allow of `self` allows `wanted`: `All` allows everything, and, as in
    /// Kafka, `Describe` follows from `Read`, `Write`, `Delete` and `Alter`, and
    /// `DescribeConfigs` from `AlterConfigs`. A deny denies only its own operation (and
    /// `All` every one).
    pub fn allows(self, wanted: Operation) -> bool {
        self == wanted
            || self == Operation::All
            || (wanted == Operation::Describe
                && matches!(
                    self,
                    Operation::Read | Operation::Write | Operation::Delete | Operation::Alter
                ))
            || (wanted == Operation::DescribeConfigs && self == Operation::AlterConfigs)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self).ok();
        f.write_str(s.as_ref().and_then(|v| v.as_str()).unwrap_or("?"))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Permission {
    Deny,
    Allow,
}

impl Permission {
    pub fn code(self) -> i8 {
        match self {
            Permission::Deny => 2,
            Permission::Allow => 3,
        }
    }

    pub fn from_code(code: i8) -> Option<Permission> {
        [Permission::Deny, Permission::Allow]
            .into_iter()
            .find(|p| p.code() == code)
    }
}

/// One ACL: `permission` of `operation` on the resources `pattern` names, for
/// `principal` connecting from `host`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AclBinding {
    pub resource_type: ResourceType,
    pub pattern_type: PatternType,
    pub resource_name: String,
    /// `User:<token name>`, or `User:*` for every user.
    pub principal: String,
    /// `*`, or the one address the binding applies to.
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

impl AclBinding {
    /// `permission` of `operation` on the resources `pattern` names, for `principal`
    /// from any host.
    pub fn from_any_host(
        principal: &str,
        resource_type: ResourceType,
        pattern: (PatternType, &str),
        operation: Operation,
        permission: Permission,
    ) -> Self {
        Self {
            resource_type,
            pattern_type: pattern.0,
            resource_name: pattern.1.to_string(),
            principal: principal.to_string(),
            host: "*".into(),
            operation,
            permission,
        }
    }

    /// Why this binding cannot be stored, if it cannot.
    pub fn invalid(&self) -> Option<String> {
        if self.resource_name.is_empty() {
            return Some("an ACL's resource name is empty".into());
        }
        if self.resource_type == ResourceType::Cluster
            && (self.resource_name != CLUSTER_NAME || self.pattern_type != PatternType::Literal)
        {
            return Some(format!(
                "the cluster resource is named '{CLUSTER_NAME}', literally, not '{}'",
                self.resource_name
            ));
        }
        match self.principal.split_once(':') {
            Some(("User", name)) if !name.is_empty() => {}
            _ => {
                return Some(format!(
                    "principal '{}' is not 'User:<name>' (a token's name, or * for every user)",
                    self.principal
                ))
            }
        }
        if self.host != "*" && self.host.parse::<std::net::IpAddr>().is_err() {
            return Some(format!("host '{}' is neither '*' nor an IP address", self.host));
        }
        None
    }

    /// Whether this binding's pattern names resource `name` of type `rt`.
    pub fn covers(&self, rt: ResourceType, name: &str) -> bool {
        self.resource_type == rt
            && match self.pattern_type {
                PatternType::Literal => self.resource_name == name || self.resource_name == "*",
                PatternType::Prefixed => name.starts_with(&self.resource_name),
            }
    }

    /// Whether this binding's pattern names every resource of its type.
    pub fn covers_all(&self) -> bool {
        match self.pattern_type {
            PatternType::Literal => self.resource_name == "*",
            PatternType::Prefixed => self.resource_name.is_empty(),
        }
    }
}

/// How a filter's name matches bindings (Kafka's `PatternType` in a filter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PatternFilter {
    Any,
    /// Bindings whose pattern would match the filter's name: literal equal, literal
    /// `*`, or a prefix of it.
    Match,
    Exactly(PatternType),
}

/// Which bindings DescribeAcls lists and DeleteAcls removes; `None` is any.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclFilter {
    pub resource_type: Option<ResourceType>,
    pub pattern: PatternFilter,
    pub resource_name: Option<String>,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Option<Operation>,
    pub permission: Option<Permission>,
}

impl AclFilter {
    pub fn matches(&self, b: &AclBinding) -> bool {
        let name_ok = match (&self.pattern, &self.resource_name) {
            (PatternFilter::Match, Some(name)) => match b.pattern_type {
                PatternType::Literal => &b.resource_name == name || b.resource_name == "*",
                PatternType::Prefixed => name.starts_with(&b.resource_name),
            },
            (PatternFilter::Exactly(p), name) => {
                b.pattern_type == *p && name.as_ref().is_none_or(|n| n == &b.resource_name)
            }
            (_, name) => name.as_ref().is_none_or(|n| n == &b.resource_name),
        };
        name_ok
            && self.resource_type.is_none_or(|t| t == b.resource_type)
            && self.principal.as_ref().is_none_or(|p| p == &b.principal)
            && self.host.as_ref().is_none_or(|h| h == &b.host)
            && self.operation.is_none_or(|o| o == b.operation)
            && self.permission.is_none_or(|p| p == b.permission)
    }
}

/// The cluster's ACLs: shared, so a view hands every request the table it was
/// judged against without copying it, and replaced whole when one changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acls(Arc<BTreeSet<AclBinding>>);

impl Acls {
    pub fn iter(&self) -> impl Iterator<Item = &AclBinding> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, b: &AclBinding) -> bool {
        self.0.contains(b)
    }

    pub fn insert(&mut self, b: AclBinding) -> bool {
        Arc::make_mut(&mut self.0).insert(b)
    }

    pub fn remove(&mut self, b: &AclBinding) -> bool {
        self.0.contains(b) && Arc::make_mut(&mut self.0).remove(b)
    }
}

impl Serialize for Acls {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.as_ref().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Acls {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        BTreeSet::deserialize(d).map(|set| Acls(Arc::new(set)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(rt: ResourceType, p: PatternType, name: &str, op: Operation, perm: Permission) -> AclBinding {
        AclBinding::from_any_host("User:alice", rt, (p, name), op, perm)
    }

    #[test]
    fn kafka_codes_round_trip() {
        for t in ResourceType::ALL {
            assert_eq!(ResourceType::from_code(t.code()), Some(t));
        }
        for o in Operation::ALL_OPS {
            assert_eq!(Operation::from_code(o.code()), Some(o));
        }
        // ANY (1) and UNKNOWN (0) name no concrete value.
        assert_eq!(Operation::from_code(1), None);
        assert_eq!(ResourceType::from_code(0), None);
        assert_eq!(PatternType::from_code(2), None, "MATCH is a filter, not a pattern");
    }

    #[test]
    fn implied_operations_follow_kafka() {
        assert!(Operation::Read.allows(Operation::Describe));
        assert!(Operation::Alter.allows(Operation::Describe));
        assert!(Operation::AlterConfigs.allows(Operation::DescribeConfigs));
        assert!(Operation::All.allows(Operation::IdempotentWrite));
        assert!(!Operation::Describe.allows(Operation::Read));
        assert!(!Operation::Write.allows(Operation::Read));
        assert!(!Operation::DescribeConfigs.allows(Operation::AlterConfigs));
    }

    #[test]
    fn patterns_cover_names_literally_by_wildcard_or_prefix() {
        use Operation::Read;
        use Permission::Allow;
        let lit = binding(ResourceType::Topic, PatternType::Literal, "orders", Read, Allow);
        assert!(lit.covers(ResourceType::Topic, "orders"));
        assert!(!lit.covers(ResourceType::Topic, "orders-eu"));
        assert!(!lit.covers(ResourceType::Group, "orders"));
        let star = binding(ResourceType::Topic, PatternType::Literal, "*", Read, Allow);
        assert!(star.covers(ResourceType::Topic, "anything") && star.covers_all());
        let pre = binding(ResourceType::Group, PatternType::Prefixed, "ord", Read, Allow);
        assert!(pre.covers(ResourceType::Group, "orders") && !pre.covers(ResourceType::Group, "pay"));
        assert!(!pre.covers_all());
    }

    #[test]
    fn filters_match_as_kafka_describes() {
        use Operation::*;
        use Permission::*;
        let lit = binding(ResourceType::Topic, PatternType::Literal, "orders", Read, Allow);
        let pre = binding(ResourceType::Topic, PatternType::Prefixed, "ord", Write, Deny);
        let any = AclFilter {
            resource_type: None,
            pattern: PatternFilter::Any,
            resource_name: None,
            principal: None,
            host: None,
            operation: None,
            permission: None,
        };
        assert!(any.matches(&lit) && any.matches(&pre));
        let matching = AclFilter {
            pattern: PatternFilter::Match,
            resource_name: Some("orders".into()),
            ..any.clone()
        };
        assert!(matching.matches(&lit) && matching.matches(&pre));
        let exact = AclFilter {
            pattern: PatternFilter::Exactly(PatternType::Prefixed),
            resource_name: Some("orders".into()),
            ..any.clone()
        };
        assert!(!exact.matches(&lit) && !exact.matches(&pre));
        let denies = AclFilter {
            permission: Some(Deny),
            ..any.clone()
        };
        assert!(!denies.matches(&lit) && denies.matches(&pre));
    }

    #[test]
    fn bad_bindings_say_why() {
        use Operation::*;
        use Permission::*;
        let mut b = binding(ResourceType::Cluster, PatternType::Literal, "other", Alter, Allow);
        assert!(b.invalid().unwrap().contains("kafka-cluster"));
        b.resource_name = CLUSTER_NAME.into();
        assert_eq!(b.invalid(), None);
        b.principal = "alice".into();
        assert!(b.invalid().unwrap().contains("User:<name>"));
        b.principal = "User:alice".into();
        b.host = "example.com".into();
        assert!(b.invalid().unwrap().contains("IP address"));
    }

    #[test]
    fn the_table_is_shared_until_changed() {
        let mut a = Acls::default();
        let b = binding(
            ResourceType::Topic,
            PatternType::Literal,
            "t",
            Operation::Read,
            Permission::Allow,
        );
        assert!(a.insert(b.clone()));
        let snapshot = a.clone();
        assert!(a.remove(&b));
        assert!(snapshot.contains(&b) && !a.contains(&b));
        let json = serde_json::to_string(&snapshot).unwrap();
        assert_eq!(serde_json::from_str::<Acls>(&json).unwrap(), snapshot);
    }
}
