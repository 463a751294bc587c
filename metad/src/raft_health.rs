//! A replica whose Raft core stopped on its own, because a storage write failed (a
//! disk filled past its marks by another process, an I/O error), can neither vote nor
//! apply. Left running it would answer every call with an error: half-alive. It exits
//! instead, saying why and naming its data directory's volume (issue 60). Its RocksDB
//! store is crash-consistent (every acknowledged write was synced), so a restart once
//! the cause is fixed recovers every entry it acknowledged.

use crate::raft_types::Raft;
use weir_shared::disk_space::DiskWatch;

/// Resolves with the Raft core's fatal error once it stops on its own.
pub async fn stopped_on_its_own(raft: &Raft) -> String {
    let mut metrics = raft.metrics();
    loop {
        if let Err(fatal) = &metrics.borrow_and_update().running_state {
            return fatal.to_string();
        }
        if metrics.changed().await.is_err() {
            return "the Raft core ended".into();
        }
    }
}

/// Why the replica exits: the Raft core's error and the metadata volume's free space.
pub fn failure(why: &str, disk: &DiskWatch) -> anyhow::Error {
    disk.check();
    let volumes: Vec<String> = disk
        .states()
        .iter()
        .map(|v| match &v.error {
            Some(e) => format!("the {} volume {} cannot be read: {e}", v.name, v.path.display()),
            None => format!(
                "the {} volume {} has {} of {} bytes free",
                v.name,
                v.path.display(),
                v.free_bytes,
                v.total_bytes
            ),
        })
        .collect();
    anyhow::anyhow!(
        "the metadata store failed and Raft stopped ({why}); {}. The store is intact: free space or fix the disk, then start the replica again",
        volumes.join("; ")
    )
}
