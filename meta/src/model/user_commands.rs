//! The metadata commands a gateway proposes on a user's behalf, and the token scope
//! each needs (issue 18). metad checks a gateway's proposal against the scopes of the
//! token it names, so a gateway certificate alone grants nothing its users could not
//! do; the gateway checks the same before it proposes.

use super::command::{Command, ConfigTarget};
use super::rows::CordonBy;
use super::scopes::{Access, Grants};

/// What a user's token needs to have `command` proposed for them: an access on a name,
/// or on some name when the command names none (a producer id range, an admin action).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need<'a> {
    pub access: Access,
    pub name: Option<&'a str>,
}

impl Need<'_> {
    /// Whether `grants` cover this need.
    pub fn met_by(&self, grants: &Grants) -> bool {
        match self.name {
            Some(name) => grants.allows(self.access, name),
            None => grants.allows_some(self.access),
        }
    }

    /// The refusal for token `token`, naming the scope it lacks.
    pub fn refusal(&self, token: &str) -> String {
        match self.name {
            Some(name) => format!("token '{token}' has no '{}' scope for '{name}'", self.access),
            None => format!("token '{token}' has no '{}' scope", self.access),
        }
    }
}

/// The need of a user-level command; `None` for commands only nodes, metad and
/// operators propose (placement, fencing, takeovers, commits, damage repairs).
pub fn needed(command: &Command) -> Option<Need<'_>> {
    fn on(access: Access, name: &str) -> Need<'_> {
        Need {
            access,
            name: Some(name),
        }
    }
    let any = |access| Need { access, name: None };
    Some(match command {
        Command::CreateTopic { name, .. }
        | Command::DeleteTopic { name, .. }
        | Command::CreatePartitions { name, .. }
        | Command::CreateStream { name, .. }
        | Command::DeleteStream { name, .. }
        | Command::AlterConfig {
            target: ConfigTarget::Topic(name) | ConfigTarget::Stream(name),
            ..
        } => on(Access::Manage, name),
        Command::AllocateProducerIds { .. } => any(Access::Write),
        Command::IssueToken { .. }
        | Command::RevokeToken { .. }
        | Command::SetScramCredential { .. }
        | Command::Cordon {
            by: CordonBy::Operator, ..
        }
        | Command::Uncordon {
            by: CordonBy::Operator, ..
        } => any(Access::Admin),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::StreamConfig;
    use weir_shared::ids::NodeId;

    fn grants(s: &[&str]) -> Grants {
        Grants::parse(&s.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn a_user_command_needs_its_scope_on_its_name() {
        let create = Command::CreateTopic {
            name: "orders".into(),
            partitions: 1,
            config: StreamConfig::default(),
        };
        let need = needed(&create).expect("a user command");
        assert!(need.met_by(&grants(&["manage:ord"])));
        assert!(!need.met_by(&grants(&["manage:pay", "read", "write"])));
        assert_eq!(need.refusal("t"), "token 't' has no 'manage' scope for 'orders'");
        let allocate = Command::AllocateProducerIds { count: 1 };
        let ids = needed(&allocate).unwrap();
        assert!(ids.met_by(&grants(&["write:x-"])) && !ids.met_by(&grants(&["read"])));
        let revoke = Command::RevokeToken { name: "t".into() };
        let revoke = needed(&revoke).unwrap();
        assert!(!revoke.met_by(&grants(&[])) && revoke.met_by(&grants(&["admin"])));
        let node_cordon = Command::Cordon {
            node: NodeId::new("s1"),
            by: CordonBy::Drain,
        };
        assert_eq!(needed(&node_cordon), None);
        assert_eq!(needed(&Command::Heartbeat), None);
    }
}
