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
//! the admin endpoints: what tokens could do before scopes existed.

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

/// A token's scopes, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grants(Vec<Grant>);

impl Grants {
    /// Parses scopes as stored in a token row; the error names the first bad one.
    pub fn parse(scopes: &[String]) -> Result<Grants, String> {
        if scopes.is_empty() {
            return Ok(Grants(
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
            .map(Grants)
    }

    /// No access at all.
    pub fn nothing() -> Grants {
        Grants(Vec::new())
    }

    /// What a request may do without `--auth`: everything.
    pub fn everything() -> Grants {
        Grants(vec![Grant {
            access: Access::Admin,
            prefix: String::new(),
        }])
    }

    /// Whether `access` to `name` is granted (`admin` grants every access).
    pub fn allows(&self, access: Access, name: &str) -> bool {
        self.0
            .iter()
            .any(|g| (g.access == access || g.access == Access::Admin) && name.starts_with(&g.prefix))
    }

    /// Whether `access` is granted on some name (a request that names none, such as
    /// listing streams or allocating a producer id).
    pub fn allows_some(&self, access: Access) -> bool {
        self.0.iter().any(|g| g.access == access || g.access == Access::Admin)
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

    fn grants(s: &[&str]) -> Grants {
        Grants::parse(&s.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn a_scope_grants_its_access_on_names_with_its_prefix() {
        let g = grants(&["read:orders-", "write:orders-eu"]);
        assert!(g.allows(Access::Read, "orders-us/0"));
        assert!(!g.allows(Access::Read, "payments/0"));
        assert!(g.allows(Access::Write, "orders-eu"));
        assert!(!g.allows(Access::Write, "orders-us"));
        assert!(!g.allows(Access::Manage, "orders-eu"));
        assert!(!g.allows(Access::Admin, ""));
        assert!(g.allows_some(Access::Write) && !g.allows_some(Access::Manage));
        let admin = grants(&["admin"]);
        assert!(admin.allows(Access::Manage, "anything") && admin.allows(Access::Admin, ""));
        let legacy = grants(&[]);
        assert!(legacy.allows(Access::Manage, "x") && !legacy.allows(Access::Admin, ""));
    }

    #[test]
    fn bad_scopes_are_refused_with_why() {
        for (bad, why) in [
            ("root", "unknown scope 'root'"),
            ("admin:x", "admin covers every name"),
            ("read:", "prefix after ':' is empty"),
        ] {
            let err = Grants::parse(&[bad.to_string()]).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
