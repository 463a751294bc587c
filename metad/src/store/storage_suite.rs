//! openraft's storage test suite run against the RocksDB log and state machine.

use super::{open_db, LogStore, StateMachineStore};
use crate::raft_types::{StorageError, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = open_db(dir.path()).expect("open rocksdb");
        let sm = StateMachineStore::open(db.clone(), &dir.path().join("snapshots")).expect("open state machine");
        Ok((dir, LogStore::new(db), sm))
    }
}

#[test]
fn openraft_storage_suite_passes_on_the_rocksdb_store() {
    Suite::test_all(RocksBuilder).expect("storage suite");
}
