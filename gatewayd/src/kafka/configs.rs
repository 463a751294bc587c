//! Kafka topic configs as Weir keeps them (`StreamConfig`): parsed from CreateTopics,
//! AlterConfigs and IncrementalAlterConfigs, and shown by DescribeConfigs. Configs Weir
//! does not act on are refused, so nobody believes them applied.

use super::caller::Caller;
use super::errors;
use super::Kafka;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResourceResult;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_meta::model::acls::Operation;
use weir_meta::model::command::ConfigTarget;
use weir_meta::model::grants::Resource;
use weir_meta::model::{Command, RejectCode, StreamConfig};

/// Resource types.
pub const TOPIC: i8 = 2;
pub const BROKER: i8 = 4;
/// DescribeConfigs sources.
const TOPIC_CONFIG: i8 = 1;
const DEFAULT_CONFIG: i8 = 5;
/// Kafka's `segment.bytes` default and minimum.
const DEFAULT_SEGMENT_BYTES: u64 = 1 << 30;
const MIN_SEGMENT_BYTES: u64 = 14;
/// Kafka's `delete.retention.ms` default (one day).
const DEFAULT_DELETE_RETENTION_MS: u64 = 86_400_000;
/// IncrementalAlterConfigs operations.
const SET: i8 = 0;
const DELETE: i8 = 1;
/// An alter that lost a race with another (the config changed between its read and
/// its landing) is read and applied again, up to this many times in all; past that
/// it is answered REQUEST_TIMED_OUT, which clients retry.
const ALTER_ATTEMPTS: usize = 5;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A size or duration config: `-1` (or absent) is "no limit".
fn unlimited_or(name: &str, value: Option<&str>) -> Result<Option<u64>, String> {
    match value {
        None => Ok(None),
        Some(v) => match v.trim().parse::<i64>() {
            Ok(-1) => Ok(None),
            Ok(n) if n >= 0 => Ok(Some(n as u64)),
            _ => Err(format!("{name} '{v}' must be -1 or a number of at least 0")),
        },
    }
}

fn at_least(name: &str, value: Option<&str>, min: u64) -> Result<Option<u64>, String> {
    match value {
        None => Ok(None),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if n >= min => Ok(Some(n)),
            _ => Err(format!("{name} '{v}' must be a number of at least {min}")),
        },
    }
}

/// Sets (or, with `None`, resets to its default) one topic config on `config`.
pub fn set(kafka: &Kafka, config: &mut StreamConfig, name: &str, value: Option<&str>) -> Result<(), String> {
    match name {
        "retention.ms" => config.retention_ms = unlimited_or(name, value)?,
        "retention.bytes" => config.retention_bytes = unlimited_or(name, value)?,
        "max.message.bytes" => {
            let bytes = at_least(name, value, 1)?;
            if let Some(b) = bytes.filter(|b| *b > kafka.max_frame_bytes as u64) {
                return Err(format!(
                    "max.message.bytes {b} is above the largest request this gateway reads ({} bytes, --kafka-max-frame-bytes)",
                    kafka.max_frame_bytes
                ));
            }
            config.max_message_bytes = bytes;
        }
        "segment.bytes" => config.segment_bytes = at_least(name, value, MIN_SEGMENT_BYTES)?,
        "compression.type" => {
            config.compression_type = match value.map(str::trim) {
                None | Some("producer") => None,
                Some(v) if super::recompress::codec(v).is_some() => Some(v.to_string()),
                Some(other) => {
                    return Err(format!(
                        "compression.type '{other}' must be one of producer, uncompressed, gzip, snappy, lz4, zstd"
                    ))
                }
            }
        }
        "delete.retention.ms" => config.delete_retention_ms = unlimited_or(name, value)?,
        "cleanup.policy" => match value.map(str::trim) {
            None | Some("delete") => {}
            Some(other) => {
                return Err(format!(
                    "cleanup.policy '{other}' is not supported by Weir: records are deleted by retention and trims, and key compaction does not exist yet; use 'delete'"
                ))
            }
        },
        // Replication is the object store's; these are accepted and mean nothing here.
        "min.insync.replicas" | "unclean.leader.election.enable" => {}
        other => return Err(format!("config '{other}' is not supported by Weir")),
    }
    Ok(())
}

