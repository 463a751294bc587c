//! Bounded decompression of Kafka record-batch payloads (gzip, snappy, lz4, zstd).
//!
//! A few kilobytes of gzip can inflate to gigabytes, so nothing here ever produces more
//! than a caller's limit: a payload that would is refused with [`InflateError::TooLarge`]
//! after at most `limit + 1` bytes came out (issue 19). Produce validates compression by
//! streaming through [`reader`] (counting records, holding no output); reads decode with
//! [`decode_all`], which holds at most one batch's limit at a time.

use bytes::Bytes;
use kafka_protocol::records::{Compression, RecordBatchDecoder, RecordSet};
use std::io::{self, Read};

/// Why a payload was not inflated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InflateError {
    #[error("a record batch inflates past the {limit}-byte limit (--max-decompressed-bytes)")]
    TooLarge { limit: usize },
    #[error("a record batch's compressed records are invalid: {0}")]
    Invalid(String),
}

/// The codec in a v2 batch's `attributes` (its low three bits).
pub fn codec(attributes: i16) -> Result<Compression, InflateError> {
    match attributes & 0x07 {
        0 => Ok(Compression::None),
        1 => Ok(Compression::Gzip),
        2 => Ok(Compression::Snappy),
        3 => Ok(Compression::Lz4),
        4 => Ok(Compression::Zstd),
        other => Err(InflateError::Invalid(format!("unknown compression codec {other}"))),
    }
}

/// A reader of `payload`'s inflated bytes that fails with [`InflateError::TooLarge`]
/// (as an `io::Error` carrying it) once more than `limit` bytes would come out.
pub fn reader<'a>(payload: &'a [u8], codec: Compression, limit: usize) -> Result<Box<dyn Read + 'a>, InflateError> {
    let inner: Box<dyn Read + 'a> = match codec {
        Compression::None => Box::new(payload),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(payload)),
        Compression::Snappy => Box::new(SnappyReader::new(payload, limit)),
        Compression::Lz4 => {
            Box::new(lz4::Decoder::new(payload).map_err(|e| InflateError::Invalid(format!("lz4: {e}")))?)
        }
        Compression::Zstd => {
            let mut d = zstd::stream::read::Decoder::with_buffer(payload)
                .map_err(|e| InflateError::Invalid(format!("zstd: {e}")))?;
            // A frame header alone must not make the decoder allocate far past the limit.
            d.window_log_max(window_log_for(limit))
                .map_err(|e| InflateError::Invalid(format!("zstd: {e}")))?;
            Box::new(ZstdWindow(d, limit))
        }
    };
    Ok(Box::new(Bounded {
        inner,
        left: limit,
        limit,
    }))
}

/// Inflates `payload` whole, at most `limit` bytes.
pub fn inflate(payload: &[u8], codec: Compression, limit: usize) -> Result<Bytes, InflateError> {
    let mut out = Vec::new();
    reader(payload, codec, limit)?.read_to_end(&mut out).map_err(from_io)?;
    Ok(out.into())
}

/// Decodes concatenated batches, inflating each one's records at most `limit` bytes:
/// `RecordBatchDecoder::decode_all` with a bounded decompressor.
pub fn decode_all(batches: &mut Bytes, limit: usize) -> Result<Vec<RecordSet>, InflateError> {
    let mut sets = Vec::new();
    let too_large = std::cell::Cell::new(false);
    while !batches.is_empty() {
        let decompress = |payload: &mut Bytes, codec: Compression| -> anyhow::Result<Bytes> {
            inflate(payload, codec, limit).map_err(|e| {
                too_large.set(matches!(e, InflateError::TooLarge { .. }));
                anyhow::Error::new(e)
            })
        };
        match RecordBatchDecoder::decode_with_custom_compression(batches, Some(decompress)) {
            Ok(set) => sets.push(set),
            Err(_) if too_large.get() => return Err(InflateError::TooLarge { limit }),
            Err(e) => return Err(InflateError::Invalid(format!("{e:#}"))),
        }
    }
    Ok(sets)
}

/// Maps a bounded reader's error back to an [`InflateError`].
pub fn from_io(e: io::Error) -> InflateError {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<InflateError>()) {
        Some(inner) => inner.clone(),
        None => InflateError::Invalid(e.to_string()),
    }
}

/// The largest zstd window a frame may ask for: what the limit allows, but never below
/// 8 MiB (windowLog 23), since a streaming compressor picks its level's window (2 MiB at
/// level 3, 8 MiB at 19) whatever the input's size. 27 is zstd's own default maximum.
fn window_log_for(limit: usize) -> u32 {
    let log = usize::BITS - limit.max(1).next_power_of_two().leading_zeros() - 1;
    log.clamp(23, 27)
}

/// A zstd frame asking for a window larger than the limit allows claims more output
/// than the limit: it is refused as too large, not as invalid.
struct ZstdWindow<R>(R, usize);

impl<R: Read> Read for ZstdWindow<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(|e| {
            // zstd's ZSTD_error_frameParameter_windowTooLarge, by its message: the
            // binding gives no code.
            if e.to_string().contains("requires too much memory") {
                io::Error::new(io::ErrorKind::InvalidData, InflateError::TooLarge { limit: self.1 })
            } else {
                e
            }
        })
    }
}

/// Counts bytes out and fails once past the limit.
struct Bounded<'a> {
    inner: Box<dyn Read + 'a>,
    left: usize,
    limit: usize,
}

impl Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // Ask for one byte past what is left, so going over is seen, not cut silently.
        let want = buf.len().min(self.left.saturating_add(1));
        let n = self.inner.read(&mut buf[..want])?;
        if n > self.left {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                InflateError::TooLarge { limit: self.limit },
            ));
        }
        self.left -= n;
        Ok(n)
    }
}

