//! ACLs (issue 59): CreateAcls adds bindings, DeleteAcls removes what its filters
//! match. Both are a user's Kafka requests, proposed in their name after metad checked
//! that they may alter the cluster (`user_commands`).

use super::{reject, Txn};
use crate::model::acls::{AclBinding, AclFilter};
use crate::model::command::{Applied, Outcome, Proposer, RejectCode};
use crate::model::state::RowKey;

/// Most bindings one command adds, so one entry stays small.
pub const MAX_ACLS_PER_COMMAND: usize = 1_000;

impl Txn<'_> {
    pub(super) fn create_acls(&mut self, proposer: &Proposer, bindings: &[AclBinding]) -> Outcome {
        if !matches!(proposer, Proposer::Operator { .. }) {
            return Err(reject(
                RejectCode::InvalidArgument,
                "ACLs are created by users, not nodes",
            ));
        }
        if bindings.len() > MAX_ACLS_PER_COMMAND {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("at most {MAX_ACLS_PER_COMMAND} ACLs at once, got {}", bindings.len()),
            ));
        }
        // All or none: the gateway answered the invalid ones before it proposed.
        if let Some(why) = bindings.iter().find_map(AclBinding::invalid) {
            return Err(reject(RejectCode::InvalidArgument, why));
        }
        for b in bindings {
            if self.state.acls.insert(b.clone()) {
                self.touch(RowKey::Acl(b.clone()));
            }
        }
        Ok(Applied::Done)
    }

    pub(super) fn delete_acls(&mut self, proposer: &Proposer, filters: &[AclFilter]) -> Outcome {
        if !matches!(proposer, Proposer::Operator { .. }) {
            return Err(reject(
                RejectCode::InvalidArgument,
                "ACLs are deleted by users, not nodes",
            ));
        }
        let mut matched = Vec::with_capacity(filters.len());
        for f in filters {
            let gone: Vec<AclBinding> = self.state.acls.iter().filter(|b| f.matches(b)).cloned().collect();
            for b in &gone {
                self.state.acls.remove(b);
                self.touch(RowKey::Acl(b.clone()));
            }
            matched.push(gone);
        }
        Ok(Applied::AclsDeleted { matched })
    }
}

#[cfg(test)]
mod tests {
    use crate::model::acls::*;
    use crate::model::apply::test_log::{node, op, Log};
    use crate::model::command::{Applied, RejectCode};
    use crate::model::Command;

    fn binding(name: &str, op: Operation, perm: Permission) -> AclBinding {
        let topic = (PatternType::Literal, name);
        AclBinding::from_any_host("User:alice", ResourceType::Topic, topic, op, perm)
    }

    #[test]
    fn acls_are_created_once_and_deleted_by_filter() {
        let mut log = Log::new();
        let read = binding("orders", Operation::Read, Permission::Allow);
        let deny = binding("orders", Operation::Write, Permission::Deny);
        let other = binding("pay", Operation::Read, Permission::Allow);
        let create = Command::CreateAcls {
            bindings: vec![read.clone(), deny.clone(), other.clone()],
        };
        assert_eq!(log.apply(op(), create.clone()), Ok(Applied::Done));
        assert_eq!(
            log.apply(op(), create),
            Ok(Applied::Done),
            "creating again changes nothing"
        );
        assert_eq!(log.meta.state.acls.len(), 3);
        let filter = AclFilter {
            resource_type: Some(ResourceType::Topic),
            pattern: PatternFilter::Match,
            resource_name: Some("orders".into()),
            principal: None,
            host: None,
            operation: None,
            permission: None,
        };
        let denies = AclFilter {
            permission: Some(Permission::Deny),
            resource_name: None,
            pattern: PatternFilter::Any,
            ..filter.clone()
        };
        let Ok(Applied::AclsDeleted { matched }) = log.apply(
            op(),
            Command::DeleteAcls {
                filters: vec![filter, denies],
            },
        ) else {
            panic!("delete");
        };
        assert_eq!(matched[0].len(), 2, "both ACLs on orders: {matched:?}");
        assert!(matched[1].is_empty(), "the deny went with the first filter");
        assert_eq!(log.meta.state.acls.iter().collect::<Vec<_>>(), vec![&other]);
    }

    /// One entry creates at most `MAX_ACLS_PER_COMMAND` ACLs: the bound applies, one
    /// more is refused whole.
    #[test]
    fn a_create_holds_at_most_max_acls_per_command() {
        use crate::model::apply::acls::MAX_ACLS_PER_COMMAND;
        let mut log = Log::new();
        let many = |n: usize| Command::CreateAcls {
            bindings: (0..n)
                .map(|i| binding(&format!("t{i}"), Operation::Read, Permission::Allow))
                .collect(),
        };
        assert_eq!(
            log.apply(op(), many(MAX_ACLS_PER_COMMAND + 1)),
            Err(RejectCode::InvalidArgument)
        );
        assert!(log.meta.state.acls.is_empty());
        assert_eq!(log.apply(op(), many(MAX_ACLS_PER_COMMAND)), Ok(Applied::Done));
        assert_eq!(log.meta.state.acls.len(), MAX_ACLS_PER_COMMAND);
    }

    #[test]
    fn an_invalid_acl_or_a_node_changes_nothing() {
        let mut log = Log::new();
        let mut bad = binding("orders", Operation::Read, Permission::Allow);
        bad.principal = "alice".into();
        let good = binding("orders", Operation::Read, Permission::Allow);
        let create = Command::CreateAcls {
            bindings: vec![good.clone(), bad],
        };
        assert_eq!(log.apply(op(), create), Err(RejectCode::InvalidArgument));
        let by_node = Command::CreateAcls { bindings: vec![good] };
        assert_eq!(log.apply(node(), by_node), Err(RejectCode::InvalidArgument));
        assert!(log.meta.state.acls.is_empty());
    }
}
