//! Topic admin (CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs) through
//! the metadata log, and InitProducerId with ids allocated by metad. Topic configs
//! themselves are `configs`' business.

use super::brokers::topic_id;
use super::caller::Caller;
use super::errors;
use super::Kafka;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::{DescribeConfigsResourceResult, DescribeConfigsResult};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::Resource;
use weir_meta::model::{Applied, Command};

use super::configs::{BROKER, TOPIC};
/// DescribeConfigs' source of the gateway's own settings.
const DEFAULT_CONFIG: i8 = 5;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Proposes `cmd`; the applied result, or a Kafka error code and message.
pub(super) async fn propose(kafka: &Kafka, caller: &Caller, cmd: Command) -> Result<Applied, (i16, String)> {
    match kafka.gw.metad.propose(&caller.proposer(), cmd).await {
        Ok((index, Ok(applied))) => {
            kafka.gw.settle(index).await;
            Ok(applied)
        }
        Ok((_, Err(rejection))) => Err(errors::admin(&Ok(rejection))),
        Err(e) => Err(errors::admin(&Err(e))),
    }
}

pub async fn create_topics(kafka: &Kafka, caller: &Caller, r: CreateTopicsRequest) -> CreateTopicsResponse {
    let mut results = vec![];
    for t in r.topics {
        let name = t.name.0.to_string();
        let partitions = if !t.assignments.is_empty() {
            t.assignments.len() as i32
        } else if t.num_partitions == -1 {
            kafka.default_partitions as i32
        } else {
            t.num_partitions
        };
        let configs: Vec<(String, Option<String>)> = t
            .configs
            .iter()
            .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
            .collect();
        let result = CreatableTopicResult::default()
            .with_name(t.name.clone())
            .with_num_partitions(partitions)
            .with_replication_factor(1);
        let checked = if !caller.grants.allows(Operation::Create, Resource::Topic(&name)) {
            Err((errors::TOPIC_AUTHORIZATION_FAILED, no_scope("create", &name)))
        } else if let Err(e) = weir_meta::model::validate_name("topic", &name) {
            Err((errors::INVALID_TOPIC_EXCEPTION, e.message))
        } else if super::brokers::is_internal_topic(&name) {
            Err((
                errors::INVALID_TOPIC_EXCEPTION,
                "topic names starting with '__' are internal".to_string(),
            ))
        } else if partitions <= 0 {
            Err((
                errors::INVALID_PARTITIONS,
                format!("partitions must be at least 1, got {partitions}"),
            ))
        } else if let Err(why) = check_assignments(kafka, &t) {
            Err(why)
        } else if t.replication_factor == 0 || t.replication_factor < -1 {
            Err((
                errors::INVALID_REPLICATION_FACTOR,
                "replication factor must be -1 or at least 1".into(),
            ))
        } else {
            super::configs::parse(kafka, &configs).map_err(|e| (errors::INVALID_CONFIG, e))
        };
        let outcome = match checked {
            Err(e) => Err(e),
            Ok(_) if r.validate_only => {
                if kafka.gw.routes.view().with(|s| s.topics.contains_key(&name)) {
                    Err((errors::TOPIC_ALREADY_EXISTS, format!("topic '{name}' already exists")))
                } else {
                    Ok(())
                }
            }
            Ok(config) => propose(
                kafka,
                caller,
                Command::CreateTopic {
                    name: name.clone(),
                    partitions: partitions as u32,
                    config,
                },
            )
            .await
            .map(|_| ()),
        };
        results.push(match outcome {
            Ok(()) => {
                let id = kafka
                    .gw
                    .routes
                    .view()
                    .with(|s| s.topics.get(&name).map(topic_id))
                    .unwrap_or_default();
                result.with_topic_id(id)
            }
            Err((code, message)) => result.with_error_code(code).with_error_message(Some(s(&message))),
        });
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// A CreateTopics' manual replica assignment, checked as Kafka does (partitions 0..n
/// each once, on known brokers, with `num_partitions` and `replication_factor` left −1).
/// It sets the partition count; which gateway leads each partition stays Weir's choice,
/// as every gateway serves every partition and the data lives in object storage.
fn check_assignments(kafka: &Kafka, t: &create_topics_request::CreatableTopic) -> Result<(), (i16, String)> {
    if t.assignments.is_empty() {
        return Ok(());
    }
    if t.num_partitions != -1 || t.replication_factor != -1 {
        return Err((
            errors::INVALID_REQUEST,
            "a replica assignment requires num_partitions and replication_factor -1".into(),
        ));
    }
    let mut indexes: Vec<i32> = t.assignments.iter().map(|a| a.partition_index).collect();
    indexes.sort_unstable();
    if indexes.iter().enumerate().any(|(i, p)| *p != i as i32) {
        return Err((
            errors::INVALID_REPLICA_ASSIGNMENT,
            format!("the assignment's partitions must be 0..{} each once", indexes.len()),
        ));
    }
    let lists: Vec<(i32, &[BrokerId])> = t
        .assignments
        .iter()
        .map(|a| (a.partition_index, a.broker_ids.as_slice()))
        .collect();
    check_broker_lists(kafka, &lists)
}

/// A CreatePartitions' assignment, checked as Kafka checks it: one broker list per new
/// partition, each of distinct live brokers. Leaders stay Weir's choice, as for
/// CreateTopics.
fn check_new_partitions(
    kafka: &Kafka,
    current: i32,
    t: &create_partitions_request::CreatePartitionsTopic,
) -> Result<(), (i16, String)> {
    let assignments = t.assignments.as_deref().unwrap_or_default();
    let new = t.count - current;
    if assignments.len() as i32 != new {
        return Err((
            errors::INVALID_REPLICA_ASSIGNMENT,
            format!(
                "{new} new partitions need {new} broker lists, got {}",
                assignments.len()
            ),
        ));
    }
    let lists: Vec<(i32, &[BrokerId])> = assignments
        .iter()
        .enumerate()
        .map(|(i, a)| (current + i as i32, a.broker_ids.as_slice()))
        .collect();
    check_broker_lists(kafka, &lists)
}

/// Each (partition, brokers) names distinct live brokers.
fn check_broker_lists(kafka: &Kafka, lists: &[(i32, &[BrokerId])]) -> Result<(), (i16, String)> {
    let known: Vec<i32> = super::brokers::brokers(kafka).iter().map(|b| b.id).collect();
    for (partition, brokers) in lists {
        let mut ids: Vec<i32> = brokers.iter().map(|b| b.0).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() || ids.len() != brokers.len() {
            return Err((
                errors::INVALID_REPLICA_ASSIGNMENT,
                format!("partition {partition} needs distinct brokers"),
            ));
        }
        if let Some(unknown) = ids.iter().find(|id| !known.contains(id)) {
            return Err((
                errors::INVALID_REPLICA_ASSIGNMENT,
                format!("partition {partition} names broker {unknown}, which is not a live broker"),
            ));
        }
    }
    Ok(())
}

pub async fn delete_topics(kafka: &Kafka, caller: &Caller, r: DeleteTopicsRequest) -> DeleteTopicsResponse {
    // v6 names topics by state (name or id); older versions by name.
    let mut wanted: Vec<(Option<String>, uuid::Uuid)> = r
        .topic_names
        .iter()
        .map(|n| (Some(n.0.to_string()), uuid::Uuid::nil()))
        .collect();
    wanted.extend(
        r.topics
            .iter()
            .map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id)),
    );
    // Each topic is deleted by its id, read from a view current as of the request, so a
    // proposal that lands after its caller gave up cannot delete a topic of that name
    // created since.
    let current = kafka.gw.catch_up().await.map_err(|e| errors::admin(&Err(e)));
    let mut results = vec![];
    for (name, requested) in wanted {
        // Answered with what the client sent until the topic is deleted, so a refusal
        // tells nothing of a topic the client may not manage.
        let result = DeletableTopicResult::default()
            .with_name(name.as_ref().map(|n| TopicName(s(n))))
            .with_topic_id(requested);
        let outcome = delete_one(kafka, caller, &current, name.as_deref(), requested).await;
        results.push(match outcome {
            Ok((name, id)) => result.with_name(Some(TopicName(s(&name)))).with_topic_id(id),
            Err((code, message)) => result.with_error_code(code).with_error_message(Some(s(&message))),
        });
    }
    DeleteTopicsResponse::default().with_responses(results)
}

