//! The `file` WAL backend: segment files in `<root>/<node>/<epoch>/`, on a volume every
//! streamd and the takeover agent can reach. A takeover renames the directory; the
//! writer checks after each fsync that its directory is still the one it created, and
//! acknowledges only then, so nothing written after a takeover is ever acknowledged.

use super::record::{
    classify_tail, decode_past_damage, decode_segment, segment_header, SegmentEnd, Tail, SEGMENT_HEADER_LEN,
};
use super::{Replay, SegmentId, WalDamage, WalError};
use bytes::Bytes;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use weir_shared::durable_dir::sync_dir;
use weir_shared::ids::{Epoch, NodeId};

fn io(e: std::io::Error) -> WalError {
    WalError::Io(e.to_string())
}

/// The directory of one incarnation's WAL.
pub fn incarnation_dir(root: &Path, node: &NodeId, epoch: Epoch) -> PathBuf {
    root.join(node.as_str()).join(format!("{:020}", epoch.0))
}

fn segment_path(dir: &Path, id: SegmentId) -> PathBuf {
    dir.join(format!("{id:020}.wal"))
}

/// An open segment file.
struct Active {
    id: SegmentId,
    file: File,
    len: u64,
}

struct Inner {
    dir: PathBuf,
    /// (device, inode) of the directory as created; a rename or replacement changes what the path names.
    identity: (u64, u64),
    active: Option<Active>,
    next_id: SegmentId,
    segment_bytes: u64,
}

/// The writer side of a file WAL.
pub struct FileSink {
    inner: Arc<Mutex<Inner>>,
}

impl FileSink {
    /// Creates the WAL directory of a new incarnation. It must not exist: an incarnation
    /// writes one WAL, and its predecessor's is recovered by takeover.
    pub fn create(root: &Path, node: &NodeId, epoch: Epoch, segment_bytes: u64) -> Result<Self, WalError> {
        let dir = incarnation_dir(root, node, epoch);
        let parent = dir.parent().expect("incarnation dir has a parent");
        // The root and the node's directory are synced into their parents too: a crash
        // right after the first registration must not lose the tree (issue 20).
        weir_shared::durable_dir::create_dir_all(parent).map_err(io)?;
        fs::create_dir(&dir)
            .map_err(|e| WalError::Io(format!("cannot create WAL directory {}: {e}", dir.display())))?;
        sync_dir(&dir).map_err(io)?;
        sync_dir(parent).map_err(io)?;
        let meta = fs::metadata(&dir).map_err(io)?;
        Ok(Self {
            inner: Arc::new(Mutex::new(Inner {
                dir,
                identity: (meta.dev(), meta.ino()),
                active: None,
                next_id: 1,
                segment_bytes,
            })),
        })
    }

    pub fn active_segment(&self) -> Option<SegmentId> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .active
            .as_ref()
            .map(|a| a.id)
    }

    pub async fn persist(&mut self, group: Bytes) -> Result<(SegmentId, u64), WalError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || inner.lock().unwrap_or_else(|p| p.into_inner()).persist(&group))
            .await
            .map_err(|e| WalError::Io(e.to_string()))?
    }

    pub async fn delete(&mut self, segment: SegmentId) -> Result<(), WalError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let inner = inner.lock().unwrap_or_else(|p| p.into_inner());
            match fs::remove_file(segment_path(&inner.dir, segment)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io(e)),
            }
        })
        .await
        .map_err(|e| WalError::Io(e.to_string()))?
    }
}

impl Inner {
    fn still_ours(&self) -> bool {
        fs::metadata(&self.dir).is_ok_and(|m| (m.dev(), m.ino()) == self.identity)
    }

    fn persist(&mut self, group: &[u8]) -> Result<(SegmentId, u64), WalError> {
        if self.active.as_ref().is_none_or(|a| a.len >= self.segment_bytes) {
            self.roll()?;
        }
        let active = self.active.as_mut().expect("rolled above");
        active.file.write_all(group).map_err(io)?;
        active.file.sync_data().map_err(io)?;
        active.len += group.len() as u64;
        let at = (active.id, group.len() as u64);
        // Durable, but acknowledge only if no takeover renamed the directory meanwhile.
        if !self.still_ours() {
            return Err(WalError::Fenced);
        }
        Ok(at)
    }

