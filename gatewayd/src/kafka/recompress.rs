//! A topic's `compression.type`, as Kafka's broker applies it: a producer's batch sent
//! in another codec is decoded and encoded again in the topic's, keeping every record
//! and every batch field (producer id, epoch, sequence, transactional, leader epoch,
//! timestamps). The owner then stores it as it stores any batch.

use bytes::Bytes;
use kafka_protocol::records::{Compression, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions};

/// The codec a `compression.type` value names (`producer` names none).
pub fn codec(name: &str) -> Option<Compression> {
    match name {
        "uncompressed" => Some(Compression::None),
        "gzip" => Some(Compression::Gzip),
        "snappy" => Some(Compression::Snappy),
        "lz4" => Some(Compression::Lz4),
        "zstd" => Some(Compression::Zstd),
        _ => None,
    }
}

/// The codec bits of a v2 batch's attributes.
fn codec_of(batch: &[u8]) -> Option<i16> {
    let attributes = batch.get(21..23)?;
    Some(i16::from_be_bytes([attributes[0], attributes[1]]) & 0x07)
}

/// `batch` (one whole v2 record batch) in codec `want`: itself when it already is.
pub fn recompress(batch: Bytes, want: Compression) -> Result<Bytes, String> {
    if codec_of(&batch) == Some(want as i16) {
        return Ok(batch);
    }
    let set = RecordBatchDecoder::decode(&mut batch.clone()).map_err(|e| format!("the batch does not decode: {e}"))?;
    if set.records.is_empty() {
        return Ok(batch);
    }
    let mut out = bytes::BytesMut::with_capacity(batch.len());
    RecordBatchEncoder::encode(
        &mut out,
        set.records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: want,
        },
    )
    .map_err(|e| format!("the batch does not encode in {want:?}: {e}"))?;
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::records::{Record, TimestampType};

    fn records() -> Vec<Record> {
        (0..20)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 3,
                producer_id: 42,
                producer_epoch: 1,
                timestamp_type: TimestampType::Creation,
                offset: i,
                sequence: 7 + i as i32,
                timestamp: 1_700_000_000_000 + i,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(vec![b'v'; 100])),
                headers: Default::default(),
            })
            .collect()
    }

    fn encoded(records: &[Record], compression: Compression) -> Bytes {
        let mut out = bytes::BytesMut::new();
        RecordBatchEncoder::encode(
            &mut out,
            records.iter(),
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .expect("encode");
        out.freeze()
    }

    // Issue 59 (librdkafka 0081's topic configs): a batch is stored in the topic's codec
    // with its records and its producer fields unchanged, and one already in it as sent.
    #[test]
    fn a_batch_is_recompressed_with_every_record_and_field_kept() {
        let plain = encoded(&records(), Compression::None);
        for want in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let stored = recompress(plain.clone(), want).expect("recompress");
            assert_eq!(codec_of(&stored), Some(want as i16));
            assert!(stored.len() < plain.len(), "{want:?} made it smaller");
            let back = RecordBatchDecoder::decode(&mut stored.clone()).expect("decode");
            assert_eq!(back.records, records(), "{want:?}");
            let same = recompress(stored.clone(), want).expect("again");
            assert_eq!(same, stored, "a batch in the topic's codec is stored as sent");
        }
        let lz4 = encoded(&records(), Compression::Lz4);
        let plain_again = recompress(lz4, Compression::None).expect("decompress");
        assert_eq!(codec_of(&plain_again), Some(0));
        assert_eq!(
            RecordBatchDecoder::decode(&mut plain_again.clone())
                .expect("decode")
                .records,
            records()
        );
    }
}
