//! Reading metadata format 1, where each stream row carried its committed ranges and
//! object rows were part of the view. Kept only to migrate a store written before
//! design 0002: a format-1 row becomes a format-2 row and the index rows it held.

use super::codec::{CodecError, MAGIC};
use super::index::IndexChange;
use super::rows::{ObjectRange, ObjectRow, StreamRow};
use super::state::Row;
use super::Metadata;
use serde_json::Value;

/// The format this module reads.
pub const FORMAT: u8 = 1;

fn body(bytes: &[u8]) -> Result<Value, CodecError> {
    match bytes {
        [MAGIC, FORMAT, body @ ..] => Ok(serde_json::from_slice(body)?),
        [MAGIC, found, ..] => Err(CodecError::UnsupportedVersion { found: *found }),
        other => Err(CodecError::UnknownFormat(other.iter().take(2).copied().collect())),
    }
}

/// A format-1 stored row: the view row it is now (none for an object row) and the
/// index rows it held.
pub fn split_row(bytes: &[u8]) -> Result<(Option<Row>, Vec<IndexChange>), CodecError> {
    split_row_value(body(bytes)?)
}

fn split_row_value(mut row: Value) -> Result<(Option<Row>, Vec<IndexChange>), CodecError> {
    if let Some(object) = row.get_mut("object") {
        let object: ObjectRow = serde_json::from_value(object.take())?;
        return Ok((None, vec![IndexChange::PutObject(object)]));
    }
    if let Some(stream) = row.get_mut("stream") {
        let ranges: Vec<ObjectRange> = match stream.as_object_mut().and_then(|s| s.remove("objects")) {
            Some(ranges) => serde_json::from_value(ranges)?,
            None => Vec::new(),
        };
        let mut stream: StreamRow = serde_json::from_value(stream.take())?;
        stream.commits = ranges.len() as u64;
        stream.bytes = ranges.iter().map(|r| r.len).sum();
        let id = stream.id;
        let changes = ranges
            .into_iter()
            .map(|range| IndexChange::PutRange { stream: id, range })
            .collect();
        return Ok((Some(Row::Stream(stream)), changes));
    }
    Ok((Some(serde_json::from_value(row)?), Vec::new()))
}

