//! Direct I/O for file-WAL segments (issue 17): writes that bypass the page cache.
//!
//! Through the page cache, every byte of a segment is copied twice by the CPU: the
//! zeros that preallocate it (about a fifth of the machine at 250 MB/s of produce) and
//! then the records over them, each copy followed by the kernel's writeback. With
//! `O_DIRECT` the device reads both straight from our buffers. Direct I/O writes whole,
//! aligned blocks, so an append rewrites the block the previous one ended in: its bytes
//! are kept here, and the new write starts with them. What lies past the records in the
//! last block is zeros, as the preallocated file held there already, so the file is
//! byte for byte what buffered writes make of it, and a torn write leaves the same
//! marks: sectors that were never written read back as the zeros they held.

use super::record::Framed;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// The unit of a direct write, and of its buffer's alignment: a multiple of the
/// logical block size of every device and file system Linux runs a WAL on.
pub const BLOCK: usize = 4096;

/// A buffer held past one write at most this large; a larger one (a single huge
/// record) is given back after its write.
pub const KEEP_BYTES: usize = 16 << 20;

/// A zeroed heap buffer whose start is aligned to [`BLOCK`], as direct I/O needs.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes, aligned.
    pub fn zeroed(len: usize) -> Self {
        let raw = vec![0u8; len + BLOCK];
        let start = raw.as_ptr().align_offset(BLOCK);
        Self { raw, start, len }
    }

    /// Makes the buffer `len` bytes long, for its owner to fill: what it held is not kept.
    #[cfg(test)]
    fn set_len(&mut self, len: usize) {
        self.reserve(len);
        self.len = len;
    }

    /// Room for `len` bytes from the aligned start, reallocating (aligned) only if
    /// there is not.
    fn reserve(&mut self, len: usize) {
        if self.start + len > self.raw.capacity() {
            *self = Self::zeroed(len);
        }
    }

    /// Refills the buffer, `len` bytes long: `fill` writes the first bytes, and zeros
    /// pad the rest. The bytes are written where they go, without a copy in between; a
    /// fill that writes more than `len` is a bug, refused before it could move the
    /// buffer off its alignment.
    fn refill(&mut self, len: usize, fill: impl FnOnce(&mut Vec<u8>)) {
        self.reserve(len);
        let at = self.raw.as_ptr();
        self.raw.truncate(self.start);
        fill(&mut self.raw);
        assert!(
            self.raw.len() <= self.start + len && self.raw.as_ptr() == at,
            "a direct write's buffer was filled past its length"
        );
        self.raw.resize(self.start + len, 0);
        self.len = len;
    }

    fn capacity(&self) -> usize {
        self.raw.capacity() - self.start
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// Appends to one segment opened with `O_DIRECT`, from its byte `len` on.
pub struct DirectAppender {
    buf: AlignedBuf,
    /// The bytes of the block the segment's data ends in, up to that end.
    tail: Vec<u8>,
}

impl DirectAppender {
    /// An appender for a segment whose data so far is `written` (its header), all in
    /// its first block.
    pub fn new(written: &[u8]) -> Self {
        assert!(written.len() < BLOCK, "a new segment's header fits its first block");
        Self {
            buf: AlignedBuf::zeroed(BLOCK),
            tail: written.to_vec(),
        }
    }

    /// Writes `group` at byte `len` of `file` (the segment's data ends there): the
    /// last block's bytes, then `group` framed straight into the aligned buffer,
    /// padded with zeros to a whole block.
    pub fn write_at(&mut self, file: &File, len: u64, group: &(impl Framed + ?Sized)) -> std::io::Result<()> {
        let carried = self.tail.len();
        debug_assert_eq!(len % BLOCK as u64, carried as u64);
        let data = carried + group.framed_len();
        let tail = &self.tail;
        self.buf.refill(data.div_ceil(BLOCK) * BLOCK, |out| {
            out.extend_from_slice(tail);
            group.frame_into(out);
        });
        file.write_all_at(self.buf.as_ref(), len - carried as u64)?;
        // The bytes of the block this write ended in start the next one.
        let ends_in = data - data % BLOCK;
        self.tail.clear();
        self.tail.extend_from_slice(&self.buf.as_ref()[ends_in..data]);
        if self.buf.capacity() > KEEP_BYTES {
            self.buf = AlignedBuf::zeroed(BLOCK);
        }
        Ok(())
    }
}

/// Opens `path` for direct writes with `options`' other settings. `None` when the file
/// system does not do direct I/O (it refuses `O_DIRECT` with `EINVAL`).
pub fn open(options: &std::fs::OpenOptions, path: &std::path::Path) -> std::io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = options.clone();
    match options.custom_flags(libc::O_DIRECT).open(path) {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `file` was opened with `O_DIRECT`, from the kernel's own account of it.
#[cfg(test)]
pub fn is_direct(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", file.as_raw_fd())).expect("fdinfo");
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| i32::from_str_radix(f.trim(), 8).ok())
        .expect("flags");
    flags & libc::O_DIRECT != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aligned_buffer_starts_on_a_block_at_any_size() {
        let mut buf = AlignedBuf::zeroed(10);
        assert_eq!(buf.as_ref().as_ptr() as usize % BLOCK, 0);
        assert_eq!(buf.as_ref(), &[0u8; 10]);
        buf.set_len(3 * BLOCK + 1);
        assert_eq!(buf.as_ref().as_ptr() as usize % BLOCK, 0);
        assert_eq!(buf.as_ref().len(), 3 * BLOCK + 1);
    }

    /// Issue 62: a refill writes in place, pads with zeros, and keeps the buffer (and
    /// its alignment) while it fits; a fill past its length is refused.
    #[test]
    fn a_refill_reuses_the_aligned_buffer_and_pads_with_zeros() {
        let mut buf = AlignedBuf::zeroed(4 * BLOCK);
        let at = buf.as_ref().as_ptr();
        buf.refill(2 * BLOCK, |out| out.extend_from_slice(&[9u8; 5000]));
        assert_eq!(buf.as_ref().as_ptr(), at, "no new buffer");
        assert_eq!(&buf.as_ref()[..5000], &[9u8; 5000][..]);
        assert!(buf.as_ref()[5000..].iter().all(|b| *b == 0));
        assert_eq!(buf.as_ref().len(), 2 * BLOCK);
        buf.refill(BLOCK, |out| out.push(1));
        assert_eq!(buf.as_ref()[..2], [1, 0], "what an earlier fill left is zeroed");
        buf.refill(8 * BLOCK, |out| out.extend_from_slice(&[3u8; 8 * BLOCK]));
        assert_eq!(buf.as_ref().as_ptr() as usize % BLOCK, 0);
        let over = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            buf.refill(BLOCK, |out| out.extend_from_slice(&[1u8; BLOCK + 1]))
        }));
        assert!(over.is_err(), "a fill past its length is refused");
    }
}
