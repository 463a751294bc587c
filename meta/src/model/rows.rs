//! The rows of the metadata state and of the object index. Field names are part of the
//! stored format (`codec::FORMAT_VERSION`): rename only with a format bump.

use serde::{Deserialize, Serialize};
use weir_shared::ids::{Epoch, Incarnation, NodeId, ObjectKey, Offset, StreamEpoch, StreamId};

/// What kind of service a node row describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    Metad,
    Streamd,
    Gatewayd,
}

/// Where a node can be reached.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddrs {
    /// gRPC (data plane for streamd, client API for metad).
    pub grpc: String,
    /// HTTP (health, admin, metrics).
    pub http: String,
}

/// Who set a node's cordon; a drain releases only the cordon it set itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CordonBy {
    Operator,
    Drain,
}

/// One node's current incarnation and liveness counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRow {
    pub id: NodeId,
    pub kind: NodeKind,
    /// Registration incarnation; strictly increasing (FO-LIV-10).
    pub epoch: Epoch,
    pub addrs: NodeAddrs,
    /// Heartbeats applied since this incarnation registered (FO-LIV-2).
    pub heartbeats: u64,
    /// Log index of the registration and of the last heartbeat.
    pub registered_index: u64,
    pub last_heartbeat_index: u64,
    pub fenced: bool,
    /// Log index at which the fence applied.
    pub fenced_index: Option<u64>,
    pub cordon: Option<CordonBy>,
    /// Set by a stopping incarnation (D-4); cleared by re-registration.
    pub terminating: bool,
    /// Set when this incarnation released its drain cordon: a drain it asked for whose
    /// request arrives late does not cordon it again. Cleared by re-registration.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain_released: bool,
}

impl NodeRow {
    pub fn incarnation(&self) -> Incarnation {
        Incarnation {
            node: self.id.clone(),
            epoch: self.epoch,
        }
    }

    /// Registered at its current epoch and not fenced.
    pub fn is_live(&self) -> bool {
        !self.fenced
    }

    /// May receive new streams: live, not terminating, not cordoned.
    pub fn is_schedulable(&self) -> bool {
        self.is_live() && !self.terminating && self.cordon.is_none()
    }
}

/// A stream's lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamState {
    /// Not being written; may be placed on an owner that has not opened it yet.
    Closed,
    /// Opened by its owner at `epoch`.
    Open,
    /// Deleted; its data is reclaimed and the row removed once nothing references it.
    Deleted,
}

/// Per-stream configuration (a topic's is copied to each of its partitions).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamConfig {
    /// Committed ranges whose newest record is older than this are trimmed by the
    /// owner; `None` keeps everything (Kafka's `retention.ms`).
    pub retention_ms: Option<u64>,
    /// The oldest committed ranges are trimmed while the rest still hold at least this
    /// many bytes (Kafka's `retention.bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_bytes: Option<u64>,
    /// Largest record batch a producer may send; `None` is the gateway's default
    /// (Kafka's `max.message.bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<u64>,
    /// Kafka's `segment.bytes`: kept and shown, advisory only (objects are cut by the
    /// uploader and compaction, not by segment size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_bytes: Option<u64>,
    /// Kafka's `compression.type` when not `producer`: the codec the gateway stores a
    /// Kafka producer's batches in, recompressing those sent in another (`uncompressed`,
    /// `gzip`, `snappy`, `lz4` or `zstd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression_type: Option<String>,
    /// Kafka's `delete.retention.ms`: kept and shown, advisory only (it times tombstones
    /// of compacted topics, and Weir has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_retention_ms: Option<u64>,
}

/// A stream's config, boxed only when it is not the default: most streams have none of
/// their own, and every view holds every stream's row (issue 57). Reads as the config
/// it holds; stored and sent as that config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamConfigBox(Option<Box<StreamConfig>>);

/// The config of a stream that has none of its own.
static DEFAULT_CONFIG: StreamConfig = StreamConfig {
    retention_ms: None,
    retention_bytes: None,
    max_message_bytes: None,
    segment_bytes: None,
    compression_type: None,
    delete_retention_ms: None,
};

impl std::ops::Deref for StreamConfigBox {
    type Target = StreamConfig;

