//! Operators without a certificate (issue 18): `weir --token` reaches metad over TLS,
//! trusting the cluster's CA, and authenticates each call with an admin token in
//! `authorization: Bearer <secret>`. metad's TLS lets a caller connect without a
//! certificate for this; every call on such a connection must carry a live token with
//! the `admin` scope, or it is refused before any service sees it. The token's holder
//! becomes the call's caller, an operator named after the token, so every check that
//! reads the caller ([`weir_shared::peer::caller`]) treats it like an operator
//! certificate; Raft, which wants a metad certificate, still refuses it.

use crate::store::ViewHub;
use std::sync::Arc;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::{Request, Status};
use weir_meta::model::rows::now_ms;
use weir_meta::model::scopes::Scopes;
use weir_shared::peer::{Identity, Role};

#[derive(Clone)]
pub struct TokenCallers {
    hub: Arc<ViewHub>,
}

impl TokenCallers {
    pub fn new(hub: Arc<ViewHub>) -> Self {
        TokenCallers { hub }
    }

    /// The operator an admin token names, or why the call is refused.
    fn operator(&self, metadata: &tonic::metadata::MetadataMap) -> Result<Identity, Status> {
        let secret = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                Status::unauthenticated(
                    "metad needs a client certificate of the cluster's CA, or an admin token \
                     ('authorization: Bearer <token>', weir --token)",
                )
            })?;
        let token = self
            .hub
            .with_state(|s| s.token_by_secret(secret).cloned())
            .ok_or_else(|| Status::unauthenticated("unknown token"))?;
        if let Some(why) = token.refusal(now_ms()) {
            return Err(Status::unauthenticated(why));
        }
        if !Scopes::parse(&token.scopes).is_ok_and(|s| s.is_admin()) {
            return Err(Status::permission_denied(format!(
                "token '{}' lacks the 'admin' scope metad's API needs",
                token.name
            )));
        }
        Ok(Identity {
            role: Role::Operator,
            id: token.name,
        })
    }
}

impl tonic::service::Interceptor for TokenCallers {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        // Plaintext (no cluster TLS), or a caller with a certificate: nothing to add.
        let Some(tls) = req.extensions().get::<TlsConnectInfo<TcpConnectInfo>>() else {
            return Ok(req);
        };
        if tls.peer_certs().is_some_and(|c| !c.is_empty()) {
            return Ok(req);
        }
        let who = self.operator(req.metadata())?;
        req.extensions_mut().insert(who);
        Ok(req)
    }
}
