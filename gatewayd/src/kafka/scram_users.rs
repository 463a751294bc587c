//! SCRAM users (issue 59): DescribeUserScramCredentials and AlterUserScramCredentials
//! (KIP-554). A Kafka user is a Weir token, so these list and change the SCRAM
//! credentials of tokens; a credential is set on a live token only, never makes a user
//! (a token carries its scopes: issue it first). Only salted keys are stored, derived
//! from the `SaltedPassword` the client sends. Both need the `admin` scope, as Kafka's
//! need the cluster's DESCRIBE and ALTER.

use super::caller::Caller;
use super::errors;
use super::Kafka;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError as KafkaError;
use std::collections::{BTreeMap, BTreeSet};
use weir_meta::model::acls::Operation;
use weir_meta::model::grants::Resource;
use weir_meta::model::rows::TokenRow;
use weir_meta::model::{Command, RejectCode};
use weir_meta::scram::{self, Mechanism, ScramCredential};

const RESOURCE_NOT_FOUND: i16 = KafkaError::ResourceNotFound.code();
const DUPLICATE_RESOURCE: i16 = KafkaError::DuplicateResource.code();
const UNACCEPTABLE_CREDENTIAL: i16 = KafkaError::UnacceptableCredential.code();
const UNSUPPORTED_SASL_MECHANISM: i16 = KafkaError::UnsupportedSaslMechanism.code();
const CLUSTER_AUTHORIZATION_FAILED: i16 = KafkaError::ClusterAuthorizationFailed.code();

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The mechanisms and iterations of a live token's credentials, `None` when it has none.
fn credential_infos(token: &TokenRow) -> Option<Vec<CredentialInfo>> {
    let creds = token.scram.as_ref().filter(|_| !token.revoked)?;
    let infos: Vec<CredentialInfo> = Mechanism::ALL
        .into_iter()
        .filter_map(|m| {
            creds.get(m).map(|c| {
                CredentialInfo::default()
                    .with_mechanism(m.kafka_type())
                    .with_iterations(i32::try_from(c.iterations).unwrap_or(i32::MAX))
            })
        })
        .collect();
    (!infos.is_empty()).then_some(infos)
}

pub fn describe(
    kafka: &Kafka,
    caller: &Caller,
    r: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let response = DescribeUserScramCredentialsResponse::default();
    if !caller.grants.allows(Operation::Describe, Resource::Cluster) {
        return response
            .with_error_code(CLUSTER_AUTHORIZATION_FAILED)
            .with_error_message(Some(s("describing SCRAM users needs DESCRIBE on the cluster")));
    }
    // Null or empty: every user with a credential, as Kafka answers.
    let users = r.users.filter(|u| !u.is_empty());
    let results = kafka.gw.routes.view().with(|state| match users {
        None => state
            .tokens
            .values()
            .filter_map(|t| {
                credential_infos(t).map(|infos| {
                    DescribeUserScramCredentialsResult::default()
                        .with_user(s(&t.name))
                        .with_credential_infos(infos)
                })
            })
            .collect(),
        Some(users) => {
            let mut seen = BTreeMap::new();
            for u in &users {
                *seen.entry(u.name.to_string()).or_insert(0) += 1;
            }
            seen.into_iter()
                .map(|(name, count)| {
                    let result = DescribeUserScramCredentialsResult::default().with_user(s(&name));
                    let infos = state.tokens.get(&name).and_then(credential_infos);
                    match (count, infos) {
                        (2.., _) => result
                            .with_error_code(DUPLICATE_RESOURCE)
                            .with_error_message(Some(s(&format!("user '{name}' is named more than once")))),
                        (_, Some(infos)) => result.with_credential_infos(infos),
                        (_, None) => result
                            .with_error_code(RESOURCE_NOT_FOUND)
                            .with_error_message(Some(s(&format!(
                                "attempt to describe a user credential that does not exist: '{name}'"
                            )))),
                    }
                })
                .collect()
        }
    });
    response.with_results(results)
}

/// One change asked for a user: a mechanism's credential set, or removed.
struct Change {
    mechanism: Mechanism,
    credential: Option<ScramCredential>,
}

