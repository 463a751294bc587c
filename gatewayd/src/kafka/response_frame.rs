//! A response frame that shares its record batches instead of copying them (issue 17).
//!
//! `kafka-protocol` encodes a message into one buffer, copying each partition's records
//! into it: for a Fetch response of megabytes, a fresh allocation the size of the
//! response (page faults and all) and a copy of every batch. [`SharedFrame`] is a buffer
//! the crate encodes into that recognises the records' bytes when they are put and keeps
//! a reference to them in their place. The frame goes out as a list of pieces with one
//! vectored write, over TLS as in clear.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::buf::ByteBufMut;
use std::collections::VecDeque;
use std::io::IoSlice;

/// Slices shorter than this are copied: a reference costs more than a small copy.
const SHARE_MIN: usize = 4096;

/// A frame being encoded: pieces done, and the piece being written.
pub struct SharedFrame {
    pieces: VecDeque<Bytes>,
    /// Bytes in `pieces`.
    done: usize,
    head: BytesMut,
    /// The values whose slices are referenced rather than copied, in encoding order.
    shared: Vec<Bytes>,
    /// Where in `shared` the next slice is looked for first.
    next: usize,
}

impl SharedFrame {
    /// A frame that references any slice of `shared` put into it.
    pub fn new(shared: Vec<Bytes>) -> Self {
        Self {
            pieces: VecDeque::new(),
            done: 0,
            head: BytesMut::with_capacity(256),
            shared,
            next: 0,
        }
    }

