//! Who sent a request, as a handler needs it: the peer and client id, the
//! authenticated principal and what its grants allow. The connection (`conn`) keeps
//! the rest of its state (the SASL exchange, the principal's slot) to itself, so a
//! handler takes only this (issue 63).

use std::net::SocketAddr;
use weir_meta::model::grants::Grants;
use weir_meta::model::Proposer;

pub struct Caller {
    pub peer: SocketAddr,
    pub client_id: String,
    /// The token name once SASL succeeded; `anonymous` without `--auth`.
    pub principal: Option<String>,
    /// What the authenticated token's scopes grant (everything without `--auth`).
    pub grants: Grants,
}

impl Caller {
    /// Metadata changes are proposed in the authenticated principal's name.
    pub fn proposer(&self) -> Proposer {
        Proposer::Operator {
            principal: self
                .principal
                .clone()
                .unwrap_or_else(|| weir_meta::model::names::ANONYMOUS.into()),
        }
    }
}
