//! Commands proposed to the metadata log, who proposes them, and what applying one yields.

use super::rows::*;
use serde::{Deserialize, Serialize};
use std::fmt;
use weir_shared::ids::{Epoch, Incarnation, NodeId, ObjectKey, Offset, StreamEpoch, StreamId};

/// Who proposed a command. Node commands are checked against the proposer's
/// incarnation at apply (FO-FEN-4, FO-FEN-5); operator commands carry the caller's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proposer {
    Node(Incarnation),
    Operator { principal: String },
}

impl fmt::Display for Proposer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Proposer::Node(i) => write!(f, "node {i}"),
            Proposer::Operator { principal } => write!(f, "operator {principal}"),
        }
    }
}

/// One entry of the metadata log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub proposer: Proposer,
    pub command: Command,
}

/// One committed-object range in a `CommitObjects`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRange {
    pub stream: StreamId,
    /// The stream epoch the records were written at; must be the stream's current one.
    pub stream_epoch: StreamEpoch,
    pub start: Offset,
    pub end: Offset,
    pub pos: u64,
    pub len: u64,
    /// CRC-32C of the range's bytes, checked by readers.
    pub crc: u32,
    /// Newest record timestamp in the range (ms), for `retention.ms`.
    #[serde(default = "super::rows::no_timestamp_default")]
    pub max_timestamp: i64,
    /// The transactions as the range leaves them (issue 23).
    #[serde(default, skip_serializing_if = "super::rows::RangeTxns::is_empty")]
    pub txns: super::rows::RangeTxns,
}

/// One range a compaction replaces, exactly as the compactor read it from the index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplacedRange {
    pub start: Offset,
    pub end: Offset,
    pub key: ObjectKey,
}

impl From<&ObjectRange> for ReplacedRange {
    /// The range as the compactor read it from the index.
    fn from(r: &ObjectRange) -> Self {
        Self {
            start: r.start,
            end: r.end,
            key: r.key.clone(),
        }
    }
}

/// A per-stream object a compaction wrote, and the one range of the stream it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactedObject {
    pub size: u64,
    /// Its `key` is the object's key.
    pub range: ObjectRange,
}

/// An object a `CompactStreams` wrote; its ranges are in the swaps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewObject {
    pub key: ObjectKey,
    pub size: u64,
}

/// One stream's part of a `CompactStreams`: a contiguous run of its ranges exactly as
/// the compactor read them, and the new ranges (in the command's objects) covering the
/// same offsets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSwap {
    pub stream: StreamId,
    pub replaced: Vec<ReplacedRange>,
    pub ranges: Vec<ObjectRange>,
}

/// Most items one batch command (`PlaceStreams`, `OpenStreams`, `CloseStreams`,
/// `BeginTransfers`)
/// carries, so no log entry or reply grows with the number of streams.
pub const MAX_BATCH: usize = 1_000;

/// One placement of a `PlaceStreams`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub stream: StreamId,
    pub node: NodeId,
}

/// One transfer of a `BeginTransfers`: the stream, at the epoch it was read, to `target`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferTo {
    pub stream: StreamId,
    pub stream_epoch: StreamEpoch,
    pub target: NodeId,
}

/// A stream at the stream epoch a command was made at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamAt {
    pub stream: StreamId,
    pub stream_epoch: StreamEpoch,
}

/// What an `AlterConfig` changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfigTarget {
    Topic(String),
    Stream(String),
}

