//! Issue 19: every decoder a peer or a disk can feed, 10,000 cases each, through the same
//! drivers the cargo-fuzz targets in `fuzz/` run (`weir_tests::fuzz`). Inputs are
//! arbitrary bytes and valid inputs with bytes changed, cut or appended, so the cases
//! reach past the first length check.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, RequestHeader};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::Compression;
use proptest::prelude::*;
use weir_shared::ids::{StreamEpoch, StreamId};
use weir_tests::fuzz;

const CASES: u32 = 10_000;

/// Valid input `seeds[i]` with `edits` applied (overwrite, then cut at `cut`, then append `tail`).
fn mutate(seeds: &[Vec<u8>], i: usize, edits: &[(usize, u8)], cut: usize, tail: &[u8]) -> Vec<u8> {
    let mut v = seeds[i % seeds.len()].clone();
    if !v.is_empty() {
        for (at, b) in edits {
            let n = v.len();
            v[at % n] = *b;
        }
    }
    if cut < v.len() {
        v.truncate(cut);
    }
    v.extend_from_slice(tail);
    v
}

/// Arbitrary bytes, or a seed mutated.
fn inputs(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let max = seeds.iter().map(Vec::len).max().unwrap_or(0) + 64;
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        (
            any::<usize>(),
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
            0..max,
            proptest::collection::vec(any::<u8>(), 0..16),
        )
            .prop_map(move |(i, edits, cut, tail)| mutate(&seeds, i, &edits, cut, &tail)),
    ]
}

fn batch(values: &[&[u8]], compression: Compression) -> Vec<u8> {
    weir_tests::batches::encoded(values, compression).to_vec()
}

const CODECS: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];

fn batch_seeds() -> Vec<Vec<u8>> {
    CODECS
        .iter()
        .map(|c| batch(&[b"one", b"two", &[9u8; 300]], *c))
        .collect()
}

fn frame_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for version in [0i16, 3] {
        let header = RequestHeader::default()
            .with_request_api_key(ApiKey::ApiVersions as i16)
            .with_request_api_version(version)
            .with_correlation_id(1)
            .with_client_id(Some(StrBytes::from_static_str("fuzz")));
        let mut b = BytesMut::new();
        header.encode(&mut b, if version >= 3 { 2 } else { 1 }).expect("header");
        ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("weir"))
            .with_client_software_version(StrBytes::from_static_str("1"))
            .encode(&mut b, version)
            .expect("body");
        seeds.push(b.to_vec());
    }
    seeds
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn kafka_frames(data in inputs(frame_seeds())) {
        fuzz::kafka_frame(&data);
    }

    #[test]
    fn record_batches(data in inputs(batch_seeds())) {
        fuzz::record_batches(&data);
    }

    #[test]
    fn compressed_payloads(data in inputs(batch_seeds().into_iter().map(|b| b[61..].to_vec()).collect())) {
        fuzz::compressed(&data);
    }

    #[test]
    fn data_objects(data in inputs({
        let mut o = weir_streamd::object::format::ObjectBuilder::new();
        o.add(StreamId(1), StreamEpoch(1), 0, 3, &[Bytes::from(batch(&[b"a", b"b", b"c"], Compression::None))]);
        o.add(StreamId(2), StreamEpoch(4), 10, 11, &[Bytes::from(batch(&[b"d"], Compression::Zstd))]);
        vec![Bytes::from(o.finish().0).to_vec()]
    })) {
        fuzz::object_format(&data);
    }

    #[test]
    fn wal_segments(data in inputs({
        let record = |stream, base| weir_streamd::wal::record::WalRecord {
            stream: StreamId(stream),
            stream_epoch: StreamEpoch(1),
            base_offset: base,
            offset_count: 2,
            batches: Bytes::from(batch(&[b"x", b"y"], Compression::None)),
        };
        let mut two = record(1, 0).encode().to_vec();
        two.extend_from_slice(&record(2, 5).encode());
        vec![two]
    })) {
        fuzz::wal_segment(&data);
    }

    #[test]
    fn metad_codec(data in inputs(vec![
        br#"{"proposer":"Operator","command":{"CreateStream":{"name":"s"}}}"#.to_vec(),
        br#"{"proposer":{"Node":"n-1"},"command":"Noop"}"#.to_vec(),
    ])) {
        fuzz::metad_codec(&data);
    }

    #[test]
    fn sasl(data in inputs(vec![b"\0app\0weir_secret".to_vec(), b"authz\0user\0pass".to_vec()])) {
        fuzz::sasl(&data);
    }

    #[test]
    fn http_bodies(data in inputs(vec![
        br#"{"records":[{"body":"aGk=","headers":[["a","b"],["n",null]],"key":"k","timestamp":1}],"match_seq_num":3}"#.to_vec(),
        br#"{"stream":"s","config":{"retention_ms":1000}}"#.to_vec(),
        br#"{"seq_num":5}"#.to_vec(),
        br#"{"name":"t","scopes":["admin"]}"#.to_vec(),
    ])) {
        fuzz::http_bodies(&data);
    }
}

type Driver = fn(&[u8]);

/// Every input a fuzz target ever crashed on, kept under `tests/fuzz-regressions/<target>/`
/// (copied from `fuzz/artifacts/`), runs through its driver again.
#[test]
fn fuzz_regressions() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz-regressions");
    let drivers: [(&str, Driver); 8] = [
        ("kafka_frame", fuzz::kafka_frame),
        ("record_batches", fuzz::record_batches),
        ("compressed", fuzz::compressed),
        ("object_format", fuzz::object_format),
        ("wal_segment", fuzz::wal_segment),
        ("metad_codec", fuzz::metad_codec),
        ("sasl", fuzz::sasl),
        ("http_bodies", fuzz::http_bodies),
    ];
    let mut ran = 0;
    for (target, driver) in drivers {
        let Ok(entries) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            driver(&std::fs::read(&path).expect("a regression input"));
            ran += 1;
        }
    }
    assert!(ran >= 1, "no regression inputs under {}", root.display());
}