/// Kafka's snappy framing (xerial: a magic header, then length-prefixed raw snappy
/// blocks), or one raw snappy block when the magic is absent, as Java's client reads it.
/// Each block's claimed length is checked against the budget before it is allocated.
struct SnappyReader<'a> {
    rest: &'a [u8],
    raw: bool,
    block: Vec<u8>,
    at: usize,
    budget: usize,
    limit: usize,
}

const SNAPPY_MAGIC: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";

impl<'a> SnappyReader<'a> {
    fn new(payload: &'a [u8], limit: usize) -> Self {
        let (rest, raw) = match payload.strip_prefix(&SNAPPY_MAGIC[..8]) {
            // The version and compatibility words that follow the magic are not checked,
            // as Java's reader does not.
            Some(_) if payload.len() >= SNAPPY_MAGIC.len() => (&payload[SNAPPY_MAGIC.len()..], false),
            _ => (payload, true),
        };
        SnappyReader {
            rest,
            raw,
            block: Vec::new(),
            at: 0,
            budget: limit,
            limit,
        }
    }

    fn next_block(&mut self) -> io::Result<bool> {
        let compressed = if self.raw {
            if self.rest.is_empty() {
                return Ok(false);
            }
            std::mem::take(&mut self.rest)
        } else {
            if self.rest.is_empty() {
                return Ok(false);
            }
            if self.rest.len() < 4 {
                return Err(invalid("snappy block length is cut short"));
            }
            let len = u32::from_be_bytes(self.rest[..4].try_into().expect("4 bytes")) as usize;
            let block = self
                .rest
                .get(4..4 + len)
                .ok_or_else(|| invalid("snappy block runs past the payload"))?;
            self.rest = &self.rest[4 + len..];
            block
        };
        let len = snap::raw::decompress_len(compressed).map_err(|e| invalid(&format!("snappy: {e}")))?;
        if len > self.budget {
            // Refused before the block is allocated.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                InflateError::TooLarge { limit: self.limit },
            ));
        }
        self.budget -= len;
        self.block.resize(len, 0);
        snap::raw::Decoder::new()
            .decompress(compressed, &mut self.block)
            .map_err(|e| invalid(&format!("snappy: {e}")))?;
        self.at = 0;
        Ok(true)
    }
}

impl Read for SnappyReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.block.len() {
            if !self.next_block()? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.block.len() - self.at);
        buf[..n].copy_from_slice(&self.block[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, InflateError::Invalid(msg.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{check_record_count, parse_header, BatchError};
    use bytes::BytesMut;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

    const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    fn batch(values: &[Vec<u8>], compression: Compression) -> Bytes {
        let records: Vec<Record> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                transactional: false,
                control: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                // Records stay in one batch while offset - sequence is constant.
                sequence: i as i32 - 1,
                timestamp: 0,
                key: None,
                value: Some(Bytes::from(v.clone())),
                headers: IndexMap::new(),
                delete_horizon: false,
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .expect("encode");
        buf.freeze()
    }

    fn check(b: &[u8], limit: usize) -> Result<(), BatchError> {
        check_record_count(b, &parse_header(b).expect("header"), limit)
    }

    // Issue 19: compressed batches are counted as they inflate, and read back bounded.
    #[test]
    fn every_codec_is_counted_and_decoded_within_the_limit() {
        for codec in CODECS {
            let b = batch(&[b"one".to_vec(), vec![7u8; 5000], b"three".to_vec()], codec);
            check(&b, 1 << 20).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            let sets = decode_all(&mut b.clone(), 1 << 20).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            let values: Vec<_> = sets
                .iter()
                .flat_map(|s| &s.records)
                .map(|r| r.value.clone().unwrap())
                .collect();
            assert_eq!(values.len(), 3, "{codec:?}");
            assert_eq!(&values[1][..], &[7u8; 5000][..], "{codec:?}");

            // A claimed count the inflated records do not match is refused.
            let mut wrong = b.to_vec();
            wrong[23..27].copy_from_slice(&1i32.to_be_bytes());
            wrong[57..61].copy_from_slice(&2i32.to_be_bytes());
            crate::batch::recompute_crc(&mut wrong);
            let err = check(&wrong, 1 << 20).unwrap_err();
            assert!(err.to_string().contains("3 records are present"), "{codec:?}: {err}");
        }
    }

    // Issue 19: a decompression bomb is refused at produce time and never inflated on read.
    #[test]
    fn a_bomb_is_refused_after_at_most_the_limit() {
        for codec in CODECS.into_iter().skip(1) {
            let bomb = batch(&[vec![0u8; 8 << 20]], codec);
            assert!(
                bomb.len() < 1 << 20,
                "{codec:?} compresses 8 MiB of zeros to {}",
                bomb.len()
            );
            let err = check(&bomb, 1 << 20).unwrap_err();
            assert!(matches!(err, BatchError::TooLarge(_)), "{codec:?}: {err}");
            assert!(err.to_string().contains("--max-decompressed-bytes"), "{codec:?}: {err}");
            assert_eq!(
                decode_all(&mut bomb.clone(), 1 << 20).unwrap_err(),
                InflateError::TooLarge { limit: 1 << 20 },
                "{codec:?}"
            );
            // The same batch under a limit it fits in is fine.
            check(&bomb, 9 << 20).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
        }
    }

    #[test]
    fn garbage_is_invalid_not_a_panic() {
        for codec in CODECS.into_iter().skip(1) {
            for junk in [
                &b""[..],
                b"\x00",
                b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\xff\xff\xff\xff",
                &[0xffu8; 64],
            ] {
                let _ = inflate(junk, codec, 1 << 20);
            }
        }
        assert!(matches!(codec(7), Err(InflateError::Invalid(_))));
    }
}
