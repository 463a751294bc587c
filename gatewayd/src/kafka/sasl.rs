//! SASL over the HTTP API's tokens: the username is the token's name and the password
//! its secret. PLAIN compares the secret's SHA-256 with the stored one; SCRAM
//! (`scram.rs`) proves the secret against salted keys without sending it.

use super::principals::PrincipalSlot;
use super::Kafka;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError as KafkaError;
use weir_meta::model::grants::Grants;
use weir_meta::scram::Mechanism;

const UNSUPPORTED_SASL_MECHANISM: i16 = KafkaError::UnsupportedSaslMechanism.code();
const SASL_AUTHENTICATION_FAILED: i16 = KafkaError::SaslAuthenticationFailed.code();

/// Agrees on a mechanism; the one agreed, if any. SCRAM-SHA-256 and SCRAM-SHA-512
/// never send the secret, so they are offered on every connection that frames SASL in
/// SaslAuthenticate requests (handshake v1 and later). PLAIN sends the secret itself,
/// so it is offered only under TLS or where `--kafka-allow-plaintext-sasl` allows it
/// (issue 18).
pub fn handshake(
    r: SaslHandshakeRequest,
    plain_allowed: bool,
    version: i16,
) -> (SaslHandshakeResponse, Option<String>) {
    let mut offered: Vec<&'static str> = vec![];
    if version >= 1 {
        offered.extend(["SCRAM-SHA-256", "SCRAM-SHA-512"]);
    }
    if plain_allowed {
        offered.push("PLAIN");
    }
    let agreed = offered
        .iter()
        .find(|m| **m == r.mechanism.as_str())
        .map(|m| m.to_string());
    let resp = SaslHandshakeResponse::default()
        .with_error_code(if agreed.is_some() {
            0
        } else {
            UNSUPPORTED_SASL_MECHANISM
        })
        .with_mechanisms(offered.iter().map(|m| StrBytes::from_static_str(m)).collect());
    (resp, agreed)
}

/// One step of a SCRAM exchange: the client-first message starts it (`exchange` holds
/// it until the client-final message), the client-final message ends it with the
/// principal on success.
pub fn scram_step(
    kafka: &Kafka,
    mechanism: Mechanism,
    exchange: &mut Option<super::scram::Started>,
    r: SaslAuthenticateRequest,
) -> (SaslAuthenticateResponse, Option<Authenticated>) {
    let now = crate::api::auth::now_ms();
    let step = match exchange.take() {
        None => super::scram::start(mechanism, &r.auth_bytes, |name| {
            kafka
                .gw
                .routes
                .view()
                .with(|s| s.tokens.get(name).cloned())
                .filter(|t| t.refusal(now).is_none())
        })
        .map(|(started, server_first)| {
            *exchange = Some(started);
            (server_first, None)
        }),
        Some(started) => started.finish(&r.auth_bytes).and_then(|(token, server_final)| {
            let slot = kafka.principals.take(&token.name)?;
            let who = Authenticated {
                grants: Grants::for_token(&token, Default::default()),
                name: token.name,
                issued_index: token.issued_index,
                slot,
            };
            Ok((server_final, Some(who)))
        }),
    };
    match step {
        Ok((bytes, who)) => (SaslAuthenticateResponse::default().with_auth_bytes(bytes.into()), who),
        Err(why) => {
            tracing::warn!(mechanism = mechanism.name(), reason = %why, "kafka SASL authentication failed");
            (
                SaslAuthenticateResponse::default()
                    .with_error_code(SASL_AUTHENTICATION_FAILED)
                    .with_error_message(Some(StrBytes::from_string(format!("authentication failed: {why}")))),
                None,
            )
        }
    }
}

/// Splits a PLAIN token (`authzid NUL username NUL password`, RFC 4616) into the
/// username and password.
pub fn parse_plain(token: &[u8]) -> Result<(&str, &str), String> {
    let mut parts = token.split(|b| *b == 0);
    let (_authzid, user, pass) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(u), Some(p), None) => (a, u, p),
        _ => return Err("malformed SASL/PLAIN token".into()),
    };
    let user = std::str::from_utf8(user).map_err(|_| "username is not UTF-8".to_string())?;
    let pass = std::str::from_utf8(pass).map_err(|_| "password is not UTF-8".to_string())?;
    Ok((user, pass))
}

/// A connection's authenticated principal.
pub struct Authenticated {
    /// The token's name.
    pub name: String,
    /// When the token was issued: a name revoked and issued again is another token.
    pub issued_index: u64,
    /// The principal's connection slot, held while the connection lives.
    pub slot: PrincipalSlot,
    /// What the token's scopes grant (the connection judges them with the ACLs).
    pub grants: Grants,
}

/// Checks a PLAIN token; the principal, and its connection slot, on success.
pub fn authenticate(kafka: &Kafka, token: &[u8]) -> Result<Authenticated, String> {
    let (name, issued_index, grants) = check_plain(kafka, token)?;
    let slot = kafka.principals.take(&name)?;
    Ok(Authenticated {
        name,
        issued_index,
        slot,
        grants,
    })
}

fn check_plain(kafka: &Kafka, token: &[u8]) -> Result<(String, u64, Grants), String> {
    let (user, pass) = parse_plain(token)?;
    let hash = crate::api::auth::secret_hash(pass);
    let token = kafka.gw.routes.view().with(|s| s.tokens.get(user).cloned());
    match token {
        Some(t) if t.secret_sha256 == hash => match t.refusal(crate::api::auth::now_ms()) {
            Some(why) => Err(why),
            None => Ok((
                t.name.clone(),
                t.issued_index,
                Grants::for_token(&t, Default::default()),
            )),
        },
        _ => Err("unknown token name or wrong secret".into()),
    }
}

/// Whether the token a connection authenticated with still may act: not revoked, not
/// expired, and not replaced by a token issued later under its name. Checked while the
/// connection lives, not only at SASL time.
pub fn still_valid(kafka: &Kafka, name: &str, issued_index: u64) -> Result<(), String> {
    let row = kafka.gw.routes.view().with(|s| s.tokens.get(name).cloned());
    match row {
        Some(t) if t.issued_index != issued_index => Err(format!("token '{name}' was revoked and issued again")),
        Some(t) => t.refusal(crate::api::auth::now_ms()).map_or(Ok(()), Err),
        None => Err(format!("token '{name}' no longer exists")),
    }
}

pub fn authenticate_request(
    kafka: &Kafka,
    r: SaslAuthenticateRequest,
) -> (SaslAuthenticateResponse, Option<Authenticated>) {
    match authenticate(kafka, &r.auth_bytes) {
        Ok(authenticated) => (SaslAuthenticateResponse::default(), Some(authenticated)),
        Err(why) => {
            tracing::warn!(reason = %why, "kafka SASL authentication failed");
            (
                SaslAuthenticateResponse::default()
                    .with_error_code(SASL_AUTHENTICATION_FAILED)
                    .with_error_message(Some(StrBytes::from_string(format!("authentication failed: {why}")))),
                None,
            )
        }
    }
}