/// A topic's config from CreateTopics' `(name, value)` pairs.
pub fn parse(kafka: &Kafka, configs: &[(String, Option<String>)]) -> Result<StreamConfig, String> {
    let mut config = StreamConfig::default();
    for (name, value) in configs {
        if value.is_none() {
            return Err(format!("config '{name}' has no value"));
        }
        set(kafka, &mut config, name, value.as_deref())?;
    }
    Ok(config)
}

fn entry(name: &str, value: Option<String>, set_on_topic: bool) -> DescribeConfigsResourceResult {
    DescribeConfigsResourceResult::default()
        .with_name(s(name))
        .with_value(value.map(StrBytes::from_string))
        .with_config_source(if set_on_topic { TOPIC_CONFIG } else { DEFAULT_CONFIG })
        .with_read_only(false)
}

fn limit(v: Option<u64>) -> String {
    v.map_or_else(|| "-1".to_string(), |n| n.to_string())
}

/// DescribeConfigs' entries for a topic with `config`.
pub fn describe(kafka: &Kafka, config: &StreamConfig) -> Vec<DescribeConfigsResourceResult> {
    vec![
        entry(
            "retention.ms",
            Some(limit(config.retention_ms)),
            config.retention_ms.is_some(),
        ),
        entry(
            "retention.bytes",
            Some(limit(config.retention_bytes)),
            config.retention_bytes.is_some(),
        ),
        entry(
            "max.message.bytes",
            Some(
                config
                    .max_message_bytes
                    .unwrap_or(kafka.max_message_bytes as u64)
                    .to_string(),
            ),
            config.max_message_bytes.is_some(),
        ),
        entry(
            "segment.bytes",
            Some(config.segment_bytes.unwrap_or(DEFAULT_SEGMENT_BYTES).to_string()),
            config.segment_bytes.is_some(),
        ),
        entry(
            "compression.type",
            Some(config.compression_type.clone().unwrap_or_else(|| "producer".into())),
            config.compression_type.is_some(),
        ),
        entry(
            "delete.retention.ms",
            Some(
                config
                    .delete_retention_ms
                    .unwrap_or(DEFAULT_DELETE_RETENTION_MS)
                    .to_string(),
            ),
            config.delete_retention_ms.is_some(),
        ),
        entry("cleanup.policy", Some("delete".into()), false),
        DescribeConfigsResourceResult::default()
            .with_name(s("message.timestamp.type"))
            .with_value(Some(s("CreateTime")))
            .with_config_source(DEFAULT_CONFIG)
            .with_read_only(true),
    ]
}

/// The codec `topic`'s batches are stored in, when its `compression.type` names one.
pub fn compression(kafka: &Kafka, topic: &str) -> Option<kafka_protocol::records::Compression> {
    kafka
        .gw
        .routes
        .view()
        .with(|s| s.topics.get(topic).and_then(|t| t.config.compression_type.clone()))
        .and_then(|c| super::recompress::codec(&c))
}

/// The largest record batch a producer may send to `topic`.
pub fn max_message_bytes(kafka: &Kafka, topic: &str) -> usize {
    kafka
        .gw
        .routes
        .view()
        .with(|s| s.topics.get(topic).and_then(|t| t.config.max_message_bytes))
        .map_or(kafka.max_message_bytes, |b| usize::try_from(b).unwrap_or(usize::MAX))
}

