//! DescribeClientQuotas and AlterClientQuotas (issue 59, KIP-546): the client quotas in
//! the metadata log, by user (a token's name) and client id. Listing needs
//! DESCRIBE_CONFIGS on the cluster and changing ALTER_CONFIGS, as in Kafka.

use super::caller::Caller;
use super::Kafka;
use kafka_protocol::messages::alter_client_quotas_response::{EntityData as AlteredEntity, EntryData as AlteredEntry};
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError as KafkaError;
use std::collections::BTreeMap;
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::Resource;
use weir_meta::model::quotas::*;
use weir_meta::model::Command;

const CLUSTER_AUTHORIZATION_FAILED: i16 = KafkaError::ClusterAuthorizationFailed.code();
const INVALID_REQUEST: i16 = KafkaError::InvalidRequest.code();

const USER: &str = "user";
const CLIENT_ID: &str = "client-id";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// An entity from its (type, name) parts; a null name is the default.
fn entity(parts: &[(String, Option<String>)]) -> Result<QuotaEntity, String> {
    let mut e = QuotaEntity {
        user: None,
        client_id: None,
    };
    for (kind, name) in parts {
        let side = match kind.as_str() {
            USER => &mut e.user,
            CLIENT_ID => &mut e.client_id,
            other => {
                return Err(format!(
                    "entity type '{other}' is not one Weir keeps quotas for: user, client-id"
                ))
            }
        };
        if side.is_some() {
            return Err(format!("entity type '{kind}' is given twice"));
        }
        *side = Some(match name {
            None => QuotaName::Default,
            Some(n) => QuotaName::Name(n.clone()),
        });
    }
    if e.user.is_none() && e.client_id.is_none() {
        return Err("an entity names a user, a client id, or both".into());
    }
    Ok(e)
}

fn parts(e: &QuotaEntity) -> Vec<(&'static str, Option<&str>)> {
    fn name(n: &QuotaName) -> Option<&str> {
        match n {
            QuotaName::Default => None,
            QuotaName::Name(n) => Some(n.as_str()),
        }
    }
    let mut out = vec![];
    if let Some(u) = &e.user {
        out.push((USER, name(u)));
    }
    if let Some(c) = &e.client_id {
        out.push((CLIENT_ID, name(c)));
    }
    out
}

