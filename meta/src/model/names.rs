//! Names of streams, topics, nodes and tokens: Kafka's legal characters, so a name
//! works on both APIs and in object keys and paths.

use super::command::{RejectCode, Rejection};

/// The internal topic holding consumer groups' committed offsets. Gateways create it
/// (as nodes, not for a user) when a group first needs it.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// Offsets streams groups are hashed over (Kafka's `offsets.topic.num.partitions`).
pub const OFFSETS_PARTITIONS: u32 = 8;

/// The offsets stream of `group`, whose owner is the group's coordinator: Kafka's rule,
/// the group id hashed over the offsets topic's partitions (CRC-32C here).
pub fn offsets_stream(group: &str) -> String {
    format!(
        "{OFFSETS_TOPIC}/{}",
        crc32c::crc32c(group.as_bytes()) % OFFSETS_PARTITIONS
    )
}

/// The internal topic holding transactional ids' state (issue 23): the owner of a
/// partition is the coordinator of the ids hashed to it.
pub const TXN_STATE_TOPIC: &str = "__transaction_state";

/// Transaction-state streams transactional ids are hashed over (Kafka's
/// `transaction.state.log.num.partitions`, smaller: each is a stream and a coordinator).
pub const TXN_STATE_PARTITIONS: u32 = 8;

/// The transaction-state stream of a transactional id, whose owner is its coordinator.
pub fn txn_state_stream(transactional_id: &str) -> String {
    format!(
        "{TXN_STATE_TOPIC}/{}",
        crc32c::crc32c(transactional_id.as_bytes()) % TXN_STATE_PARTITIONS
    )
}

/// Who a gateway without `--auth` acts for; no token may take this name.
pub const ANONYMOUS: &str = "anonymous";

/// Longest accepted name (Kafka allows 249 for topics).
pub const MAX_NAME_LEN: usize = 249;

/// Checks a name; the error says which rule it breaks.
pub fn validate_name(what: &str, name: &str) -> Result<(), Rejection> {
    let invalid = |message: String| Err(Rejection::new(RejectCode::InvalidArgument, message));
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return invalid(format!(
            "{what} name must be 1 to {MAX_NAME_LEN} characters, got {}",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return invalid(format!("{what} name '{name}' is reserved"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return invalid(format!(
            "{what} name '{name}' has '{c}'; use letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}