    fn roll(&mut self) -> Result<(), WalError> {
        if !self.still_ours() {
            return Err(WalError::Fenced);
        }
        let id = self.next_id;
        let path = segment_path(&self.dir, id);
        let mut file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(|e| if self.still_ours() { io(e) } else { WalError::Fenced })?;
        file.write_all(&segment_header()).map_err(io)?;
        file.sync_all().map_err(io)?;
        sync_dir(&self.dir).map_err(io)?;
        self.next_id += 1;
        self.active = Some(Active {
            id,
            file,
            len: SEGMENT_HEADER_LEN as u64,
        });
        Ok(())
    }
}

/// Takes over the WAL of `(node, epoch)` as `agent`: renames its directory (fencing the
/// writer, INV-7), then replays it. A torn tail of the last segment is cut; any other
/// damage is reported as corruption and nothing is cut. Idempotent: a second takeover reads the
/// already-renamed directory.
pub fn take_over(root: &Path, node: &NodeId, epoch: Epoch, agent: &str) -> Result<Replay, WalError> {
    let dir = incarnation_dir(root, node, epoch);
    let taken = dir.with_extension(format!("taken-by-{agent}"));
    match fs::rename(&dir, &taken) {
        Ok(()) => {
            if let Some(parent) = dir.parent() {
                sync_dir(parent).map_err(io)?;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !taken.exists() {
                // Another agent took it, or the incarnation never wrote: look for any taken copy.
                let parent = dir.parent().expect("incarnation dir has a parent");
                let prefix = format!(
                    "{}.taken-by-",
                    dir.file_name().and_then(|n| n.to_str()).unwrap_or_default()
                );
                let other = fs::read_dir(parent)
                    .ok()
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
                    .find(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(&prefix))
                    });
                return match other {
                    Some(path) => replay_dir(&path),
                    None => Ok(Replay::default()),
                };
            }
        }
        Err(e) => return Err(io(e)),
    }
    replay_dir(&taken)
}

/// Replays every segment of a WAL directory in order. A torn tail of the last segment
/// is cut; any other damage is reported with the records after it, and nothing is cut.
pub fn replay_dir(dir: &Path) -> Result<Replay, WalError> {
    let mut segments: Vec<(SegmentId, PathBuf)> = fs::read_dir(dir)
        .map_err(io)?
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let id = path.file_stem()?.to_str()?.parse().ok()?;
            (path.extension()? == "wal").then_some((id, path))
        })
        .collect();
    segments.sort();
    let mut replay = Replay::default();
    let last = segments.len().saturating_sub(1);
    for (i, (id, path)) in segments.iter().enumerate() {
        let data = fs::read(path).map_err(io)?;
        if data.len() < SEGMENT_HEADER_LEN && i == last {
            // A segment whose creation was cut short holds no record.
            continue;
        }
        let (mut recs, end) =
            decode_segment(&data).map_err(|e| WalError::Corrupt(format!("{}: {e}", path.display())))?;
        replay.records.append(&mut recs);
        let SegmentEnd::Invalid { at, reason } = end else {
            continue;
        };
        let tail = if i == last {
            classify_tail(&data, at)
        } else {
            Tail::Corrupt { next: None }
        };
        match tail {
            Tail::Zeroed | Tail::Torn => {
                if tail == Tail::Zeroed {
                    tracing::info!(
                        segment = id,
                        at,
                        "the last WAL segment ends in space never written; cutting it"
                    )
                } else {
                    tracing::warn!(segment = id, at, %reason, "cutting the torn tail of the last WAL segment")
                }
                OpenOptions::new()
                    .write(true)
                    .open(path)
                    .and_then(|f| f.set_len(at as u64).and_then(|_| f.sync_all()))
                    .map_err(io)?;
            }
            Tail::Corrupt { .. } => {
                let (mut after, damage) = decode_past_damage(&data, at, reason);
                for d in damage {
                    let d = WalDamage {
                        place: format!("WAL segment {}", path.display()),
                        damage: d,
                    };
                    tracing::error!(damage = %d, "damaged WAL segment: not a torn write, so nothing is cut; the records after it are replayed");
                    replay.damage.push(d);
                }
                replay.records.append(&mut after);
            }
        }
    }
    Ok(replay)
}
