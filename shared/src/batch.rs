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
    #[error("record batch is too large: {0}")]
    TooLarge(String),
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

    /// Whether the batch was written inside a Kafka transaction.
    pub fn is_transactional(&self) -> bool {
        self.attributes & 0x10 != 0
    }
}

/// Why a producer's batch is one only a transaction coordinator may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProducerBatchError {
    /// A control batch (a transaction marker): as in Kafka, clients may not write one.
    #[error("clients are not allowed to write control records")]
    Control,
    /// A transactional batch: it would stand for a transaction no coordinator knows
    /// about, which `read_committed` readers would wait on for ever.
    #[error("transactional records need a transactional producer, and transactions are not supported")]
    Transactional,
}

/// Checks a batch a producer sent (Kafka Produce, HTTP append): markers are written by
/// transaction coordinators only, and transactional data only inside a transaction.
pub fn check_producer_batch(header: &BatchHeader) -> Result<(), ProducerBatchError> {
    if header.is_control() {
        return Err(ProducerBatchError::Control);
    }
    if header.is_transactional() {
        return Err(ProducerBatchError::Transactional);
    }
    Ok(())
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

/// Checks that a producer's batch claims exactly the offsets of the records it holds:
/// at least one record, `lastOffsetDelta` = `recordCount` - 1, and `recordCount` records
/// actually present. Without it a 61-byte batch whose `lastOffsetDelta` is 2^31 would
/// consume 2^31 offsets (issue 19). Compressed records are counted as they inflate, never
/// held, and a batch whose records would inflate past `max_inflated` bytes is refused
/// with [`BatchError::TooLarge`], so none stored can become a bomb for its readers.
pub fn check_record_count(bytes: &[u8], header: &BatchHeader, max_inflated: usize) -> Result<(), BatchError> {
    if header.record_count < 1 {
        return Err(BatchError::Malformed("a batch must hold at least one record".into()));
    }
    if header.last_offset_delta != header.record_count - 1 {
        return Err(BatchError::Malformed(format!(
            "lastOffsetDelta {} does not match recordCount {} (it must be recordCount - 1)",
            header.last_offset_delta, header.record_count
        )));
    }
    if header.is_control() {
        return Ok(());
    }
    let codec = crate::inflate::codec(header.attributes).map_err(inflate_error)?;
    let payload = &bytes[HEADER_LEN..header.total_len];
    let present = if codec == kafka_protocol::records::Compression::None {
        // The hot path (HTTP appends, most producers): walked in place, nothing copied.
        count_records(payload, header.record_count)?
    } else {
        let reader = crate::inflate::reader(payload, codec, max_inflated).map_err(inflate_error)?;
        count_records(std::io::BufReader::with_capacity(64 << 10, reader), header.record_count)?
    };
    if present != i64::from(header.record_count) {
        return Err(BatchError::Malformed(format!(
            "recordCount {} but {present} records are present",
            header.record_count
        )));
    }
    Ok(())
}

fn inflate_error(e: crate::inflate::InflateError) -> BatchError {
    match e {
        crate::inflate::InflateError::TooLarge { limit } => BatchError::TooLarge(format!(
            "its records inflate past the {limit}-byte limit (--max-decompressed-bytes)"
        )),
        crate::inflate::InflateError::Invalid(m) => BatchError::Malformed(m),
    }
}

/// Counts length-prefixed records in `r` to its end, skipping their bodies; stops early
/// once past `claimed`, which is already wrong.
fn count_records(mut r: impl std::io::BufRead, claimed: i32) -> Result<i64, BatchError> {
    use std::io::Read;
    let io = |e: std::io::Error| inflate_error(crate::inflate::from_io(e));
    let mut present = 0i64;
    loop {
        if r.fill_buf().map_err(io)?.is_empty() {
            return Ok(present);
        }
        if present > i64::from(claimed) {
            return Ok(present);
        }
        let mut raw = 0u64;
        let mut done = false;
        for i in 0..10 {
            let mut byte = [0u8; 1];
            if r.read(&mut byte).map_err(io)? == 0 {
                break;
            }
            raw |= u64::from(byte[0] & 0x7f) << (7 * i);
            if byte[0] & 0x80 == 0 {
                done = true;
                break;
            }
        }
        let len = ((raw >> 1) as i64) ^ -((raw & 1) as i64);
        if !done || len < 0 {
            return Err(BatchError::Malformed(format!("record {present} has no valid length")));
        }
        let skipped = std::io::copy(&mut (&mut r).take(len as u64), &mut std::io::sink()).map_err(io)?;
        if skipped != len as u64 {
            return Err(BatchError::Malformed(format!("record {present} runs past the batch")));
        }
        present += 1;
    }
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

/// Splits a buffer of concatenated batches by their headers alone, for bytes already
/// checked as a whole (a committed range whose CRC-32C matched): a read of one batch
/// must not pay for checking every batch of a 64 MiB range again (issue 17).
pub fn split_batches_by_header(bytes: &[u8]) -> Result<Vec<(BatchHeader, &[u8])>, BatchError> {
    batches_from(bytes, 0)
        .map(|b| b.map(|(_, header, batch)| (header, batch)))
        .collect()
}

/// The batches of `bytes` from byte `pos` on, by their headers alone as
/// [`split_batches_by_header`], each with its position. A read takes only the batches
/// it returns, and starts where the previous read of a range stopped, rather than
/// walking a 64 MiB range's tens of thousands of headers from its start (issue 17).
/// After an error it yields nothing more.
pub fn batches_from(bytes: &[u8], pos: usize) -> BatchesFrom<'_> {
    BatchesFrom { bytes, pos }
}

/// See [`batches_from`].
pub struct BatchesFrom<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Iterator for BatchesFrom<'a> {
    type Item = Result<(usize, BatchHeader, &'a [u8]), BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.bytes.get(self.pos..).filter(|r| !r.is_empty())?;
        let at = self.pos;
        match parse_header(rest) {
            Ok(header) => {
                self.pos += header.total_len;
                Some(Ok((at, header, &rest[..header.total_len])))
            }
            Err(e) => {
                self.pos = self.bytes.len();
                Some(Err(e))
            }
        }
    }
}