/// One resource's change: the new config from the current one, or a Kafka error. The
/// current config is read from a view caught up with the log, and the alter names the
/// version it read (compare-and-set): one whose answer was lost and that lands late
/// cannot undo a newer change, and concurrent incremental alters of different configs
/// keep both.
async fn alter_one(
    kafka: &Kafka,
    caller: &Caller,
    resource_type: i8,
    name: &str,
    validate_only: bool,
    change: impl Fn(&mut StreamConfig) -> Result<(), String>,
) -> Result<(), (i16, String)> {
    match resource_type {
        TOPIC if !caller.grants.allows(Operation::AlterConfigs, Resource::Topic(name)) => {
            return Err((
                errors::TOPIC_AUTHORIZATION_FAILED,
                format!("the token has no 'manage' scope for topic '{name}'"),
            ))
        }
        TOPIC => {}
        BROKER => {
            return Err((
                errors::INVALID_REQUEST,
                "broker configs are gatewayd's flags and cannot be altered at run time".into(),
            ))
        }
        other => {
            return Err((
                errors::INVALID_REQUEST,
                format!("resource type {other} is not supported"),
            ))
        }
    }
    let mut attempt = 1;
    loop {
        kafka.gw.catch_up().await.map_err(|e| errors::admin(&Err(e)))?;
        let current = kafka
            .gw
            .routes
            .view()
            .with(|s| s.topics.get(name).map(|t| (t.config.clone(), t.topic_id)));
        let (read, topic_id) = current.ok_or_else(|| {
            (
                errors::UNKNOWN_TOPIC_OR_PARTITION,
                format!("topic '{name}' does not exist"),
            )
        })?;
        let mut config = read.clone();
        change(&mut config).map_err(|e| (errors::INVALID_CONFIG, e))?;
        if validate_only {
            return Ok(());
        }
        let command = Command::AlterConfig {
            target: ConfigTarget::Topic(name.to_string()),
            config,
            expected: Some(read),
            topic_id: Some(topic_id),
        };
        match kafka.gw.metad.propose(&caller.proposer(), command).await {
            Ok((index, Ok(_))) => {
                kafka.gw.settle(index).await;
                return Ok(());
            }
            // Another alter landed between the read and this one (or this one's own
            // earlier attempt, whose answer was lost): read again, after a pause.
            Ok((_, Err(r))) if r.code == RejectCode::Conflict && attempt < ALTER_ATTEMPTS => {
                attempt += 1;
                let pause = rand::random_range(20..100) * attempt as u64;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
            // Retryable: the client tries again later.
            Ok((_, Err(r))) if r.code == RejectCode::Conflict => {
                return Err((errors::REQUEST_TIMED_OUT, r.message));
            }
            Ok((_, Err(r))) => return Err(errors::admin(&Ok(r))),
            Err(e) => return Err(errors::admin(&Err(e))),
        }
    }
}

pub async fn alter_configs(kafka: &Kafka, caller: &Caller, r: AlterConfigsRequest) -> AlterConfigsResponse {
    let mut responses = vec![];
    for res in r.resources {
        let name = res.resource_name.to_string();
        let configs: Vec<(String, Option<String>)> = res
            .configs
            .iter()
            .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
            .collect();
        // AlterConfigs replaces the whole set: what it does not name returns to its default.
        let outcome = alter_one(kafka, caller, res.resource_type, &name, r.validate_only, |config| {
            *config = StreamConfig::default();
            configs
                .iter()
                .try_for_each(|(n, v)| set(kafka, config, n, v.as_deref()))
        })
        .await;
        let response = alter_configs_response::AlterConfigsResourceResponse::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name);
        responses.push(match outcome {
            Ok(()) => response,
            Err((code, message)) => response.with_error_code(code).with_error_message(Some(s(&message))),
        });
    }
    AlterConfigsResponse::default().with_responses(responses)
}

pub async fn incremental_alter_configs(
    kafka: &Kafka,
    caller: &Caller,
    r: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut responses = vec![];
    for res in r.resources {
        let name = res.resource_name.to_string();
        let ops: Vec<(String, i8, Option<String>)> = res
            .configs
            .iter()
            .map(|c| {
                (
                    c.name.to_string(),
                    c.config_operation,
                    c.value.as_ref().map(|v| v.to_string()),
                )
            })
            .collect();
        let outcome = alter_one(kafka, caller, res.resource_type, &name, r.validate_only, |config| {
            ops.iter().try_for_each(|(n, op, v)| match *op {
                SET => set(kafka, config, n, v.as_deref()),
                DELETE => set(kafka, config, n, None),
                _ => Err(format!(
                    "config '{n}': APPEND and SUBTRACT apply to list configs, and Weir's topic configs are not lists"
                )),
            })
        })
        .await;
        let response = incremental_alter_configs_response::AlterConfigsResourceResponse::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name);
        responses.push(match outcome {
            Ok(()) => response,
            Err((code, message)) => response.with_error_code(code).with_error_message(Some(s(&message))),
        });
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}
