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
        crate::model::scopes::Grants::parse(scopes).map_err(|why| reject(RejectCode::InvalidArgument, why))?;
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