/// A format-1 state document (a stored snapshot's `state`) as format-2 metadata.
pub fn metadata_from_state(mut state: Value) -> Result<Metadata, CodecError> {
    let mut meta = Metadata::default();
    let objects = state.as_object_mut().and_then(|s| s.remove("objects"));
    // The streams are read row by row below; the rest of the document as it is.
    let streams = state
        .as_object_mut()
        .and_then(|s| s.insert("streams".into(), Value::Object(Default::default())));
    for (_, object) in objects.and_then(|o| o.as_object().cloned()).unwrap_or_default() {
        let (_, changes) = split_row_value(serde_json::json!({ "object": object }))?;
        meta.index.apply(&changes);
    }
    let mut rows = Vec::new();
    for (_, stream) in streams.and_then(|s| s.as_object().cloned()).unwrap_or_default() {
        let (row, changes) = split_row_value(serde_json::json!({ "stream": stream }))?;
        meta.index.apply(&changes);
        rows.extend(row);
    }
    meta.state = serde_json::from_value(state)?;
    for row in rows {
        meta.state.set_row(&row.key(), Some(row));
    }
    Ok(meta)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::index::{page, IndexRead};
    use crate::model::state::State;
    use weir_shared::ids::{ObjectKey, Offset, StreamId};

    /// Format-1 rows of `meta`, as a format-1 store held them: ranges inside stream
    /// rows, object rows beside them.
    pub(crate) fn format1_rows(meta: &Metadata) -> Vec<Vec<u8>> {
        let encode = |v: &Value| {
            let mut out = vec![MAGIC, FORMAT];
            out.extend(serde_json::to_vec(v).unwrap());
            out
        };
        let mut out = Vec::new();
        for row in meta.state.rows() {
            let mut v = serde_json::to_value(&row).unwrap();
            if let Row::Stream(s) = &row {
                let ranges = meta.index.ranges_from(s.id, Offset(0), usize::MAX);
                let stream = v["stream"].as_object_mut().unwrap();
                stream.remove("commits");
                stream.remove("bytes");
                stream.insert("objects".into(), serde_json::to_value(ranges).unwrap());
            }
            out.push(encode(&v));
        }
        for object in meta.index.objects() {
            out.push(encode(&serde_json::json!({ "object": object })));
        }
        out
    }

    /// Migrates the rows a format-1 store held.
    pub(crate) fn migrate_rows(rows: &[Vec<u8>], applied_index: u64) -> Metadata {
        let mut meta = Metadata::default();
        for bytes in rows {
            let (row, changes) = split_row(bytes).expect("a format-1 row");
            meta.index.apply(&changes);
            if let Some(row) = row {
                meta.state.set_row(&row.key(), Some(row));
            }
        }
        meta.state.applied_index = applied_index;
        meta
    }

    fn sample() -> Metadata {
        let mut meta = Metadata::default();
        let mut state = State::default();
        state.counters.next_stream_id = 2;
        meta.state = state;
        let stream = StreamRow {
            id: StreamId(1),
            name: "s".into(),
            topic: None,
            partition: None,
            state: crate::model::StreamState::Open,
            owner: None,
            epoch: weir_shared::ids::StreamEpoch(1),
            transfer_target: None,
            transfer_target_epoch: None,
            transfer_op: None,
            start_offset: Offset(0),
            committed_end: Offset(5),
            commits: 2,
            bytes: 20,
            leader_epochs: vec![],
            config: Default::default(),
            damage: None,
        };
        meta.state
            .set_row(&crate::model::RowKey::Stream(StreamId(1)), Some(Row::Stream(stream)));
        let range = |key: &str, start, end| ObjectRange {
            key: ObjectKey(key.into()),
            start: Offset(start),
            end: Offset(end),
            pos: 0,
            len: 10,
            crc: 7,
            max_timestamp: crate::model::rows::NO_TIMESTAMP,
            txns: Default::default(),
        };
        meta.index.apply(&[
            IndexChange::PutRange {
                stream: StreamId(1),
                range: range("data/a", 0, 3),
            },
            IndexChange::PutRange {
                stream: StreamId(1),
                range: range("data/b", 3, 5),
            },
            IndexChange::PutObject(ObjectRow {
                key: ObjectKey("data/a".into()),
                size: 10,
                committed_index: 3,
                streams: vec![StreamId(1)],
            }),
            IndexChange::PutObject(ObjectRow {
                key: ObjectKey("data/b".into()),
                size: 10,
                committed_index: 4,
                streams: vec![StreamId(1)],
            }),
        ]);
        meta
    }

    /// A format-1 store's rows migrate to the same view and index, answering every read
    /// as before; a whole format-1 state document does too.
    #[test]
    fn format1_rows_and_states_migrate_to_the_same_metadata() {
        let meta = sample();
        let migrated = migrate_rows(&format1_rows(&meta), 0);
        assert_eq!(migrated, meta);
        let (pages, _) = page(&migrated.index, StreamId(1), Offset(4), false, 10);
        assert_eq!(pages.len(), 1);
        assert_eq!(pages[0].key, ObjectKey("data/b".into()));

        let mut doc = serde_json::to_value(&meta.state).unwrap();
        let stream = doc["streams"]["1"].as_object_mut().unwrap();
        stream.remove("commits");
        stream.remove("bytes");
        stream.insert(
            "objects".into(),
            serde_json::to_value(meta.index.ranges_from(StreamId(1), Offset(0), 10)).unwrap(),
        );
        let objects: serde_json::Map<String, Value> = meta
            .index
            .objects()
            .map(|o| (o.key.0.clone(), serde_json::to_value(o).unwrap()))
            .collect();
        doc["objects"] = Value::Object(objects);
        assert_eq!(metadata_from_state(doc).unwrap(), meta);
    }
}
