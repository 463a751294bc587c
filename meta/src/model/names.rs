//! Names of streams, topics, nodes and tokens: Kafka's legal characters, so a name
//! works on both APIs and in object keys and paths.

use super::command::{RejectCode, Rejection};

/// The internal topic holding consumer groups' committed offsets. Gateways create it
/// (as nodes, not for a user) when a group first needs it.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

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
