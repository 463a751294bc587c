//! The object index in RocksDB (design 0002): column family `index`, one row per
//! committed range keyed by (stream, start offset) and one per committed object. Read by
//! apply (through `IndexRead`) and by the index API; written only by apply, in the same
//! batch as the view's rows.

use super::db::CF_INDEX;
use rocksdb::{Direction, IteratorMode, WriteBatch, DB};
use weir_meta::model::codec;
use weir_meta::model::rows::{ObjectRange, ObjectRow};
use weir_meta::model::{IndexChange, IndexRead};
use weir_shared::ids::{ObjectKey, Offset, StreamId};

/// Key prefixes in `index`; stored format, must be kept stable.
const RANGE: u8 = 0x01;
const OBJECT: u8 = 0x02;
/// `0x03 ‖ releasing log index (u64 BE) ‖ object key`, empty value: the objects GC
/// deletes, in release order (issue 57).
const RELEASED: u8 = 0x03;

fn released_key(index: u64, key: &ObjectKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + key.0.len());
    out.push(RELEASED);
    out.extend_from_slice(&index.to_be_bytes());
    out.extend_from_slice(key.0.as_bytes());
    out
}

pub fn range_key(stream: StreamId, start: Offset) -> Vec<u8> {
    let mut key = Vec::with_capacity(17);
    key.push(RANGE);
    key.extend_from_slice(&stream.0.to_be_bytes());
    key.extend_from_slice(&start.0.to_be_bytes());
    key
}

fn stream_prefix(stream: StreamId) -> [u8; 9] {
    let mut prefix = [0u8; 9];
    prefix[0] = RANGE;
    prefix[1..].copy_from_slice(&stream.0.to_be_bytes());
    prefix
}

pub fn object_key(key: &ObjectKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + key.0.len());
    out.push(OBJECT);
    out.extend_from_slice(key.0.as_bytes());
    out
}

/// Adds `changes` to `batch`.
pub fn write(db: &DB, batch: &mut WriteBatch, changes: &[IndexChange]) {
    let cf = db.cf_handle(CF_INDEX).expect("opened with this column family");
    for change in changes {
        match change {
            IndexChange::PutRange { stream, range } => {
                batch.put_cf(cf, range_key(*stream, range.start), codec::encode(range))
            }
            IndexChange::DeleteRange { stream, start } => batch.delete_cf(cf, range_key(*stream, *start)),
            IndexChange::PutObject(row) => batch.put_cf(cf, object_key(&row.key), codec::encode(row)),
            IndexChange::DeleteObject(key) => batch.delete_cf(cf, object_key(key)),
            IndexChange::Released { index, key } => batch.put_cf(cf, released_key(*index, key), []),
            IndexChange::ForgetReleased { through } => {
                let mut end = vec![RELEASED];
                end.extend_from_slice(&through.saturating_add(1).to_be_bytes());
                batch.delete_range_cf(cf, vec![RELEASED], end);
            }
        }
    }
}

/// How many ranges and objects the index holds (an estimate from RocksDB's key count
/// is not enough for tests; this counts, so it is for operators and benchmarks).
pub fn counts(db: &DB) -> (u64, u64) {
    let cf = db.cf_handle(CF_INDEX).expect("opened with this column family");
    let (mut ranges, mut objects) = (0, 0);
    for (key, _) in db.iterator_cf(cf, IteratorMode::Start).flatten() {
        match key.first() {
            Some(&RANGE) => ranges += 1,
            Some(&OBJECT) => objects += 1,
            _ => {}
        }
    }
    (ranges, objects)
}

/// About how many rows the index holds (RocksDB's estimate: no scan).
pub fn estimated_rows(db: &DB) -> u64 {
    let cf = db.cf_handle(CF_INDEX).expect("opened with this column family");
    db.property_int_value_cf(cf, "rocksdb.estimate-num-keys")
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// Up to `limit` released objects after log index `after`, in release order; whether
/// more follow.
pub fn released(db: &DB, after: u64, limit: usize) -> (Vec<(u64, ObjectKey)>, bool) {
    let cf = db.cf_handle(CF_INDEX).expect("opened with this column family");
    let mut from = vec![RELEASED];
    from.extend_from_slice(&after.saturating_add(1).to_be_bytes());
    let mut out: Vec<(u64, ObjectKey)> = db
        .iterator_cf(cf, IteratorMode::From(&from, Direction::Forward))
        .flatten()
        .take_while(|(k, _)| k.first() == Some(&RELEASED))
        .take(limit + 1)
        .filter_map(|(k, _)| {
            let index = u64::from_be_bytes(k.get(1..9)?.try_into().ok()?);
            let key = String::from_utf8(k.get(9..)?.to_vec()).ok()?;
            Some((index, ObjectKey(key)))
        })
        .collect();
    let more = out.len() > limit;
    out.truncate(limit);
    (out, more)
}

/// Up to `limit` committed objects after skipping `skip`, in key order.
pub fn objects(db: &DB, skip: usize, limit: usize) -> Vec<ObjectRow> {
    let cf = db.cf_handle(CF_INDEX).expect("opened with this column family");
    db.iterator_cf(cf, IteratorMode::From(&[OBJECT], Direction::Forward))
        .flatten()
        .take_while(|(k, _)| k.first() == Some(&OBJECT))
        .skip(skip)
        .take(limit)
        .filter_map(|(_, v)| codec::decode(&v).ok())
        .collect()
}

/// The index as stored; reads see every batch written so far.
pub struct StoreIndex<'a> {
    db: &'a DB,
}

