//! API tokens (issued and revoked by operators) and Kafka producer id blocks.

use super::{reject, validate_name, Txn, MAX_PRODUCER_ID_BLOCK};
use crate::model::command::{Applied, Outcome, Proposer, RejectCode};
use crate::model::rows::*;
use crate::model::state::RowKey;

impl Txn<'_> {
    pub(super) fn issue_token(
        &mut self,
        proposer: &Proposer,
        name: &str,
        secret_sha256: &str,
        scopes: &[String],
        expires_at_ms: Option<u64>,
        scram: Option<&crate::scram::ScramCredentials>,
    ) -> Outcome {
        if !matches!(proposer, Proposer::Operator { .. }) {
            return Err(reject(RejectCode::InvalidArgument, "only an operator issues tokens"));
        }
        validate_name("token", name)?;
        // A gateway without --auth acts for `anonymous`; a token of that name would
        // be taken for its users, or they for it (issue 18).
        if name == crate::model::names::ANONYMOUS {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("token name '{name}' is reserved for the users of a gateway without --auth"),
            ));
        }
        crate::model::scopes::Scopes::parse(scopes).map_err(|why| reject(RejectCode::InvalidArgument, why))?;
        if let Some(c) = scram {
            crate::scram::validate(c).map_err(|why| reject(RejectCode::InvalidArgument, why))?;
        }
        if secret_sha256.len() != 64 || !secret_sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(reject(
                RejectCode::InvalidArgument,
                "secret_sha256 must be 64 hex digits",
            ));
        }
        if self.state.tokens.get(name).is_some_and(|t| !t.revoked) {
            return Err(reject(
                RejectCode::AlreadyExists,
                format!("token '{name}' already exists"),
            ));
        }
        self.state.tokens.insert(
            name.to_string(),
            TokenRow {
                name: name.to_string(),
                secret_sha256: secret_sha256.to_ascii_lowercase(),
                scopes: scopes.to_vec(),
                revoked: false,
                issued_index: self.index,
                expires_at_ms,
                scram: scram.cloned(),
            },
        );
        self.touch(RowKey::Token(name.to_string()));
        Ok(Applied::Done)
    }

    pub(super) fn revoke_token(&mut self, proposer: &Proposer, name: &str) -> Outcome {
        if !matches!(proposer, Proposer::Operator { .. }) {
            return Err(reject(RejectCode::InvalidArgument, "only an operator revokes tokens"));
        }
        let token = self
            .state
            .tokens
            .get_mut(name)
            .ok_or_else(|| reject(RejectCode::NotFound, format!("token '{name}' does not exist")))?;
        if !token.revoked {
            token.revoked = true;
            self.touch(RowKey::Token(name.to_string()));
        }
        Ok(Applied::Done)
    }

    /// AlterUserScramCredentials (issue 59): a token's credential of one mechanism set
    /// or removed. The token must be live: a SCRAM user is a token, which carries the
    /// scopes it is granted, so a credential never makes a user with no token.
    pub(super) fn set_scram_credential(
        &mut self,
        proposer: &Proposer,
        name: &str,
        mechanism: &str,
        credential: Option<&crate::scram::ScramCredential>,
    ) -> Outcome {
        if !matches!(proposer, Proposer::Operator { .. }) {
            return Err(reject(
                RejectCode::InvalidArgument,
                "only an operator sets SCRAM credentials",
            ));
        }
        let m = crate::scram::Mechanism::parse(mechanism).ok_or_else(|| {
            reject(
                RejectCode::InvalidArgument,
                format!("unknown SCRAM mechanism '{mechanism}'; use SCRAM-SHA-256 or SCRAM-SHA-512"),
            )
        })?;
        if let Some(c) = credential {
            crate::scram::validate_one(m, c).map_err(|why| reject(RejectCode::InvalidArgument, why))?;
        }
        let token = self.state.tokens.get_mut(name).filter(|t| !t.revoked).ok_or_else(|| {
            reject(
                RejectCode::NotFound,
                format!("token '{name}' does not exist; a SCRAM user is a token: issue it first"),
            )
        })?;
        let mut scram = token.scram.clone().unwrap_or(crate::scram::ScramCredentials {
            sha256: None,
            sha512: None,
        });
        if credential.is_none() && scram.get(m).is_none() {
            return Err(reject(
                RejectCode::NotFound,
                format!("token '{name}' has no {} credential", m.name()),
            ));
        }
        scram.set(m, credential.cloned());
        token.scram = (!scram.is_empty()).then_some(scram);
        self.touch(RowKey::Token(name.to_string()));
        Ok(Applied::Done)
    }

    pub(super) fn allocate_producer_ids(&mut self, proposer: &Proposer, count: u32) -> Outcome {
        self.privileged(proposer)?;
        if count == 0 || count > MAX_PRODUCER_ID_BLOCK {
            return Err(reject(
                RejectCode::InvalidArgument,
                format!("count must be 1 to {MAX_PRODUCER_ID_BLOCK}, got {count}"),
            ));
        }
        let first = self.state.counters.next_producer_id;
        self.state.counters.next_producer_id = first + i64::from(count);
        self.touch(RowKey::Counters);
        Ok(Applied::ProducerIds { first, count })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_log::{node, op, Log};
    use crate::model::command::{Applied, RejectCode};
    use crate::model::Command;
    use crate::scram::{credentials, derive, Mechanism};

    fn issue(log: &mut Log, name: &str) {
        let issue = Command::IssueToken {
            name: name.into(),
            secret_sha256: "ab".repeat(32),
            scopes: vec!["read".into()],
            expires_at_ms: None,
            scram: Some(credentials("weir_secret")),
        };
        assert_eq!(log.apply(op(), issue), Ok(Applied::Done));
    }

    fn set(name: &str, mechanism: &str, scram: Option<crate::scram::ScramCredential>) -> Command {
        Command::SetScramCredential {
            name: name.into(),
            mechanism: mechanism.into(),
            scram,
        }
    }

    // Issue 59: AlterUserScramCredentials sets one mechanism's credential of a live
    // token, removes it, and removes the credentials altogether once none is left; an
    // unknown or revoked token, a mechanism with nothing to remove, a credential below
    // Kafka's iterations and a node proposer are refused.
    #[test]
    fn a_token_scram_credential_is_set_and_removed_per_mechanism() {
        let mut log = Log::new();
        issue(&mut log, "alice");
        let new = derive(Mechanism::Sha256, "new password", b"salt-of-sixteen!", 8192);
        assert_eq!(
            log.apply(op(), set("alice", "SCRAM-SHA-256", Some(new.clone()))),
            Ok(Applied::Done)
        );
        let scram = |log: &Log| log.meta.state.tokens["alice"].scram.clone();
        let now = scram(&log).expect("credentials");
        assert_eq!(now.get(Mechanism::Sha256), Some(&new));
        assert!(now.get(Mechanism::Sha512).is_some(), "the other mechanism is untouched");
        assert_eq!(log.apply(op(), set("alice", "SCRAM-SHA-512", None)), Ok(Applied::Done));
        assert!(scram(&log).expect("one left").get(Mechanism::Sha512).is_none());
        assert_eq!(
            log.apply(op(), set("alice", "SCRAM-SHA-512", None)),
            Err(RejectCode::NotFound)
        );
        assert_eq!(log.apply(op(), set("alice", "SCRAM-SHA-256", None)), Ok(Applied::Done));
        assert_eq!(scram(&log), None, "no mechanism left");

        assert_eq!(
            log.apply(op(), set("bob", "SCRAM-SHA-256", Some(new.clone()))),
            Err(RejectCode::NotFound)
        );
        assert_eq!(
            log.apply(op(), set("alice", "SCRAM-MD5", Some(new.clone()))),
            Err(RejectCode::InvalidArgument)
        );
        let weak = derive(Mechanism::Sha256, "p", b"salt", 1024);
        assert_eq!(
            log.apply(op(), set("alice", "SCRAM-SHA-256", Some(weak))),
            Err(RejectCode::InvalidArgument)
        );
        assert_eq!(
            log.apply(node(), set("alice", "SCRAM-SHA-256", Some(new.clone()))),
            Err(RejectCode::InvalidArgument)
        );
        assert_eq!(
            log.apply(op(), Command::RevokeToken { name: "alice".into() }),
            Ok(Applied::Done)
        );
        assert_eq!(
            log.apply(op(), set("alice", "SCRAM-SHA-256", Some(new))),
            Err(RejectCode::NotFound)
        );
    }
}
