//! The data-object format: a header, each stream's batches as one contiguous chunk,
//! an index of the chunks, and a footer with checksums and the format version.
//!
//! `WEIROBJ | version u8 | chunks... | index | footer`, where the index is
//! `count u32` then per chunk `stream u64 | stream_epoch u64 | start u64 | end u64 |
//! pos u64 | len u64 | crc32c u32`, and the footer (last 25 bytes) is
//! `index_pos u64 | index_len u32 | index_crc u32 | version u8 | WEIRFTR\0`.
//! Integers are big-endian. A reader refuses an unknown version with a clear error.

use bytes::{BufMut, Bytes, BytesMut};
use object_store::{PutPayload, PutPayloadMut};
use weir_shared::ids::{StreamEpoch, StreamId};

pub const OBJECT_MAGIC: &[u8; 7] = b"WEIROBJ";
const FOOTER_MAGIC: &[u8; 8] = b"WEIRFTR\0";
/// The data-object format version; bump on any incompatible change.
pub const OBJECT_VERSION: u8 = 1;
const FOOTER_LEN: usize = 8 + 4 + 4 + 1 + 8;
const INDEX_ENTRY: usize = 8 * 6 + 4;

/// One stream's chunk inside an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub stream: StreamId,
    pub stream_epoch: StreamEpoch,
    pub start: u64,
    pub end: u64,
    pub pos: u64,
    pub len: u64,
    pub crc: u32,
}

/// Why an object cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectFormatError {
    #[error("data object format version {0} is not supported (this build reads version {OBJECT_VERSION}); read it with a matching version of Weir")]
    UnsupportedVersion(u8),
    #[error("not a Weir data object")]
    UnknownFormat,
    #[error("data object is corrupt: {0}")]
    Corrupt(String),
}

/// Batches at least this large go into an object as they are, without a copy; smaller
/// ones are copied together into blocks of [`BLOCK_BYTES`], so an object of many small
/// batches is written in few large pieces.
const PASS_THROUGH_BYTES: usize = 64 << 10;

/// The blocks small batches are copied into: well below the allocator's huge sizes,
/// which are mapped fresh and unmapped on free (design 0009).
const BLOCK_BYTES: usize = 256 << 10;

/// Builds an object from per-stream chunks of batches, as the list of pieces a PUT
/// sends: the batches themselves where they are large, so building an object does not
/// copy the bytes it uploads (issue 62).
pub struct ObjectBuilder {
    body: PutPayloadMut,
    chunks: Vec<Chunk>,
}

impl Default for ObjectBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ObjectBuilder {
    pub fn new() -> Self {
        let mut body = PutPayloadMut::new().with_block_size(BLOCK_BYTES);
        body.extend_from_slice(OBJECT_MAGIC);
        body.extend_from_slice(&[OBJECT_VERSION]);
        Self {
            body,
            chunks: Vec::new(),
        }
    }

