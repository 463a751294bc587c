//! ListTransactions (KIP-664) and DescribeTransactions, answered by a coordinator from
//! its table of transactional ids: what operators and consoles read to find hanging
//! transactions. Authorization is the gateway's; it drops ids the token may not see.

use super::coordinator::Txns;
use super::state::{TxnEntry, TxnState};
use crate::error::StreamdError;
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState as Described};
use kafka_protocol::messages::list_transactions_response::TransactionState as Listed;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use std::collections::BTreeMap;
use std::sync::Arc;
use weir_meta::model::now_ms;

const TRANSACTIONAL_ID_NOT_FOUND: i16 = kafka_protocol::ResponseError::TransactionalIdNotFound.code();
const INVALID_REQUEST: i16 = kafka_protocol::ResponseError::InvalidRequest.code();

const STATES: [TxnState; 6] = [
    TxnState::Empty,
    TxnState::Ongoing,
    TxnState::PrepareCommit,
    TxnState::PrepareAbort,
    TxnState::CompleteCommit,
    TxnState::CompleteAbort,
];

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Whether `e` passes a ListTransactions' filters (each empty filter passes all).
fn listed(
    id: &str,
    e: &TxnEntry,
    states: &[TxnState],
    producers: &[i64],
    longer_than_ms: Option<u64>,
    pattern: Option<&regex::Regex>,
    now: u64,
) -> bool {
    (states.is_empty() || states.contains(&e.state))
        && (producers.is_empty() || producers.contains(&e.producer_id))
        && longer_than_ms.is_none_or(|d| e.state == TxnState::Ongoing && now.saturating_sub(e.started_ms) > d)
        && pattern.is_none_or(|re| re.is_match(id))
}

impl Txns {
    /// The ids of the coordinator of `stream` that pass `r`'s filters.
    pub(super) async fn list(
        self: &Arc<Self>,
        stream: &str,
        r: ListTransactionsRequest,
    ) -> Result<ListTransactionsResponse, StreamdError> {
        let mut states = vec![];
        let mut unknown = vec![];
        for f in &r.state_filters {
            match STATES.iter().find(|st| st.name() == f.as_str()) {
                Some(st) => states.push(*st),
                None => unknown.push(f.clone()),
            }
        }
        let pattern = match r.transactional_id_pattern.as_deref().filter(|p| !p.is_empty()) {
            // Kafka matches the whole id (Java's `Matcher.matches`).
            Some(p) => match regex::Regex::new(&format!("^(?:{p})$")) {
                Ok(re) => Some(re),
                Err(_) => return Ok(ListTransactionsResponse::default().with_error_code(INVALID_REQUEST)),
            },
            None => None,
        };
        let producers: Vec<i64> = r.producer_id_filters.iter().map(|p| p.0).collect();
        let longer_than_ms = u64::try_from(r.duration_filter).ok();
        let now = now_ms();
        let found = self.with_table(stream, |table| {
            table
                .iter()
                .filter(|(id, e)| listed(id, e, &states, &producers, longer_than_ms, pattern.as_ref(), now))
                .map(|(id, e)| {
                    Listed::default()
                        .with_transactional_id(TransactionalId(s(id)))
                        .with_producer_id(e.producer_id.into())
                        .with_transaction_state(s(e.state.name()))
                })
                .collect()
        });
        Ok(ListTransactionsResponse::default()
            .with_unknown_state_filters(unknown)
            .with_transaction_states(found.await?))
    }

    /// Each asked id's entry, or TRANSACTIONAL_ID_NOT_FOUND.
    pub(super) async fn describe(
        self: &Arc<Self>,
        stream: &str,
        r: DescribeTransactionsRequest,
    ) -> Result<DescribeTransactionsResponse, StreamdError> {
        let described = self.with_table(stream, |table| {
            r.transactional_ids
                .iter()
                .map(|id| match table.get(id.as_str()) {
                    None => Described::default()
                        .with_transactional_id(id.clone())
                        .with_error_code(TRANSACTIONAL_ID_NOT_FOUND)
                        .with_transaction_state(s(""))
                        .with_producer_id((-1).into())
                        .with_producer_epoch(-1),
                    Some(e) => {
                        let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
                        for p in &e.partitions {
                            if let Some((t, i)) = p.rsplit_once('/').and_then(|(t, i)| Some((t, i.parse().ok()?))) {
                                topics.entry(t).or_default().push(i);
                            }
                        }
                        Described::default()
                            .with_transactional_id(id.clone())
                            .with_transaction_state(s(e.state.name()))
                            .with_transaction_timeout_ms(i32::try_from(e.timeout_ms).unwrap_or(i32::MAX))
                            .with_transaction_start_time_ms(if e.started_ms == 0 { -1 } else { e.started_ms as i64 })
                            .with_producer_id(e.producer_id.into())
                            .with_producer_epoch(e.epoch)
                            .with_topics(
                                topics
                                    .into_iter()
                                    .map(|(t, ps)| TopicData::default().with_topic(TopicName(s(t))).with_partitions(ps))
                                    .collect(),
                            )
                    }
                })
                .collect()
        });
        Ok(DescribeTransactionsResponse::default().with_transaction_states(described.await?))
    }
}
