//! CreateAcls, DescribeAcls and DeleteAcls (issue 59): Kafka's ACL APIs over the ACLs
//! in the metadata log, which every gateway enforces on Kafka and HTTP alike. Listing
//! needs DESCRIBE on the cluster and changing ALTER, as in Kafka.

use super::caller::Caller;
use super::Kafka;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError as KafkaError;
use std::collections::BTreeMap;
use weir_meta::model::acls::*;
use weir_meta::model::grants::Resource;
use weir_meta::model::{Applied, Command};

const CLUSTER_AUTHORIZATION_FAILED: i16 = KafkaError::ClusterAuthorizationFailed.code();
const INVALID_REQUEST: i16 = KafkaError::InvalidRequest.code();

/// Kafka's "any" code in a filter (resource type, pattern, operation, permission).
const ANY: i8 = 1;
/// Kafka's MATCH pattern type, a filter only.
const MATCH: i8 = 2;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A binding from a CreateAcls entry, or why it is not one.
fn binding(c: &create_acls_request::AclCreation) -> Result<AclBinding, String> {
    let resource_type = ResourceType::from_code(c.resource_type).ok_or_else(|| {
        format!(
            "resource type {} is not one Weir keeps ACLs for: topic (2), group (3), cluster (4), transactional id (5)",
            c.resource_type
        )
    })?;
    let pattern_type = PatternType::from_code(c.resource_pattern_type).ok_or_else(|| {
        format!(
            "pattern type {} is neither LITERAL (3) nor PREFIXED (4)",
            c.resource_pattern_type
        )
    })?;
    let operation = Operation::from_code(c.operation)
        .ok_or_else(|| format!("operation {} is not a concrete ACL operation", c.operation))?;
    let permission = Permission::from_code(c.permission_type)
        .ok_or_else(|| format!("permission {} is neither DENY (2) nor ALLOW (3)", c.permission_type))?;
    let b = AclBinding {
        resource_type,
        pattern_type,
        resource_name: c.resource_name.to_string(),
        principal: c.principal.to_string(),
        host: c.host.to_string(),
        operation,
        permission,
    };
    match b.invalid() {
        Some(why) => Err(why),
        None => Ok(b),
    }
}

/// The fields DescribeAcls and DeleteAcls share, which make a filter.
struct FilterFields<'a> {
    resource_type: i8,
    resource_name: Option<&'a StrBytes>,
    pattern_type: i8,
    principal: Option<&'a StrBytes>,
    host: Option<&'a StrBytes>,
    operation: i8,
    permission: i8,
}

impl<'a> From<&'a DescribeAclsRequest> for FilterFields<'a> {
    fn from(r: &'a DescribeAclsRequest) -> Self {
        Self {
            resource_type: r.resource_type_filter,
            resource_name: r.resource_name_filter.as_ref(),
            pattern_type: r.pattern_type_filter,
            principal: r.principal_filter.as_ref(),
            host: r.host_filter.as_ref(),
            operation: r.operation,
            permission: r.permission_type,
        }
    }
}

impl<'a> From<&'a DeleteAclsFilter> for FilterFields<'a> {
    fn from(f: &'a DeleteAclsFilter) -> Self {
        Self {
            resource_type: f.resource_type_filter,
            resource_name: f.resource_name_filter.as_ref(),
            pattern_type: f.pattern_type_filter,
            principal: f.principal_filter.as_ref(),
            host: f.host_filter.as_ref(),
            operation: f.operation,
            permission: f.permission_type,
        }
    }
}

