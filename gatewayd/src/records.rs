//! HTTP records <-> Kafka v2 record batches (encoded and decoded by `kafka-protocol`),
//! so a record appended over HTTP is an ordinary Kafka record and the other way round.
//!
//! Text fields are UTF-8 by default; with `weir-format: base64` (or `?format=base64`)
//! bodies, keys and header values are base64 in both directions, for binary data.

use base64::Engine;
use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use serde::{Deserialize, Serialize};
use weir_shared::inflate::InflateError;

/// How bodies, keys and header values are written in JSON.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// UTF-8 text (bytes that are not valid UTF-8 are read back lossily).
    #[default]
    Raw,
    /// Standard base64, for binary data.
    Base64,
}

impl Format {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "raw" => Ok(Format::Raw),
            "base64" => Ok(Format::Base64),
            other => Err(format!("format '{other}' is not one of raw, base64")),
        }
    }

    fn decode(self, what: &str, s: &str) -> Result<Bytes, String> {
        match self {
            Format::Raw => Ok(Bytes::copy_from_slice(s.as_bytes())),
            Format::Base64 => base64::engine::general_purpose::STANDARD
                .decode(s)
                .map(Bytes::from)
                .map_err(|e| format!("{what} is not valid base64: {e}")),
        }
    }

    fn encode(self, b: &[u8]) -> String {
        match self {
            Format::Raw => String::from_utf8_lossy(b).into_owned(),
            Format::Base64 => base64::engine::general_purpose::STANDARD.encode(b),
        }
    }
}

/// One record of an append request.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppendRecord {
    /// The record's value; `null` (or absent) is a Kafka null value.
    #[serde(default)]
    pub body: Option<String>,
    /// `[name, value]` pairs; a `null` value is a Kafka null header value.
    #[serde(default)]
    pub headers: Vec<(String, Option<String>)>,
    #[serde(default)]
    pub key: Option<String>,
    /// Milliseconds since the epoch; the gateway's clock when absent.
    #[serde(default)]
    pub timestamp: Option<i64>,
}

/// One record of a read answer.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ReadRecord {
    pub seq_num: u64,
    pub timestamp: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub headers: Vec<(String, Option<String>)>,
    pub body: Option<String>,
}

/// The idempotent identity a batch is stamped with.
#[derive(Clone, Copy, Debug)]
pub struct ProducerStamp {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Encodes `records` as one uncompressed v2 batch.
pub fn encode_batch(records: &[AppendRecord], format: Format, stamp: Option<ProducerStamp>) -> Result<Bytes, String> {
    if records.is_empty() {
        return Err("an append needs at least one record".into());
    }
    let now = now_ms();
    let mut out = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        let value = r
            .body
            .as_deref()
            .map(|b| format.decode(&format!("records[{i}].body"), b))
            .transpose()?;
        let key = r
            .key
            .as_deref()
            .map(|k| format.decode(&format!("records[{i}].key"), k))
            .transpose()?;
        let mut headers = IndexMap::new();
        for (name, v) in &r.headers {
            if name.is_empty() {
                return Err(format!("records[{i}] has a header with an empty name"));
            }
            let value = v
                .as_deref()
                .map(|v| format.decode(&format!("records[{i}] header '{name}'"), v))
                .transpose()?;
            if headers.insert(StrBytes::from_string(name.clone()), value).is_some() {
                return Err(format!("records[{i}] repeats header '{name}'"));
            }
        }
        let timestamp = r.timestamp.unwrap_or(now);
        if timestamp < 0 {
            return Err(format!("records[{i}].timestamp must not be negative"));
        }
        out.push(Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: stamp.map_or(-1, |s| s.producer_id),
            producer_epoch: stamp.map_or(-1, |s| s.producer_epoch),
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder keeps records in one batch while offset - sequence is constant;
            // without a producer the base sequence stays -1.
            sequence: stamp.map_or(-1, |s| s.base_sequence).wrapping_add(i as i32),
            timestamp,
            key,
            value,
            headers,
        });
    }
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &out,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| format!("cannot encode the records: {e}"))?;
    Ok(buf.freeze())
}

