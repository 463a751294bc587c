//! The node: the streams it serves, and the tasks that keep them (reconciling
//! ownership with the view, uploading, heartbeating).

mod aborts;
mod append;
pub(crate) mod close;
pub mod compaction;
pub mod coordination;
pub mod core_api;
mod damage;
mod handles;
mod markers;
mod producers;
pub mod ranges;
mod read;
mod reconcile;
mod recovering_reads;
mod retention;
mod takeover;
mod uploader;

pub use read::Isolation;

use crate::object::cache::BlockCache;
use crate::object::pace::Pace;
use crate::object::range_reads::RangeReads;
use crate::stream::StreamHandle;
use crate::wal::WalWriter;
use object_store::ObjectStore;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use weir_meta::client::MetadClient;
use weir_meta::model::Proposer;
use weir_meta::registration::{self, Registered};
use weir_meta::view::View;
use weir_shared::ids::{Incarnation, StreamId};

pub use append::{Admitted, Appended};
pub use compaction::compaction_loop;
pub use markers::MarkerWritten;
pub use reconcile::reconcile_loop;
pub use retention::{retention_loop, Retention};
pub use takeover::{takeover_loop, WalSource};
pub use uploader::upload_loop;

/// Tunables of the data plane.
#[derive(Clone, Debug)]
pub struct Tunables {
    /// Upload at least this often while anything is buffered.
    pub upload_interval: Duration,
    /// Upload as soon as this many bytes are buffered.
    pub upload_bytes: u64,
    /// Re-put an object whose commit has been retried this long, so GC cannot have taken it.
    pub reupload_after: Duration,
    /// Largest append accepted.
    pub max_append_bytes: usize,
    /// Most members one consumer group admits (issue 19).
    pub max_group_members: usize,
    /// A classic group's first rebalance waits this for more members.
    pub group_initial_rebalance_delay: std::time::Duration,
    /// KIP-848 consumer groups' heartbeat interval and session timeout.
    pub consumer_heartbeat_interval: Duration,
    pub consumer_session_timeout: Duration,
    /// Most bytes one batch's compressed records may inflate to (issue 19).
    pub max_decompressed_bytes: usize,
    /// Committed bytes replayed at open to rebuild idempotent-producer state.
    pub producer_state_bytes: u64,
    /// Bytes of object ranges cached for reads.
    pub cache_bytes: u64,
    /// Size of the per-stream objects compaction writes.
    pub compaction_target_bytes: u64,
    /// How often compaction passes start, and the bytes per second they read and
    /// write at most (0: no limit).
    pub compaction_interval: Duration,
    pub compaction_max_bytes_per_sec: u64,
}

