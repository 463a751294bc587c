//! The state machine's snapshots as files: the current one's record, building one,
//! opening it for a follower, and finishing an install (RR-INT-6). Apart from applying
//! entries: only building, sending and installing a snapshot touch these files.

use super::StateMachineStore;
use crate::raft_types::SnapshotMeta;
use crate::store::db::{sync_write, CF_SNAPSHOT};
use crate::store::snapshot_file;
use rocksdb::DB;
use serde::{Deserialize, Serialize};
use std::path::Path;
use weir_meta::model::codec;

/// Keys in `snapshot`; stable. (`staged`, a whole format-1 snapshot, is no longer written.)
const KEY_CURRENT: &[u8] = b"current";
pub(super) const KEY_INSTALL_MARKER: &[u8] = b"install_marker";

/// The file a snapshot being received is written to, in the snapshot directory.
pub(super) const INCOMING: &str = "incoming.snap";

/// The current snapshot, or one being installed: its metadata and its file's name in
/// the snapshot directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct SnapshotRecord {
    pub(super) meta: SnapshotMeta,
    pub(super) file: String,
}

impl StateMachineStore {
    pub(super) fn current_record(&self) -> anyhow::Result<Option<SnapshotRecord>> {
        let cf = self.db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
        Ok(self
            .db
            .get_cf(cf, KEY_CURRENT)?
            .map(|b| codec::decode(&b))
            .transpose()?)
    }

    /// Writes a snapshot of the store as it stands, makes it the current one and drops
    /// older files; the new file is returned open, so a build that another replaces at
    /// once still has the file it built.
    pub(super) fn write_snapshot(&self) -> anyhow::Result<(SnapshotRecord, std::fs::File)> {
        let building = self
            .snapshots
            .join(format!("building-{:08x}.tmp", rand::random::<u32>()));
        let header = snapshot_file::write(&self.db, &building)?;
        let snapshot_id = match header.last_applied {
            Some(l) => format!("{}-{}-{:08x}", l.leader_id.term, l.index, rand::random::<u32>()),
            None => format!("0-0-{:08x}", rand::random::<u32>()),
        };
        let path = snapshot_file::path_of(&self.snapshots, &snapshot_id);
        std::fs::rename(&building, &path)?;
        snapshot_file::sync_dir(&self.snapshots)?;
        let record = SnapshotRecord {
            meta: SnapshotMeta {
                last_log_id: header.last_applied,
                last_membership: header.membership,
                snapshot_id,
            },
            file: file_name(&path),
        };
        let cf = self.db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
        self.db
            .put_cf_opt(cf, KEY_CURRENT, codec::encode(&record), &sync_write())?;
        let file = std::fs::File::open(&path)?;
        remove_other_snapshots(&self.snapshots, &record.file);
        let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        tracing::info!(snapshot_id = %record.meta.snapshot_id, bytes, "built metadata snapshot");
        Ok((record, file))
    }

    /// The current snapshot, opened. A build running in the background may make a new
    /// snapshot current and delete this one's file between reading the record and
    /// opening it; the record then names the newer file, which is opened instead.
    pub(super) fn open_current(&self) -> anyhow::Result<Option<(SnapshotRecord, std::fs::File)>> {
        open_current_of(&self.snapshots, || self.current_record())
    }
}

pub(super) fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Opens the file of the snapshot `current` names, reading the record again when a
/// newer snapshot replaced the file in between (a background build). Gives up after a
/// few replacements in a row, which a build taking seconds makes impossible in practice.
fn open_current_of(
    snapshots: &Path,
    mut current: impl FnMut() -> anyhow::Result<Option<SnapshotRecord>>,
) -> anyhow::Result<Option<(SnapshotRecord, std::fs::File)>> {
    let mut attempts = 0;
    loop {
        let Some(record) = current()? else { return Ok(None) };
        match std::fs::File::open(snapshots.join(&record.file)) {
            Ok(file) => return Ok(Some((record, file))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempts < 3 => attempts += 1,
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "snapshot {} ({}): {e}",
                    record.meta.snapshot_id,
                    record.file
                ))
            }
        }
    }
}

/// Deletes snapshot files other than `keep` and the one being received.
fn remove_other_snapshots(dir: &Path, keep: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != keep && name != INCOMING && (name.ends_with(".snap") || name.ends_with(".tmp")) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Replaces the store with the staged snapshot `record` names, clearing the install
/// marker and making it current in the last (synced) batch.
pub(super) fn finish_install(db: &DB, snapshots: &Path, record: &SnapshotRecord) -> anyhow::Result<()> {
    let path = snapshots.join(&record.file);
    let cf = db.cf_handle(CF_SNAPSHOT).expect("opened with this column family");
    snapshot_file::install(db, &path, |batch| {
        batch.put_cf(cf, KEY_CURRENT, codec::encode(record));
        batch.delete_cf(cf, KEY_INSTALL_MARKER);
    })?;
    remove_other_snapshots(snapshots, &record.file);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(file: &str) -> SnapshotRecord {
        SnapshotRecord {
            meta: SnapshotMeta {
                last_log_id: None,
                last_membership: Default::default(),
                snapshot_id: file.into(),
            },
            file: file.into(),
        }
    }

    // A snapshot a background build replaced between reading its record and opening
    // its file is served from the newer file. It used to be a storage error, which
    // stops Raft (a CI run's leader lost its metadata log this way).
    #[test]
    fn a_snapshot_replaced_while_it_is_opened_is_read_from_the_newer_file() {
        use std::io::Read;
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("new.snap"), b"new").expect("write");
        let mut reads = vec![record("new.snap"), record("old.snap")];
        let (got, mut file) = open_current_of(dir.path(), || Ok(reads.pop()))
            .expect("opened")
            .expect("a snapshot");
        assert_eq!(got.file, "new.snap");
        let mut text = String::new();
        file.read_to_string(&mut text).expect("read");
        assert_eq!(text, "new");
        // A file missing for good is still an error, naming it.
        let err = open_current_of(dir.path(), || Ok(Some(record("gone.snap")))).unwrap_err();
        assert!(err.to_string().contains("gone.snap"), "{err}");
        assert!(open_current_of(dir.path(), || Ok(None)).expect("no snapshot").is_none());
    }
}
