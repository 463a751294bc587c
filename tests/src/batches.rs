//! Minimal Kafka v2 record batches for tests: one record per batch with a given value,
//! built by hand so tests do not depend on the encoder under test.

/// A v2 batch holding one record whose value is `value`.
pub fn batch(value: &[u8]) -> Vec<u8> {
    let mut record = Vec::new();
    record.push(0u8); // attributes
    put_varint(&mut record, 0); // timestamp delta
    put_varint(&mut record, 0); // offset delta
    put_varint(&mut record, -1); // null key
    put_varint(&mut record, value.len() as i64);
    record.extend_from_slice(value);
    put_varint(&mut record, 0); // headers
    let mut body = Vec::new();
    put_varint(&mut body, record.len() as i64);
    body.extend_from_slice(&record);

    let mut b = Vec::new();
    b.extend_from_slice(&0i64.to_be_bytes()); // base offset
    b.extend_from_slice(&0i32.to_be_bytes()); // batch length, set below
    b.extend_from_slice(&0i32.to_be_bytes()); // partition leader epoch
    b.push(2); // magic
    b.extend_from_slice(&0u32.to_be_bytes()); // crc, set below
    b.extend_from_slice(&0i16.to_be_bytes()); // attributes
    b.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
    b.extend_from_slice(&0i64.to_be_bytes()); // base timestamp
    b.extend_from_slice(&0i64.to_be_bytes()); // max timestamp
    b.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    b.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    b.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    b.extend_from_slice(&1i32.to_be_bytes()); // record count
    b.extend_from_slice(&body);
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// `batch` with its attributes set to `attributes` (and its CRC made right again): a
/// control batch (0x20), a transactional one (0x10).
pub fn with_attributes(mut batch: Vec<u8>, attributes: i16) -> Vec<u8> {
    batch[21..23].copy_from_slice(&attributes.to_be_bytes());
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
    batch
}

/// `batch` as an idempotent producer's: producer id `pid`, epoch `epoch`, base
/// sequence `seq` (and its CRC made right again).
pub fn idempotent(mut batch: Vec<u8>, pid: i64, epoch: i16, seq: i32) -> Vec<u8> {
    batch[43..51].copy_from_slice(&pid.to_be_bytes());
    batch[51..53].copy_from_slice(&epoch.to_be_bytes());
    batch[53..57].copy_from_slice(&seq.to_be_bytes());
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
    batch
}

/// `batch` marked transactional (attribute bit 4), its CRC recomputed: data written
/// inside a producer's transaction (issue 23).
pub fn transactional(mut batch: Vec<u8>) -> Vec<u8> {
    let attributes = i16::from_be_bytes([batch[21], batch[22]]) | 0x10;
    batch[21..23].copy_from_slice(&attributes.to_be_bytes());
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
    batch
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let byte = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The values of the single-record batches in `data`, with their base offsets.
pub fn values(data: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 61 {
        let base = i64::from_be_bytes(rest[0..8].try_into().expect("8")) as u64;
        let len = i32::from_be_bytes(rest[8..12].try_into().expect("4")) as usize + 12;
        let batch = &rest[..len];
        let mut pos = 61;
        let (_rec_len, n) = get_varint(&batch[pos..]);
        pos += n;
        pos += 1; // attributes
        for _ in 0..2 {
            let (_, n) = get_varint(&batch[pos..]);
            pos += n;
        }
        let (key_len, n) = get_varint(&batch[pos..]);
        pos += n;
        if key_len > 0 {
            pos += key_len as usize;
        }
        let (vlen, n) = get_varint(&batch[pos..]);
        pos += n;
        out.push((base, batch[pos..pos + vlen as usize].to_vec()));
        rest = &rest[len..];
    }
    out
}

fn get_varint(b: &[u8]) -> (i64, usize) {
    let mut z = 0u64;
    let mut shift = 0;
    for (i, byte) in b.iter().enumerate() {
        z |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return (((z >> 1) as i64) ^ -((z & 1) as i64), i + 1);
        }
        shift += 7;
    }
    (0, b.len())
}

/// One v2 batch of `values` (key `k`, one record each) encoded by kafka-protocol with
/// `compression`, as a producer sends them: for tests of compressed batches, which the
/// hand-built [`batch`] does not cover.
pub fn encoded(values: &[&[u8]], compression: kafka_protocol::records::Compression) -> bytes::Bytes {
    use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
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
            // The encoder keeps records in one batch while offset - sequence is constant.
            sequence: i as i32 - 1,
            timestamp: 7,
            key: Some(bytes::Bytes::from_static(b"k")),
            value: Some(bytes::Bytes::copy_from_slice(v)),
            headers: Default::default(),
            delete_horizon: false,
        })
        .collect();
    let mut buf = bytes::BytesMut::new();
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