/// The filter `fields` name, or why they name none.
fn filter(fields: FilterFields) -> Result<AclFilter, String> {
    let FilterFields {
        resource_type,
        resource_name,
        pattern_type,
        principal,
        host,
        operation,
        permission,
    } = fields;
    let any_or = |code: i8, what: &str, known: Option<()>| match (code, known) {
        (ANY, _) | (_, Some(())) => Ok(()),
        _ => Err(format!("{what} {code} is not one a filter names")),
    };
    any_or(
        resource_type,
        "resource type",
        ResourceType::from_code(resource_type).map(|_| ()),
    )?;
    any_or(operation, "operation", Operation::from_code(operation).map(|_| ()))?;
    any_or(permission, "permission", Permission::from_code(permission).map(|_| ()))?;
    let pattern = match pattern_type {
        ANY => PatternFilter::Any,
        MATCH => PatternFilter::Match,
        p => PatternFilter::Exactly(PatternType::from_code(p).ok_or_else(|| format!("pattern type {p} is unknown"))?),
    };
    Ok(AclFilter {
        resource_type: ResourceType::from_code(resource_type),
        pattern,
        resource_name: resource_name.map(|n| n.to_string()),
        principal: principal.map(|p| p.to_string()),
        host: host.map(|h| h.to_string()),
        operation: Operation::from_code(operation),
        permission: Permission::from_code(permission),
    })
}

pub fn describe(kafka: &Kafka, caller: &Caller, r: DescribeAclsRequest) -> DescribeAclsResponse {
    let response = DescribeAclsResponse::default();
    if !caller.grants.allows(Operation::Describe, Resource::Cluster) {
        return response
            .with_error_code(CLUSTER_AUTHORIZATION_FAILED)
            .with_error_message(Some(s("describing ACLs needs DESCRIBE on the cluster")));
    }
    let f = match filter(FilterFields::from(&r)) {
        Ok(f) => f,
        Err(why) => {
            return response
                .with_error_code(INVALID_REQUEST)
                .with_error_message(Some(s(&why)))
        }
    };
    // Grouped by resource pattern, as Kafka answers.
    let mut by_resource: BTreeMap<(ResourceType, String, PatternType), Vec<AclDescription>> = BTreeMap::new();
    kafka.gw.routes.view().with(|state| {
        for b in state.acls.iter().filter(|b| f.matches(b)) {
            by_resource
                .entry((b.resource_type, b.resource_name.clone(), b.pattern_type))
                .or_default()
                .push(
                    AclDescription::default()
                        .with_principal(s(&b.principal))
                        .with_host(s(&b.host))
                        .with_operation(b.operation.code())
                        .with_permission_type(b.permission.code()),
                );
        }
    });
    response.with_resources(
        by_resource
            .into_iter()
            .map(|((rt, name, pattern), acls)| {
                DescribeAclsResource::default()
                    .with_resource_type(rt.code())
                    .with_resource_name(s(&name))
                    .with_pattern_type(pattern.code())
                    .with_acls(acls)
            })
            .collect(),
    )
}