/// The newest `maxTimestamp` among the batches in `bytes` (already validated; headers
/// only, no CRC), or `-1` when there is none. Age-based retention reads it.
pub fn max_timestamp(mut bytes: &[u8]) -> i64 {
    let mut newest = -1;
    while let Ok(header) = parse_header(bytes) {
        newest = newest.max(header.max_timestamp);
        if header.total_len > bytes.len() {
            break;
        }
        bytes = &bytes[header.total_len..];
    }
    newest
}

/// Where the first whole batch starts in `bytes`, a tail cut at an unknown position
/// from a run of batches whose last one ends exactly at the end of `bytes` at offset
/// `end`: the first position from which headers chain to the end with continuous
/// offsets, ending at `end`, every CRC valid. A read of just the tail of a large range
/// (an open rebuilding producer state) finds its footing this way.
pub fn first_whole_batch(bytes: &[u8], end: u64) -> Option<usize> {
    (0..bytes.len()).find(|&at| chains_to(&bytes[at..], end) && split_batches(&bytes[at..]).is_ok())
}

/// Whether `bytes` is headers chained to its very end, offsets continuous, ending at `end`.
fn chains_to(mut bytes: &[u8], end: u64) -> bool {
    let mut next: Option<u64> = None;
    while !bytes.is_empty() {
        let Ok(header) = parse_header(bytes) else { return false };
        let Ok(base) = u64::try_from(header.base_offset) else {
            return false;
        };
        if next.is_some_and(|n| n != base) {
            return false;
        }
        next = Some(base + header.offset_count());
        bytes = &bytes[header.total_len..];
    }
    next == Some(end)
}

