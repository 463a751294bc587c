//! One driver per decoder a peer or a disk can feed (issue 19): each takes arbitrary
//! bytes, runs the decoder the way the service does, and checks what must hold whatever
//! the input (no panic, no allocation past the bytes given or the limit, round trips
//! where there is an encoder). The cargo-fuzz targets in `fuzz/` and the 10,000-case
//! property tests in `tests/tests/decoders.rs` both call these, so what the fuzzer
//! explores and what CI checks are the same code.

use bytes::Bytes;
use kafka_protocol::records::Compression;

/// Limit on inflated bytes in the drivers: small, so a bomb is refused quickly.
pub const INFLATE_LIMIT: usize = 1 << 20;

/// The Kafka frame decoder: header, then the body of whichever API the header names.
pub fn kafka_frame(data: &[u8]) {
    let _ = weir_gatewayd::kafka::frame::decode(Bytes::copy_from_slice(data), |_, _| true);
    let _ =
        weir_gatewayd::kafka::frame::decode(Bytes::copy_from_slice(data), weir_gatewayd::kafka::versions::supported);
}

/// Record batches as a producer sends them: framing and CRC, the record count, the
/// compressed records (bounded), then the records themselves as the HTTP API reads them.
/// The bytes run twice: as given, and with every batch's CRC made right, so the fuzzer
/// reaches the records behind the checksum.
pub fn record_batches(data: &[u8]) {
    validate_and_read(data);
    let mut fixed = data.to_vec();
    let mut at = 0;
    while let Ok(header) = weir_shared::batch::parse_header(&fixed[at..]) {
        let end = at + header.total_len;
        weir_shared::batch::recompute_crc(&mut fixed[at..end]);
        at = end;
    }
    validate_and_read(&fixed);
}

fn validate_and_read(data: &[u8]) {
    let Ok(batches) = weir_shared::batch::split_batches(data) else {
        return;
    };
    for (header, bytes) in batches {
        assert_eq!(bytes.len(), header.total_len);
        if weir_shared::batch::check_record_count(bytes, &header, INFLATE_LIMIT).is_ok() {
            // A batch that passed validation decodes within the same limit.
            let _ = weir_shared::inflate::decode_all(&mut Bytes::copy_from_slice(bytes), INFLATE_LIMIT);
        }
    }
    let _ = weir_gatewayd::records::decode_batches(
        Bytes::copy_from_slice(data),
        0,
        1000,
        weir_gatewayd::records::Format::Base64,
        INFLATE_LIMIT,
    );
}

/// Compressed payloads in every codec: never more than the limit comes out.
pub fn compressed(data: &[u8]) {
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        if let Ok(out) = weir_shared::inflate::inflate(data, codec, INFLATE_LIMIT) {
            assert!(out.len() <= INFLATE_LIMIT, "{codec:?} gave {} bytes", out.len());
        }
    }
}

/// The data-object reader: the index, then every chunk's checksum. The bytes run as
/// given, and as the body and index entries of an object whose header, footer and index
/// checksum are right, so the fuzzer reaches the entries behind the magic and the CRC.
pub fn object_format(data: &[u8]) {
    read_object(data);
    let entries = data
        .first()
        .map_or(0, |n| usize::from(*n % 8))
        .min(data.len().saturating_sub(1) / 52);
    let (index_entries, body) = data.get(1..).unwrap_or_default().split_at(entries * 52);
    let mut object = weir_streamd::object::format::OBJECT_MAGIC.to_vec();
    object.push(weir_streamd::object::format::OBJECT_VERSION);
    object.extend_from_slice(body);
    let index_pos = object.len() as u64;
    let mut index = (entries as u32).to_be_bytes().to_vec();
    index.extend_from_slice(index_entries);
    object.extend_from_slice(&index);
    object.extend_from_slice(&index_pos.to_be_bytes());
    object.extend_from_slice(&(index.len() as u32).to_be_bytes());
    object.extend_from_slice(&crc32c::crc32c(&index).to_be_bytes());
    object.push(weir_streamd::object::format::OBJECT_VERSION);
    object.extend_from_slice(b"WEIRFTR\0");
    if entries == 0 {
        // A well-formed object with an empty index always reads.
        assert_eq!(
            weir_streamd::object::format::read_index(&object).map(|c| c.len()).ok(),
            Some(0)
        );
    }
    read_object(&object);
}