/// The commands of the metadata log. Variant and field names are stored format.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Command {
    /// Fixes the cluster's heartbeat timing; applies once (FO-LIV-13, D-18).
    InitCluster {
        settings: ClusterSettings,
    },
    /// Registers a new incarnation of `node` at an epoch above every earlier one (FO-LIV-10).
    RegisterNode {
        node: NodeId,
        kind: NodeKind,
        addrs: NodeAddrs,
        /// The registering node's timing; refused unless equal to the cluster's (FO-LIV-14).
        heartbeat_interval_sec: u64,
        node_timeout_sec: u64,
    },
    /// Increments the proposer's heartbeat count (FO-LIV-2).
    Heartbeat,
    /// Fences `node` at `epoch` only if its row still shows `seen_heartbeats` (FO-FEN-1, FO-FEN-2).
    FenceNode {
        node: NodeId,
        epoch: Epoch,
        seen_heartbeats: u64,
    },
    /// The proposer fences itself, unconditionally (FO-FEN-3).
    FenceSelf,
    /// Removes the row of `node`, fenced at `epoch`, once nothing refers to any of its
    /// incarnations (no stream, no takeover under way): rows of nodes long gone do not
    /// stay in the view for ever. Its takeover rows go with it.
    ReapNode {
        node: NodeId,
        epoch: Epoch,
    },
    /// The proposer is stopping (D-4).
    MarkTerminating,
    Cordon {
        node: NodeId,
        by: CordonBy,
    },
    /// Removes a cordon; `by` must match who set it unless the operator forces it.
    Uncordon {
        node: NodeId,
        by: CordonBy,
    },
    CreateTopic {
        name: String,
        partitions: u32,
        config: StreamConfig,
    },
    /// Deletes topic `name`; when `topic_id` is given, only that incarnation of it, so
    /// a proposal that lands late (its caller gave up and the topic was recreated since)
    /// deletes nothing it did not mean to.
    DeleteTopic {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic_id: Option<[u8; 16]>,
    },
    /// Grows a topic to `partitions` in all.
    CreatePartitions {
        name: String,
        partitions: u32,
    },
    CreateStream {
        name: String,
        config: StreamConfig,
    },
    /// Deletes stream `name`; when `id` is given, only that incarnation of it (as
    /// [`Command::DeleteTopic`]).
    DeleteStream {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<StreamId>,
    },
    /// Assigns a closed stream to a live node, which then opens it.
    PlaceStream {
        stream: StreamId,
        node: NodeId,
    },
    /// Places many closed streams at once (D-23), each exactly as `PlaceStream` would,
    /// each its own compare-and-set: one that no longer holds is refused alone and the
    /// others apply. At most [`MAX_BATCH`] placements.
    PlaceStreams {
        placements: Vec<Placement>,
    },
    /// Starts a planned transfer of an open stream to `target` (SD-DRN-2): the owner's
    /// close then hands the stream to `target` in the same entry.
    BeginTransfer {
        stream: StreamId,
        stream_epoch: StreamEpoch,
        target: NodeId,
    },
    /// Starts planned transfers of many open streams at once (D-23), each exactly as
    /// `BeginTransfer` would; the entry's log index is each transfer's operation id. At
    /// most [`MAX_BATCH`] transfers.
    BeginTransfers {
        transfers: Vec<TransferTo>,
    },
    /// Ends a planned transfer that did not happen; the stream stays where it is (SD-DRN-7).
    CancelTransfer {
        stream: StreamId,
        stream_epoch: StreamEpoch,
    },
    /// RR-INT-4: the metadata leader discards a transfer's mark whose coordinator is
    /// gone; `op` is the log index of the transfer's `BeginTransfer`, `reason` says why.
    DiscardTransfer {
        stream: StreamId,
        op: u64,
        reason: String,
    },
    /// The placed owner opens the stream at its epoch + 1 (INV-6). An owner that stamps
    /// Kafka leader epochs into its batches says so, and only then is where this open's
    /// epoch starts recorded (issue 22): an older owner's batches carry whatever the
    /// producer wrote, which no recorded epoch may claim. Absent in older entries, and
    /// never recorded for them, so replicas of every release apply them alike.
    OpenStream {
        stream: StreamId,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stamps_leader_epochs: bool,
    },
    /// The placed owner opens many streams at once (D-23), each exactly as
    /// `OpenStream` would; refused whole only when the proposer is not live. At most
    /// [`MAX_BATCH`] streams.
    OpenStreams {
        streams: Vec<StreamId>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stamps_leader_epochs: bool,
    },
    /// The owner closes the stream after committing everything it acknowledged.
    CloseStream {
        stream: StreamId,
        stream_epoch: StreamEpoch,
    },
    /// Closes many streams at once (D-23), each exactly as `CloseStream` would. At
    /// most [`MAX_BATCH`] streams.
    CloseStreams {
        streams: Vec<StreamAt>,
    },
    /// Makes an uploaded data object visible, from the owner at the current stream epoch,
    /// each range starting exactly at the stream's committed end.
    CommitObjects {
        key: ObjectKey,
        size: u64,
        ranges: Vec<CommitRange>,
    },
    /// Advances the stream's start offset to `start` (retention, DeleteRecords, HTTP
    /// trim); never moves it back. Ranges wholly below it leave the object index, and
    /// objects no stream references any more leave it too (GC then deletes them).
    TrimStream {
        stream: StreamId,
        start: Offset,
    },
    /// Replaces `replaced`, a contiguous run of the stream's ranges, by the ranges of
    /// `objects`, which cover exactly the same offsets (D-20). Compare-and-set: it
    /// applies only while every replaced range is in the index as read, so a stale or
    /// overlapping compaction changes nothing. Objects left without a stream leave the
    /// index (GC deletes them after its grace period).
    CompactObjects {
        stream: StreamId,
        replaced: Vec<ReplacedRange>,
        objects: Vec<CompactedObject>,
    },
    /// A compaction pass's batch over many streams at once: new objects, each holding
    /// ranges of one or more streams, and each stream's swap. Every swap is its own
    /// compare-and-set: one whose ranges changed (a trim, a takeover's commits, another
    /// compaction) is skipped and the others apply. Refused whole when no swap applies.
    CompactStreams {
        objects: Vec<NewObject>,
        swaps: Vec<StreamSwap>,
    },
    /// Replaces the configuration of a topic (and of each of its partitions) or of a
    /// stream. With `expected`, only if the config is still the one its proposer read,
    /// and, with `topic_id`, still of that topic rather than one recreated since under
    /// the same name (compare-and-set): an alter that lands late (its answer lost, its
    /// proposal held on a slow link) never undoes a newer change, and two
    /// read-modify-writes never lose one another's update. Both compare state that
    /// every release keeps alike.
    AlterConfig {
        target: ConfigTarget,
        config: StreamConfig,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expected: Option<StreamConfig>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic_id: Option<[u8; 16]>,
    },
    /// Takes lease `name` if its holder is still `expected` (compare-and-set).
    AcquireLease {
        name: String,
        expected: Option<Incarnation>,
    },
    /// The holder renews its lease.
    RenewLease {
        name: String,
    },
    IssueToken {
        name: String,
        secret_sha256: String,
        scopes: Vec<String>,
        /// When the token stops authenticating (Unix ms); never without. Judged by
        /// the gateway's clock at each request, never when the entry is applied.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at_ms: Option<u64>,
        /// The secret's SCRAM credentials (SASL/SCRAM-SHA-256 and -512); tokens
        /// issued before SCRAM existed have none and authenticate with PLAIN only.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scram: Option<crate::scram::ScramCredentials>,
    },
    RevokeToken {
        name: String,
    },
    /// Sets (or, with `scram` absent, removes) the SCRAM credential of one mechanism
    /// (`SCRAM-SHA-256`, `SCRAM-SHA-512`) of token `name`: Kafka's
    /// AlterUserScramCredentials, where a token is a user (issue 59).
    SetScramCredential {
        name: String,
        mechanism: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scram: Option<crate::scram::ScramCredential>,
    },
    /// Adds ACLs (Kafka's CreateAcls, issue 59); one already there is left as it is.
    CreateAcls {
        bindings: Vec<crate::model::acls::AclBinding>,
    },
    /// Removes every ACL that matches one of `filters` (Kafka's DeleteAcls); answers
    /// [`Applied::AclsDeleted`].
    DeleteAcls {
        filters: Vec<crate::model::acls::AclFilter>,
    },
    /// Sets and removes client quotas of one entity (Kafka's AlterClientQuotas, issue 59).
    AlterClientQuotas {
        entity: crate::model::quotas::QuotaEntity,
        #[serde(default)]
        set: std::collections::BTreeMap<crate::model::quotas::QuotaKey, crate::model::quotas::QuotaValue>,
        #[serde(default)]
        remove: Vec<crate::model::quotas::QuotaKey>,
    },
    /// Allocates `count` Kafka producer ids.
    AllocateProducerIds {
        count: u32,
    },
    /// Removes a deleted stream's row once its data is reclaimed.
    DestroyStream {
        stream: StreamId,
    },
    /// GC deleted the objects released at or below log index `through` from the bucket:
    /// they leave the released-objects log (D-23).
    ForgetReleased {
        through: u64,
    },
    /// Records that `agent` recovers the WAL of the fenced or replaced `(node, epoch)`.
    BeginTakeover {
        node: NodeId,
        epoch: Epoch,
        agent: NodeId,
    },
    /// The agent has uploaded and committed every record of the taken-over WAL.
    CompleteTakeover {
        node: NodeId,
        epoch: Epoch,
    },
    /// A streamd found the stream's committed data in `from..until` damaged; the
    /// stream is marked damaged (the earliest damage is kept) until an operator acts.
    ReportDamage {
        stream: StreamId,
        from: Offset,
        until: Offset,
        what: String,
    },
    /// An operator's remedy for a damaged stream, recorded in the log as its audit.
    ResolveDamage {
        stream: StreamId,
        remedy: DamageRemedy,
    },
}

