//! DescribeGroups, ListGroups and DeleteGroups: the requests about whole groups, which
//! look across both kinds of group and the offsets table.

use super::membership::code;
use super::offsets::Change;
use super::{s, GroupCoordinator, Groups, GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, NOT_COORDINATOR};
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse, GroupId,
    ListGroupsRequest, ListGroupsResponse,
};
use std::collections::BTreeMap;

pub(super) fn describe(c: &GroupCoordinator, r: DescribeGroupsRequest) -> DescribeGroupsResponse {
    c.with(|st| {
        let groups = r
            .groups
            .into_iter()
            .map(|id| match st.groups.get(id.0.as_str()) {
                // A KIP-848 group is described by ConsumerGroupDescribe; to DescribeGroups
                // before v6 it is no classic group: Dead, as Kafka answers.
                _ if st.consumer_groups.contains_key(id.0.as_str()) => {
                    DescribedGroup::default().with_group_id(id).with_group_state(s("Dead"))
                }
                Some(g) => DescribedGroup::default()
                    .with_group_id(id.clone())
                    .with_group_state(s(g.phase.name()))
                    .with_protocol_type(s(g.protocol_type.as_deref().unwrap_or("")))
                    .with_protocol_data(s(g.protocol.as_deref().unwrap_or("")))
                    .with_members(
                        g.members
                            .values()
                            .map(|m| {
                                DescribedGroupMember::default()
                                    .with_member_id(s(&m.id))
                                    .with_group_instance_id(m.group_instance_id.as_deref().map(s))
                                    .with_client_id(s(&m.client_id))
                                    .with_client_host(s(&m.client_host))
                                    .with_member_metadata(m.metadata(g.protocol.as_deref()))
                                    .with_member_assignment(m.assignment.clone())
                            })
                            .collect(),
                    ),
                None if st.offsets.group(id.0.as_str()).is_some() => DescribedGroup::default()
                    .with_group_id(id)
                    .with_group_state(s("Empty"))
                    .with_protocol_type(s("consumer")),
                None => DescribedGroup::default().with_group_id(id).with_group_state(s("Dead")),
            })
            .collect();
        DescribeGroupsResponse::default().with_groups(groups)
    })
}

pub(super) fn list(c: &GroupCoordinator, r: ListGroupsRequest) -> ListGroupsResponse {
    c.with(|st| {
        let mut listed: BTreeMap<String, (String, &'static str, &'static str)> = BTreeMap::new();
        for g in st.offsets.groups() {
            listed.insert(g.clone(), ("consumer".into(), "Empty", "classic"));
        }
        for g in st.consumer_groups.values() {
            listed.insert(g.id.clone(), ("consumer".into(), g.state_name(), "consumer"));
        }
        for g in st.groups.values() {
            if g.is_empty() && st.offsets.group(&g.id).is_none() {
                continue;
            }
            listed.insert(
                g.id.clone(),
                (g.protocol_type.clone().unwrap_or_default(), g.phase.name(), "classic"),
            );
        }
        let groups = listed
            .into_iter()
            .filter(|(_, (_, state, _))| {
                r.states_filter.is_empty() || r.states_filter.iter().any(|f| f.eq_ignore_ascii_case(state))
            })
            .map(|(id, (protocol_type, state, kind))| {
                ListedGroup::default()
                    .with_group_id(GroupId(s(&id)))
                    .with_protocol_type(s(&protocol_type))
                    .with_group_state(s(state))
                    .with_group_type(s(kind))
            })
            .collect();
        ListGroupsResponse::default().with_groups(groups)
    })
}

impl Groups {
    pub(super) async fn delete(&self, c: &GroupCoordinator, r: DeleteGroupsRequest) -> DeleteGroupsResponse {
        let mut results = vec![];
        for name in r.groups_names {
            let group = name.0.to_string();
            let state = c.with(|st| {
                let members = st.groups.get(&group).is_some_and(|g| !g.is_empty())
                    || st.consumer_groups.get(&group).is_some_and(|g| !g.is_empty());
                let known = st.groups.contains_key(&group)
                    || st.consumer_groups.contains_key(&group)
                    || st.offsets.group(&group).is_some();
                (members, known)
            });
            let error = match state {
                (true, _) => NON_EMPTY_GROUP,
                (false, false) => GROUP_ID_NOT_FOUND,
                (false, true) => match self.store(c, vec![Change::DeleteGroup { group: group.clone() }]).await {
                    Ok(()) => {
                        c.with(|st| {
                            st.groups.remove(&group);
                            st.consumer_groups.remove(&group);
                        });
                        code::NONE
                    }
                    Err(_) => NOT_COORDINATOR,
                },
            };
            results.push(
                DeletableGroupResult::default()
                    .with_group_id(name)
                    .with_error_code(error),
            );
        }
        DeleteGroupsResponse::default().with_results(results)
    }
}
