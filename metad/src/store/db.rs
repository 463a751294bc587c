//! The RocksDB database's layout (column families, keys) and how it is opened.

use rocksdb::{BlockBasedOptions, Cache, ColumnFamilyDescriptor, Options, WriteBufferManager, DB};
use std::path::Path;
use weir_meta::model::state::RowKey;

/// Column families; names are stored format and must be kept stable.
pub const CF_META: &str = "meta";
pub const CF_LOG: &str = "log";
pub const CF_SM: &str = "sm";
pub const CF_HISTORY: &str = "history";
pub const CF_SNAPSHOT: &str = "snapshot";
/// The object index (design 0002; format 2).
pub const CF_INDEX: &str = "index";

/// Keys in `meta`; stable.
pub const KEY_FORMAT: &[u8] = b"format";
pub const KEY_VOTE: &[u8] = b"vote";
pub const KEY_COMMITTED: &[u8] = b"committed";
pub const KEY_LAST_PURGED: &[u8] = b"last_purged";
pub const KEY_APPLIED: &[u8] = b"applied";
pub const KEY_MEMBERSHIP: &[u8] = b"membership";

/// The most write-ahead log a restart replays.
const MAX_TOTAL_WAL_BYTES: u64 = 16 << 20;
/// One block cache for every column family; memtables are charged to it too.
const BLOCK_CACHE_BYTES: usize = 64 << 20;
/// All memtables together, before RocksDB flushes the largest.
const MEMTABLE_BYTES: usize = 32 << 20;
/// Finished write-ahead log files kept to be written over by the next ones.
const WAL_FILES_RECYCLED: usize = 4;

/// Opens (creating if needed) the RocksDB database under `dir`, with every column
/// family; its format is checked by the caller ([`super::open::open_db`]).
pub fn open_rocks(dir: &Path) -> anyhow::Result<DB> {
    weir_shared::durable_dir::create_dir_all(dir)?;
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // One WAL serves every column family, and a file is kept until every family has
    // flushed past it: the quiet ones (meta, sm) would keep the busy log's writes alive
    // and make a restart replay all of them. Past this size RocksDB flushes the
    // families holding the oldest file, which bounds the replay (design 0002).
    opts.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES);
    // Every acknowledged write waits on a WAL fdatasync (RR-WAL-3). Into a recycled
    // file, whose blocks exist already, that sync changes no inode, so it is one device
    // flush instead of a journal commit as well: 1,224 → 2,049 stream creations a second
    // in `weir dev` (issue 57). RocksDB keeps point-in-time recovery with it.
    opts.set_recycle_log_file_num(WAL_FILES_RECYCLED);
    // Memory stays bounded as the index grows: without this each family has its own
    // cache and memtables, and every table file's index and filter blocks stay in
    // memory outside any cache (metad's RSS grew with the index in the soak).
    let cache = Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    opts.set_write_buffer_manager(&WriteBufferManager::new_write_buffer_manager_with_cache(
        MEMTABLE_BYTES,
        false,
        cache.clone(),
    ));
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(&cache);
    table.set_cache_index_and_filter_blocks(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    let cf_opts = || {
        let mut o = Options::default();
        o.set_block_based_table_factory(&table);
        o
    };
    let cfs = [CF_META, CF_LOG, CF_SM, CF_HISTORY, CF_SNAPSHOT, CF_INDEX]
        .into_iter()
        .map(|name| ColumnFamilyDescriptor::new(name, cf_opts()));
    let db = DB::open_cf_descriptors(&opts, dir, cfs)
        .map_err(|e| anyhow::anyhow!("cannot open metadata store at {}: {e}", dir.display()))?;
    Ok(db)
}

/// Readies the store for its close: syncs the write-ahead log, writes every family's
/// memtables to table files (so the next start replays no log), then drops queued
/// compactions and waits for running workers, so the close that follows ends once no
/// worker is left. A full or failing disk shows here with RocksDB's own message
/// (OBS-17, SD-TD-6); the workers are stopped all the same.
pub fn prepare_close(db: &DB) -> Result<(), rocksdb::Error> {
    let flushed = flush(db);
    db.cancel_all_background_work(true);
    flushed
}