/// How an operator resolves a damaged stream; neither leaves a hole above the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DamageRemedy {
    /// The damaged object was put back: the mark is cleared, and the owner reads the
    /// range again, reporting it anew if it is still damaged.
    Restored,
    /// The start offset moves past the damage, dropping everything below it.
    TrimPast,
}

impl Command {
    /// An open by an owner that stamps no leader epochs: the plans' simulations of
    /// what the log would do, and tests.
    pub fn open(stream: StreamId) -> Command {
        Command::OpenStream {
            stream,
            stamps_leader_epochs: false,
        }
    }

    /// A short name for logs, metrics and the log dump.
    /// Whether applying this adds lasting state (a topic, streams, a token): what a
    /// replica under its disk's refuse mark refuses (issue 60). Heartbeats, failover,
    /// deletes, trims and the data path's commits go on, and deletes free space.
    pub fn adds_state(&self) -> bool {
        matches!(
            self,
            Command::CreateTopic { .. }
                | Command::CreatePartitions { .. }
                | Command::CreateStream { .. }
                | Command::IssueToken { .. }
        )
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Command::InitCluster { .. } => "init_cluster",
            Command::RegisterNode { .. } => "register_node",
            Command::Heartbeat => "heartbeat",
            Command::FenceNode { .. } => "fence_node",
            Command::FenceSelf => "fence_self",
            Command::ReapNode { .. } => "reap_node",
            Command::MarkTerminating => "mark_terminating",
            Command::Cordon { .. } => "cordon",
            Command::Uncordon { .. } => "uncordon",
            Command::CreateTopic { .. } => "create_topic",
            Command::DeleteTopic { .. } => "delete_topic",
            Command::CreatePartitions { .. } => "create_partitions",
            Command::CreateStream { .. } => "create_stream",
            Command::DeleteStream { .. } => "delete_stream",
            Command::PlaceStream { .. } => "place_stream",
            Command::PlaceStreams { .. } => "place_streams",
            Command::BeginTransfer { .. } => "begin_transfer",
            Command::BeginTransfers { .. } => "begin_transfers",
            Command::CancelTransfer { .. } => "cancel_transfer",
            Command::DiscardTransfer { .. } => "discard_transfer",
            Command::OpenStream { .. } => "open_stream",
            Command::OpenStreams { .. } => "open_streams",
            Command::CloseStream { .. } => "close_stream",
            Command::CloseStreams { .. } => "close_streams",
            Command::CommitObjects { .. } => "commit_objects",
            Command::TrimStream { .. } => "trim_stream",
            Command::CompactObjects { .. } => "compact_objects",
            Command::CompactStreams { .. } => "compact_streams",
            Command::AlterConfig { .. } => "alter_config",
            Command::AcquireLease { .. } => "acquire_lease",
            Command::RenewLease { .. } => "renew_lease",
            Command::IssueToken { .. } => "issue_token",
            Command::RevokeToken { .. } => "revoke_token",
            Command::SetScramCredential { .. } => "set_scram_credential",
            Command::CreateAcls { .. } => "create_acls",
            Command::DeleteAcls { .. } => "delete_acls",
            Command::AlterClientQuotas { .. } => "alter_client_quotas",
            Command::AllocateProducerIds { .. } => "allocate_producer_ids",
            Command::DestroyStream { .. } => "destroy_stream",
            Command::ForgetReleased { .. } => "forget_released",
            Command::BeginTakeover { .. } => "begin_takeover",
            Command::CompleteTakeover { .. } => "complete_takeover",
            Command::ReportDamage { .. } => "report_damage",
            Command::ResolveDamage { .. } => "resolve_damage",
        }
    }
}