/// One entry of a DeleteTopics request, named by `name` or by `requested` id (one of
/// them, as Kafka requires), checked in Kafka's order: the request's shape, then
/// authorization, then existence. The deleted topic's name and id.
async fn delete_one(
    kafka: &Kafka,
    caller: &Caller,
    current: &Result<(), (i16, String)>,
    name: Option<&str>,
    requested: uuid::Uuid,
) -> Result<(String, uuid::Uuid), (i16, String)> {
    if name.is_some() != requested.is_nil() {
        return Err((
            errors::INVALID_REQUEST,
            "name a topic by its name or by its id, not both and not neither".into(),
        ));
    }
    let by_id = name.is_none();
    let found: Option<(String, uuid::Uuid)> = kafka.gw.routes.view().with(|s| {
        match name {
            Some(n) => s.topics.get(n),
            None => s.topics.values().find(|t| topic_id(t) == requested),
        }
        .map(|t| (t.name.clone(), topic_id(t)))
    });
    let Some(name) = name
        .map(str::to_string)
        .or_else(|| found.as_ref().map(|(n, _)| n.clone()))
    else {
        current.clone()?;
        return Err((errors::UNKNOWN_TOPIC_ID, "no topic has this id".into()));
    };
    if !caller.grants.allows(Operation::Delete, Resource::Topic(&name)) {
        let message = if by_id {
            "the token has no 'manage' scope for the topic of this id".to_string()
        } else {
            no_scope("delete", &name)
        };
        return Err((errors::TOPIC_AUTHORIZATION_FAILED, message));
    }
    if super::brokers::is_internal_topic(&name) {
        return Err((
            errors::INVALID_TOPIC_EXCEPTION,
            "internal topics cannot be deleted".into(),
        ));
    }
    current.clone()?;
    let Some((_, id)) = found else {
        return Err((
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("topic '{name}' does not exist"),
        ));
    };
    let command = Command::DeleteTopic {
        name: name.clone(),
        topic_id: Some(*id.as_bytes()),
    };
    propose(kafka, caller, command).await?;
    Ok((name, id))
}