    fn deref(&self) -> &StreamConfig {
        self.0.as_deref().unwrap_or(&DEFAULT_CONFIG)
    }
}

impl From<StreamConfig> for StreamConfigBox {
    fn from(config: StreamConfig) -> Self {
        Self((config != DEFAULT_CONFIG).then(|| Box::new(config)))
    }
}

impl Serialize for StreamConfigBox {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for StreamConfigBox {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        StreamConfig::deserialize(d).map(Self::from)
    }
}

/// `max_timestamp` of ranges committed before ranges carried one: unknown, so age-based
/// retention keeps them.
pub const NO_TIMESTAMP: i64 = -1;

/// Serde default of `max_timestamp` fields.
pub fn no_timestamp_default() -> i64 {
    NO_TIMESTAMP
}

/// A contiguous range of one stream's records stored in a data object: a row of the
/// object index, never of the view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRange {
    pub key: ObjectKey,
    /// First offset in the range, and the offset after the last.
    pub start: Offset,
    pub end: Offset,
    /// Byte position and length of the range inside the object.
    pub pos: u64,
    pub len: u64,
    /// CRC-32C of the range's bytes.
    pub crc: u32,
    /// Newest record timestamp in the range (ms since the epoch), for `retention.ms`.
    #[serde(default = "no_timestamp_default")]
    pub max_timestamp: i64,
    /// The transactions as the range leaves them, for `read_committed` readers and a
    /// new owner (issue 23). Empty in ranges without transactional data, and in ranges
    /// committed before it existed.
    #[serde(default, skip_serializing_if = "RangeTxns::is_empty")]
    pub txns: RangeTxns,
}

/// An aborted transaction: `read_committed` readers drop the producer's batches from
/// `first_offset` up to its abort marker at `last_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: u64,
    pub last_offset: u64,
}

/// A committed range's summary of the transactions in its stream (design 0005): small,
/// kept in the object index beside the range, merged by compaction and dropped by
/// retention with it, so it grows with aborts and open transactions, never with
/// uploads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeTxns {
    /// The last stable offset at the range's end: the first offset of the oldest
    /// transaction still open there, none when none is. A reader looking for aborts
    /// that overlap offsets below `x` stops after the first range ending at or past `x`
    /// whose value is none or at least `x`: every transaction begun below `x` ended
    /// before it. A value may
    /// be lower than the exact one (compaction cuts inside a range), never higher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lso_at_end: Option<u64>,
    /// The aborted transactions whose markers lie in the range, in offset order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aborted: Vec<AbortedTxn>,
}

impl RangeTxns {
    pub fn is_empty(&self) -> bool {
        self.lso_at_end.is_none() && self.aborted.is_empty()
    }

    /// Whether the summary fits the range `[start, end)` it is carried with: every
    /// marker inside it, every abort's data before its marker, the LSO at most `end`.
    pub fn fits(&self, start: u64, end: u64) -> bool {
        self.lso_at_end.is_none_or(|l| l <= end)
            && self
                .aborted
                .iter()
                .all(|a| a.first_offset <= a.last_offset && (start..end).contains(&a.last_offset))
    }
}

/// One stream (an HTTP stream, or one partition of a topic).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamRow {
    pub id: StreamId,
    /// HTTP stream name, or `topic/partition`.
    pub name: String,
    pub topic: Option<String>,
    pub partition: Option<u32>,
    pub state: StreamState,
    /// The incarnation that owns (or is placed to own) the stream.
    pub owner: Option<Incarnation>,
    /// Incremented on every open (INV-6).
    pub epoch: StreamEpoch,
    /// A planned transfer's target node.
    pub transfer_target: Option<NodeId>,
    /// The target's registration epoch when the transfer began: the hand-off is to
    /// that incarnation only (RR-INT-5). Absent in rows written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_target_epoch: Option<Epoch>,
    /// The log index of the `BeginTransfer` that set the mark: the transfer's operation
    /// id, so a discard clears exactly that transfer (RR-INT-4). Absent in older rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_op: Option<u64>,
    /// First retained offset.
    pub start_offset: Offset,
    /// Offset after the last record committed in data objects.
    pub committed_end: Offset,
    /// How many ranges have been committed to the stream (its ranges themselves are in
    /// the object index, design 0002); readers' caches compare it.
    #[serde(default)]
    pub commits: u64,
    /// Bytes of the committed ranges the index holds for the stream (`retention.bytes`).
    #[serde(default)]
    pub bytes: u64,
    pub config: StreamConfigBox,
    /// Damage found in the stream's committed data; reads of it are refused until an
    /// operator acts (issue 20).
    /// Boxed: rare, and as large as the rest of the row's fixed fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damage: Option<Box<StreamDamage>>,
    /// Where each recent open's Kafka leader epoch starts (issue 22,
    /// [`super::leader_epochs`]); pruned below the start offset and capped. Absent in
    /// rows written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leader_epochs: Vec<EpochStart>,
}

