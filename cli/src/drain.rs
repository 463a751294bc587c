//! `weir nodes drain NODE`: cordon the node (as the operator, so it takes no new
//! streams), then move its streams one at a time by a planned close — the owner uploads
//! and commits everything it buffered and closes the stream — after which placement
//! opens each on another node. Reports per stream where it went, or why it did not.
//! Nothing stops the drained process (SD-TRG-5).

use serde_json::{json, Value};
use std::time::Duration;
use weir_metad::client::MetadClient;
use weir_metad::model::{Command, CordonBy, Proposer};
use weir_proto::streamd::streamd_client::StreamdClient;
use weir_proto::streamd::CloseStreamRequest;
use weir_shared::ids::NodeId;

/// (stream name, owner node, owner epoch, state) of every stream.
async fn streams(client: &MetadClient) -> anyhow::Result<Vec<(String, Option<(String, u64)>, String)>> {
    let all = client.admin("streams", 0, 0).await?;
    let rows = all["streams"].as_object().cloned().unwrap_or_default();
    Ok(rows
        .values()
        .map(|r| {
            let owner = r["owner"]["node"]
                .as_str()
                .map(|n| (n.to_string(), r["owner"]["epoch"].as_u64().unwrap_or(0)));
            (
                r["name"].as_str().unwrap_or_default().to_string(),
                owner,
                r["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

pub async fn drain(
    client: &MetadClient,
    operator: &Proposer,
    node: &str,
    per_stream: Duration,
) -> anyhow::Result<Value> {
    let (_, cordoned) = client
        .propose(
            operator,
            Command::Cordon {
                node: NodeId::new(node),
                by: CordonBy::Operator,
            },
        )
        .await?;
    if let Err(r) = cordoned {
        anyhow::bail!("cannot cordon '{node}': {}", r.message);
    }
    let nodes = client.admin("nodes", 0, 0).await?;
    let row = nodes["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["node_id"] == node))
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("node '{node}' is not registered"))?;
    let addr = row["addrs"]["grpc"].as_str().unwrap_or_default().to_string();
    let owned: Vec<String> = streams(client)
        .await?
        .into_iter()
        .filter(|(_, owner, state)| state == "open" && owner.as_ref().is_some_and(|(n, _)| n == node))
        .map(|(name, _, _)| name)
        .collect();
    let mut owner = StreamdClient::new(weir_metad::network::channel(&addr)?).max_decoding_message_size(64 << 20);
    let mut report = vec![];
    for name in owned {
        let closed = tokio::time::timeout(
            per_stream,
            owner.close_stream(CloseStreamRequest { stream: name.clone() }),
        )
        .await;
        let outcome = match closed {
            Err(_) => json!({"stream": name, "moved": false, "error": "the owner did not close it in time"}),
            Ok(Err(status)) => json!({"stream": name, "moved": false, "error": status.message()}),
            Ok(Ok(reply)) => {
                let end = reply.into_inner().end_offset;
                match wait_moved(client, &name, node, per_stream).await {
                    Some(to) => json!({"stream": name, "moved": true, "to": to, "closed_at": end}),
                    None => json!({
                        "stream": name, "moved": false, "closed_at": end,
                        "error": "closed, but no other node opened it in time (is any node schedulable?)"
                    }),
                }
            }
        };
        report.push(outcome);
    }
    Ok(json!({"node": node, "cordoned": true, "streams": report}))
}

/// Waits until `stream` is open on a node other than `from`; that node.
async fn wait_moved(client: &MetadClient, stream: &str, from: &str, within: Duration) -> Option<String> {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if let Ok(all) = streams(client).await {
            if let Some((_, Some((to, _)), state)) = all.into_iter().find(|(n, _, _)| n == stream) {
                if state == "open" && to != from {
                    return Some(to);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}