pub async fn create_partitions(kafka: &Kafka, caller: &Caller, r: CreatePartitionsRequest) -> CreatePartitionsResponse {
    let mut results = vec![];
    for t in r.topics {
        let name = t.name.0.to_string();
        let current = kafka
            .gw
            .routes
            .view()
            .with(|s| s.topics.get(&name).map(|t| t.partitions.len() as i32));
        // A manual assignment is checked (and then only sets the count), as Kafka's.
        let assignment = match current {
            Some(c) if t.assignments.is_some() && t.count > c => check_new_partitions(kafka, c, &t),
            _ => Ok(()),
        };
        let outcome = match current {
            _ if !caller.grants.allows(Operation::Alter, Resource::Topic(&name)) => {
                Err((errors::TOPIC_AUTHORIZATION_FAILED, no_scope("alter", &name)))
            }
            None => Err((
                errors::UNKNOWN_TOPIC_OR_PARTITION,
                format!("topic '{name}' does not exist"),
            )),
            Some(c) if t.count <= c => Err((
                errors::INVALID_PARTITIONS,
                format!(
                    "topic '{name}' has {c} partitions; the new count must be above that, got {}",
                    t.count
                ),
            )),
            Some(_) if assignment.is_err() => assignment,
            Some(_) if r.validate_only => Ok(()),
            Some(_) => propose(
                kafka,
                caller,
                Command::CreatePartitions {
                    name: name.clone(),
                    partitions: t.count as u32,
                },
            )
            .await
            .map(|_| ())
            .map_err(|(code, m)| {
                (
                    if code == errors::INVALID_REQUEST {
                        errors::INVALID_PARTITIONS
                    } else {
                        code
                    },
                    m,
                )
            }),
        };
        let result = CreatePartitionsTopicResult::default().with_name(t.name);
        results.push(match outcome {
            Ok(()) => result,
            Err((code, message)) => result.with_error_code(code).with_error_message(Some(s(&message))),
        });
    }
    CreatePartitionsResponse::default().with_results(results)
}

fn config_entry(name: &str, value: Option<String>, source: i8, read_only: bool) -> DescribeConfigsResourceResult {
    DescribeConfigsResourceResult::default()
        .with_name(s(name))
        .with_value(value.map(StrBytes::from_string))
        .with_config_source(source)
        .with_read_only(read_only)
}