pub async fn create(kafka: &Kafka, caller: &Caller, r: CreateAclsRequest) -> CreateAclsResponse {
    let authorized = caller.grants.allows(Operation::Alter, Resource::Cluster);
    // Each creation is answered on its own: the invalid ones with why, the rest by
    // one proposal (all or none, as one entry of the metadata log).
    let checked: Vec<Result<AclBinding, (i16, String)>> = r
        .creations
        .iter()
        .map(|c| match authorized {
            false => Err((
                CLUSTER_AUTHORIZATION_FAILED,
                "creating ACLs needs ALTER on the cluster".to_string(),
            )),
            true => binding(c).map_err(|why| (INVALID_REQUEST, why)),
        })
        .collect();
    let valid: Vec<AclBinding> = checked.iter().filter_map(|c| c.as_ref().ok().cloned()).collect();
    let proposed = match valid.is_empty() {
        true => Ok(()),
        false => super::admin::propose(kafka, caller, Command::CreateAcls { bindings: valid })
            .await
            .map(|_| ()),
    };
    let results = checked
        .into_iter()
        .map(|c| {
            let outcome = c.and_then(|_| proposed.clone());
            match outcome {
                Ok(()) => AclCreationResult::default(),
                Err((code, why)) => AclCreationResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(s(&why))),
            }
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

pub async fn delete(kafka: &Kafka, caller: &Caller, r: DeleteAclsRequest) -> DeleteAclsResponse {
    let failed = |code: i16, why: &str| {
        DeleteAclsFilterResult::default()
            .with_error_code(code)
            .with_error_message(Some(s(why)))
    };
    if !caller.grants.allows(Operation::Alter, Resource::Cluster) {
        let results = r
            .filters
            .iter()
            .map(|_| failed(CLUSTER_AUTHORIZATION_FAILED, "deleting ACLs needs ALTER on the cluster"))
            .collect();
        return DeleteAclsResponse::default().with_filter_results(results);
    }
    let parsed: Vec<Result<AclFilter, String>> = r.filters.iter().map(|f| filter(FilterFields::from(f))).collect();
    let valid: Vec<AclFilter> = parsed.iter().filter_map(|f| f.as_ref().ok().cloned()).collect();
    let outcome = match valid.is_empty() {
        true => Ok(Vec::new()),
        false => match super::admin::propose(kafka, caller, Command::DeleteAcls { filters: valid }).await {
            Ok(Applied::AclsDeleted { matched }) => Ok(matched),
            Ok(other) => Err((INVALID_REQUEST, format!("metad answered {other:?} to DeleteAcls"))),
            Err(e) => Err(e),
        },
    };
    let mut matched = match &outcome {
        Ok(m) => m.clone().into_iter(),
        Err(_) => Vec::new().into_iter(),
    };
    let results = parsed
        .into_iter()
        .map(|f| match (f, &outcome) {
            (Err(why), _) => failed(INVALID_REQUEST, &why),
            (Ok(_), Err((code, why))) => failed(*code, why),
            (Ok(_), Ok(_)) => DeleteAclsFilterResult::default().with_matching_acls(
                matched
                    .next()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|b| {
                        DeleteAclsMatchingAcl::default()
                            .with_resource_type(b.resource_type.code())
                            .with_resource_name(s(&b.resource_name))
                            .with_pattern_type(b.pattern_type.code())
                            .with_principal(s(&b.principal))
                            .with_host(s(&b.host))
                            .with_operation(b.operation.code())
                            .with_permission_type(b.permission.code())
                    })
                    .collect(),
            ),
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_creation_is_checked_before_it_is_proposed() {
        let c = create_acls_request::AclCreation::default()
            .with_resource_type(2)
            .with_resource_name(s("orders"))
            .with_resource_pattern_type(3)
            .with_principal(s("User:alice"))
            .with_host(s("*"))
            .with_operation(4)
            .with_permission_type(2);
        let b = binding(&c).expect("valid");
        assert_eq!(
            (b.resource_type, b.operation, b.permission),
            (ResourceType::Topic, Operation::Write, Permission::Deny)
        );
        let any_op = c.clone().with_operation(ANY);
        assert!(binding(&any_op).unwrap_err().contains("not a concrete"));
        let user_type = c.clone().with_resource_type(7);
        assert!(binding(&user_type).unwrap_err().contains("resource type 7"));
        let matching = c.with_resource_pattern_type(MATCH);
        assert!(binding(&matching).unwrap_err().contains("pattern type 2"));
    }

    #[test]
    fn a_filter_takes_any_and_match() {
        let r = DescribeAclsRequest::default()
            .with_resource_type_filter(ANY)
            .with_pattern_type_filter(MATCH)
            .with_operation(ANY)
            .with_permission_type(3);
        let f = filter(FilterFields::from(&r)).unwrap();
        assert_eq!(f.resource_type, None);
        assert_eq!(f.pattern, PatternFilter::Match);
        assert_eq!(f.permission, Some(Permission::Allow));
        let unknown = DeleteAclsFilter::default()
            .with_resource_type_filter(0)
            .with_pattern_type_filter(ANY)
            .with_operation(ANY)
            .with_permission_type(ANY);
        assert!(filter(FilterFields::from(&unknown)).is_err(), "UNKNOWN is no filter");
    }
}
