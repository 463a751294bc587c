//! The write-ahead log of one streamd incarnation: appends are acknowledged only once
//! durable, and a WAL taken over by another process acknowledges nothing more (INV-7).
//! Two backends: segment files in a per-incarnation directory on a shared volume
//! (`file`), or segment objects written with put-if-absent (`object`).

pub mod file;
pub mod object;
pub mod record;
pub mod writer;

pub use record::WalRecord;
pub use writer::WalWriter;

/// What a takeover read from a WAL: every whole record, in order, and the damage found
/// between them (issue 20). Damage never cuts what follows it: the records after it are
/// here, and the takeover marks the streams it lost records of.
#[derive(Debug, Default)]
pub struct Replay {
    pub records: Vec<WalRecord>,
    pub damage: Vec<WalDamage>,
}

/// Damage in one WAL segment or object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalDamage {
    /// Which segment or object, and where in it.
    pub place: String,
    pub damage: record::Damage,
}

impl std::fmt::Display for WalDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}: {}", self.place, self.damage.at, self.damage.reason)
    }
}

/// Why a WAL operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalError {
    /// The WAL was taken over: this writer must acknowledge nothing more and stop.
    #[error("write-ahead log was taken over (fenced)")]
    Fenced,
    /// Over `--wal-max-bytes`; retry once uploads reclaim space.
    #[error("write-ahead log holds {0} bytes, over its limit")]
    Full(u64),
    #[error("write-ahead log I/O failed: {0}")]
    Io(String),
    #[error("write-ahead log is corrupt: {0}")]
    Corrupt(String),
}

/// Sequence number of a segment (file or object) within one incarnation's WAL.
pub type SegmentId = u64;

/// The WAL backend a node writes to.
pub enum Sink {
    File(file::FileSink),
    Object(object::ObjectSink),
}

impl Sink {
    /// Makes `group` (whole encoded records) durable; returns the segment holding it.
    pub async fn persist(&mut self, group: bytes::Bytes) -> Result<(SegmentId, u64), WalError> {
        match self {
            Sink::File(f) => f.persist(group).await,
            Sink::Object(o) => o.persist(group).await,
        }
    }

    /// The writer stopped: gives back the disk a file WAL holds ahead (its preallocated
    /// tail and the prepared next segment). Nothing written is removed.
    pub async fn close(&mut self) {
        if let Sink::File(f) = self {
            f.close().await;
        }
    }

    /// Deletes a segment whose records are all committed in data objects.
    pub async fn delete(&mut self, segment: SegmentId) -> Result<(), WalError> {
        match self {
            Sink::File(f) => f.delete(segment).await,
            Sink::Object(o) => o.delete(segment).await,
        }
    }

    /// The segment reclaim must keep: the file being written, or the newest WAL object,
    /// whose key is how a takeover finds where the writer is and fences above it.
    pub fn boundary_segment(&self) -> Option<SegmentId> {
        match self {
            Sink::File(f) => f.active_segment(),
            Sink::Object(o) => o.newest_segment(),
        }
    }
}
