//! The `file` WAL backend: segment files in `<root>/<node>/<epoch>/`, on a volume every
//! streamd and the takeover agent can reach. A takeover renames the directory; the
//! writer checks after each fsync that its directory is still the one it created, and
//! acknowledges only then, so nothing written after a takeover is ever acknowledged.
//!
//! Segments are zero-filled to their full size before they are written (issue 17), by a
//! background thread that prepares the next one while the current one fills. A write
//! into blocks that already exist changes no file metadata, so its fdatasync is one
//! device flush instead of a journal commit as well (several times the sync rate on
//! ext4). The zeroed, never-written tail is a clean end of the last segment on replay;
//! a segment that is finished is cut to the end of its records first, so only the last
//! segment may end in zeros.
//!
//! Both the zeros and the records are written with direct I/O where the file system
//! allows it ([`super::direct`]), so neither is copied through the page cache.

use super::direct::{self, AlignedBuf, DirectAppender, BLOCK};
use super::record::{
    classify_tail, decode_past_damage, decode_segment, segment_header, Framed, SegmentEnd, Tail, SEGMENT_HEADER_LEN,
};
use super::{Replay, SegmentId, WalDamage, WalError};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use weir_shared::durable_dir::sync_dir;
use weir_shared::ids::{Epoch, NodeId};

fn io(e: std::io::Error) -> WalError {
    WalError::Io(e.to_string())
}

/// Whether `e` says the volume (or the user's quota on it) is full.
fn is_no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// A failed write: [`WalError::NoSpace`] for a full volume, whose write the writer
/// retries; any other failure's outcome is unknown.
fn write_failed(e: std::io::Error) -> WalError {
    if is_no_space(&e) {
        WalError::NoSpace(e.to_string())
    } else {
        io(e)
    }
}

/// The directory of one incarnation's WAL.
pub fn incarnation_dir(root: &Path, node: &NodeId, epoch: Epoch) -> PathBuf {
    root.join(node.as_str()).join(format!("{:020}", epoch.0))
}

fn segment_path(dir: &Path, id: SegmentId) -> PathBuf {
    dir.join(format!("{id:020}.wal"))
}

/// Where the next segment is prepared; renamed to its segment name when it is needed.
/// Replay reads only `.wal` files, so a prepared segment is never mistaken for one.
const PREPARED: &str = "next-segment.prepared";

/// A segment ready to be written: preallocated, and whether it was opened for direct I/O.
struct Prepared {
    file: File,
    direct: bool,
}

/// Creates the next segment at [`PREPARED`]: the header, then zeros up to `size`,
/// synced. Replaces a leftover from before. With `direct`, the zeros are written with
/// direct I/O, unless the file system does not do it.
fn prepare_segment(dir: &Path, size: u64, direct: bool) -> std::io::Result<Prepared> {
    let path = dir.join(PREPARED);
    let mut options = OpenOptions::new();
    options.create(true).write(true).truncate(true);
    if direct {
        if let Some(file) = direct::open(&options, &path)? {
            match zero_fill_direct(&file, size) {
                Ok(()) => {
                    file.sync_all()?;
                    return Ok(Prepared { file, direct: true });
                }
                // Opened, but its writes are refused (a file system that accepts the flag only).
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(e),
            }
        }
        tracing::info!(dir = %dir.display(), "the WAL's file system does not do direct I/O; writing segments through the page cache");
    }
    let mut file = options.open(&path)?;
    file.write_all(&segment_header())?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = size.saturating_sub(SEGMENT_HEADER_LEN as u64);
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    Ok(Prepared { file, direct: false })
}