pub fn describe_configs(kafka: &Kafka, caller: &Caller, r: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let mut results = vec![];
    for res in r.resources {
        let name = res.resource_name.to_string();
        let result = DescribeConfigsResult::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name.clone());
        let entries = match res.resource_type {
            TOPIC if !caller.grants.allows(Operation::DescribeConfigs, Resource::Topic(&name)) => {
                results.push(
                    result
                        .with_error_code(errors::TOPIC_AUTHORIZATION_FAILED)
                        .with_error_message(Some(s(&no_scope("describe the configs of", &name)))),
                );
                continue;
            }
            TOPIC => match kafka.gw.routes.view().with(|s| s.topics.get(&name).cloned()) {
                None => {
                    results.push(
                        result
                            .with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION)
                            .with_error_message(Some(s(&format!("topic '{name}' does not exist")))),
                    );
                    continue;
                }
                Some(t) => super::configs::describe(kafka, &t.config),
            },
            BROKER => vec![
                config_entry(
                    "auto.create.topics.enable",
                    Some(kafka.auto_create_topics.to_string()),
                    DEFAULT_CONFIG,
                    true,
                ),
                config_entry(
                    "num.partitions",
                    Some(kafka.default_partitions.to_string()),
                    DEFAULT_CONFIG,
                    true,
                ),
                config_entry(
                    "message.max.bytes",
                    Some(kafka.max_message_bytes.to_string()),
                    DEFAULT_CONFIG,
                    true,
                ),
                config_entry(
                    "socket.request.max.bytes",
                    Some(kafka.max_frame_bytes.to_string()),
                    DEFAULT_CONFIG,
                    true,
                ),
                // What consoles read to learn the cluster's abilities (issue 59): the
                // Kafka release whose APIs Weir serves, and that topics can be deleted.
                config_entry(
                    "inter.broker.protocol.version",
                    Some(super::versions::KAFKA_RELEASE.to_string()),
                    DEFAULT_CONFIG,
                    true,
                ),
                config_entry("delete.topic.enable", Some("true".into()), DEFAULT_CONFIG, true),
                // Replication is the object store's: a partition has one replica.
                config_entry("default.replication.factor", Some("1".into()), DEFAULT_CONFIG, true),
                config_entry("min.insync.replicas", Some("1".into()), DEFAULT_CONFIG, true),
                // A topic without `retention.ms` keeps everything.
                config_entry("log.retention.ms", Some("-1".into()), DEFAULT_CONFIG, true),
                config_entry("log.retention.bytes", Some("-1".into()), DEFAULT_CONFIG, true),
            ],
            other => {
                results.push(
                    result
                        .with_error_code(errors::INVALID_REQUEST)
                        .with_error_message(Some(s(&format!("resource type {other} is not supported")))),
                );
                continue;
            }
        };
        let entries = entries
            .into_iter()
            .filter(|e| {
                res.configuration_keys
                    .as_ref()
                    .is_none_or(|keys| keys.iter().any(|k| k.as_str() == e.name.as_str()))
            })
            .collect();
        results.push(result.with_configs(entries));
    }
    DescribeConfigsResponse::default().with_results(results)
}

/// InitProducerId for an idempotent producer (one with a transactional id goes to its
/// coordinator, `transactions.rs`).
pub async fn init_producer_id(kafka: &Kafka, caller: &Caller, _: InitProducerIdRequest) -> InitProducerIdResponse {
    // An idempotent producer id is for writing: IDEMPOTENT_WRITE on the cluster, or
    // WRITE on some topic (KIP-679), as metad judges it too.
    if !weir_meta::model::user_commands::Need::ProducerIds.met_by(&caller.grants) {
        return InitProducerIdResponse::default()
            .with_error_code(errors::CLUSTER_AUTHORIZATION_FAILED)
            .with_producer_id((-1).into())
            .with_producer_epoch(-1);
    }
    // A new id each time: the owner keeps sequence state per id, so a fresh id starts
    // clean, as a bumped epoch would.
    match propose(kafka, caller, Command::AllocateProducerIds { count: 1 }).await {
        Ok(Applied::ProducerIds { first, .. }) => InitProducerIdResponse::default()
            .with_producer_id(first.into())
            .with_producer_epoch(0),
        // metad refused this user (D-21): retrying would not help.
        Err((code, _)) if code == errors::TOPIC_AUTHORIZATION_FAILED => InitProducerIdResponse::default()
            .with_error_code(errors::CLUSTER_AUTHORIZATION_FAILED)
            .with_producer_id((-1).into())
            .with_producer_epoch(-1),
        _ => InitProducerIdResponse::default()
            .with_error_code(errors::COORDINATOR_NOT_AVAILABLE)
            .with_producer_id((-1).into())
            .with_producer_epoch(-1),
    }
}

/// Why a topic request was refused by the caller's scopes and ACLs.
fn no_scope(op: &str, topic: &str) -> String {
    format!("the user may not {op} topic '{topic}'")
}
