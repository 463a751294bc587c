//! Free space on the volumes a process writes (issue 60). Each volume has two marks:
//! below the alert mark the process says so (a gauge, a warning, `/ready` detail);
//! below the refuse mark it refuses new client writes with a retryable error, so the
//! write-ahead log and the metadata store never run into a full disk themselves, and it
//! takes writes again by itself once space returns.
//!
//! A mark is the smaller of a byte count and a share of the volume, so a small volume
//! is not refused from the start and a large one does not keep a fixed share idle.

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The free-space marks, shared by streamd and metad.
#[derive(clap::Args, Clone, Debug)]
pub struct DiskSpaceArgs {
    /// Alert (gauge, warning, `/ready` detail) when a volume has fewer free bytes than
    /// this or `--disk-alert-free-percent` of the volume, whichever is smaller. 0 turns
    /// the alert off.
    #[arg(long, env = "WEIR_DISK_ALERT_FREE_BYTES", default_value_t = 2 << 30)]
    pub disk_alert_free_bytes: u64,
    /// See `--disk-alert-free-bytes`.
    #[arg(long, env = "WEIR_DISK_ALERT_FREE_PERCENT", default_value_t = 10.0, value_parser = percent)]
    pub disk_alert_free_percent: f64,
    /// Refuse client writes (Kafka `KAFKA_STORAGE_ERROR`, HTTP 507 `insufficient_storage`)
    /// when a volume has fewer free bytes than this or `--disk-refuse-free-percent` of
    /// the volume, whichever is smaller. Reads, consumer groups, deletes, trims,
    /// uploads and compaction go on. 0 turns the refusal off.
    #[arg(long, env = "WEIR_DISK_REFUSE_FREE_BYTES", default_value_t = 1 << 30)]
    pub disk_refuse_free_bytes: u64,
    /// See `--disk-refuse-free-bytes`.
    #[arg(long, env = "WEIR_DISK_REFUSE_FREE_PERCENT", default_value_t = 5.0, value_parser = percent)]
    pub disk_refuse_free_percent: f64,
    /// How often free space is read, in milliseconds.
    #[arg(long, env = "WEIR_DISK_CHECK_INTERVAL_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub disk_check_interval_ms: u64,
}

impl Default for DiskSpaceArgs {
    fn default() -> Self {
        Self {
            disk_alert_free_bytes: 2 << 30,
            disk_alert_free_percent: 10.0,
            disk_refuse_free_bytes: 1 << 30,
            disk_refuse_free_percent: 5.0,
            disk_check_interval_ms: 1_000,
        }
    }
}

impl DiskSpaceArgs {
    /// These marks with the byte counts given and the shares at 100 %, so the bytes
    /// decide (tests, and `weir dev` on a small volume).
    pub fn with_bytes(mut self, alert: u64, refuse: u64) -> Self {
        self.disk_alert_free_bytes = alert;
        self.disk_refuse_free_bytes = refuse;
        self.disk_alert_free_percent = 100.0;
        self.disk_refuse_free_percent = 100.0;
        self
    }
}

fn percent(s: &str) -> Result<f64, String> {
    let p: f64 = s.trim_end_matches('%').parse().map_err(|e| format!("{e}"))?;
    if (0.0..=100.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p} is not a percentage from 0 to 100"))
    }
}

/// How a volume stands against its marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Ok,
    Alert,
    Refuse,
}

/// One volume's last reading.
#[derive(Clone, Debug, Serialize)]
pub struct VolumeState {
    /// What the process keeps there (`wal`, `data`, `metadata`).
    pub name: String,
    pub path: PathBuf,
    pub free_bytes: u64,
    pub total_bytes: u64,
    pub alert_below_bytes: u64,
    pub refuse_below_bytes: u64,
    pub level: Level,
    /// Why the volume could not be read, when it could not (counted as refusing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl VolumeState {
    fn describe(&self) -> String {
        match &self.error {
            Some(e) => format!("the {} volume {} cannot be read: {e}", self.name, self.path.display()),
            None => format!(
                "the {} volume {} has {} bytes free, under its refuse mark of {} bytes",
                self.name,
                self.path.display(),
                self.free_bytes,
                self.refuse_below_bytes
            ),
        }
    }
}

/// Watches the free space of a process's volumes; cheap to clone and to ask.
#[derive(Clone)]
pub struct DiskWatch {
    inner: Arc<Inner>,
}