pub fn describe(kafka: &Kafka, caller: &Caller, r: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse {
    let failed = |code: i16, why: &str| {
        DescribeClientQuotasResponse::default()
            .with_error_code(code)
            .with_error_message(Some(s(why)))
            .with_entries(None)
    };
    if !caller.grants.allows(Operation::DescribeConfigs, Resource::Cluster) {
        return failed(
            CLUSTER_AUTHORIZATION_FAILED,
            "describing client quotas needs DESCRIBE_CONFIGS on the cluster",
        );
    }
    let mut filter: Vec<(&str, QuotaMatch)> = vec![];
    for c in &r.components {
        let kind = match c.entity_type.as_str() {
            USER => USER,
            CLIENT_ID => CLIENT_ID,
            other => {
                return failed(
                    INVALID_REQUEST,
                    &format!("entity type '{other}' is not user or client-id"),
                )
            }
        };
        let m = match (c.match_type, &c._match) {
            (0, Some(name)) => QuotaMatch::Exact(name.to_string()),
            (0, None) | (1, _) => QuotaMatch::Default,
            (2, _) => QuotaMatch::Specified,
            (t, _) => return failed(INVALID_REQUEST, &format!("match type {t} is not 0, 1 or 2")),
        };
        filter.push((kind, m));
    }
    let entries = kafka.gw.routes.view().with(|state| {
        state
            .quotas
            .values()
            .filter(|row| {
                let side = |kind: &str| match kind {
                    USER => row.entity.user.as_ref(),
                    _ => row.entity.client_id.as_ref(),
                };
                let matched = filter.iter().all(|(kind, m)| m.matches(side(kind)));
                // Strict: the entity has no side the filter does not name.
                let strict_ok = !r.strict
                    || [USER, CLIENT_ID]
                        .into_iter()
                        .all(|kind| side(kind).is_none() || filter.iter().any(|(k, _)| *k == kind));
                matched && strict_ok
            })
            .map(|row| {
                EntryData::default()
                    .with_entity(
                        parts(&row.entity)
                            .into_iter()
                            .map(|(kind, name)| {
                                EntityData::default()
                                    .with_entity_type(s(kind))
                                    .with_entity_name(name.map(s))
                            })
                            .collect(),
                    )
                    .with_values(
                        row.values
                            .iter()
                            .map(|(k, v)| ValueData::default().with_key(s(k.name())).with_value(v.get()))
                            .collect(),
                    )
            })
            .collect()
    });
    DescribeClientQuotasResponse::default().with_entries(Some(entries))
}

pub async fn alter(kafka: &Kafka, caller: &Caller, r: AlterClientQuotasRequest) -> AlterClientQuotasResponse {
    let authorized = caller.grants.allows(Operation::AlterConfigs, Resource::Cluster);
    let mut results = Vec::with_capacity(r.entries.len());
    for e in r.entries {
        let named: Vec<(String, Option<String>)> = e
            .entity
            .iter()
            .map(|p| (p.entity_type.to_string(), p.entity_name.as_ref().map(|n| n.to_string())))
            .collect();
        let outcome = match authorized {
            false => Err((
                CLUSTER_AUTHORIZATION_FAILED,
                "changing client quotas needs ALTER_CONFIGS on the cluster".to_string(),
            )),
            true => command(&named, &e.ops).map_err(|why| (INVALID_REQUEST, why)),
        };
        let outcome = match outcome {
            Ok(cmd) if !r.validate_only => super::admin::propose(kafka, caller, cmd).await.map(|_| ()),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        let result = AlteredEntry::default().with_entity(
            named
                .iter()
                .map(|(kind, name)| {
                    AlteredEntity::default()
                        .with_entity_type(s(kind))
                        .with_entity_name(name.as_deref().map(s))
                })
                .collect(),
        );
        results.push(match outcome {
            Ok(()) => result,
            Err((code, why)) => result.with_error_code(code).with_error_message(Some(s(&why))),
        });
    }
    AlterClientQuotasResponse::default().with_entries(results)
}

/// The command one AlterClientQuotas entry asks for, or why it is invalid.
fn command(named: &[(String, Option<String>)], ops: &[alter_client_quotas_request::OpData]) -> Result<Command, String> {
    let entity = entity(named)?;
    let mut set = BTreeMap::new();
    let mut remove = vec![];
    for op in ops {
        let key = QuotaKey::from_name(op.key.as_str()).ok_or_else(|| {
            format!(
                "quota '{}' is not one Weir enforces: producer_byte_rate, consumer_byte_rate, request_percentage",
                op.key
            )
        })?;
        if set.contains_key(&key) || remove.contains(&key) {
            return Err(format!("quota '{}' is given twice", key.name()));
        }
        if op.remove {
            remove.push(key);
        } else {
            if let Some(why) = invalid_value(key, op.value) {
                return Err(why);
            }
            set.insert(key, QuotaValue::new(op.value));
        }
    }
    Ok(Command::AlterClientQuotas { entity, set, remove })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: &str, value: f64, remove: bool) -> alter_client_quotas_request::OpData {
        alter_client_quotas_request::OpData::default()
            .with_key(s(key))
            .with_value(value)
            .with_remove(remove)
    }

    #[test]
    fn an_entry_becomes_one_command_or_says_why_not() {
        let named = vec![
            ("user".to_string(), Some("alice".to_string())),
            ("client-id".to_string(), None),
        ];
        let Ok(Command::AlterClientQuotas { entity, set, remove }) = command(
            &named,
            &[
                op("producer_byte_rate", 1e6, false),
                op("consumer_byte_rate", 0.0, true),
            ],
        ) else {
            panic!("a command");
        };
        assert_eq!(entity.user, Some(QuotaName::Name("alice".into())));
        assert_eq!(entity.client_id, Some(QuotaName::Default));
        assert_eq!(set[&QuotaKey::ProducerByteRate].get(), 1e6);
        assert_eq!(remove, vec![QuotaKey::ConsumerByteRate]);
        let err = command(&named, &[op("controller_mutation_rate", 1.0, false)]).unwrap_err();
        assert!(err.contains("not one Weir enforces"), "{err}");
        let err = command(&[("ip".into(), None)], &[]).unwrap_err();
        assert!(err.contains("entity type 'ip'"), "{err}");
        let err = command(&named, &[op("producer_byte_rate", -5.0, false)]).unwrap_err();
        assert!(err.contains("positive"), "{err}");
    }
}