impl<'a> StoreIndex<'a> {
    pub fn new(db: &'a DB) -> Self {
        Self { db }
    }

    fn decode_range(&self, value: &[u8]) -> Option<ObjectRange> {
        match codec::decode(value) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::error!(error = %e, "undecodable object index row skipped");
                None
            }
        }
    }
}

impl IndexRead for StoreIndex<'_> {
    fn object(&self, key: &ObjectKey) -> Option<ObjectRow> {
        let cf = self.db.cf_handle(CF_INDEX).expect("opened with this column family");
        let value = self.db.get_cf(cf, object_key(key)).ok()??;
        codec::decode(&value).ok()
    }

    fn ranges_from(&self, stream: StreamId, from: Offset, limit: usize) -> Vec<ObjectRange> {
        let cf = self.db.cf_handle(CF_INDEX).expect("opened with this column family");
        let prefix = stream_prefix(stream);
        let start = range_key(stream, from);
        self.db
            .iterator_cf(cf, IteratorMode::From(&start, Direction::Forward))
            .flatten()
            .take_while(|(k, _)| k.starts_with(&prefix))
            .take(limit)
            .filter_map(|(_, v)| self.decode_range(&v))
            .collect()
    }

    fn ranges_before(&self, stream: StreamId, before: Offset, limit: usize) -> Vec<ObjectRange> {
        let cf = self.db.cf_handle(CF_INDEX).expect("opened with this column family");
        let prefix = stream_prefix(stream);
        let bound = range_key(stream, before);
        self.db
            .iterator_cf(cf, IteratorMode::From(&bound, Direction::Reverse))
            .flatten()
            // A reverse seek lands on `bound` itself when it exists: ranges start before it.
            .skip_while(|(k, _)| k.as_ref() >= bound.as_slice())
            .take_while(|(k, _)| k.starts_with(&prefix))
            .take(limit)
            .filter_map(|(_, v)| self.decode_range(&v))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_meta::model::index::page;
    use weir_meta::model::MemIndex;

    fn range(key: &str, start: u64, end: u64) -> ObjectRange {
        ObjectRange {
            key: ObjectKey(key.into()),
            start: Offset(start),
            end: Offset(end),
            pos: start,
            len: end - start,
            crc: 1,
            max_timestamp: weir_meta::model::NO_TIMESTAMP,
            txns: Default::default(),
        }
    }

    /// The stored index answers every read as the reference in-memory index does,
    /// across streams whose ids and offsets sort next to each other.
    #[test]
    fn the_stored_index_reads_as_the_reference_index() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = super::super::open_db(dir.path()).expect("open");
        let mut changes = Vec::new();
        for stream in [1u64, 2, 256] {
            let mut at = 0;
            for (i, len) in [3u64, 1, 5, 2].into_iter().enumerate() {
                changes.push(IndexChange::PutRange {
                    stream: StreamId(stream),
                    range: range(&format!("data/{stream}-{i}"), at, at + len),
                });
                at += len;
            }
        }
        changes.push(IndexChange::PutObject(ObjectRow {
            key: ObjectKey("data/1-0".into()),
            size: 3,
            committed_index: 1,
            streams: vec![StreamId(1)],
        }));
        let mut batch = WriteBatch::default();
        write(&db, &mut batch, &changes);
        db.write(batch).expect("write");
        let mut reference = MemIndex::default();
        reference.apply(&changes);
        let stored = StoreIndex::new(&db);
        for stream in [0u64, 1, 2, 3, 256] {
            for offset in 0..13 {
                for reverse in [false, true] {
                    for limit in [1, 2, 10] {
                        assert_eq!(
                            page(&stored, StreamId(stream), Offset(offset), reverse, limit),
                            page(&reference, StreamId(stream), Offset(offset), reverse, limit),
                            "stream {stream} offset {offset} reverse {reverse} limit {limit}"
                        );
                    }
                }
            }
        }
        assert_eq!(
            stored.object(&ObjectKey("data/1-0".into())),
            reference.object(&ObjectKey("data/1-0".into()))
        );
        assert_eq!(stored.object(&ObjectKey("data/none".into())), None);
        assert_eq!(counts(&db), (12, 1));
    }
}
