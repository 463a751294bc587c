//! Raft snapshots as files (design 0002): a point-in-time copy of the view's rows and the
//! object index, written from a RocksDB snapshot in bounded frames, so neither building,
//! sending (openraft sends files in chunks) nor installing one holds the whole state in
//! one buffer or one message.
//!
//! Format (stored, must be kept stable): `WEIRSNAP`, a version byte, then frames of
//! `kind (u8) | length (u32 BE) | payload`: one `META` (the versioned JSON of
//! [`Header`]), any number of `VIEW_ROWS` and `INDEX_ROWS` (each a run of
//! `key length (u32 BE) | key | value length (u32 BE) | value`, at most [`FRAME_BYTES`]),
//! and one `END` carrying the number of rows (u64 BE).

use super::db::{sync_write, CF_INDEX, CF_META, CF_SM, KEY_APPLIED, KEY_MEMBERSHIP};
use crate::raft_types::{LogId, StoredMembership};
use rocksdb::{IteratorMode, WriteBatch, DB};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use weir_meta::model::codec;

const MAGIC: &[u8; 8] = b"WEIRSNAP";
const VERSION: u8 = 2;
const META: u8 = 0x01;
const VIEW_ROWS: u8 = 0x02;
const INDEX_ROWS: u8 = 0x03;
const END: u8 = 0xff;

/// Most payload bytes in one frame, and in one write batch when installing.
pub const FRAME_BYTES: usize = 1 << 20;

/// What a snapshot covers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Header {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
}

fn invalid(why: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.into())
}

/// Writes frames of one kind, flushing each at [`FRAME_BYTES`].
struct FrameWriter<'w, W: Write> {
    out: &'w mut W,
    kind: u8,
    buf: Vec<u8>,
    rows: u64,
}

impl<'w, W: Write> FrameWriter<'w, W> {
    fn new(out: &'w mut W, kind: u8) -> Self {
        Self {
            out,
            kind,
            buf: Vec::new(),
            rows: 0,
        }
    }

