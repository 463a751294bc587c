//! Opens the metadata store: the database, then its format marker, checked before
//! anything is read (RR-WAL-6): a new store is marked with this build's format, a
//! format-1 store is migrated, and any other format is refused.

use super::db::{open_rocks, CF_META, KEY_FORMAT};
use rocksdb::DB;
use std::path::Path;
use std::sync::Arc;
use weir_meta::model::codec::FORMAT_VERSION;

/// Opens (creating if needed) the metadata store under `dir`, migrating one written
/// in format 1 and refusing any other format.
pub fn open_db(dir: &Path) -> anyhow::Result<Arc<DB>> {
    let db = open_rocks(dir)?;
    let meta = db.cf_handle(CF_META).expect("created above");
    match db.get_cf(meta, KEY_FORMAT)? {
        None => {
            let mut wo = rocksdb::WriteOptions::default();
            wo.set_sync(true);
            db.put_cf_opt(meta, KEY_FORMAT, [FORMAT_VERSION], &wo)?;
        }
        Some(v) if v.as_slice() == [FORMAT_VERSION] => {}
        Some(v) if v.as_slice() == [weir_meta::model::format1::FORMAT] => {
            super::migrate::from_format1(&db)
                .map_err(|e| anyhow::anyhow!("cannot migrate the metadata store at {} from format 1: {e:#}", dir.display()))?;
        }
        Some(v) => anyhow::bail!(
            "metadata store at {} has format {:?}, this build reads format {FORMAT_VERSION}; recreate the data directory or run a matching version",
            dir.display(),
            v
        ),
    }
    Ok(Arc::new(db))
}