pub async fn alter(
    kafka: &Kafka,
    caller: &Caller,
    r: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    // Per user, in request order: its changes, or the first error found in them.
    let mut users: BTreeMap<String, Result<Vec<Change>, (i16, String)>> = BTreeMap::new();
    let mut asked: BTreeSet<(String, i8)> = BTreeSet::new();
    let mut add = |name: &str, mechanism: i8, change: Result<Option<ScramCredential>, (i16, String)>| {
        let entry = users.entry(name.to_string()).or_insert_with(|| Ok(Vec::new()));
        let Ok(changes) = entry else { return };
        let checked = (|| {
            if name.is_empty() {
                return Err((UNACCEPTABLE_CREDENTIAL, "a SCRAM user needs a name".to_string()));
            }
            let m = Mechanism::from_kafka_type(mechanism).ok_or_else(|| {
                (
                    UNSUPPORTED_SASL_MECHANISM,
                    format!("unknown SCRAM mechanism {mechanism}"),
                )
            })?;
            if !asked.insert((name.to_string(), mechanism)) {
                return Err((
                    DUPLICATE_RESOURCE,
                    format!("{} of user '{name}' is changed more than once", m.name()),
                ));
            }
            Ok(Change {
                mechanism: m,
                credential: change?,
            })
        })();
        match checked {
            Ok(c) => changes.push(c),
            Err(e) => *entry = Err(e),
        }
    };
    for d in &r.deletions {
        add(&d.name, d.mechanism, Ok(None));
    }
    for u in &r.upsertions {
        let credential = Mechanism::from_kafka_type(u.mechanism)
            .map(|m| {
                let iterations = u32::try_from(u.iterations).unwrap_or(0);
                let c = scram::from_salted_password(m, &u.salt, iterations, &u.salted_password);
                if u.salt.is_empty() || u.salted_password.is_empty() {
                    return Err((
                        UNACCEPTABLE_CREDENTIAL,
                        "the salt and salted password may not be empty".into(),
                    ));
                }
                scram::validate_one(m, &c).map_err(|why| (UNACCEPTABLE_CREDENTIAL, why))?;
                Ok(Some(c))
            })
            .unwrap_or(Ok(None));
        add(&u.name, u.mechanism, credential);
    }
    // As Kafka does, authorization comes first: without it every user is refused so.
    let authorized = caller.grants.allows(Operation::Alter, Resource::Cluster);
    let mut results = Vec::with_capacity(users.len());
    for (name, changes) in users {
        let outcome = match changes {
            _ if !authorized => Err((
                CLUSTER_AUTHORIZATION_FAILED,
                "changing SCRAM users needs ALTER on the cluster".to_string(),
            )),
            Err(e) => Err(e),
            Ok(changes) => apply(kafka, caller, &name, changes).await,
        };
        let result = AlterUserScramCredentialsResult::default().with_user(s(&name));
        results.push(match outcome {
            Ok(()) => result,
            Err((code, message)) => result.with_error_code(code).with_error_message(Some(s(&message))),
        });
    }
    AlterUserScramCredentialsResponse::default().with_results(results)
}

/// Proposes a user's changes, one mechanism at a time; stops at the first refused.
async fn apply(kafka: &Kafka, caller: &Caller, name: &str, changes: Vec<Change>) -> Result<(), (i16, String)> {
    for c in changes {
        let cmd = Command::SetScramCredential {
            name: name.to_string(),
            mechanism: c.mechanism.name().to_string(),
            scram: c.credential,
        };
        match kafka.gw.metad.propose(&caller.proposer(), cmd).await {
            Ok((index, Ok(_))) => kafka.gw.settle(index).await,
            Ok((_, Err(rejection))) => {
                let code = match rejection.code {
                    RejectCode::NotFound => RESOURCE_NOT_FOUND,
                    RejectCode::InvalidArgument => UNACCEPTABLE_CREDENTIAL,
                    _ => errors::admin(&Ok(rejection.clone())).0,
                };
                return Err((code, rejection.message));
            }
            Err(e) => return Err(errors::admin(&Err(e))),
        }
    }
    Ok(())
}