/// What an applied command produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Applied {
    Done,
    Registered {
        epoch: Epoch,
    },
    StreamCreated {
        stream: StreamId,
    },
    TopicCreated {
        streams: Vec<StreamId>,
    },
    StreamOpened {
        stream_epoch: StreamEpoch,
        committed_end: Offset,
    },
    /// The stream's start offset after a trim.
    Trimmed {
        start: Offset,
    },
    LeaseHeld {
        generation: u64,
    },
    ProducerIds {
        first: i64,
        count: u32,
    },
    /// A `CompactStreams` applied, except for these streams' swaps, whose ranges had
    /// changed since the compactor read them.
    Compacted {
        skipped: Vec<StreamId>,
    },
    /// A `DeleteAcls` applied: the ACLs each filter removed, in the order of the filters
    /// (a binding two filters match is listed under the first).
    AclsDeleted {
        matched: Vec<Vec<crate::model::acls::AclBinding>>,
    },
    /// A batch command applied: each item's outcome, in the order of the items, as the
    /// single command would have had it.
    Each {
        outcomes: Vec<Outcome>,
    },
}

/// Why apply refused a command; the variants are how a caller reacts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectCode {
    /// The proposer's incarnation is fenced: it must stop.
    Fenced,
    /// The proposer's incarnation was replaced by a newer registration: it must stop.
    Superseded,
    /// The proposer is not registered.
    UnknownNode,
    NotFound,
    AlreadyExists,
    /// A compare-and-set found something else (FenceNode, leases, offsets).
    Conflict,
    /// The proposer does not own the stream, or not at that epoch.
    NotOwner,
    InvalidArgument,
    /// The cluster is not initialized yet; retry.
    NotReady,
}

/// A refused command. Apply is deterministic, so every replica refuses it the same way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct Rejection {
    pub code: RejectCode,
    pub message: String,
}

impl Rejection {
    pub fn new(code: RejectCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<RejectCode> for weir_shared::error_code::ErrorCode {
    /// The one mapping of a refusal to the system's error codes; HTTP, gRPC and Kafka
    /// answers follow from the code.
    fn from(code: RejectCode) -> Self {
        use weir_shared::error_code::ErrorCode as E;
        match code {
            // An incarnation the log fenced, replaced or does not know must stop.
            RejectCode::Fenced | RejectCode::Superseded | RejectCode::UnknownNode => E::Fenced,
            RejectCode::NotFound => E::NotFound,
            RejectCode::AlreadyExists => E::AlreadyExists,
            RejectCode::Conflict => E::Conflict,
            RejectCode::NotOwner => E::NotOwner,
            RejectCode::InvalidArgument => E::InvalidArgument,
            RejectCode::NotReady => E::Unavailable,
        }
    }
}

/// The result of applying one command.
pub type Outcome = Result<Applied, Rejection>;
