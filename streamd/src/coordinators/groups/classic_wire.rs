//! JoinGroup, SyncGroup and LeaveGroup on the wire: the conversions between the
//! protocol's messages and the classic state machine of `membership/`, apart from the
//! coordinator's dispatch and state in `mod.rs`.

use super::membership::{code, Answer, Group, JoinArgs, JoinOutcome, SyncOutcome};
use super::{instance, s, Client, GroupCoordinator, Groups, NOT_COORDINATOR};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, SyncGroupRequest, SyncGroupResponse,
};
use std::time::{Duration, Instant};

impl Groups {
    pub(super) async fn join(
        &self,
        c: &GroupCoordinator,
        r: JoinGroupRequest,
        version: i16,
        client: Client,
    ) -> JoinGroupResponse {
        let args = JoinArgs {
            member_id: r.member_id.to_string(),
            group_instance_id: instance(&r.group_instance_id).map(str::to_string),
            client_id: client.id,
            client_host: client.host,
            session_timeout: Duration::from_millis(r.session_timeout_ms.max(0) as u64),
            // v0 has no rebalance timeout: it is the session timeout.
            rebalance_timeout: Duration::from_millis(if version == 0 {
                r.session_timeout_ms.max(0) as u64
            } else {
                r.rebalance_timeout_ms.max(0) as u64
            }),
            protocol_type: r.protocol_type.to_string(),
            protocols: r
                .protocols
                .iter()
                .map(|p| (p.name.to_string(), p.metadata.clone()))
                .collect(),
            require_known_member_id: version >= 4,
            max_size: self.core.tunables().max_group_members,
            initial_delay: self.core.tunables().group_initial_rebalance_delay,
        };
        let group = r.group_id.0.to_string();
        let answer = c.with(|st| {
            // A KIP-848 group with members is not a classic one (Kafka answers so too
            // when no online migration is allowed); an empty one gives way.
            if st.consumer_groups.get(&group).is_some_and(|g| !g.is_empty()) {
                return Answer::Now(JoinOutcome {
                    error: code::INCONSISTENT_GROUP_PROTOCOL,
                    generation: -1,
                    member_id: args.member_id.clone(),
                    ..Default::default()
                });
            }
            st.consumer_groups.remove(&group);
            st.groups
                .entry(group.clone())
                .or_insert_with(|| Group::new(&group))
                .join(args, Instant::now())
        });
        let o = match answer {
            Answer::Now(o) => o,
            Answer::Later(rx) => rx.await.unwrap_or_else(|_| JoinOutcome {
                error: NOT_COORDINATOR,
                generation: -1,
                member_id: r.member_id.to_string(),
                ..Default::default()
            }),
        };
        // The protocol name is nullable only from v7; older versions get "".
        let protocol = match (o.protocol.as_deref(), version) {
            (None, v) if v < 7 => Some(""),
            (p, _) => p,
        };
        JoinGroupResponse::default()
            .with_error_code(o.error)
            .with_generation_id(o.generation)
            .with_protocol_type(o.protocol_type.as_deref().map(s))
            .with_protocol_name(protocol.map(s))
            .with_leader(s(&o.leader))
            .with_member_id(s(&o.member_id))
            .with_members(
                o.members
                    .into_iter()
                    .map(|(id, instance, metadata)| {
                        JoinGroupResponseMember::default()
                            .with_member_id(s(&id))
                            .with_group_instance_id(instance.as_deref().map(s))
                            .with_metadata(metadata)
                    })
                    .collect(),
            )
    }
}

pub(super) async fn sync(c: &GroupCoordinator, r: SyncGroupRequest) -> SyncGroupResponse {
    let assignments = r
        .assignments
        .iter()
        .map(|a| (a.member_id.to_string(), a.assignment.clone()))
        .collect();
    let answer = c.with(|st| match st.groups.get_mut(r.group_id.0.as_str()) {
        Some(g) => g.sync(
            &r.member_id,
            instance(&r.group_instance_id),
            r.generation_id,
            assignments,
            Instant::now(),
        ),
        None => Answer::Now(SyncOutcome {
            error: code::UNKNOWN_MEMBER_ID,
            ..Default::default()
        }),
    });
    let o = match answer {
        Answer::Now(o) => o,
        Answer::Later(rx) => rx.await.unwrap_or(SyncOutcome {
            error: NOT_COORDINATOR,
            ..Default::default()
        }),
    };
    SyncGroupResponse::default()
        .with_error_code(o.error)
        .with_protocol_type(o.protocol_type.as_deref().map(s))
        .with_protocol_name(o.protocol.as_deref().map(s))
        .with_assignment(o.assignment)
}

pub(super) fn leave(c: &GroupCoordinator, r: LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
    let now = Instant::now();
    c.with(|st| {
        let group = st.groups.get_mut(r.group_id.0.as_str());
        if version < 3 {
            let e = group.map_or(code::UNKNOWN_MEMBER_ID, |g| g.leave(&r.member_id, None, now));
            return LeaveGroupResponse::default().with_error_code(e);
        }
        let Some(g) = group else {
            return LeaveGroupResponse::default().with_error_code(code::UNKNOWN_MEMBER_ID);
        };
        let members = r
            .members
            .iter()
            .map(|m| {
                MemberResponse::default()
                    .with_member_id(m.member_id.clone())
                    .with_group_instance_id(m.group_instance_id.clone())
                    .with_error_code(g.leave(&m.member_id, instance(&m.group_instance_id), now))
            })
            .collect();
        LeaveGroupResponse::default().with_members(members)
    })
}