    /// Adds one stream's contiguous batches covering `start..end`.
    pub fn add(
        &mut self,
        stream: StreamId,
        stream_epoch: StreamEpoch,
        start: u64,
        end: u64,
        batches: &[Bytes],
    ) -> &Chunk {
        let pos = self.body.content_length() as u64;
        let mut hasher = 0u32;
        let mut len = 0u64;
        for b in batches {
            hasher = crc32c::crc32c_append(hasher, b);
            if b.len() >= PASS_THROUGH_BYTES {
                self.body.push(b.clone());
            } else {
                self.body.extend_from_slice(b);
            }
            len += b.len() as u64;
        }
        self.chunks.push(Chunk {
            stream,
            stream_epoch,
            start,
            end,
            pos,
            len,
            crc: hasher,
        });
        self.chunks.last().expect("just pushed")
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The finished object, as the pieces to PUT, and its chunks.
    pub fn finish(mut self) -> (PutPayload, Vec<Chunk>) {
        let index_pos = self.body.content_length() as u64;
        let mut index = BytesMut::with_capacity(4 + self.chunks.len() * INDEX_ENTRY + FOOTER_LEN);
        index.put_u32(self.chunks.len() as u32);
        for c in &self.chunks {
            index.put_u64(c.stream.0);
            index.put_u64(c.stream_epoch.0);
            index.put_u64(c.start);
            index.put_u64(c.end);
            index.put_u64(c.pos);
            index.put_u64(c.len);
            index.put_u32(c.crc);
        }
        let index_crc = crc32c::crc32c(&index);
        let index_len = index.len() as u32;
        index.put_u64(index_pos);
        index.put_u32(index_len);
        index.put_u32(index_crc);
        index.put_u8(OBJECT_VERSION);
        index.put_slice(FOOTER_MAGIC);
        self.body.push(index.freeze());
        (self.body.freeze(), self.chunks)
    }
}

/// Reads and checks a whole object's index (tools, GC, tests).
pub fn read_index(object: &[u8]) -> Result<Vec<Chunk>, ObjectFormatError> {
    if object.len() < OBJECT_MAGIC.len() + 1 + FOOTER_LEN || &object[..7] != OBJECT_MAGIC {
        return Err(ObjectFormatError::UnknownFormat);
    }
    if object[7] != OBJECT_VERSION {
        return Err(ObjectFormatError::UnsupportedVersion(object[7]));
    }
    let footer = &object[object.len() - FOOTER_LEN..];
    if &footer[17..25] != FOOTER_MAGIC {
        return Err(ObjectFormatError::Corrupt("footer magic missing".into()));
    }
    if footer[16] != OBJECT_VERSION {
        return Err(ObjectFormatError::UnsupportedVersion(footer[16]));
    }
    let index_pos = u64::from_be_bytes(footer[0..8].try_into().expect("8")) as usize;
    let index_len = u32::from_be_bytes(footer[8..12].try_into().expect("4")) as usize;
    let index_crc = u32::from_be_bytes(footer[12..16].try_into().expect("4"));
    let index = index_pos
        .checked_add(index_len)
        .filter(|end| *end <= object.len() - FOOTER_LEN)
        .map(|end| &object[index_pos..end])
        .ok_or_else(|| ObjectFormatError::Corrupt("index lies outside the object".into()))?;
    if crc32c::crc32c(index) != index_crc {
        return Err(ObjectFormatError::Corrupt("index checksum mismatch".into()));
    }
    let count = u32::from_be_bytes(
        index
            .get(0..4)
            .ok_or_else(|| ObjectFormatError::Corrupt("empty index".into()))?
            .try_into()
            .expect("4"),
    ) as usize;
    if index.len()
        != 4 + count
            .checked_mul(INDEX_ENTRY)
            .ok_or_else(|| ObjectFormatError::Corrupt("index count overflows".into()))?
    {
        return Err(ObjectFormatError::Corrupt(format!(
            "index of {} bytes cannot hold {count} entries",
            index.len()
        )));
    }
    let mut chunks = Vec::with_capacity(count);
    for i in 0..count {
        let e = &index[4 + i * INDEX_ENTRY..4 + (i + 1) * INDEX_ENTRY];
        let u = |at: usize| u64::from_be_bytes(e[at..at + 8].try_into().expect("8"));
        let chunk = Chunk {
            stream: StreamId(u(0)),
            stream_epoch: StreamEpoch(u(8)),
            start: u(16),
            end: u(24),
            pos: u(32),
            len: u(40),
            crc: u32::from_be_bytes(e[48..52].try_into().expect("4")),
        };
        let data_end = chunk
            .pos
            .checked_add(chunk.len)
            .ok_or_else(|| ObjectFormatError::Corrupt("chunk range overflows".into()))?;
        if data_end > index_pos as u64 {
            return Err(ObjectFormatError::Corrupt(format!(
                "chunk of stream {} lies outside the data",
                chunk.stream
            )));
        }
        chunks.push(chunk);
    }
    Ok(chunks)
}

/// Checks a chunk's bytes (fetched by a ranged read) against its recorded checksum.
pub fn verify_chunk(chunk: &Chunk, bytes: &[u8]) -> Result<(), ObjectFormatError> {
    if bytes.len() as u64 != chunk.len || crc32c::crc32c(bytes) != chunk.crc {
        return Err(ObjectFormatError::Corrupt(format!(
            "chunk of stream {} ({}..{}) fails its checksum",
            chunk.stream, chunk.start, chunk.end
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_round_trip_and_damage_is_detected() {
        let mut b = ObjectBuilder::new();
        b.add(
            StreamId(1),
            StreamEpoch(2),
            0,
            3,
            &[Bytes::from_static(b"abc"), Bytes::from_static(b"de")],
        );
        b.add(StreamId(7), StreamEpoch(1), 10, 11, &[Bytes::from_static(b"z")]);
        let (obj, chunks) = b.finish();
        let obj = Bytes::from(obj);
        assert_eq!(read_index(&obj).unwrap(), chunks);
        let c = &chunks[0];
        verify_chunk(c, &obj[c.pos as usize..(c.pos + c.len) as usize]).unwrap();
        let mut bad = obj.to_vec();
        bad[c.pos as usize] ^= 1;
        assert!(verify_chunk(c, &bad[c.pos as usize..(c.pos + c.len) as usize]).is_err());
        let mut newer = obj.to_vec();
        newer[7] = OBJECT_VERSION + 1;
        assert!(matches!(
            read_index(&newer),
            Err(ObjectFormatError::UnsupportedVersion(_))
        ));
        let mut idx = obj.to_vec();
        let n = idx.len();
        idx[n - 30] ^= 1;
        assert!(read_index(&idx).is_err());
    }

    /// Issue 62: a large batch goes into the PUT as the same bytes, not a copy; small
    /// ones share blocks; either way the object reads back whole.
    #[test]
    fn large_batches_are_not_copied_and_small_ones_are_packed() {
        let large = Bytes::from(vec![7u8; PASS_THROUGH_BYTES]);
        let small: Vec<Bytes> = (0..100u8).map(|i| Bytes::from(vec![i; 1000])).collect();
        let mut b = ObjectBuilder::new();
        b.add(StreamId(1), StreamEpoch(1), 0, 100, &small);
        b.add(StreamId(2), StreamEpoch(1), 0, 1, std::slice::from_ref(&large));
        let (payload, chunks) = b.finish();
        let pieces: Vec<&Bytes> = payload.iter().collect();
        assert!(
            pieces
                .iter()
                .any(|p| p.as_ptr() == large.as_ptr() && p.len() == large.len()),
            "the large batch is sent as it is"
        );
        // Header and 100 small batches in one block, the large batch, the index.
        assert_eq!(
            pieces.len(),
            3,
            "{:?}",
            pieces.iter().map(|p| p.len()).collect::<Vec<_>>()
        );
        let obj = Bytes::from(payload);
        assert_eq!(read_index(&obj).unwrap(), chunks);
        for (c, want) in chunks.iter().zip([small.concat(), large.to_vec()]) {
            let got = &obj[c.pos as usize..(c.pos + c.len) as usize];
            assert_eq!(got, &want[..]);
            verify_chunk(c, got).unwrap();
        }
    }
}
