//! Operator node and transfer endpoints (admin scope): cordon, uncordon and drain a
//! node, and move one stream by planned transfer (or dry-run it). Cordons go through the
//! metadata log; drains and transfers are run by the metad leader, which reports per
//! stream what moved and why a move failed.

use super::error::ApiError;
use super::{Gateway, Principal};
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use weir_meta::model::{Command, CordonBy};
use weir_proto::metad::{DrainRequest, TransferRequest};
use weir_shared::ids::NodeId;

/// Longest budget a drain or transfer may ask for, in seconds.
const MAX_BUDGET_SEC: u64 = 3600;
/// How much longer than its budget the gateway waits for the leader's report.
const CALL_MARGIN: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetQuery {
    budget_sec: Option<u64>,
}

fn budget(sec: Option<u64>, default: u64) -> Result<Duration, ApiError> {
    match sec.unwrap_or(default) {
        s @ 1..=MAX_BUDGET_SEC => Ok(Duration::from_secs(s)),
        s => Err(ApiError::invalid(format!(
            "budget_sec must be between 1 and {MAX_BUDGET_SEC}, got {s}"
        ))),
    }
}

async fn set_cordon(gw: &Gateway, who: &Principal, node: String, cordon: bool) -> Result<Json<Value>, ApiError> {
    let node = NodeId::new(node);
    let command = if cordon {
        Command::Cordon {
            node: node.clone(),
            by: CordonBy::Operator,
        }
    } else {
        Command::Uncordon {
            node: node.clone(),
            by: CordonBy::Operator,
        }
    };
    let (index, outcome) = gw.metad.propose(&who.proposer(), command).await?;
    outcome?;
    gw.settle(index).await;
    Ok(Json(json!({"node": node, "cordoned": cordon, "log_index": index})))
}

/// SD-CRD-1: the node takes no new streams; what it has stays.
pub async fn cordon(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Principal>,
    Path(node): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_cordon(&gw, &who, node, true).await
}

/// SD-CRD-3: clears an operator cordon; clearing twice is harmless.
pub async fn uncordon(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Principal>,
    Path(node): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_cordon(&gw, &who, node, false).await
}

/// SD-DRN-1: cordons the node and moves its streams one at a time; the leader's report.
pub async fn drain(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Principal>,
    Path(node): Path<String>,
    query: Result<Query<BudgetQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query?;
    let budget = budget(query.budget_sec, 300)?;
    let request = DrainRequest {
        node,
        budget_ms: budget.as_millis() as u64,
        requester: Vec::new(),
        principal: who.name,
    };
    Ok(Json(gw.metad.drain(request, budget + CALL_MARGIN).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferBody {
    to: String,
    #[serde(default)]
    dry_run: bool,
    budget_sec: Option<u64>,
}

/// SD-TRM-6: moves a stream to `to`, or with `dry_run` checks that it could; a refusal
/// names the first failing check.
pub async fn transfer(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Principal>,
    Path(stream): Path<String>,
    body: Result<Json<TransferBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body?;
    let budget = budget(body.budget_sec, 60)?;
    let request = TransferRequest {
        stream,
        target: body.to,
        dry_run: body.dry_run,
        budget_ms: budget.as_millis() as u64,
        principal: who.name,
    };
    Ok(Json(gw.metad.transfer(request, budget + CALL_MARGIN).await?))
}