/// Decodes whole batches into records at offsets `from` and later, at most `limit` of
/// them; control records are skipped. No batch's records are inflated past
/// `max_inflated` bytes.
pub fn decode_batches(
    mut batches: Bytes,
    from: u64,
    limit: usize,
    format: Format,
    max_inflated: usize,
) -> Result<Vec<ReadRecord>, InflateError> {
    let sets = weir_shared::inflate::decode_all(&mut batches, max_inflated)?;
    let mut out = Vec::new();
    for set in sets {
        for r in set.records {
            if r.control || r.offset < 0 || (r.offset as u64) < from {
                continue;
            }
            if out.len() == limit {
                return Ok(out);
            }
            out.push(ReadRecord {
                seq_num: r.offset as u64,
                timestamp: r.timestamp,
                key: r.key.as_deref().map(|k| format.encode(k)),
                headers: r
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.as_deref().map(|v| format.encode(v))))
                    .collect(),
                body: r.value.as_deref().map(|v| format.encode(v)),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(body: &str) -> AppendRecord {
        AppendRecord {
            body: Some(body.into()),
            headers: vec![("h".into(), Some("v".into())), ("n".into(), None)],
            key: Some("k".into()),
            timestamp: Some(42),
        }
    }

    #[test]
    fn records_round_trip_through_a_kafka_batch() {
        let batch = encode_batch(&[record("a"), record("b")], Format::Raw, None).expect("encode");
        let header = weir_shared::batch::parse_header(&batch).expect("a valid v2 batch");
        assert_eq!(header.record_count, 2);
        assert_eq!(header.producer_id, -1);
        let back = decode_batches(batch, 0, 10, Format::Raw, 1 << 20).expect("decode");
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].seq_num, 1);
        assert_eq!(back[1].body.as_deref(), Some("b"));
        assert_eq!(back[0].key.as_deref(), Some("k"));
        assert_eq!(back[0].timestamp, 42);
        assert_eq!(
            back[0].headers,
            vec![("h".to_string(), Some("v".to_string())), ("n".to_string(), None)]
        );
    }

    #[test]
    fn base64_carries_binary_bodies() {
        let r = AppendRecord {
            body: Some("AAEC/w==".into()),
            headers: vec![],
            key: None,
            timestamp: None,
        };
        let batch = encode_batch(&[r], Format::Base64, None).expect("encode");
        let back = decode_batches(batch, 0, 10, Format::Base64, 1 << 20).expect("decode");
        assert_eq!(back[0].body.as_deref(), Some("AAEC/w=="));
        assert!(encode_batch(
            &[AppendRecord {
                body: Some("not base64!".into()),
                headers: vec![],
                key: None,
                timestamp: None
            }],
            Format::Base64,
            None
        )
        .is_err());
    }

    #[test]
    fn a_stamped_batch_carries_its_producer_and_sequence() {
        let stamp = ProducerStamp {
            producer_id: 77,
            producer_epoch: 0,
            base_sequence: 0,
        };
        let batch = encode_batch(&[record("a"), record("b")], Format::Raw, Some(stamp)).expect("encode");
        let h = weir_shared::batch::parse_header(&batch).expect("header");
        assert_eq!((h.producer_id, h.producer_epoch, h.base_sequence), (77, 0, 0));
    }

    #[test]
    fn reads_skip_records_before_the_start_and_stop_at_the_limit() {
        let batch = encode_batch(&[record("a"), record("b"), record("c")], Format::Raw, None).expect("encode");
        let back = decode_batches(batch, 1, 1, Format::Raw, 1 << 20).expect("decode");
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].seq_num, 1);
    }

    #[test]
    fn repeated_header_names_are_refused() {
        let r = AppendRecord {
            body: None,
            headers: vec![("a".into(), None), ("a".into(), None)],
            key: None,
            timestamp: None,
        };
        assert!(encode_batch(&[r], Format::Raw, None).is_err());
    }
}
