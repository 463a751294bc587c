//! The Raft log and vote in RocksDB: entries keyed by big-endian index in `log`,
//! vote, committed id and purge point in `meta`. Every write but the committed id's is
//! synced before openraft is told it is durable (RR-WAL-3).

use super::db::{sync_write, CF_LOG, CF_META, KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE};
use crate::raft_types::{Entry, LogId, NodeId, StorageError, TypeConfig, Vote};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, RaftLogReader, StorageIOError};
use rocksdb::{Direction, IteratorMode, DB};
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use weir_meta::model::codec;

/// The Raft log store; cheap to clone (the log reader is a clone).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
}

fn io_err(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::new(subject, verb, openraft::AnyError::new(&e)).into()
}

impl LogStore {
    pub fn new(db: Arc<DB>) -> Self {
        Self { db }
    }

    fn cf_log(&self) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(CF_LOG).expect("opened with this column family")
    }

    fn cf_meta(&self) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(CF_META).expect("opened with this column family")
    }

    fn get_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        subject: ErrorSubject<NodeId>,
    ) -> Result<Option<T>, StorageError> {
        let bytes = self
            .db
            .get_cf(self.cf_meta(), key)
            .map_err(|e| io_err(subject.clone(), ErrorVerb::Read, e))?;
        bytes
            .map(|b| codec::decode_compatible(&b).map_err(|e| io_err(subject, ErrorVerb::Read, e)))
            .transpose()
    }

    fn put_meta<T: serde::Serialize>(
        &self,
        key: &[u8],
        value: &T,
        subject: ErrorSubject<NodeId>,
    ) -> Result<(), StorageError> {
        self.db
            .put_cf_opt(self.cf_meta(), key, codec::encode(value), &sync_write())
            .map_err(|e| io_err(subject, ErrorVerb::Write, e))
    }

    fn last_entry_id(&self) -> Result<Option<LogId>, StorageError> {
        let mut iter = self.db.iterator_cf(self.cf_log(), IteratorMode::End);
        match iter.next() {
            None => Ok(None),
            Some(item) => {
                let (_, value) = item.map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
                let entry: Entry =
                    codec::decode_compatible(&value).map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
                Ok(Some(entry.log_id))
            }
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => *i + 1,
            Bound::Unbounded => 0,
        };
        let mut entries = Vec::new();
        let iter = self.db.iterator_cf(
            self.cf_log(),
            IteratorMode::From(&start.to_be_bytes(), Direction::Forward),
        );
        for item in iter {
            let (key, value) = item.map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
            let index = u64::from_be_bytes(key.as_ref().try_into().map_err(|_| {
                io_err(
                    ErrorSubject::Logs,
                    ErrorVerb::Read,
                    std::io::Error::other("log key is not 8 bytes"),
                )
            })?);
            if !range.contains(&index) {
                break;
            }
            let entry: Entry =
                codec::decode_compatible(&value).map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
            entries.push(entry);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.get_meta(KEY_LAST_PURGED, ErrorSubject::Store)?;
        let last = self.last_entry_id()?.or(last_purged);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.put_meta(KEY_VOTE, vote, ErrorSubject::Vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(KEY_VOTE, ErrorSubject::Vote)
    }

    /// Not synced: openraft calls this on every commit advance, one by one, inside its
    /// core loop, so a synced write here doubled the fsyncs each proposal waits on. The
    /// committed id is a hint (the state machine syncs what it applied, RR-WAL-3), and
    /// RocksDB's write-ahead log keeps writes in order, so a committed id that survives a
    /// crash never runs ahead of the synced log entries before it.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.db
            .put_cf(self.cf_meta(), KEY_COMMITTED, codec::encode(&committed))
            .map_err(|e| io_err(ErrorSubject::Store, ErrorVerb::Write, e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self
            .get_meta::<Option<LogId>>(KEY_COMMITTED, ErrorSubject::Store)?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut batch = rocksdb::WriteBatch::default();
        for entry in entries {
            batch.put_cf(self.cf_log(), entry.log_id.index.to_be_bytes(), codec::encode(&entry));
        }
        // One synced batch per append call: durable before the callback fires.
        let result = self.db.write_opt(batch, &sync_write());
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(io_err(ErrorSubject::Logs, ErrorVerb::Write, e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let from = log_id.index.to_be_bytes();
        let to = u64::MAX.to_be_bytes();
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete_range_cf(self.cf_log(), from, to);
        batch.delete_cf(self.cf_log(), to);
        self.db
            .write_opt(batch, &sync_write())
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Record the purge point first, so a crash in between never leaves a gap unexplained.
        self.put_meta(KEY_LAST_PURGED, &log_id, ErrorSubject::Store)?;
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete_range_cf(self.cf_log(), 0u64.to_be_bytes(), (log_id.index + 1).to_be_bytes());
        self.db
            .write_opt(batch, &sync_write())
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }
}