    /// Bytes encoded so far.
    pub fn len(&self) -> usize {
        self.done + self.head.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shared value `src` lies in, if any: the one after the last found first, as
    /// batches are put in the order they were collected.
    fn find_shared(&mut self, src: &[u8]) -> Option<Bytes> {
        let (start, end) = (src.as_ptr() as usize, src.as_ptr() as usize + src.len());
        let n = self.shared.len();
        let found = (0..n).map(|i| (self.next + i) % n).find(|&i| {
            let b = &self.shared[i];
            let b_start = b.as_ptr() as usize;
            b_start <= start && end <= b_start + b.len()
        })?;
        self.next = found + 1;
        Some(self.shared[found].slice_ref(src))
    }

    /// Adds `piece`, already encoded, as it is.
    pub fn push(&mut self, piece: Bytes) {
        if !piece.is_empty() {
            self.push_piece(piece);
        }
    }

    fn push_piece(&mut self, piece: Bytes) {
        if !self.head.is_empty() {
            let head = self.head.split().freeze();
            self.done += head.len();
            self.pieces.push_back(head);
        }
        self.done += piece.len();
        self.pieces.push_back(piece);
    }

    /// The whole frame, prefixed by its size as Kafka frames are.
    pub fn finish(mut self) -> Pieces {
        let size = self.len() as i32;
        if !self.head.is_empty() {
            let head = self.head.split().freeze();
            self.done += head.len();
            self.pieces.push_back(head);
        }
        self.pieces.push_front(Bytes::copy_from_slice(&size.to_be_bytes()));
        Pieces {
            remaining: self.done + 4,
            pieces: self.pieces,
        }
    }
}

// SAFETY: every method but `put_slice` is `BytesMut`'s own, on `head`, so the trait's
// contract (what `chunk_mut` hands out and `advance_mut` commits) is `BytesMut`'s;
// `put_slice` either keeps the slice as a piece of its own or hands it to `head`.
#[allow(unsafe_code)]
unsafe impl BufMut for SharedFrame {
    fn remaining_mut(&self) -> usize {
        self.head.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller initialised `cnt` bytes of `head`'s chunk.
        unsafe { self.head.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut bytes::buf::UninitSlice {
        self.head.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        if src.len() >= SHARE_MIN {
            if let Some(piece) = self.find_shared(src) {
                self.push_piece(piece);
                return;
            }
        }
        self.head.put_slice(src);
    }
}

/// Offsets count the whole frame; `seek` and `range` reach only the piece being written,
/// which is all generated messages need (they leave no gaps; only record encoding does,
/// and records are encoded apart).
impl ByteBufMut for SharedFrame {
    fn offset(&self) -> usize {
        self.len()
    }

    fn seek(&mut self, offset: usize) {
        let at = offset
            .checked_sub(self.done)
            .expect("a shared frame seeks only within the piece being written");
        self.head.resize(at, 0);
    }

    fn range(&mut self, r: std::ops::Range<usize>) -> &mut [u8] {
        assert!(
            r.start >= self.done,
            "a shared frame's range lies in the piece being written"
        );
        &mut self.head[r.start - self.done..r.end - self.done]
    }
}

/// A finished frame: its pieces in order, written with vectored writes.
pub struct Pieces {
    pieces: VecDeque<Bytes>,
    remaining: usize,
}

impl Buf for Pieces {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.pieces.front().map(|b| &b[..]).unwrap_or(&[])
    }

    fn advance(&mut self, mut cnt: usize) {
        self.remaining -= cnt;
        while cnt > 0 {
            let front = self.pieces.front_mut().expect("advanced past the frame");
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.pieces.pop_front();
        }
        while self.pieces.front().is_some_and(|b| b.is_empty()) {
            self.pieces.pop_front();
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slot, piece) in dst.iter_mut().zip(self.pieces.iter().filter(|p| !p.is_empty())) {
            *slot = IoSlice::new(piece);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{FetchResponse, FetchableTopicResponse, PartitionData};
    use kafka_protocol::protocol::Encodable;

    fn response(records: &[Bytes]) -> FetchResponse {
        FetchResponse::default().with_responses(vec![FetchableTopicResponse::default().with_partitions(
            records
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    PartitionData::default()
                        .with_partition_index(i as i32)
                        .with_records(Some(r.clone()))
                })
                .collect(),
        )])
    }

    fn gathered(mut pieces: Pieces) -> Vec<u8> {
        let mut out = Vec::new();
        while pieces.has_remaining() {
            let mut slices = [IoSlice::new(&[]); 3];
            let n = pieces.chunks_vectored(&mut slices);
            assert!(n > 0);
            // As a short vectored write would: part of what was offered.
            let take = (slices[..n].iter().map(|s| s.len()).sum::<usize>() / 2).max(1);
            let mut left = take;
            for s in &slices[..n] {
                let k = left.min(s.len());
                out.extend_from_slice(&s[..k]);
                left -= k;
            }
            pieces.advance(take);
        }
        out
    }

    // Issue 17: a Fetch response's batches go out as references to the batches read, not
    // copies, and the frame is byte for byte what `kafka-protocol` encodes, at a flexible
    // version and an older one.
    #[test]
    fn a_fetch_frame_references_its_batches_and_encodes_as_the_crate_does() {
        let records: Vec<Bytes> = (0..3u8)
            .map(|i| Bytes::from(vec![i; 10_000 + usize::from(i)]))
            .collect();
        let small = Bytes::from_static(b"tiny");
        let mut all = records.clone();
        all.push(small.clone());
        for version in [4i16, 11, 12, 16] {
            let resp = response(&all);
            let mut expected = BytesMut::new();
            resp.encode(&mut expected, version).unwrap();
            let mut frame = SharedFrame::new(all.clone());
            resp.encode(&mut frame, version).unwrap();
            assert_eq!(frame.len(), expected.len());
            let pieces = frame.finish();
            let shared: Vec<&Bytes> = pieces
                .pieces
                .iter()
                .filter(|p| records.iter().any(|r| r.as_ptr() == p.as_ptr()))
                .collect();
            assert_eq!(shared.len(), 3, "version {version}: every large batch is referenced");
            let mut whole = (expected.len() as i32).to_be_bytes().to_vec();
            whole.extend_from_slice(&expected);
            assert_eq!(gathered(pieces), whole, "version {version}");
        }
    }
}