/// Where one open's Kafka leader epoch starts ([`super::leader_epochs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStart {
    pub leader_epoch: i32,
    pub stream_epoch: StreamEpoch,
    pub start: Offset,
}

impl StreamRow {
    /// A new stream: closed, placed nowhere, at epoch 0, empty.
    pub fn new(id: StreamId, name: String, topic: Option<(&str, u32)>, config: &StreamConfig) -> Self {
        StreamRow {
            id,
            name,
            topic: topic.map(|(t, _)| t.to_string()),
            partition: topic.map(|(_, p)| p),
            state: StreamState::Closed,
            owner: None,
            epoch: StreamEpoch(0),
            transfer_target: None,
            transfer_target_epoch: None,
            transfer_op: None,
            start_offset: Offset(0),
            committed_end: Offset(0),
            commits: 0,
            bytes: 0,
            config: config.clone().into(),
            damage: None,
            leader_epochs: vec![],
        }
    }

    /// Ends a planned transfer's mark, whatever ended it.
    pub fn clear_transfer(&mut self) {
        self.transfer_target = None;
        self.transfer_target_epoch = None;
        self.transfer_op = None;
    }
}

/// Damaged committed data of a stream: an object range that fails its checksum or is
/// not what the index says. Reads of `from..until` are refused with `corrupt`, naming
/// `what`, and reads from below stop at `from`, until an operator restores the data or
/// trims past `until`; either remedy leaves no hole above the start offset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamDamage {
    /// First damaged offset.
    pub from: Offset,
    /// Offset after the damaged range.
    pub until: Offset,
    /// What is damaged and how, as the finder saw it (object key, range, reason).
    pub what: String,
    /// The incarnation that found it.
    pub found_by: String,
}

/// A Kafka topic: one stream per partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRow {
    pub name: String,
    /// Kafka topic id (UUID bytes), derived from the creating log index.
    pub topic_id: [u8; 16],
    pub partitions: Vec<StreamId>,
    pub config: StreamConfig,
}

/// A data object committed to the log, with the streams that reference it: a row of the
/// object index, never of the view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRow {
    pub key: ObjectKey,
    pub size: u64,
    pub committed_index: u64,
    pub streams: Vec<StreamId>,
}

/// A named lease; decides which metad runs a loop, never whether it is correct.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRow {
    pub name: String,
    pub holder: Incarnation,
    /// Incremented on every change of holder.
    pub generation: u64,
    pub acquired_index: u64,
    pub renewed_index: u64,
}

/// Progress of a WAL takeover of a fenced or replaced incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TakeoverState {
    /// Recorded; waiting for an agent to replay and upload.
    Pending,
    /// The agent reported every record uploaded and committed.
    Recovered,
    /// The dead incarnation's open streams are closed; nothing left to do.
    Done,
}

/// A WAL takeover: `(dead node, dead epoch)` recovered by `agent`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeoverRow {
    pub dead: Incarnation,
    pub agent: Option<Incarnation>,
    pub state: TakeoverState,
}

/// An API token; only a hash of its secret is stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRow {
    pub name: String,
    /// Hex SHA-256 of the secret.
    pub secret_sha256: String,
    pub scopes: Vec<String>,
    pub revoked: bool,
    pub issued_index: u64,
    /// When the token stops authenticating (Unix ms); never without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// Salted SCRAM keys of the secret, when issued with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scram: Option<crate::scram::ScramCredentials>,
}