/// Writes the header and zeros up to `size`, rounded up to whole blocks, with direct I/O.
fn zero_fill_direct(file: &File, size: u64) -> std::io::Result<()> {
    let size = size.max(SEGMENT_HEADER_LEN as u64).div_ceil(BLOCK as u64) * BLOCK as u64;
    let mut zeros = AlignedBuf::zeroed((1 << 20).min(size as usize));
    zeros.as_mut()[..SEGMENT_HEADER_LEN].copy_from_slice(&segment_header());
    let mut at = 0;
    while at < size {
        let n = (size - at).min(zeros.as_ref().len() as u64) as usize;
        file.write_all_at(&zeros.as_ref()[..n], at)?;
        if at == 0 {
            zeros.as_mut()[..SEGMENT_HEADER_LEN].fill(0);
        }
        at += n as u64;
    }
    Ok(())
}

/// An empty directory made ahead in a node's WAL directory, while there is room, that
/// the next incarnation's directory is renamed from (issue 60): a rename takes no free
/// block where a new directory takes one, so a node restarted on a full volume still
/// gets its WAL, serves reads and refuses appends until space returns.
const SPARE_DIR: &str = "spare";

/// Creates `dir`, which must not exist (an incarnation writes one WAL): from the spare
/// directory when there is one, else anew.
fn make_incarnation_dir(dir: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(dir) {
        Ok(_) => return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "it exists")),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    let spare = dir.with_file_name(SPARE_DIR);
    // Only an empty spare is used: anything in it would be replayed as this WAL.
    let empty = fs::read_dir(&spare).is_ok_and(|mut entries| entries.next().is_none());
    if empty && fs::rename(&spare, dir).is_ok() {
        return Ok(());
    }
    fs::create_dir(dir)
}

/// Makes the next incarnation's spare directory. Best effort: without room for it,
/// the next start creates its directory anew.
fn make_spare_dir(parent: &Path) {
    let spare = parent.join(SPARE_DIR);
    match fs::create_dir(&spare).and_then(|()| sync_dir(parent)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            tracing::warn!(dir = %spare.display(), error = %e, "cannot make the next incarnation's spare WAL directory")
        }
    }
}

/// An open segment file.
struct Active {
    id: SegmentId,
    file: File,
    len: u64,
    /// Set when the file was opened for direct I/O: its writes go through this.
    direct: Option<DirectAppender>,
}

struct Inner {
    dir: PathBuf,
    /// (device, inode) of the directory as created; a rename or replacement changes what the path names.
    identity: (u64, u64),
    active: Option<Active>,
    next_id: SegmentId,
    segment_bytes: u64,
    /// Whether segments are written with direct I/O: asked for, and until the file
    /// system refuses it.
    direct: bool,
    /// The next segment being zero-filled in the background, if started.
    preparing: Option<JoinHandle<std::io::Result<Prepared>>>,
    /// Where a buffered write frames its group, kept from one write to the next.
    framed: Vec<u8>,
}

/// The writer side of a file WAL. Its calls block on the disk: the WAL writer runs it on
/// a thread of its own.
pub struct FileSink {
    inner: Inner,
}

impl FileSink {
    /// Creates the WAL directory of a new incarnation. It must not exist: an incarnation
    /// writes one WAL, and its predecessor's is recovered by takeover.
    pub fn create(root: &Path, node: &NodeId, epoch: Epoch, segment_bytes: u64) -> Result<Self, WalError> {
        Self::create_with(root, node, epoch, segment_bytes, true)
    }

    /// As [`FileSink::create`]; `direct` false writes through the page cache.
    fn create_with(
        root: &Path,
        node: &NodeId,
        epoch: Epoch,
        segment_bytes: u64,
        direct: bool,
    ) -> Result<Self, WalError> {
        let dir = incarnation_dir(root, node, epoch);
        let parent = dir.parent().expect("incarnation dir has a parent");
        // The root and the node's directory are synced into their parents too: a crash
        // right after the first registration must not lose the tree (issue 20).
        weir_shared::durable_dir::create_dir_all(parent).map_err(io)?;
        make_incarnation_dir(&dir)
            .map_err(|e| WalError::Io(format!("cannot create WAL directory {}: {e}", dir.display())))?;
        sync_dir(&dir).map_err(io)?;
        sync_dir(parent).map_err(io)?;
        make_spare_dir(parent);
        let meta = fs::metadata(&dir).map_err(io)?;
        let mut inner = Inner {
            dir,
            identity: (meta.dev(), meta.ino()),
            active: None,
            next_id: 1,
            segment_bytes,
            direct,
            preparing: None,
            framed: Vec::new(),
        };
        // The first segment is ready by the first append, most likely.
        inner.start_preparing();
        Ok(Self { inner })
    }

