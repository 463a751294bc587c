//! The write-ahead log of one streamd incarnation: appends are acknowledged only once
//! durable, and a WAL taken over by another process acknowledges nothing more (INV-7).
//! Two backends: segment files in a per-incarnation directory on a shared volume
//! (`file`), or segment objects written with put-if-absent (`object`).

mod direct;
pub mod file;
mod file_writer;
mod group_commit;
pub mod object;
mod object_writer;
pub mod record;
mod stall;
#[cfg(test)]
mod test_store;
pub mod writer;

pub use record::WalRecord;
pub use writer::{OnDurable, WalWriter};

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
    /// The WAL's volume is full (issue 60): nothing of the write was acknowledged, the
    /// writer retries it, and new appends are refused until it succeeds. Not a fence:
    /// the outcome is known (not written).
    #[error("write-ahead log volume is full: {0}")]
    NoSpace(String),
    /// A write waits for its store (a full volume, an object store refusing PUTs):
    /// new appends are refused until it goes through (issue 60). The reason says which.
    #[error("{0}")]
    Stalled(String),
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