fn read_object(data: &[u8]) {
    if let Ok(chunks) = weir_streamd::object::format::read_index(data) {
        for chunk in chunks {
            let (pos, len) = (chunk.pos as usize, chunk.len as usize);
            if let Some(bytes) = pos.checked_add(len).and_then(|end| data.get(pos..end)) {
                let _ = weir_streamd::object::format::verify_chunk(&chunk, bytes);
            }
        }
    }
}

/// The WAL decoder as a takeover runs it: a segment, the tail's classification, and
/// replay past damage; every record it yields re-encodes to bytes that decode to it.
pub fn wal_segment(data: &[u8]) {
    use weir_streamd::wal::record;
    // With and without a valid segment header in front, so records are reached.
    let mut framed = record::segment_header().to_vec();
    framed.extend_from_slice(data);
    // And with every whole record's CRC made right, so the fuzzer reaches the bodies.
    let mut fixed = framed.clone();
    let mut at = record::SEGMENT_HEADER_LEN;
    while let Some(len) = fixed
        .get(at..at + 4)
        .map(|l| u32::from_be_bytes(l.try_into().expect("4")) as usize)
    {
        let Some(body) = fixed.get(at + 8..at + 8 + len) else {
            break;
        };
        let crc = crc32c::crc32c(body);
        fixed[at + 4..at + 8].copy_from_slice(&crc.to_be_bytes());
        at += 8 + len;
    }
    for segment in [data, &framed[..], &fixed[..]] {
        let Ok((mut records, end)) = record::decode_segment(segment) else {
            continue;
        };
        if let record::SegmentEnd::Invalid { at, reason } = end {
            let _ = record::classify_tail(segment, at);
            let (more, _damage) = record::decode_past_damage(segment, at, reason);
            records.extend(more);
        }
        for r in records {
            let mut again = record::segment_header().to_vec();
            again.extend_from_slice(&r.encode());
            let (back, end) = record::decode_segment(&again).expect("a valid header");
            assert_eq!(end, record::SegmentEnd::Clean);
            assert_eq!(back, vec![r]);
        }
    }
}

/// metad's codec: commands and proposals as they arrive in the log, and the view.
pub fn metad_codec(data: &[u8]) {
    use weir_meta::model::codec;
    let _ = codec::decode_compatible::<weir_meta::model::command::Proposal>(data);
    let _ = codec::decode_compatible::<weir_meta::model::command::Command>(data);
    let _ = codec::decode::<weir_meta::model::state::State>(data);
    // The same bytes behind a valid header, so the JSON decoder sees them.
    let mut framed = codec::encode(&());
    framed.truncate(2);
    framed.extend_from_slice(data);
    if let Ok(p) = codec::decode_compatible::<weir_meta::model::command::Proposal>(&framed) {
        let back: weir_meta::model::command::Proposal =
            codec::decode_compatible(&codec::encode(&p)).expect("what was decoded encodes and decodes again");
        assert_eq!(back, p);
    }
    let _ = codec::decode::<weir_meta::model::state::State>(&framed);
}

/// The SASL parsers: PLAIN tokens and the SaslHandshake / SaslAuthenticate bodies.
pub fn sasl(data: &[u8]) {
    if let Ok((user, pass)) = weir_gatewayd::kafka::sasl::parse_plain(data) {
        // Both come from the token, with two separators between them.
        assert!(user.len() + pass.len() + 2 <= data.len());
    }
    use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
    use kafka_protocol::protocol::Decodable;
    for version in 0..=2 {
        let _ = SaslAuthenticateRequest::decode(&mut Bytes::copy_from_slice(data), version);
        let _ = SaslHandshakeRequest::decode(&mut Bytes::copy_from_slice(data), version.min(1));
    }
}

/// The HTTP API's request bodies: append (then encoded to a batch in both formats),
/// stream creation, trim and token issue.
pub fn http_bodies(data: &[u8]) {
    use weir_gatewayd::api::{append::AppendBody, streams::CreateBody, tokens::IssueBody, trim::TrimBody};
    use weir_gatewayd::records::{encode_batch, Format};
    if let Ok(body) = serde_json::from_slice::<AppendBody>(data) {
        for format in [Format::Raw, Format::Base64] {
            if let Ok(batch) = encode_batch(body.records(), format, None) {
                let header = weir_shared::batch::parse_header(&batch).expect("an encoded batch parses");
                weir_shared::batch::check_record_count(&batch, &header, usize::MAX).expect("an encoded batch is whole");
            }
        }
    }
    let _ = serde_json::from_slice::<CreateBody>(data);
    let _ = serde_json::from_slice::<TrimBody>(data);
    let _ = serde_json::from_slice::<IssueBody>(data);
}
