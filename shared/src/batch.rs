//! Kafka v2 `RecordBatch` framing: the unit Weir stores, replicates into objects and
//! serves. Only the fixed header is interpreted here; records stay opaque bytes, so a
//! Kafka fetch returns exactly what was produced. The owner assigns offsets by
//! rewriting `baseOffset`, which lies outside the CRC.

/// Size of the fixed v2 batch header.
pub const HEADER_LEN: usize = 61;
/// `baseOffset` (8) + `batchLength` (4): the bytes before `batchLength` counts.
const LOG_OVERHEAD: usize = 12;
/// The CRC covers everything from `attributes` on.
const CRC_START: usize = 21;

/// Producer ids at or above this are derived from HTTP idempotency keys; Kafka
/// producer ids are allocated from 0 and never get near it.
pub const IDEMPOTENCY_KEY_PRODUCER_BASE: i64 = 1 << 62;

/// The producer id an HTTP idempotency key maps to: a retried append with the same
/// key is a retry of the same idempotent batch (producer epoch 0, sequence 0), which
/// the stream owner answers with the original offsets.
pub fn idempotency_producer_id(key: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    IDEMPOTENCY_KEY_PRODUCER_BASE | (i64::from_be_bytes(first) & (IDEMPOTENCY_KEY_PRODUCER_BASE - 1))
}

/// Why a batch was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("record batch is truncated: {0}")]
    Truncated(String),
    #[error("record batch magic {0} is not supported; only v2 (magic 2) batches are accepted")]
    UnsupportedMagic(i8),
    #[error("record batch CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CorruptCrc { stored: u32, computed: u32 },
    #[error("record batch is malformed: {0}")]
    Malformed(String),
}

/// A parsed view of one batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Bytes of the whole batch, header included.
    pub total_len: usize,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    /// Offsets the batch spans.
    pub fn offset_count(&self) -> u64 {
        self.last_offset_delta as u64 + 1
    }

    /// Whether the batch is a transactional control batch.
    pub fn is_control(&self) -> bool {
        self.attributes & 0x20 != 0
    }
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

/// Parses the header of the batch at the start of `bytes` without checking its CRC.
pub fn parse_header(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    if bytes.len() < HEADER_LEN {
        return Err(BatchError::Truncated(format!(
            "{} bytes, the header alone is {HEADER_LEN}",
            bytes.len()
        )));
    }
    let batch_length = be_i32(bytes, 8);
    if batch_length < (HEADER_LEN - LOG_OVERHEAD) as i32 {
        return Err(BatchError::Malformed(format!(
            "batchLength {batch_length} is shorter than a header"
        )));
    }
    let total_len = LOG_OVERHEAD + batch_length as usize;
    if bytes.len() < total_len {
        return Err(BatchError::Truncated(format!(
            "batch declares {total_len} bytes, {} present",
            bytes.len()
        )));
    }
    let magic = bytes[16] as i8;
    if magic != 2 {
        return Err(BatchError::UnsupportedMagic(magic));
    }
    let header = BatchHeader {
        base_offset: be_i64(bytes, 0),
        total_len,
        attributes: be_i16(bytes, 21),
        last_offset_delta: be_i32(bytes, 23),
        base_timestamp: be_i64(bytes, 27),
        max_timestamp: be_i64(bytes, 35),
        producer_id: be_i64(bytes, 43),
        producer_epoch: be_i16(bytes, 51),
        base_sequence: be_i32(bytes, 53),
        record_count: be_i32(bytes, 57),
    };
    if header.last_offset_delta < 0 || header.record_count < 0 {
        return Err(BatchError::Malformed(format!(
            "negative lastOffsetDelta {} or recordCount {}",
            header.last_offset_delta, header.record_count
        )));
    }
    Ok(header)
}

/// Checks the CRC-32C of the batch at the start of `bytes`.
pub fn verify_crc(bytes: &[u8], header: &BatchHeader) -> Result<(), BatchError> {
    let stored = u32::from_be_bytes(bytes[17..21].try_into().expect("4 bytes"));
    let computed = crc32c::crc32c(&bytes[CRC_START..header.total_len]);
    if stored != computed {
        return Err(BatchError::CorruptCrc { stored, computed });
    }
    Ok(())
}

/// Splits a buffer of concatenated batches, checking each header and CRC.
pub fn split_batches(mut bytes: &[u8]) -> Result<Vec<(BatchHeader, &[u8])>, BatchError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let header = parse_header(bytes)?;
        verify_crc(bytes, &header)?;
        let (batch, rest) = bytes.split_at(header.total_len);
        out.push((header, batch));
        bytes = rest;
    }
    Ok(out)
}

/// Rewrites `baseOffset` in place; it lies outside the CRC, so the batch stays valid.
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
    batch[0..8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Fixes up the CRC after a header change inside the checksummed range (tests, encoders).
pub fn recompute_crc(batch: &mut [u8]) {
    let crc = crc32c::crc32c(&batch[CRC_START..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// A valid v2 batch header claiming `count` records over opaque `payload` bytes (tests
/// of framing, which never look inside records).
pub fn opaque_batch(count: i32, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_LEN];
    b.extend_from_slice(payload);
    let len = (b.len() - LOG_OVERHEAD) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    b[16] = 2;
    b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
    b[43..51].copy_from_slice(&(-1i64).to_be_bytes());
    b[53..57].copy_from_slice(&(-1i32).to_be_bytes());
    b[57..61].copy_from_slice(&count.to_be_bytes());
    recompute_crc(&mut b);
    b
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn batch(count: i32, payload: &[u8]) -> Vec<u8> {
        opaque_batch(count, payload)
    }

    #[test]
    fn batches_split_and_offsets_rewrite_without_breaking_the_crc() {
        let mut buf = batch(3, b"abc");
        buf.extend(batch(1, b"d"));
        let parts = split_batches(&buf).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].0.offset_count(), 3);
        let mut first = parts[0].1.to_vec();
        set_base_offset(&mut first, 42);
        let (h, _) = split_batches(&first).unwrap()[0];
        assert_eq!(h.base_offset, 42);
    }

    #[test]
    fn corrupt_truncated_and_foreign_batches_are_refused() {
        let mut b = batch(2, b"xyz");
        let last = b.len() - 1;
        b[last] ^= 0xff;
        assert!(matches!(split_batches(&b), Err(BatchError::CorruptCrc { .. })));
        let b = batch(2, b"xyz");
        assert!(matches!(
            split_batches(&b[..b.len() - 1]),
            Err(BatchError::Truncated(_))
        ));
        let mut b = batch(1, b"");
        b[16] = 1;
        assert!(matches!(split_batches(&b), Err(BatchError::UnsupportedMagic(1))));
        let mut b = batch(1, b"");
        b[8..12].copy_from_slice(&3i32.to_be_bytes());
        assert!(matches!(split_batches(&b), Err(BatchError::Malformed(_))));
    }

    #[test]
    fn idempotency_keys_map_above_kafka_producer_ids() {
        let a = idempotency_producer_id("order-1");
        assert!(a >= IDEMPOTENCY_KEY_PRODUCER_BASE);
        assert_eq!(a, idempotency_producer_id("order-1"));
        assert_ne!(a, idempotency_producer_id("order-2"));
    }
}