struct Inner {
    volumes: Vec<(String, PathBuf)>,
    args: DiskSpaceArgs,
    states: Mutex<Vec<VolumeState>>,
    /// Set while any volume is under its refuse mark: the one thing a write asks.
    refusing: AtomicBool,
    gauges: Gauges,
}

#[derive(Clone)]
struct Gauges {
    free: prometheus::IntGaugeVec,
    level: prometheus::IntGaugeVec,
}

fn gauges() -> Gauges {
    use prometheus::{IntGaugeVec, Opts};
    let free = IntGaugeVec::new(
        Opts::new("disk_free_bytes", "Free bytes on a volume the process writes"),
        &["volume"],
    )
    .expect("static metric");
    let level = IntGaugeVec::new(
        Opts::new(
            "disk_level",
            "A volume against its free-space marks: 0 ok, 1 under the alert mark, 2 under the refuse mark",
        ),
        &["volume"],
    )
    .expect("static metric");
    Gauges {
        free: crate::metrics::register(free),
        level: crate::metrics::register(level),
    }
}

impl DiskWatch {
    /// Watches `volumes` (a name, and a path on the volume) against `args`' marks;
    /// reads them once before returning.
    pub fn new(volumes: Vec<(String, PathBuf)>, args: DiskSpaceArgs) -> Self {
        let watch = Self {
            inner: Arc::new(Inner {
                volumes,
                args,
                states: Mutex::new(Vec::new()),
                refusing: AtomicBool::new(false),
                gauges: gauges(),
            }),
        };
        watch.check();
        watch
    }

    /// Reads the volumes every `--disk-check-interval-ms` until `stop`; spawned by the caller.
    pub fn watch(&self, stop: CancellationToken) -> impl std::future::Future<Output = ()> + Send + 'static {
        let watch = self.clone();
        let every = Duration::from_millis(self.inner.args.disk_check_interval_ms);
        async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let w = watch.clone();
                // statvfs is a system call on a possibly slow volume: off the runtime.
                if tokio::task::spawn_blocking(move || w.check()).await.is_err() {
                    return;
                }
            }
        }
    }

    /// Reads every volume now, says what changed, and updates the gauges.
    pub fn check(&self) {
        let inner = &self.inner;
        let fresh: Vec<VolumeState> = inner
            .volumes
            .iter()
            .map(|(name, path)| read(name, path, &inner.args))
            .collect();
        let mut states = inner.states.lock().unwrap_or_else(|p| p.into_inner());
        for (i, now) in fresh.iter().enumerate() {
            let before = states.get(i).map_or(Level::Ok, |s| s.level);
            inner
                .gauges
                .free
                .with_label_values(&[&now.name])
                .set(now.free_bytes as i64);
            inner.gauges.level.with_label_values(&[&now.name]).set(now.level as i64);
            if now.level == before {
                continue;
            }
            let (volume, path, free) = (&now.name, now.path.display(), now.free_bytes);
            match now.level {
                Level::Refuse => {
                    tracing::error!(volume, %path, free_bytes = free, refuse_below_bytes = now.refuse_below_bytes, error = now.error.as_deref(), "volume is under its refuse mark; refusing new writes until space returns")
                }
                Level::Alert => {
                    tracing::warn!(volume, %path, free_bytes = free, alert_below_bytes = now.alert_below_bytes, "volume is under its alert mark")
                }
                Level::Ok => tracing::info!(volume, %path, free_bytes = free, "volume has space again"),
            }
        }
        inner
            .refusing
            .store(fresh.iter().any(|s| s.level == Level::Refuse), Ordering::Release);
        *states = fresh;
    }

    /// Why a client write must be refused now, if it must: which volume, and how full.
    pub fn refusal(&self) -> Option<String> {
        if !self.inner.refusing.load(Ordering::Acquire) {
            return None;
        }
        let states = self.inner.states.lock().unwrap_or_else(|p| p.into_inner());
        states
            .iter()
            .find(|s| s.level == Level::Refuse)
            .map(VolumeState::describe)
    }

    /// The last reading of every volume, for `/ready`.
    pub fn states(&self) -> Vec<VolumeState> {
        self.inner.states.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The worst level of any volume.
    pub fn level(&self) -> Level {
        self.states().iter().map(|s| s.level).max().unwrap_or(Level::Ok)
    }
}