/// Rewrites `baseOffset` in place; it lies outside the CRC, so the batch stays valid.
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
    batch[0..8].copy_from_slice(&base_offset.to_be_bytes());
}

/// The Kafka leader epoch a whole batch was appended under.
pub fn partition_leader_epoch(batch: &[u8]) -> i32 {
    be_i32(batch, LOG_OVERHEAD)
}

/// Stamps the Kafka leader epoch the batch was appended under (`partitionLeaderEpoch`,
/// after `batchLength` and, like `baseOffset`, outside the CRC).
pub fn set_partition_leader_epoch(batch: &mut [u8], epoch: i32) {
    batch[LOG_OVERHEAD..LOG_OVERHEAD + 4].copy_from_slice(&epoch.to_be_bytes());
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

    // Issue 23: markers and transactional data come from coordinators and transactions,
    // never from a plain producer.
    #[test]
    fn a_producer_may_not_write_markers_or_transactional_batches() {
        let plain = opaque_batch(1, b"a");
        let header = |attributes: i16| BatchHeader {
            attributes,
            ..parse_header(&plain).expect("header")
        };
        assert_eq!(check_producer_batch(&header(0)), Ok(()));
        assert_eq!(check_producer_batch(&header(0x01)), Ok(()), "compressed (gzip)");
        assert_eq!(check_producer_batch(&header(0x30)), Err(ProducerBatchError::Control));
        assert_eq!(check_producer_batch(&header(0x20)), Err(ProducerBatchError::Control));
        assert_eq!(
            check_producer_batch(&header(0x10)),
            Err(ProducerBatchError::Transactional)
        );
    }

    // Issue 17: a read walks a range's batches from where the last read stopped, each
    // with its position; a cut batch ends the walk with an error.
    #[test]
    fn batches_from_starts_at_a_position_and_stops_at_a_cut_batch() {
        let batches: Vec<Vec<u8>> = (1..=4).map(|n| opaque_batch(n, &vec![b'x'; n as usize * 10])).collect();
        let joined = batches.concat();
        let all: Vec<(usize, i32)> = batches_from(&joined, 0)
            .map(|b| b.map(|(pos, h, _)| (pos, h.record_count)).expect("whole"))
            .collect();
        let starts: Vec<usize> = batches
            .iter()
            .scan(0, |at, b| {
                let start = *at;
                *at += b.len();
                Some(start)
            })
            .collect();
        assert_eq!(all, starts.iter().copied().zip(1..=4).collect::<Vec<_>>());
        let later: Vec<i32> = batches_from(&joined, starts[2])
            .map(|b| b.expect("whole").1.record_count)
            .collect();
        assert_eq!(later, [3, 4]);
        assert_eq!(batches_from(&joined, joined.len()).count(), 0);
        let cut = &joined[..joined.len() - 1];
        let walked: Vec<bool> = batches_from(cut, 0).map(|b| b.is_ok()).collect();
        assert_eq!(
            walked,
            [true, true, true, false],
            "the cut batch is an error, and the last item"
        );
    }

    // Issue 17: reads and compaction split ranges already checked whole by headers alone.
    #[test]
    fn split_by_header_skips_the_crcs_that_split_batches_checks() {
        let mut bad = opaque_batch(1, b"a");
        bad.extend(opaque_batch(2, b"bc"));
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(split_batches(&bad).is_err());
        let got = split_batches_by_header(&bad).expect("headers are whole");
        assert_eq!(got.len(), 2);
        assert_eq!(got.iter().map(|(_, b)| b.len()).sum::<usize>(), bad.len());
        assert!(
            split_batches_by_header(&bad[..last]).is_err(),
            "a cut batch is still refused"
        );
    }

    pub fn batch(count: i32, payload: &[u8]) -> Vec<u8> {
        opaque_batch(count, payload)
    }

    /// One uncompressed record per value, as a producer sends them.
    fn records_batch(values: &[&[u8]]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        for (i, v) in values.iter().enumerate() {
            let mut r = vec![0u8, 0, (i as u8) << 1, 1]; // attributes, ts delta, offset delta, null key
            r.push((v.len() as u8) << 1);
            r.extend_from_slice(v);
            r.push(0); // no headers
            b.push((r.len() as u8) << 1);
            b.extend_from_slice(&r);
        }
        let len = (b.len() - LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        b[16] = 2;
        let n = values.len() as i32;
        b[23..27].copy_from_slice(&(n - 1).to_be_bytes());
        b[57..61].copy_from_slice(&n.to_be_bytes());
        recompute_crc(&mut b);
        b
    }

    // Issue 19: a batch claims exactly the offsets of the records it holds.
    #[test]
    fn record_counts_are_reconciled_with_the_offsets_claimed_and_the_records_present() {
        let check = |b: &[u8]| check_record_count(b, &parse_header(b).unwrap(), 1 << 20);
        assert!(check(&records_batch(&[b"a", b"bc", b"def"])).is_ok());
        let mut greedy = records_batch(&[b"a"]);
        greedy[23..27].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(check(&greedy).unwrap_err().to_string().contains("lastOffsetDelta"));
        let mut claims_two = records_batch(&[b"a"]);
        claims_two[23..27].copy_from_slice(&1i32.to_be_bytes());
        claims_two[57..61].copy_from_slice(&2i32.to_be_bytes());
        assert!(check(&claims_two)
            .unwrap_err()
            .to_string()
            .contains("1 records are present"));
        let mut empty = records_batch(&[b"a"]);
        empty[57..61].copy_from_slice(&0i32.to_be_bytes());
        assert!(check(&empty).is_err());
        let mut cut = records_batch(&[b"abc"]);
        cut[HEADER_LEN] = 0x7e; // the record claims 63 bytes
        assert!(check(&cut).unwrap_err().to_string().contains("runs past"));
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
        set_partition_leader_epoch(&mut first, 7);
        let (h, _) = split_batches(&first).unwrap()[0];
        assert_eq!(h.base_offset, 42);
        assert_eq!(partition_leader_epoch(&first), 7);
        assert_eq!(first[12..16], 7i32.to_be_bytes(), "the epoch follows batchLength");
        verify_crc(&first, &h).expect("the CRC still holds");
    }

    /// Batches at offsets 0.., each `count` records of `payload`, concatenated.
    fn run(batches: usize, count: i32, payload: &[u8]) -> (Vec<u8>, Vec<usize>) {
        let (mut out, mut starts, mut offset) = (Vec::new(), Vec::new(), 0i64);
        for _ in 0..batches {
            let mut b = batch(count, payload);
            set_base_offset(&mut b, offset);
            offset += i64::from(count);
            starts.push(out.len());
            out.extend(b);
        }
        (out, starts)
    }

    #[test]
    fn a_tail_cut_anywhere_finds_its_first_whole_batch() {
        // Payloads that look like batch headers must not fool it.
        let (bytes, starts) = run(20, 3, &batch(1, b"decoy"));
        let end = 60;
        for cut in [0, 1, 17, starts[5] - 1, starts[5], starts[5] + 30, starts[19]] {
            let expected = starts
                .iter()
                .copied()
                .find(|&s| s >= cut)
                .expect("a batch after the cut");
            assert_eq!(
                first_whole_batch(&bytes[cut..], end),
                Some(expected - cut),
                "cut at {cut}"
            );
        }
        assert_eq!(first_whole_batch(&bytes[starts[19] + 1..], end), None, "no whole batch");
        assert_eq!(
            first_whole_batch(&bytes, 59),
            None,
            "must end at the range's end offset"
        );
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
