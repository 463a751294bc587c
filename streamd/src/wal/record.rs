//! The WAL's on-disk record format, shared by both backends.
//!
//! A segment starts with [`SEGMENT_MAGIC`] and a version byte. Each record is
//! `len u32 | crc32c u32 | body`, where `body` is
//! `kind u8 | stream_id u64 | stream_epoch u64 | base_offset u64 | offset_count u32 | batches`.
//! All integers are big-endian. An invalid record in the last segment of a file WAL is a
//! torn tail, and cut, only when it bears a crash's marks ([`classify_tail`]); anywhere
//! else, and in any object WAL object, it is corruption.

use bytes::{BufMut, Bytes, BytesMut};
use weir_shared::ids::{StreamEpoch, StreamId};

/// Marks a WAL segment; must be kept stable.
pub const SEGMENT_MAGIC: &[u8; 7] = b"WEIRWAL";
/// The record format version; bump on any incompatible change.
pub const WAL_VERSION: u8 = 1;
pub const SEGMENT_HEADER_LEN: usize = 8;
const RECORD_PREFIX: usize = 8;
const BODY_FIXED: usize = 1 + 8 + 8 + 8 + 4;
/// Largest record accepted on replay; guards against reading a garbage length.
pub const MAX_RECORD: usize = 256 * 1024 * 1024;
/// Bytes a record adds to its batches: the largest append a record can hold is
/// [`MAX_RECORD`] less this.
pub const RECORD_OVERHEAD: usize = RECORD_PREFIX + BODY_FIXED;

/// Record kinds; stable.
const KIND_BATCHES: u8 = 1;

/// One appended write: the batches of one stream at one epoch, with offsets assigned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalRecord {
    pub stream: StreamId,
    pub stream_epoch: StreamEpoch,
    pub base_offset: u64,
    pub offset_count: u32,
    pub batches: Bytes,
}

impl WalRecord {
    pub fn end_offset(&self) -> u64 {
        self.base_offset + u64::from(self.offset_count)
    }

    /// Bytes the framed record takes.
    pub fn encoded_len(&self) -> usize {
        RECORD_PREFIX + BODY_FIXED + self.batches.len()
    }

    /// The framed record, ready to write.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out.freeze()
    }

    /// Appends the framed record to `out`: the group commit frames each record straight
    /// into the buffer it writes from, so the batches are copied once on their way to
    /// the disk. The checksum is taken over the header and the batches as they are, so
    /// `out` is only written, never read back.
    pub fn encode_into(&self, out: &mut impl BufMut) {
        let body_len = BODY_FIXED + self.batches.len();
        let mut head = [0u8; RECORD_PREFIX + BODY_FIXED];
        let mut fixed = &mut head[RECORD_PREFIX..];
        fixed.put_u8(KIND_BATCHES);
        fixed.put_u64(self.stream.0);
        fixed.put_u64(self.stream_epoch.0);
        fixed.put_u64(self.base_offset);
        fixed.put_u32(self.offset_count);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head[RECORD_PREFIX..]), &self.batches);
        head[..4].copy_from_slice(&(body_len as u32).to_be_bytes());
        head[4..8].copy_from_slice(&crc.to_be_bytes());
        out.put_slice(&head);
        out.put_slice(&self.batches);
    }
}

/// Framed records on their way to a write: how many bytes they take, and a way to
/// frame them into the buffer the write goes from.
pub trait Framed {
    fn framed_len(&self) -> usize;
    fn frame_into(&self, out: &mut impl BufMut);
}

/// Records framed already (tests, tools).
impl Framed for [u8] {
    fn framed_len(&self) -> usize {
        self.len()
    }

    fn frame_into(&self, out: &mut impl BufMut) {
        out.put_slice(self);
    }
}

/// The header every segment starts with.
pub fn segment_header() -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[..7].copy_from_slice(SEGMENT_MAGIC);
    h[7] = WAL_VERSION;
    h
}

/// What decoding a segment found.
#[derive(Debug, PartialEq, Eq)]
pub enum SegmentEnd {
    /// Every byte belonged to a whole, valid record.
    Clean,
    /// A partial or failing record starts at this byte position; [`classify_tail`] tells
    /// a torn last write from damage.
    Invalid { at: usize, reason: String },
}

/// Why a segment cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(
        "WAL segment has an unknown format (no WEIRWAL header); it was not written by Weir: recreate the WAL directory"
    )]
    UnknownFormat,
    #[error("WAL segment format version {0} is not supported (this build reads version {WAL_VERSION}); the WAL must be recreated or read by a matching version")]
    UnsupportedVersion(u8),
}