    pub fn active_segment(&self) -> Option<SegmentId> {
        self.inner.active.as_ref().map(|a| a.id)
    }

    /// Writes and syncs `group` (whole encoded records); the segment holding it, and its length.
    pub fn persist(&mut self, group: &(impl Framed + ?Sized)) -> Result<(SegmentId, u64), WalError> {
        self.inner.persist(group)
    }

    /// Cuts the active segment to its records and deletes the prepared one, so a WAL
    /// that stopped holds only what was written. A WAL taken over is left to its agent.
    pub fn close(&mut self) {
        // OBS-17: cutting and syncing the active segment failed (a full or failing
        // disk): an error, though what was acknowledged was synced before.
        if let Err(e) = self.inner.close() {
            tracing::error!(error = %e, "closing the write-ahead log failed");
        }
    }

    pub fn delete(&mut self, segment: SegmentId) -> Result<(), WalError> {
        match fs::remove_file(segment_path(&self.inner.dir, segment)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(e)),
        }
    }
}

impl Inner {
    fn still_ours(&self) -> bool {
        fs::metadata(&self.dir).is_ok_and(|m| (m.dev(), m.ino()) == self.identity)
    }

    fn persist(&mut self, group: &(impl Framed + ?Sized)) -> Result<(SegmentId, u64), WalError> {
        if self.active.as_ref().is_none_or(|a| a.len >= self.segment_bytes) {
            self.roll()?;
        }
        let active = self.active.as_mut().expect("rolled above");
        // Positioned: the file is longer than what is written (its zeroed tail). A write
        // that failed part way leaves bytes past `len`, which the retry overwrites and
        // a replay reads as a torn tail.
        match &mut active.direct {
            Some(direct) => direct.write_at(&active.file, active.len, group),
            None => {
                self.framed.clear();
                group.frame_into(&mut self.framed);
                let written = active.file.write_all_at(&self.framed, active.len);
                if self.framed.capacity() > direct::KEEP_BYTES {
                    self.framed = Vec::new();
                }
                written
            }
        }
        .map_err(write_failed)?;
        active.file.sync_data().map_err(io)?;
        let len = group.framed_len() as u64;
        active.len += len;
        let (at, filled) = ((active.id, len), active.len);
        // The next segment is prepared once this one is half full: ready in time, and a
        // node that writes little keeps one preallocated segment, not two.
        if self.preparing.is_none() && filled >= self.segment_bytes / 2 {
            self.start_preparing();
        }
        // Durable, but acknowledge only if no takeover renamed the directory meanwhile.
        if !self.still_ours() {
            return Err(WalError::Fenced);
        }
        Ok(at)
    }

