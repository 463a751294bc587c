//! Internal streams whose records are JSON keys and values (the offsets stream, the
//! transaction-state stream): encoding a batch of them, and replaying stored batches.

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

/// Encodes `(key, value)` records, a `None` value being a tombstone, as one
/// uncompressed batch.
pub fn encode(records: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>, what: &str) -> Result<Bytes, String> {
    encode_as(records, None, what)
}

/// [`encode`], as a transactional batch of `producer` (id, epoch) when given: the
/// coordinator writes a transaction's offsets so (TxnOffsetCommit), with no sequence,
/// as Kafka's group coordinator does.
pub fn encode_as(
    records: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>,
    producer: Option<(i64, i16)>,
    what: &str,
) -> Result<Bytes, String> {
    let (producer_id, producer_epoch) = producer.unwrap_or((-1, -1));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let records = records
        .into_iter()
        .enumerate()
        .map(|(i, (key, value))| Record {
            transactional: producer.is_some(),
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: -1,
            timestamp: now,
            key: Some(Bytes::from(key)),
            value: value.map(Bytes::from),
            headers: IndexMap::new(),
        })
        .collect::<Vec<_>>();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| format!("cannot encode {what}: {e}"))?;
    Ok(buf.freeze())
}

/// Replays stored batches in order, handing each record to `apply`. A batch that does
/// not decode is skipped with a warning: one bad batch must not make everything the
/// stream holds unavailable. `max_inflated` bounds what one batch may inflate to.
pub fn replay(batches: Bytes, max_inflated: usize, what: &str, mut apply: impl FnMut(&Record)) -> Result<(), String> {
    let split = weir_shared::batch::split_batches(&batches).map_err(|e| format!("{what} stream: {e}"))?;
    for (header, raw) in split {
        let mut one = Bytes::copy_from_slice(raw);
        match weir_shared::inflate::decode_all(&mut one, max_inflated) {
            Ok(sets) => sets.iter().flat_map(|s| &s.records).for_each(&mut apply),
            Err(e) => {
                tracing::warn!(offset = header.base_offset, error = %e, "skipped a batch of the {what} stream that does not decode")
            }
        }
    }
    Ok(())
}