/// Decodes a whole segment: its valid records, and where (if anywhere) it stops being valid.
pub fn decode_segment(data: &[u8]) -> Result<(Vec<WalRecord>, SegmentEnd), DecodeError> {
    if data.len() < SEGMENT_HEADER_LEN || &data[..7] != SEGMENT_MAGIC {
        return Err(DecodeError::UnknownFormat);
    }
    if data[7] != WAL_VERSION {
        return Err(DecodeError::UnsupportedVersion(data[7]));
    }
    let mut records = Vec::new();
    let mut pos = SEGMENT_HEADER_LEN;
    while pos < data.len() {
        match decode_record(&data[pos..]) {
            Ok((record, used)) => {
                records.push(record);
                pos += used;
            }
            Err(reason) => return Ok((records, SegmentEnd::Invalid { at: pos, reason })),
        }
    }
    Ok((records, SegmentEnd::Clean))
}

/// Where the first whole record after the damage at `at` starts, if any.
pub fn resync(data: &[u8], at: usize) -> Option<usize> {
    (at + 1..data.len()).find(|p| is_whole_record(&data[*p..]))
}

/// Damage inside a segment that whole records follow or that bears no torn write's
/// marks: acknowledged records may be lost in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// Byte where the damage starts, and where the next whole record starts (if any).
    pub at: usize,
    pub next: Option<usize>,
    pub reason: String,
    /// The damaged record's stream, epoch and offsets, when its framing still reads
    /// (a flipped bit in its body): the stream whose records the damage lost.
    pub suspect: Option<(StreamId, StreamEpoch, u64, u64)>,
}

/// Decodes `data` from `at` on, past damage: every whole record after each damaged
/// stretch, and the damage found. Records are never invented: each one returned
/// passed its CRC.
pub fn decode_past_damage(data: &[u8], at: usize, reason: String) -> (Vec<WalRecord>, Vec<Damage>) {
    let (mut records, mut damage) = (Vec::new(), Vec::new());
    let (mut at, mut reason) = (at, reason);
    loop {
        let next = resync(data, at);
        damage.push(Damage {
            at,
            next,
            reason: reason.clone(),
            suspect: legible_header(&data[at..]),
        });
        let Some(mut pos) = next else {
            return (records, damage);
        };
        loop {
            if pos >= data.len() {
                return (records, damage);
            }
            match decode_record(&data[pos..]) {
                Ok((record, used)) => {
                    records.push(record);
                    pos += used;
                }
                // Space never written (a preallocated segment's tail) ends the data.
                // Only a last segment has one; earlier damage is reported either way.
                Err(_) if data[pos..].iter().all(|b| *b == 0) => return (records, damage),
                Err(why) => {
                    (at, reason) = (pos, why);
                    break;
                }
            }
        }
    }
}

/// The stream, epoch and offsets a damaged record's header names, when its length
/// still frames it within `data`; not trusted for data, only to say whose it was.
fn legible_header(data: &[u8]) -> Option<(StreamId, StreamEpoch, u64, u64)> {
    if data.len() < RECORD_PREFIX + BODY_FIXED || data[RECORD_PREFIX] != KIND_BATCHES {
        return None;
    }
    let len = u32::from_be_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
    if !(BODY_FIXED..=MAX_RECORD).contains(&len) || RECORD_PREFIX + len > data.len() {
        return None;
    }
    let u64_at = |at: usize| u64::from_be_bytes(data[at..at + 8].try_into().expect("8 bytes"));
    let count = u32::from_be_bytes(
        data[RECORD_PREFIX + 25..RECORD_PREFIX + 29]
            .try_into()
            .expect("4 bytes"),
    );
    let base = u64_at(RECORD_PREFIX + 17);
    Some((
        StreamId(u64_at(RECORD_PREFIX + 1)),
        StreamEpoch(u64_at(RECORD_PREFIX + 9)),
        base,
        base.checked_add(u64::from(count))?,
    ))
}

/// What follows the first invalid record of a file WAL's last segment.
#[derive(Debug, PartialEq, Eq)]
pub enum Tail {
    /// Only zeros: space the writer never filled. A clean end of the log.
    Zeroed,
    /// The last write, cut short or with pages that never reached the disk, by a crash
    /// before its sync: nothing in it was acknowledged, and it is cut.
    Torn,
    /// Damage to bytes that were written whole: a whole record follows it (at `next`),
    /// or it shows none of a torn write's marks. Acknowledged records may be in it or
    /// after it, so nothing is cut.
    Corrupt { next: Option<usize> },
}