    fn close(&mut self) -> std::io::Result<()> {
        if let Some(handle) = self.preparing.take() {
            let _ = handle.join();
        }
        if !self.still_ours() {
            return Ok(());
        }
        if let Some(active) = &self.active {
            // Past `len` lie only zeros, or a write whose sync failed (never acknowledged).
            active.file.set_len(active.len)?;
            active.file.sync_all()?;
        }
        match fs::remove_file(self.dir.join(PREPARED)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Starts zero-filling the next segment on its own thread.
    fn start_preparing(&mut self) {
        let (dir, size, direct) = (self.dir.clone(), self.segment_bytes, self.direct);
        let spawned = std::thread::Builder::new()
            .name("wal-prepare".into())
            .spawn(move || prepare_segment(&dir, size, direct));
        match spawned {
            Ok(handle) => self.preparing = Some(handle),
            // The next roll prepares it inline instead.
            Err(e) => tracing::warn!(error = %e, "cannot start preparing the next WAL segment"),
        }
    }

    /// The prepared next segment: waits for the one being prepared, or prepares it now.
    fn take_prepared(&mut self) -> std::io::Result<Prepared> {
        let prepared = match self.preparing.take().map(|h| h.join()) {
            Some(Ok(Ok(prepared))) => prepared,
            Some(Ok(Err(e))) => {
                tracing::warn!(error = %e, "preparing the next WAL segment failed; trying again");
                prepare_segment(&self.dir, self.segment_bytes, self.direct)?
            }
            Some(Err(_)) | None => prepare_segment(&self.dir, self.segment_bytes, self.direct)?,
        };
        self.direct = prepared.direct;
        Ok(prepared)
    }

    fn roll(&mut self) -> Result<(), WalError> {
        if !self.still_ours() {
            return Err(WalError::Fenced);
        }
        let fenced_or = |this: &Self, e: std::io::Error| if this.still_ours() { io(e) } else { WalError::Fenced };
        let prepared = match self.take_prepared() {
            Ok(prepared) => prepared,
            // Issue 60: no room for the next segment. What was prepared of it is given
            // back, and the roll is tried again with the same write.
            Err(e) if is_no_space(&e) && self.still_ours() => {
                let _ = fs::remove_file(self.dir.join(PREPARED));
                return Err(WalError::NoSpace(e.to_string()));
            }
            Err(e) => return Err(fenced_or(self, e)),
        };
        // A finished segment ends where its records end, so only the last segment of a
        // WAL can end in zeros; synced before the next segment exists.
        if let Some(done) = &self.active {
            done.file.set_len(done.len).map_err(io)?;
            done.file.sync_all().map_err(io)?;
        }
        let id = self.next_id;
        let path = segment_path(&self.dir, id);
        fs::rename(self.dir.join(PREPARED), &path).map_err(|e| fenced_or(self, e))?;
        sync_dir(&self.dir).map_err(io)?;
        self.next_id += 1;
        self.active = Some(Active {
            id,
            file: prepared.file,
            len: SEGMENT_HEADER_LEN as u64,
            direct: prepared.direct.then(|| DirectAppender::new(&segment_header())),
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

/// Deletes the taken-over WAL of `(node, epoch)` once its records are committed and the
/// takeover is complete in the log: nothing reads it again, and each dead incarnation
/// would otherwise keep its segments (a preallocated one is its full size) for ever.
pub fn remove_taken(root: &Path, node: &NodeId, epoch: Epoch) -> std::io::Result<usize> {
    let dir = incarnation_dir(root, node, epoch);
    let Some(parent) = dir.parent() else { return Ok(0) };
    let prefix = format!(
        "{}.taken-by-",
        dir.file_name().and_then(|n| n.to_str()).unwrap_or_default()
    );
    let mut removed = 0;
    for entry in fs::read_dir(parent)?.flatten() {
        if entry.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
            fs::remove_dir_all(entry.path())?;
            removed += 1;
        }
    }
    if removed > 0 {
        sync_dir(parent)?;
    }
    Ok(removed)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::record::{WalRecord, RECORD_OVERHEAD};
    use bytes::Bytes;
    use weir_shared::ids::{StreamEpoch, StreamId};

    fn record(i: u64, size: usize) -> WalRecord {
        WalRecord {
            stream: StreamId(7),
            stream_epoch: StreamEpoch(1),
            base_offset: i,
            offset_count: 1,
            batches: Bytes::from(vec![i as u8; size]),
        }
    }

    fn segments(dir: &Path) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = fs::read_dir(dir)
            .expect("dir")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "wal"))
            .collect();
        out.sort();
        out
    }

    // Issue 60: each incarnation leaves an empty spare directory that the next one's WAL
    // directory is renamed from (no free block needed), and makes the next spare; an
    // incarnation's directory that exists already is refused, spare or not.
    #[test]
    fn the_next_incarnation_takes_the_spare_directory() {
        let root = tempfile::tempdir().expect("tmp");
        let node = NodeId::new("n");
        let mut first = FileSink::create(root.path(), &node, Epoch(1), 64 << 10).expect("create");
        first.close();
        let spare = root.path().join("n").join(SPARE_DIR);
        let spare_inode = fs::metadata(&spare).expect("a spare after the first start").ino();
        let _second = FileSink::create(root.path(), &node, Epoch(2), 64 << 10).expect("create");
        let second = incarnation_dir(root.path(), &node, Epoch(2));
        assert_eq!(
            fs::metadata(&second).expect("dir").ino(),
            spare_inode,
            "renamed from the spare"
        );
        assert!(fs::metadata(&spare).expect("the next spare").ino() != spare_inode);
        assert!(
            FileSink::create(root.path(), &node, Epoch(2), 64 << 10).is_err(),
            "epoch 2 exists"
        );
        // A spare with something in it is not used: it would be replayed as the WAL.
        fs::write(spare.join("stray"), b"x").expect("stray file");
        let _third = FileSink::create(root.path(), &node, Epoch(3), 64 << 10).expect("create");
        assert!(!incarnation_dir(root.path(), &node, Epoch(3)).join("stray").exists());
        assert!(spare.join("stray").exists());
    }

    // Issue 17: a segment is zero-filled to its full size before it is written, and its
    // never-written tail is a clean end on replay: no damage, nothing invented.
    #[test]
    fn a_segment_is_preallocated_and_its_zeroed_tail_ends_the_log() {
        let root = tempfile::tempdir().expect("tmp");
        let node = NodeId::new("n");
        let mut sink = FileSink::create(root.path(), &node, Epoch(1), 1 << 20).expect("create");
        for i in 0..3 {
            sink.persist(&record(i, 100).encode()[..]).expect("persist");
        }
        let dir = incarnation_dir(root.path(), &node, Epoch(1));
        let files = segments(&dir);
        assert_eq!(files.len(), 1);
        assert_eq!(fs::metadata(&files[0]).expect("segment").len(), 1 << 20, "preallocated");
        let replay = replay_dir(&dir).expect("replay");
        assert!(replay.damage.is_empty(), "{:?}", replay.damage);
        assert_eq!(replay.records, (0..3).map(|i| record(i, 100)).collect::<Vec<_>>());
    }

    // Issue 17: a WAL whose writer stopped gives its preallocated space back (a clean
    // stop's incarnation is never taken over, so nothing else would), and keeps every
    // record.
    #[test]
    fn a_closed_wal_holds_only_its_records() {
        let root = tempfile::tempdir().expect("tmp");
        let node = NodeId::new("n");
        let mut sink = FileSink::create(root.path(), &node, Epoch(1), 64 << 10).expect("create");
        // Past half the segment, so the next one is being prepared.
        for i in 0..300 {
            sink.persist(&record(i, 100).encode()[..]).expect("persist");
        }
        assert!(sink.inner.preparing.is_some());
        sink.close();
        let dir = incarnation_dir(root.path(), &node, Epoch(1));
        let files = segments(&dir);
        assert_eq!(files.len(), 1);
        let written = SEGMENT_HEADER_LEN + (0..300).map(|i| record(i, 100).encode().len()).sum::<usize>();
        assert_eq!(fs::metadata(&files[0]).expect("segment").len(), written as u64);
        assert!(!dir.join(PREPARED).exists(), "the prepared segment is deleted");
        let replay = replay_dir(&dir).expect("replay");
        assert_eq!(replay.records.len(), 300);
    }

    // Issue 17: segments are written with direct I/O, block by block, rewriting the
    // block each write ended in, and hold byte for byte what writes through the page
    // cache make of the same groups: records that end mid-block, on a block's end, span
    // many blocks, and roll over into new segments.
    #[test]
    fn direct_segments_hold_what_buffered_writes_make() {
        let node = NodeId::new("n");
        let (direct_root, buffered_root) = (tempfile::tempdir().expect("tmp"), tempfile::tempdir().expect("tmp"));
        let mut direct = FileSink::create(direct_root.path(), &node, Epoch(1), 64 << 10).expect("create");
        let mut buffered =
            FileSink::create_with(buffered_root.path(), &node, Epoch(1), 64 << 10, false).expect("create");
        // The first record ends its group exactly on the first block's end.
        let first = BLOCK - SEGMENT_HEADER_LEN - RECORD_OVERHEAD;
        let sizes = [first, 1, 100, 4000, 4096, 20_000, 3, 9000, 70_000, 5, 12_000];
        let records: Vec<WalRecord> = (0..60).map(|i| record(i, sizes[i as usize % sizes.len()])).collect();
        for (i, r) in records.iter().enumerate() {
            let mut group = r.encode().to_vec();
            if i % 7 == 3 {
                // Some groups hold two records.
                group.extend_from_slice(&record(1000 + i as u64, 10).encode());
            }
            let at = direct.persist(&group[..]).expect("direct persist");
            assert_eq!(at, buffered.persist(&group[..]).expect("buffered persist"));
            let active = direct.inner.active.as_ref().expect("active");
            assert!(
                direct::is_direct(&active.file),
                "segment {} is written with direct I/O",
                active.id
            );
        }
        // Closed, the last segments end at their records too.
        direct.close();
        buffered.close();
        let (direct_dir, buffered_dir) = (
            incarnation_dir(direct_root.path(), &node, Epoch(1)),
            incarnation_dir(buffered_root.path(), &node, Epoch(1)),
        );
        let (direct_files, buffered_files) = (segments(&direct_dir), segments(&buffered_dir));
        assert!(direct_files.len() > 3, "{direct_files:?}");
        assert_eq!(direct_files.len(), buffered_files.len());
        for (d, b) in direct_files.iter().zip(&buffered_files) {
            let (d_data, b_data) = (fs::read(d).expect("direct"), fs::read(b).expect("buffered"));
            assert_eq!(d_data.len(), b_data.len(), "{}", d.display());
            assert!(d_data == b_data, "{} differs from the buffered segment", d.display());
        }
        let replay = replay_dir(&direct_dir).expect("replay");
        assert!(replay.damage.is_empty(), "{:?}", replay.damage);
        assert_eq!(replay.records.len(), 60 + (0..60).filter(|i| i % 7 == 3).count());
    }

    // Issue 17, issue 20: a finished segment is cut to the end of its records before the
    // next one is named, so only the last segment can end in zeros (anywhere else a
    // zeroed tail is damage), and a WAL of many segments replays whole.
    #[test]
    fn finished_segments_end_at_their_records_and_replay_whole() {
        let root = tempfile::tempdir().expect("tmp");
        let node = NodeId::new("n");
        let mut sink = FileSink::create(root.path(), &node, Epoch(1), 4096).expect("create");
        for i in 0..20 {
            sink.persist(&record(i, 1000).encode()[..]).expect("persist");
        }
        let dir = incarnation_dir(root.path(), &node, Epoch(1));
        let files = segments(&dir);
        assert!(files.len() > 3, "{files:?}");
        for f in &files[..files.len() - 1] {
            let data = fs::read(f).expect("segment");
            let (_, end) = decode_segment(&data).expect("decodes");
            assert_eq!(end, SegmentEnd::Clean, "{} ends in zeros", f.display());
        }
        let replay = replay_dir(&dir).expect("replay");
        assert!(replay.damage.is_empty(), "{:?}", replay.damage);
        assert_eq!(replay.records, (0..20).map(|i| record(i, 1000)).collect::<Vec<_>>());
    }
}
