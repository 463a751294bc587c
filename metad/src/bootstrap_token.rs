//! DEP-8: the first admin token comes from the bootstrapping replica only. Given
//! `--bootstrap-admin-token-file`, a replica issues the token `admin` (scope `admin`)
//! through the metadata log once, unless one exists; replicas without the file, and
//! restarts after the token exists, do nothing. Only its SHA-256 is stored.

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use weir_meta::client::MetadClient;
use weir_meta::model::{Command, Proposer, RejectCode};

pub const ADMIN_TOKEN: &str = "admin";

/// Reads the secret: the file's first line, which must not be empty.
pub fn read_secret(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--bootstrap-admin-token-file {}: {e}", path.display()))?;
    let secret = text.lines().next().unwrap_or_default().trim().to_string();
    anyhow::ensure!(
        !secret.is_empty(),
        "--bootstrap-admin-token-file {} is empty",
        path.display()
    );
    Ok(secret)
}

pub async fn issue(advertise: String, hub: Arc<crate::store::ViewHub>, secret: String, cancel: CancellationToken) {
    let Ok(client) = MetadClient::new(&[advertise], Duration::from_secs(5)) else {
        return;
    };
    let proposer = Proposer::Operator {
        principal: "bootstrap".into(),
    };
    loop {
        if hub.with_state(|s| s.tokens.contains_key(ADMIN_TOKEN)) {
            return;
        }
        let cmd = Command::IssueToken {
            name: ADMIN_TOKEN.into(),
            secret_sha256: weir_meta::model::rows::secret_sha256(&secret),
            scopes: vec!["admin".into()],
            expires_at_ms: None,
            scram: Some(weir_meta::scram::credentials(&secret)),
        };
        match client.propose(&proposer, cmd).await {
            Ok((index, Ok(_))) => {
                tracing::info!(
                    log_index = index,
                    token = ADMIN_TOKEN,
                    "issued the bootstrap admin token"
                );
                return;
            }
            Ok((_, Err(r))) if r.code == RejectCode::AlreadyExists => return,
            Ok((_, Err(r))) if r.code != RejectCode::NotReady => {
                tracing::warn!(rejection = %r, "bootstrap admin token refused");
                return;
            }
            _ => {}
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