/// Sector size for the torn-write test: a write the disk never finished leaves whole
/// sectors unwritten, which read back as zeros (etcd's WAL uses the same mark).
const SECTOR: usize = 512;

/// Classifies the bytes of a last segment from `at`, where its first invalid record
/// starts. Torn only on evidence of a crash mid-write: the record runs past the end of
/// the file, or a zeroed run starting on a sector boundary lies inside it or ends the
/// file. A bit flipped in a record written whole, or a whole record after the damage,
/// is corruption, never cut: it may hold acknowledged records (issue 20).
pub fn classify_tail(data: &[u8], at: usize) -> Tail {
    let rest = &data[at.min(data.len())..];
    if rest.iter().all(|b| *b == 0) {
        return Tail::Zeroed;
    }
    // A preallocated segment ends in zeros that were never written: judge only what was
    // (else a bit flipped in the last record's length would find those zeros and pass
    // for a torn write, cutting an acknowledged record).
    let written = data.len() - data.iter().rev().take_while(|b| **b == 0).count();
    let data = &data[..written];
    let rest = &data[at..];
    if let Some(next) = resync(data, at) {
        return Tail::Corrupt { next: Some(next) };
    }
    if rest.len() < RECORD_PREFIX {
        return Tail::Torn;
    }
    let len = u32::from_be_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
    let end = if (BODY_FIXED..=MAX_RECORD).contains(&len) {
        if RECORD_PREFIX + len > rest.len() {
            return Tail::Torn;
        }
        at + RECORD_PREFIX + len
    } else {
        data.len()
    };
    if has_unwritten_sector(data, at, end) {
        Tail::Torn
    } else {
        Tail::Corrupt { next: None }
    }
}

/// Whether `[from, to)` holds a zeroed sector: a whole aligned one, or a zeroed run from
/// a sector boundary to the end of the file (the part of a page never written back).
fn has_unwritten_sector(data: &[u8], from: usize, to: usize) -> bool {
    let mut s = from.div_ceil(SECTOR) * SECTOR;
    while s < to {
        let e = (s + SECTOR).min(data.len());
        // A whole sector, or the partial one that ends the file.
        if data[s..e].iter().all(|b| *b == 0) {
            return true;
        }
        s += SECTOR;
    }
    false
}

/// Whether `data` starts with a whole, valid record. Cheap structural checks come
/// before the CRC, so scanning every byte of a damaged segment stays linear.
fn is_whole_record(data: &[u8]) -> bool {
    if data.len() < RECORD_PREFIX + BODY_FIXED || data[RECORD_PREFIX] != KIND_BATCHES {
        return false;
    }
    let u64_at = |at: usize| u64::from_be_bytes(data[at..at + 8].try_into().expect("8 bytes"));
    let len = u32::from_be_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
    // Ids, epochs and offsets Weir assigns never reach these bounds.
    let plausible = (BODY_FIXED..=MAX_RECORD).contains(&len)
        && RECORD_PREFIX + len <= data.len()
        && u64_at(RECORD_PREFIX + 1) < 1 << 48
        && u64_at(RECORD_PREFIX + 9) < 1 << 48
        && u64_at(RECORD_PREFIX + 17) < 1 << 62;
    plausible && decode_record(data).is_ok()
}