impl TokenRow {
    /// Why the token may not authenticate at `now_ms` (Unix ms), if it may not.
    pub fn refusal(&self, now_ms: u64) -> Option<String> {
        if self.revoked {
            return Some(format!("token '{}' is revoked", self.name));
        }
        match self.expires_at_ms {
            Some(at) if now_ms >= at => Some(format!("token '{}' expired at {at} (Unix ms)", self.name)),
            _ => None,
        }
    }
}

/// Hex SHA-256 of a token secret: what a token row stores and every check compares.
pub fn secret_sha256(secret: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The wall clock in Unix ms, which token expiry is judged against.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Settings fixed at bootstrap and shared by the whole cluster (D-18).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSettings {
    pub heartbeat_interval_sec: u64,
    pub node_timeout_sec: u64,
}

impl ClusterSettings {
    /// FO-LIV-4/5: holder heartbeats without a node heartbeat before the node is dead.
    pub fn missed_heartbeats_threshold(&self) -> u64 {
        self.node_timeout_sec.div_ceil(self.heartbeat_interval_sec)
    }
}

/// Monotonic allocators.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub next_stream_id: u64,
    /// Next Kafka producer id to hand out (allocated in blocks).
    pub next_producer_id: i64,
    /// The highest epoch of a node row reaped (`ReapNode`): a node id registering
    /// without a row starts above it, so no id's epochs ever go back (FO-LIV-10).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reaped_epoch_floor: u64,
    /// What reaped gateway rows added to `leader_epochs::gateway_changes`, which must
    /// never go back (issue 22).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retired_gateway_changes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::{AbortedTxn, ObjectRange, RangeTxns, TokenRow};

    // Issue 23: a range's transaction summary is stored only when it says something,
    // rows written before it read as "nothing open, no aborts", and metad takes only
    // a summary that fits its range.
    #[test]
    fn a_range_summary_is_optional_in_stored_rows_and_must_fit_its_range() {
        let plain = r#"{"key":"data/a","start":10,"end":20,"pos":0,"len":5,"crc":1,"max_timestamp":7}"#;
        let old: ObjectRange = serde_json::from_str(plain).expect("a row from before summaries");
        assert_eq!(old.txns, RangeTxns::default());
        assert_eq!(
            serde_json::to_string(&old).expect("json"),
            plain,
            "an empty summary is not stored"
        );
        let abort = |first, last| AbortedTxn {
            producer_id: 7,
            first_offset: first,
            last_offset: last,
        };
        let summary = RangeTxns {
            lso_at_end: Some(4),
            aborted: vec![abort(2, 15)],
        };
        let with = ObjectRange {
            txns: summary.clone(),
            ..old
        };
        let back: ObjectRange = serde_json::from_str(&serde_json::to_string(&with).expect("json")).expect("decode");
        assert_eq!(back.txns, summary);
        assert!(summary.fits(10, 20));
        assert!(!summary.fits(16, 20), "its marker at 15 is outside");
        assert!(
            !RangeTxns {
                lso_at_end: Some(21),
                aborted: vec![]
            }
            .fits(10, 20),
            "an LSO past the end"
        );
        assert!(
            !RangeTxns {
                lso_at_end: None,
                aborted: vec![abort(16, 15)]
            }
            .fits(10, 20),
            "data after its marker"
        );
    }

    #[test]
    fn a_token_is_refused_once_revoked_or_from_its_expiry_on() {
        let token = |revoked, expires_at_ms| TokenRow {
            name: "t".into(),
            secret_sha256: String::new(),
            scopes: Vec::new(),
            revoked,
            issued_index: 1,
            expires_at_ms,
            scram: None,
        };
        assert_eq!(token(false, None).refusal(u64::MAX), None, "no expiry: never");
        assert_eq!(token(false, Some(1_000)).refusal(999), None);
        let expired = token(false, Some(1_000)).refusal(1_000).expect("refused at its expiry");
        assert!(expired.contains("expired at 1000"), "{expired}");
        let revoked = token(true, Some(1_000)).refusal(0).expect("revoked before its expiry");
        assert!(revoked.contains("revoked"), "{revoked}");
    }
}