fn flush(db: &DB) -> Result<(), rocksdb::Error> {
    db.flush_wal(true)?;
    let families: Vec<_> = [CF_META, CF_LOG, CF_SM, CF_HISTORY, CF_SNAPSHOT, CF_INDEX]
        .into_iter()
        .filter_map(|name| db.cf_handle(name))
        .collect();
    db.flush_cfs_opt(&families.iter().collect::<Vec<_>>(), &rocksdb::FlushOptions::default())
}

/// A synced write: acknowledged only once data and filesystem metadata are durable (RR-WAL-3).
pub fn sync_write() -> rocksdb::WriteOptions {
    let mut wo = rocksdb::WriteOptions::default();
    wo.set_sync(true);
    wo
}

/// Stable storage key of a view row: a kind byte (must be kept stable) then the key.
/// 0x13 held format 1's object rows; it is never reused.
pub fn row_key_bytes(key: &RowKey) -> Vec<u8> {
    let mut out = Vec::new();
    match key {
        RowKey::Settings => out.push(0x01),
        RowKey::Counters => out.push(0x02),
        RowKey::Node(id) => {
            out.push(0x10);
            out.extend_from_slice(id.as_str().as_bytes());
        }
        RowKey::Stream(id) => {
            out.push(0x11);
            out.extend_from_slice(&id.0.to_be_bytes());
        }
        RowKey::Topic(name) => {
            out.push(0x12);
            out.extend_from_slice(name.as_bytes());
        }
        RowKey::Lease(name) => {
            out.push(0x14);
            out.extend_from_slice(name.as_bytes());
        }
        RowKey::Takeover(node, epoch) => {
            out.push(0x15);
            out.extend_from_slice(&epoch.0.to_be_bytes());
            out.extend_from_slice(node.as_str().as_bytes());
        }
        RowKey::Token(name) => {
            out.push(0x16);
            out.extend_from_slice(name.as_bytes());
        }
        RowKey::Acl(b) => {
            // The binding's JSON: its fields in a fixed order, so equal bindings have
            // equal keys.
            out.push(0x17);
            out.extend_from_slice(&serde_json::to_vec(b).expect("an ACL binding serializes"));
        }
        RowKey::Quota(entity) => {
            out.push(0x18);
            out.extend_from_slice(&serde_json::to_vec(entity).expect("a quota entity serializes"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::open_db;

    /// Bytes in the database's live write-ahead log files, what the next open replays:
    /// those numbered at or above `db`'s oldest log still needed (the files below it
    /// are kept only to be written over, WAL_FILES_RECYCLED).
    fn wal_bytes(db: &DB, dir: &Path) -> u64 {
        let keep = db
            .property_int_value("rocksdb.min-log-number-to-keep")
            .expect("property")
            .expect("a number");
        std::fs::read_dir(dir)
            .expect("data dir")
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let number: u64 = name.strip_suffix(".log")?.parse().ok()?;
                (number >= keep).then(|| e.metadata().map(|m| m.len()).unwrap_or(0))
            })
            .sum()
    }

    // SD-TD-6: the close writes the memtables of every family out and stops the
    // workers, so the next open replays no log; without it the entries stay in the log.
    #[test]
    fn sd_td_6_a_prepared_close_leaves_no_log_to_replay() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = open_db(dir.path()).expect("open");
        for (cf, key) in [(CF_LOG, b"entry".as_slice()), (CF_SM, b"row".as_slice())] {
            let handle = db.cf_handle(cf).expect("family");
            db.put_cf_opt(handle, key, b"value", &sync_write()).expect("write");
        }
        assert!(wal_bytes(&db, dir.path()) > 0, "the writes are in the log first");
        prepare_close(&db).expect("close");
        // SD-TD-6: the close wrote the journal's entries out, so nothing is left to replay...
        assert_eq!(wal_bytes(&db, dir.path()), 0, "nothing left to replay");
        drop(db);
        let db = open_db(dir.path()).expect("reopen");
        let handle = db.cf_handle(CF_SM).expect("family");
        // SD-TD-6: ...and what was written is still there after the reopen.
        assert_eq!(db.get_cf(handle, b"row").expect("read").as_deref(), Some(&b"value"[..]));
    }
}
