//! Migrates a store written in metadata format 1 to format 2 (design 0002): each stream
//! row's committed ranges and the object rows move from the view to the object index,
//! and the format-1 snapshot (one JSON document of the whole state) is dropped for a
//! format-2 snapshot file, which `StateMachineStore::open` writes. One synced batch: a
//! crash midway leaves format 1, and the migration runs again at the next open.

use super::db::{row_key_bytes, sync_write, CF_META, CF_SM, CF_SNAPSHOT, KEY_APPLIED, KEY_FORMAT, KEY_MEMBERSHIP};
use rocksdb::{IteratorMode, WriteBatch, DB};
use serde_json::Value;
use weir_meta::model::codec::{self, FORMAT_VERSION};
use weir_meta::model::{format1, IndexChange};

/// Keys of format 1's `snapshot` family: the current snapshot, and an install a crash
/// interrupted (the whole staged document, and its marker).
const KEY_CURRENT: &[u8] = b"current";
const KEY_STAGED: &[u8] = b"staged";
const KEY_INSTALL_MARKER: &[u8] = b"install_marker";

/// What a migration moved.
#[derive(Debug, Default)]
struct Moved {
    rows: u64,
    ranges: u64,
    objects: u64,
}

impl Moved {
    fn count(&mut self, changes: &[IndexChange]) {
        for c in changes {
            match c {
                IndexChange::PutRange { .. } => self.ranges += 1,
                IndexChange::PutObject(_) => self.objects += 1,
                _ => {}
            }
        }
    }
}

pub fn from_format1(db: &DB) -> anyhow::Result<()> {
    let cf = |name| db.cf_handle(name).expect("opened with this column family");
    let mut batch = WriteBatch::default();
    let mut moved = Moved::default();
    if db.get_cf(cf(CF_SNAPSHOT), KEY_INSTALL_MARKER)?.is_some() {
        // A format-1 install a crash interrupted: its staged state replaces the rows.
        let staged = db
            .get_cf(cf(CF_SNAPSHOT), KEY_STAGED)?
            .ok_or_else(|| anyhow::anyhow!("snapshot install marker without a staged snapshot"))?;
        let stored: Value = codec::decode_compatible(&staged)?;
        let data: Vec<u8> = serde_json::from_value(stored["data"].clone())?;
        let mut doc: Value = codec::decode_compatible(&data)?;
        let meta = format1::metadata_from_state(doc["state"].take())?;
        batch.delete_range_cf(cf(CF_SM), [0x00u8].as_slice(), [0xffu8; 9].as_slice());
        for row in meta.state.rows() {
            batch.put_cf(cf(CF_SM), row_key_bytes(&row.key()), codec::encode(&row));
            moved.rows += 1;
        }
        let changes: Vec<IndexChange> = meta
            .index
            .all_ranges()
            .map(|(stream, range)| IndexChange::PutRange {
                stream,
                range: range.clone(),
            })
            .chain(meta.index.objects().cloned().map(IndexChange::PutObject))
            .collect();
        moved.count(&changes);
        super::index::write(db, &mut batch, &changes);
        let last_applied: Option<crate::raft_types::LogId> = serde_json::from_value(doc["last_applied"].take())?;
        let membership: crate::raft_types::StoredMembership = serde_json::from_value(doc["membership"].take())?;
        batch.put_cf(cf(CF_META), KEY_APPLIED, codec::encode(&last_applied));
        batch.put_cf(cf(CF_META), KEY_MEMBERSHIP, codec::encode(&membership));
        tracing::warn!("finished an interrupted format-1 snapshot install while migrating");
    } else {
        for item in db.iterator_cf(cf(CF_SM), IteratorMode::Start) {
            let (key, value) = item?;
            let (row, changes) = format1::split_row(&value)?;
            moved.count(&changes);
            super::index::write(db, &mut batch, &changes);
            match row {
                Some(row) => {
                    batch.put_cf(cf(CF_SM), row_key_bytes(&row.key()), codec::encode(&row));
                    moved.rows += 1;
                }
                // Object rows left the view.
                None => batch.delete_cf(cf(CF_SM), key),
            }
        }
    }
    for key in [KEY_CURRENT, KEY_STAGED, KEY_INSTALL_MARKER] {
        batch.delete_cf(cf(CF_SNAPSHOT), key);
    }
    batch.put_cf(cf(CF_META), KEY_FORMAT, [FORMAT_VERSION]);
    db.write_opt(batch, &sync_write())?;
    tracing::info!(
        rows = moved.rows,
        ranges = moved.ranges,
        objects = moved.objects,
        "migrated the metadata store from format 1 to format {FORMAT_VERSION}: committed ranges moved from the view to the object index"
    );
    Ok(())
}