/// Decodes the record at the start of `data`, returning it and the bytes it used.
fn decode_record(data: &[u8]) -> Result<(WalRecord, usize), String> {
    if data.len() < RECORD_PREFIX {
        return Err(format!("{} bytes left, a record prefix is {RECORD_PREFIX}", data.len()));
    }
    let len = u32::from_be_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
    if !(BODY_FIXED..=MAX_RECORD).contains(&len) {
        return Err(format!("record length {len} is out of range"));
    }
    let Some(body) = data.get(RECORD_PREFIX..RECORD_PREFIX + len) else {
        return Err(format!(
            "record of {len} bytes is cut short at {}",
            data.len() - RECORD_PREFIX
        ));
    };
    let stored = u32::from_be_bytes(data[4..8].try_into().expect("4 bytes"));
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(format!(
            "record CRC mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    if body[0] != KIND_BATCHES {
        return Err(format!("unknown record kind {}", body[0]));
    }
    let u64_at = |at: usize| u64::from_be_bytes(body[at..at + 8].try_into().expect("8 bytes"));
    let record = WalRecord {
        stream: StreamId(u64_at(1)),
        stream_epoch: StreamEpoch(u64_at(9)),
        base_offset: u64_at(17),
        offset_count: u32::from_be_bytes(body[25..29].try_into().expect("4 bytes")),
        batches: Bytes::copy_from_slice(&body[BODY_FIXED..]),
    };
    Ok((record, RECORD_PREFIX + len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(i: u64, payload: &[u8]) -> WalRecord {
        WalRecord {
            stream: StreamId(i % 3),
            stream_epoch: StreamEpoch(1),
            base_offset: i * 10,
            offset_count: 10,
            batches: Bytes::copy_from_slice(payload),
        }
    }

    fn segment(records: &[WalRecord]) -> Vec<u8> {
        let mut data = segment_header().to_vec();
        for r in records {
            data.extend_from_slice(&r.encode());
        }
        data
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_found() {
        let records: Vec<_> = (0..5).map(|i| record(i, b"payload")).collect();
        let data = segment(&records);
        assert_eq!(decode_segment(&data).unwrap(), (records.clone(), SegmentEnd::Clean));
        let cut = &data[..data.len() - 3];
        let (got, end) = decode_segment(cut).unwrap();
        assert_eq!(got, records[..4].to_vec());
        assert!(matches!(end, SegmentEnd::Invalid { .. }));
    }

    // Issue 17: the group commit frames records one after another into one buffer; each
    // is framed as alone, so a group decodes as its records, CRCs and all.
    #[test]
    fn records_framed_into_one_buffer_decode_as_framed_alone() {
        let records: Vec<_> = (0..4).map(|i| record(i, &vec![i as u8; 100 * i as usize])).collect();
        let mut group = BytesMut::from(&segment_header()[..]);
        for r in &records {
            r.encode_into(&mut group);
        }
        assert_eq!(&group[..], &segment(&records)[..]);
        assert_eq!(decode_segment(&group).unwrap(), (records.clone(), SegmentEnd::Clean));
        assert_eq!(
            group.len(),
            SEGMENT_HEADER_LEN + records.iter().map(WalRecord::encoded_len).sum::<usize>()
        );
    }

    fn first_invalid(data: &[u8]) -> usize {
        match decode_segment(data).unwrap().1 {
            SegmentEnd::Invalid { at, .. } => at,
            SegmentEnd::Clean => panic!("the segment decodes whole"),
        }
    }

    // Issue 20, defect 2: only a crash's marks make a torn tail.
    #[test]
    fn a_write_cut_short_is_torn_and_a_zeroed_tail_is_a_clean_end() {
        let records: Vec<_> = (0..5).map(|i| record(i, &[0xab; 700])).collect();
        let data = segment(&records);
        let cut = &data[..data.len() - 100];
        assert_eq!(classify_tail(cut, first_invalid(cut)), Tail::Torn);
        let mut zeroed = data.clone();
        zeroed.extend_from_slice(&[0; 4096]);
        assert_eq!(classify_tail(&zeroed, first_invalid(&zeroed)), Tail::Zeroed);
    }

    #[test]
    fn a_last_record_whose_pages_never_reached_the_disk_is_torn() {
        let records: Vec<_> = (0..3).map(|i| record(i, &[0xab; 1500])).collect();
        let mut data = segment(&records);
        let last_start = data.len() - records[2].encode().len();
        // The sectors from the first boundary inside the last record read back as zeros.
        let boundary = last_start.div_ceil(SECTOR) * SECTOR;
        data[boundary..].fill(0);
        assert_eq!(first_invalid(&data), last_start);
        assert_eq!(classify_tail(&data, last_start), Tail::Torn);
    }

    #[test]
    fn a_flipped_bit_in_the_last_record_written_whole_is_corruption() {
        let records: Vec<_> = (0..3).map(|i| record(i, &[0xab; 1500])).collect();
        let mut data = segment(&records);
        let n = data.len();
        data[n - 10] ^= 0x04;
        let at = first_invalid(&data);
        assert_eq!(classify_tail(&data, at), Tail::Corrupt { next: None });
    }

    // Issue 17 with issue 20's rules: a preallocated segment's zeroed tail is never
    // taken for a crash's mark. Damage to the last record written whole, even to its
    // length, is still corruption; a last record whose pages never reached the disk is
    // still torn.
    #[test]
    fn a_preallocated_tail_does_not_make_damage_look_torn() {
        let records: Vec<_> = (0..3).map(|i| record(i, &[0xab; 1500])).collect();
        let whole = segment(&records);
        let last_start = whole.len() - records[2].encode().len();
        let preallocated = |mut d: Vec<u8>| {
            d.resize(64 << 10, 0);
            d
        };
        let mut flipped = whole.clone();
        let n = flipped.len();
        flipped[n - 10] ^= 0x04;
        let flipped = preallocated(flipped);
        assert_eq!(
            classify_tail(&flipped, first_invalid(&flipped)),
            Tail::Corrupt { next: None }
        );
        let mut bad_length = whole.clone();
        bad_length[last_start..last_start + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        let bad_length = preallocated(bad_length);
        assert_eq!(first_invalid(&bad_length), last_start);
        assert_eq!(classify_tail(&bad_length, last_start), Tail::Corrupt { next: None });
        let mut torn = whole.clone();
        let boundary = last_start.div_ceil(SECTOR) * SECTOR;
        torn[boundary..].fill(0);
        let torn = preallocated(torn);
        assert_eq!(classify_tail(&torn, last_start), Tail::Torn);
    }

    #[test]
    fn decoding_past_damage_returns_every_whole_record_after_it_and_whose_record_it_was() {
        let records: Vec<_> = (0..5).map(|i| record(i, &[0x77; 300])).collect();
        let mut data = segment(&records);
        let third = SEGMENT_HEADER_LEN + records[0].encode().len() + records[1].encode().len();
        data[third + 100] ^= 0x01;
        let at = first_invalid(&data);
        assert_eq!(at, third);
        let (after, damage) = decode_past_damage(&data, at, "CRC".into());
        assert_eq!(after, records[3..].to_vec());
        assert_eq!(damage.len(), 1);
        assert_eq!(damage[0].next, Some(third + records[2].encode().len()));
        assert_eq!(damage[0].suspect, Some((StreamId(2), StreamEpoch(1), 20, 30)));
    }

    proptest! {
        /// A flipped bit in any record but the newest is corruption with the next whole
        /// record found: cutting there would drop acknowledged records.
        #[test]
        fn damage_before_the_newest_record_is_never_a_torn_tail(
            n in 2u64..8, flip in any::<prop::sample::Index>(), bit in 0u8..8, size in 1usize..900,
        ) {
            let records: Vec<_> = (0..n).map(|i| record(i, &vec![0x5a ^ i as u8; size])).collect();
            let mut data = segment(&records);
            let newest = data.len() - records[records.len() - 1].encode().len();
            let at = SEGMENT_HEADER_LEN + flip.index(newest - SEGMENT_HEADER_LEN);
            data[at] ^= 1 << bit;
            let first = first_invalid(&data);
            let tail = classify_tail(&data, first);
            prop_assert!(matches!(tail, Tail::Corrupt { next: Some(_) }), "{:?}", tail);
        }
    }

    // RR-WAL-6: the format is checked before decoding.
    #[test]
    fn foreign_and_future_segments_are_refused() {
        // RR-WAL-6: a segment without the WAL's format identifier is refused before decoding.
        assert!(matches!(decode_segment(b"garbage!"), Err(DecodeError::UnknownFormat)));
        let mut data = segment(&[record(1, b"x")]);
        data[7] = WAL_VERSION + 1;
        let err = decode_segment(&data).unwrap_err().to_string();
        // RR-WAL-6: an unknown version fails with the instruction to recreate the state.
        assert!(err.contains("must be recreated"), "{err}");
    }

    proptest! {
        /// Any corruption of a segment's records yields a prefix of the records and a torn
        /// end, never a record that was not written.
        #[test]
        fn corruption_never_yields_unwritten_records(n in 1u64..8, flip in any::<prop::sample::Index>(), bit in 0u8..8) {
            let records: Vec<_> = (0..n).map(|i| record(i, &[i as u8; 13])).collect();
            let mut data = segment(&records);
            let at = SEGMENT_HEADER_LEN + flip.index(data.len() - SEGMENT_HEADER_LEN);
            data[at] ^= 1 << bit;
            let (got, end) = decode_segment(&data).unwrap();
            prop_assert!(got.len() < records.len());
            prop_assert_eq!(&got[..], &records[..got.len()]);
            let torn = matches!(end, SegmentEnd::Invalid { .. });
            prop_assert!(torn);
        }

        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn arbitrary_bytes_never_panic(mut data in prop::collection::vec(any::<u8>(), 0..512)) {
            if data.len() >= 8 {
                data[..8].copy_from_slice(&segment_header());
            }
            let _ = decode_segment(&data);
        }
    }
}