/// One streamd incarnation's data plane.
pub struct Node {
    pub me: Incarnation,
    pub metad: Arc<MetadClient>,
    pub view: Arc<View>,
    pub wal: WalWriter,
    /// Free space on the WAL, data and local object volumes (issue 60).
    pub disk: weir_shared::disk_space::DiskWatch,
    pub store: Arc<dyn ObjectStore>,
    pub cache: Arc<BlockCache>,
    /// Readers' GETs of committed ranges, shared and fetched ahead.
    pub range_reads: RangeReads,
    /// Compaction's reads and writes, at its rate.
    pub compaction_pace: Pace,
    /// Where committed offsets are stored: cached ranges of the object index.
    pub ranges: ranges::RangeCache,
    pub tunables: Tunables,
    /// The handles of the streams in use here; an open stream gets one on first use
    /// (`handles`), so an idle stream costs only its row in the view.
    streams: RwLock<HashMap<StreamId, Arc<StreamHandle>>>,
    /// Streams this incarnation stopped serving, at the stream epoch it served: not
    /// served at that epoch again while the view still shows it open here (a close
    /// that landed before the view applied it).
    stopped: std::sync::Mutex<HashMap<StreamId, weir_shared::ids::StreamEpoch>>,
    /// Passed the catch-up fence; serves nothing before.
    admitted: AtomicBool,
    /// Wakes the uploader early (buffer over threshold, or a close waiting).
    pub upload_now: Notify,
    /// The streams with buffered records not yet uploaded: what the uploader visits.
    pub(crate) uploads: uploader::UploadQueue,
    /// Cancelled when this incarnation is fenced or replaced: the process exits 75.
    pub fenced: CancellationToken,
    /// Shared with the registration: set before a clean stop's self-fence (SD-TD-1).
    self_fencing: Arc<AtomicBool>,
    /// Set at a stop request: readiness fails (SD-CS-2).
    pub terminating: AtomicBool,
    /// Cancelled in drain-support step 3: waiting reads end (SD-CS-4).
    pub reads_end: CancellationToken,
    /// Set in drain-support step 4: appends are refused as `unavailable` (retryable).
    pub intake_closed: AtomicBool,
    /// Where dead incarnations' WALs are taken over from.
    pub wal_source: WalSource,
    /// Takeovers this incarnation is running as agent.
    takeovers_running: std::sync::Mutex<std::collections::HashSet<Incarnation>>,
    /// The damage last seen marked on each served stream, to read a range again once
    /// an operator clears its mark.
    damage_seen: std::sync::Mutex<HashMap<weir_shared::ids::StreamId, weir_meta::model::StreamDamage>>,
    /// Damage reported and not yet in the view: (lowest start reported, when), so
    /// concurrent reads of one damaged range report and count it once.
    damage_reporting: Arc<std::sync::Mutex<HashMap<weir_shared::ids::StreamId, (u64, std::time::Instant)>>>,
    /// Work the node starts for one stream or takeover (closes, takeovers, group
    /// ticks), waited for at teardown.
    pub tasks: weir_shared::task_kinds::KindTasks,
    /// The tasks serving append streams: they end with their calls, and are never
    /// aborted, since an aborted one would end its call as if every append were answered.
    pub calls: tokio_util::task::TaskTracker,
    /// The coordinators above the core: admission asks them to verify a transactional
    /// write (KIP-890), and tells them of each marker written; registered once they
    /// exist (they hold the node).
    pub coordination: coordination::Coordination,
}

impl Node {
    pub fn new(
        registered: &Registered,
        wal: WalWriter,
        disk: weir_shared::disk_space::DiskWatch,
        store: Arc<dyn ObjectStore>,
        tunables: Tunables,
        wal_source: WalSource,
    ) -> Self {
        let cache = Arc::new(BlockCache::new(tunables.cache_bytes));
        let tasks = weir_shared::task_kinds::KindTasks::new();
        Self {
            me: registered.me.clone(),
            metad: registered.metad.clone(),
            view: registered.view.clone(),
            wal,
            disk,
            range_reads: RangeReads::new(store.clone(), cache.clone(), tasks.clone()),
            compaction_pace: Pace::new(
                tunables.compaction_max_bytes_per_sec,
                crate::metrics::metrics().compaction_paced_seconds.clone(),
            ),
            store,
            cache,
            ranges: ranges::RangeCache::new(ranges::CAPACITY),
            tunables,
            streams: RwLock::new(HashMap::new()),
            stopped: Default::default(),
            admitted: AtomicBool::new(false),
            upload_now: Notify::new(),
            uploads: Default::default(),
            // The registration's token: fenced there (heartbeat refused, own row) is fenced here.
            fenced: registered.fenced.clone(),
            self_fencing: registered.self_fencing.clone(),
            terminating: AtomicBool::new(false),
            reads_end: CancellationToken::new(),
            intake_closed: AtomicBool::new(false),
            wal_source,
            takeovers_running: Default::default(),
            damage_seen: Default::default(),
            damage_reporting: Default::default(),
            tasks,
            calls: tokio_util::task::TaskTracker::new(),
            coordination: Default::default(),
        }
    }

    /// A clean stop is about to fence this incarnation (SD-TD-1): from here on, a fenced
    /// row or a refused write is the expected end, not an error.
    pub fn fencing_self(&self) {
        self.self_fencing.store(true, Ordering::Release);
    }

    pub fn proposer(&self) -> Proposer {
        Proposer::Node(self.me.clone())
    }

    pub fn admit(&self) {
        self.admitted.store(true, Ordering::Release);
    }

    pub fn is_admitted(&self) -> bool {
        self.admitted.load(Ordering::Acquire)
    }

    /// Marks this incarnation fenced: every stream stops at once and the process exits 75.
    /// Logged as an error unless [`Node::fencing_self`] came first.
    pub fn fence(&self, why: &str) {
        if !self.fenced.is_cancelled() {
            registration::log_fenced(&self.me, why, &self.self_fencing);
        }
        self.fenced.cancel();
        for handle in self.all_streams() {
            handle.stop();
        }
    }
}