/// `path`, or its nearest ancestor that exists: a directory not made yet is on the
/// volume of the directory it will be made in.
fn existing(path: &Path) -> &Path {
    path.ancestors().find(|p| p.exists()).unwrap_or(path)
}

/// `volumes` with each file system once, under the first name given for it.
pub fn distinct_volumes(volumes: Vec<(String, PathBuf)>) -> Vec<(String, PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    volumes
        .into_iter()
        .filter(|(_, path)| match std::fs::metadata(existing(path)) {
            Ok(meta) => seen.insert(meta.dev()),
            Err(_) => true,
        })
        .collect()
}

/// The mark of `bytes` or `percent` of `total`, whichever is smaller; 0 when either is 0.
fn mark(bytes: u64, percent: f64, total: u64) -> u64 {
    let share = (total as f64 * percent / 100.0) as u64;
    bytes.min(share)
}

fn read(name: &str, path: &Path, args: &DiskSpaceArgs) -> VolumeState {
    let mut state = VolumeState {
        name: name.to_owned(),
        path: path.to_owned(),
        free_bytes: 0,
        total_bytes: 0,
        alert_below_bytes: 0,
        refuse_below_bytes: 0,
        level: Level::Ok,
        error: None,
    };
    match nix::sys::statvfs::statvfs(existing(path)) {
        Ok(st) => {
            let unit = st.fragment_size();
            // What an unprivileged writer can still use: root's reserve is not counted.
            state.free_bytes = st.blocks_available() * unit;
            state.total_bytes = st.blocks() * unit;
            state.alert_below_bytes = mark(
                args.disk_alert_free_bytes,
                args.disk_alert_free_percent,
                state.total_bytes,
            );
            state.refuse_below_bytes = mark(
                args.disk_refuse_free_bytes,
                args.disk_refuse_free_percent,
                state.total_bytes,
            );
            state.level = if state.free_bytes < state.refuse_below_bytes {
                Level::Refuse
            } else if state.free_bytes < state.alert_below_bytes {
                Level::Alert
            } else {
                Level::Ok
            };
        }
        Err(e) => {
            state.error = Some(e.to_string());
            state.level = Level::Refuse;
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_the_smaller_of_its_bytes_and_its_share_and_zero_turns_it_off() {
        assert_eq!(mark(1 << 30, 5.0, 100 << 20), 5 << 20, "a small volume: the share");
        assert_eq!(mark(1 << 30, 5.0, 1 << 40), 1 << 30, "a large volume: the bytes");
        assert_eq!(mark(0, 5.0, 1 << 40), 0);
        assert_eq!(mark(1 << 30, 0.0, 1 << 40), 0);
    }

    #[test]
    fn percentages_are_checked() {
        assert_eq!(percent("5"), Ok(5.0));
        assert_eq!(percent("12.5%"), Ok(12.5));
        assert!(percent("101").is_err());
        assert!(percent("-1").is_err());
        assert!(percent("x").is_err());
    }

    /// Issue 60: a real volume read against marks above and below its free space.
    #[test]
    fn a_volume_under_its_refuse_mark_refuses_and_names_itself() {
        let dir = tempfile::tempdir().expect("tmp");
        let volumes = vec![("wal".to_owned(), dir.path().to_owned())];
        let free = DiskWatch::new(volumes.clone(), DiskSpaceArgs::default().with_bytes(0, 0));
        assert_eq!(free.level(), Level::Ok);
        assert_eq!(free.refusal(), None);
        let full = DiskWatch::new(volumes, DiskSpaceArgs::default().with_bytes(u64::MAX, u64::MAX));
        assert_eq!(full.level(), Level::Refuse, "every volume has less than 100 % free");
        let why = full.refusal().expect("refusing");
        assert!(
            why.contains("the wal volume") && why.contains("under its refuse mark"),
            "{why}"
        );
        let later = DiskWatch::new(
            vec![("data".to_owned(), dir.path().join("made/later"))],
            DiskSpaceArgs::default().with_bytes(u64::MAX, u64::MAX),
        );
        let why = later.refusal().expect("read on the volume it will be made on");
        assert!(!why.contains("cannot be read"), "{why}");
        let both = distinct_volumes(vec![
            ("wal".to_owned(), dir.path().join("wal")),
            ("data".to_owned(), dir.path().to_owned()),
        ]);
        assert_eq!(both.len(), 1, "one file system, watched once");
        assert_eq!(both[0].0, "wal");
    }
}
