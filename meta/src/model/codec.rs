//! Versioned encoding of everything metad stores or sends: a two-byte header
//! (magic, format version) checked before any JSON is decoded (RR-WAL-6).

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Marks a Weir metadata document; must be kept stable.
pub const MAGIC: u8 = b'W';
/// The current format of stored rows, log entries, snapshots and deltas; bump on any
/// incompatible change to `rows`, `command` or `state`. Format 2 moved the committed
/// ranges out of the view into the object index (design 0002).
pub const FORMAT_VERSION: u8 = 2;
/// The oldest format [`decode_compatible`] reads: documents whose shape did not change
/// since (commands, outcomes, log entries, history).
pub const OLDEST_COMPATIBLE: u8 = 1;

/// A stored or received document that cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("stored metadata has an unknown format (header {0:02x?}); it was not written by this version of Weir: recreate the data directory or run a matching version")]
    UnknownFormat(Vec<u8>),
    #[error("stored metadata format version {found} is not supported (this build reads version {FORMAT_VERSION}); recreate the data directory or run a matching version")]
    UnsupportedVersion { found: u8 },
    #[error("metadata document is corrupt: {0}")]
    Corrupt(#[from] serde_json::Error),
}

/// Encodes `value` with the current header.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![MAGIC, FORMAT_VERSION];
    serde_json::to_writer(&mut out, value).expect("model types serialize infallibly");
    out
}

/// Decodes a document of the current format after checking its header: rows, the
/// view, deltas and snapshots, whose shape changes with the format.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes {
        [MAGIC, FORMAT_VERSION, body @ ..] => Ok(serde_json::from_slice(body)?),
        [MAGIC, found, ..] => Err(CodecError::UnsupportedVersion { found: *found }),
        other => Err(CodecError::UnknownFormat(other.iter().take(2).copied().collect())),
    }
}

/// Decodes a document written by this format or an older one whose shape is the same:
/// commands, outcomes, log entries and history entries written before an upgrade.
pub fn decode_compatible<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes {
        [MAGIC, v, body @ ..] if (OLDEST_COMPATIBLE..=FORMAT_VERSION).contains(v) => Ok(serde_json::from_slice(body)?),
        [MAGIC, found, ..] => Err(CodecError::UnsupportedVersion { found: *found }),
        other => Err(CodecError::UnknownFormat(other.iter().take(2).copied().collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RR-WAL-6: the format is checked before decoding.
    #[test]
    fn unknown_versions_and_foreign_bytes_are_refused_with_an_instruction() {
        let good = encode(&vec![1u64, 2]);
        assert_eq!(decode::<Vec<u64>>(&good).unwrap(), vec![1, 2]);
        let mut newer = good.clone();
        newer[1] = FORMAT_VERSION + 1;
        let err = decode::<Vec<u64>>(&newer).unwrap_err().to_string();
        // RR-WAL-6: an unknown format version is refused with the instruction to recreate the state.
        assert!(err.contains("recreate the data directory"), "{err}");
        // RR-WAL-6: bytes without the format identifier are refused before decoding.
        assert!(matches!(
            decode::<Vec<u64>>(b"[1,2]"),
            Err(CodecError::UnknownFormat(_))
        ));
        assert!(matches!(
            decode::<Vec<u64>>(&[MAGIC, FORMAT_VERSION, b'x']),
            Err(CodecError::Corrupt(_))
        ));
        // A format-1 command still decodes where its shape is unchanged, never as a row.
        let mut old = good.clone();
        old[1] = 1;
        assert_eq!(decode_compatible::<Vec<u64>>(&old).unwrap(), vec![1, 2]);
        assert!(matches!(
            decode::<Vec<u64>>(&old),
            Err(CodecError::UnsupportedVersion { found: 1 })
        ));
    }
}