    fn row(&mut self, key: &[u8], value: &[u8]) -> std::io::Result<()> {
        if !self.buf.is_empty() && self.buf.len() + key.len() + value.len() + 8 > FRAME_BYTES {
            self.flush()?;
        }
        self.buf.extend_from_slice(&(key.len() as u32).to_be_bytes());
        self.buf.extend_from_slice(key);
        self.buf.extend_from_slice(&(value.len() as u32).to_be_bytes());
        self.buf.extend_from_slice(value);
        self.rows += 1;
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            frame(self.out, self.kind, &self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    fn finish(mut self) -> std::io::Result<u64> {
        self.flush()?;
        Ok(self.rows)
    }
}

fn frame(out: &mut impl Write, kind: u8, payload: &[u8]) -> std::io::Result<()> {
    out.write_all(&[kind])?;
    out.write_all(&(payload.len() as u32).to_be_bytes())?;
    out.write_all(payload)
}

/// Writes a snapshot of `db` as it stands to `path` (synced); what it covers.
pub fn write(db: &DB, path: &Path) -> anyhow::Result<Header> {
    let snap = db.snapshot();
    let cf = |name| db.cf_handle(name).expect("opened with this column family");
    let header = Header {
        last_applied: snap
            .get_cf(cf(CF_META), KEY_APPLIED)?
            .map(|b| codec::decode_compatible(&b))
            .transpose()?
            .flatten(),
        membership: snap
            .get_cf(cf(CF_META), KEY_MEMBERSHIP)?
            .map(|b| codec::decode_compatible(&b))
            .transpose()?
            .unwrap_or_default(),
    };
    let mut out = BufWriter::new(File::create(path)?);
    out.write_all(MAGIC)?;
    out.write_all(&[VERSION])?;
    frame(&mut out, META, &codec::encode(&header))?;
    let mut rows = 0;
    for (kind, name) in [(VIEW_ROWS, CF_SM), (INDEX_ROWS, CF_INDEX)] {
        let mut frames = FrameWriter::new(&mut out, kind);
        for item in snap.iterator_cf(cf(name), IteratorMode::Start) {
            let (key, value) = item?;
            frames.row(&key, &value)?;
        }
        rows += frames.finish()?;
    }
    frame(&mut out, END, &rows.to_be_bytes())?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(header)
}

/// Reads a snapshot file frame by frame.
struct Reader {
    input: BufReader<File>,
}

impl Reader {
    fn open(path: &Path) -> std::io::Result<Self> {
        let mut input = BufReader::new(File::open(path)?);
        let mut magic = [0u8; 9];
        input.read_exact(&mut magic)?;
        if &magic[..8] != MAGIC {
            return Err(invalid(format!("{} is not a Weir metadata snapshot", path.display())));
        }
        if magic[8] != VERSION {
            return Err(invalid(format!(
                "metadata snapshot {} has format {}, this build reads format {VERSION}",
                path.display(),
                magic[8]
            )));
        }
        Ok(Self { input })
    }

    fn next(&mut self) -> std::io::Result<(u8, Vec<u8>)> {
        let mut head = [0u8; 5];
        self.input.read_exact(&mut head)?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > FRAME_BYTES * 2 {
            return Err(invalid(format!("snapshot frame of {len} bytes is over the limit")));
        }
        let mut payload = vec![0u8; len];
        self.input.read_exact(&mut payload)?;
        Ok((head[0], payload))
    }
}

/// The rows of a `VIEW_ROWS` or `INDEX_ROWS` payload.
fn rows(payload: &[u8]) -> std::io::Result<Vec<(&[u8], &[u8])>> {
    let mut out = Vec::new();
    let mut rest = payload;
    let take = |rest: &mut &[u8]| -> std::io::Result<usize> {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| invalid("truncated snapshot row"))?;
        *rest = tail;
        Ok(u32::from_be_bytes(*len) as usize)
    };
    while !rest.is_empty() {
        let klen = take(&mut rest)?;
        let key = rest.get(..klen).ok_or_else(|| invalid("truncated snapshot key"))?;
        rest = &rest[klen..];
        let vlen = take(&mut rest)?;
        let value = rest.get(..vlen).ok_or_else(|| invalid("truncated snapshot value"))?;
        rest = &rest[vlen..];
        out.push((key, value));
    }
    Ok(out)
}

/// Reads the snapshot at `path`: its header, then every run of rows with the column
/// family it belongs to, checking the row count at the end.
fn read_rows(
    path: &Path,
    mut rows_of: impl FnMut(&'static str, Vec<(&[u8], &[u8])>) -> anyhow::Result<()>,
) -> anyhow::Result<Header> {
    let mut reader = Reader::open(path)?;
    let (kind, payload) = reader.next()?;
    anyhow::ensure!(
        kind == META,
        "snapshot {} does not start with its header",
        path.display()
    );
    let header: Header = codec::decode(&payload)?;
    let mut count = 0u64;
    loop {
        let (kind, payload) = reader.next()?;
        let family = match kind {
            VIEW_ROWS => CF_SM,
            INDEX_ROWS => CF_INDEX,
            END => {
                let total = u64::from_be_bytes(payload.as_slice().try_into().map_err(|_| invalid("bad snapshot end"))?);
                anyhow::ensure!(
                    total == count,
                    "snapshot {} holds {count} rows, not the {total} it announces",
                    path.display()
                );
                return Ok(header);
            }
            other => anyhow::bail!("snapshot {} has an unknown frame kind {other:#x}", path.display()),
        };
        let rows = rows(&payload)?;
        count += rows.len() as u64;
        rows_of(family, rows)?;
    }
}

/// What a snapshot file covers, after checking its frames end to end: a snapshot that
/// was cut short or damaged is refused before anything is replaced.
pub fn verify(path: &Path) -> anyhow::Result<Header> {
    read_rows(path, |_, _| Ok(()))
}

/// Replaces the view's rows and the index in `db` with the snapshot at `path`, in
/// batches of at most [`FRAME_BYTES`]; the last batch also writes the applied position
/// and `finish` (the caller's marker and current-snapshot edits), synced. A crash before
/// that batch leaves the caller's install marker in place, and the install is redone.
pub fn install(db: &DB, path: &Path, finish: impl FnOnce(&mut WriteBatch)) -> anyhow::Result<Header> {
    let cf = |name| db.cf_handle(name).expect("opened with this column family");
    verify(path)?;
    let mut clear = WriteBatch::default();
    for name in [CF_SM, CF_INDEX] {
        clear.delete_range_cf(cf(name), [0x00u8].as_slice(), [0xffu8; 64].as_slice());
    }
    db.write(clear)?;
    let header = read_rows(path, |family, rows| {
        let mut batch = WriteBatch::default();
        for (key, value) in rows {
            batch.put_cf(cf(family), key, value);
        }
        Ok(db.write(batch)?)
    })?;
    let mut last = WriteBatch::default();
    last.put_cf(cf(CF_META), KEY_APPLIED, codec::encode(&header.last_applied));
    last.put_cf(cf(CF_META), KEY_MEMBERSHIP, codec::encode(&header.membership));
    finish(&mut last);
    db.write_opt(last, &sync_write())?;
    Ok(header)
}

/// Syncs a directory, so a rename or creation in it is durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The file of snapshot `id` in `dir`.
pub fn path_of(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.snap"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot of many rows crosses frames and installs row for row, in another store.
    #[test]
    fn a_snapshot_over_many_frames_installs_exactly() {
        let from = tempfile::tempdir().expect("temp dir");
        let to = tempfile::tempdir().expect("temp dir");
        let db = super::super::open_db(from.path()).expect("open");
        let mut batch = WriteBatch::default();
        let value = vec![b'x'; 300];
        for i in 0..10_000u32 {
            batch.put_cf(db.cf_handle(CF_SM).unwrap(), i.to_be_bytes(), &value);
            batch.put_cf(db.cf_handle(CF_INDEX).unwrap(), (i as u64).to_be_bytes(), &value[..100]);
        }
        db.write(batch).unwrap();
        let path = from.path().join("s.snap");
        write(&db, &path).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > 4 * FRAME_BYTES as u64);
        let other = super::super::open_db(to.path()).expect("open");
        other
            .put_cf(other.cf_handle(CF_SM).unwrap(), b"stale", b"gone")
            .unwrap();
        install(&other, &path, |_| {}).unwrap();
        let count = |db: &DB, name| db.iterator_cf(db.cf_handle(name).unwrap(), IteratorMode::Start).count();
        assert_eq!(count(&other, CF_SM), 10_000);
        assert_eq!(count(&other, CF_INDEX), 10_000);
        assert!(other
            .get_cf(other.cf_handle(CF_SM).unwrap(), b"stale")
            .unwrap()
            .is_none());
        // A truncated file is refused before the store is touched.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert!(install(&other, &path, |_| {}).is_err());
        assert_eq!(count(&other, CF_SM), 10_000);
    }
}
