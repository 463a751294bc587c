//! Transaction markers: the control batch a coordinator has written into each partition
//! of a transaction when it commits or aborts (KIP-98). One control record: key
//! `(version 0, type)`, type 0 for abort and 1 for commit; value `(version 0,
//! coordinator epoch)`. Clients skip control batches; `read_committed` readers use the
//! aborts to drop the aborted transaction's batches.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

const ABORT: i16 = 0;
const COMMIT: i16 = 1;
/// Most a control batch may inflate to when decoded (one tiny record).
const MARKER_INFLATED_BYTES: usize = 64 << 10;

/// One marker, as written into a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marker {
    pub producer_id: i64,
    pub epoch: i16,
    pub commit: bool,
    /// The epoch of the coordinator's state stream when it wrote the marker.
    pub coordinator_epoch: i32,
}

/// Encodes `marker` as a control batch at offset 0 (the owner assigns its offset).
pub fn encode(marker: &Marker, timestamp_ms: i64) -> Result<Bytes, String> {
    let mut key = BytesMut::with_capacity(4);
    key.put_i16(0);
    key.put_i16(if marker.commit { COMMIT } else { ABORT });
    let mut value = BytesMut::with_capacity(6);
    value.put_i16(0);
    value.put_i32(marker.coordinator_epoch);
    let record = Record {
        transactional: true,
        control: true,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: marker.producer_id,
        producer_epoch: marker.epoch,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: timestamp_ms,
        key: Some(key.freeze()),
        value: Some(value.freeze()),
        headers: IndexMap::new(),
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &[record],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| format!("cannot encode a transaction marker: {e}"))?;
    Ok(buf.freeze())
}

/// The marker a stored control batch holds; `None` for a control batch of another
/// kind, or one that does not decode.
pub fn decode(batch: &[u8]) -> Option<Marker> {
    let mut bytes = Bytes::copy_from_slice(batch);
    let sets = weir_shared::inflate::decode_all(&mut bytes, MARKER_INFLATED_BYTES).ok()?;
    let record = sets.into_iter().flat_map(|s| s.records).next()?;
    from_record(&record)
}

/// The marker a decoded control record holds; `None` for any other record.
pub fn from_record(record: &kafka_protocol::records::Record) -> Option<Marker> {
    if !record.control {
        return None;
    }
    let key = record.key.as_ref()?;
    let value = record.value.as_ref()?;
    if key.len() < 4 || value.len() < 6 {
        return None;
    }
    let kind = i16::from_be_bytes([key[2], key[3]]);
    let coordinator_epoch = i32::from_be_bytes([value[2], value[3], value[4], value[5]]);
    let commit = match kind {
        COMMIT => true,
        ABORT => false,
        _ => return None,
    };
    Some(Marker {
        producer_id: record.producer_id,
        epoch: record.producer_epoch,
        commit,
        coordinator_epoch,
    })
}
