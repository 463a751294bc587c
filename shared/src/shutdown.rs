//! The shutdown orchestrator every binary uses (seed 001, requirements §4.4–4.5).
//!
//! - SIGINT/SIGTERM handlers are installed first; a signal that arrives during startup
//!   is held (the stop token is cancelled and startup code acts on it once it is done),
//!   and its deadline runs from its arrival (SD-TRG-6, SD-TRG-7).
//! - The first stop request wins; later ones change nothing (SD-TRG-8). A repeated
//!   signal logs `repeated termination signal received; abandoning graceful shutdown`
//!   and exits 130 (SIGINT) or 143 (SIGTERM) at once (SD-EX-4).
//! - One absolute deadline (`--shutdown-deadline-sec`) is enforced by an OS thread, not
//!   the async runtime, so a wedged process still ends: it logs
//!   `shutdown deadline expired; abandoning graceful shutdown` and exits 1 (SD-DL-3/4).
//! - Phases stop-requested → drain-support → terminal-teardown each log
//!   `shutdown <phase> phase finished` with `outcome` (SD-PH-1..3); the exit status is
//!   1 when a phase was `Forced`, else 0 (SD-EX-1/2).

use clap::Args;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The shutdown flags every service takes.
#[derive(Args, Clone, Debug)]
pub struct ShutdownArgs {
    /// Absolute bound on the whole shutdown, from the first stop request; on expiry the
    /// process exits 1 at once.
    #[arg(long, env = "WEIR_SHUTDOWN_DEADLINE_SEC", default_value_t = 50)]
    pub shutdown_deadline_sec: u64,

    /// Bound on the drain-support phase (within the deadline).
    #[arg(long, env = "WEIR_DRAIN_TIMEOUT_SEC", default_value_t = 30)]
    pub drain_timeout_sec: u64,

    /// How long a stopping node keeps accepting and serving after readiness fails, so
    /// load balancers move traffic away first.
    #[arg(long, env = "WEIR_SHUTDOWN_DRAIN_SEC", default_value_t = 5)]
    pub shutdown_drain_sec: u64,

    /// How long in-flight requests get once listeners stop accepting.
    #[arg(long, env = "WEIR_SHUTDOWN_TIMEOUT_SEC", default_value_t = 10)]
    pub shutdown_timeout_sec: u64,
}

impl ShutdownArgs {
    pub fn validate(&self) -> Result<(), crate::config::ConfigError> {
        if self.shutdown_deadline_sec == 0 {
            return Err(crate::config::ConfigError::new(
                "--shutdown-deadline-sec must be at least 1",
            ));
        }
        Ok(())
    }

    /// DEP-4: a drain timeout at or past the deadline never lengthens the drain (the
    /// deadline ends the process first). Said once at startup: such a setting usually
    /// means one of the two was raised alone.
    pub fn warn_if_drain_outlasts_deadline(&self) {
        if self.drain_timeout_sec >= self.shutdown_deadline_sec {
            tracing::warn!(
                drain_timeout_sec = self.drain_timeout_sec,
                shutdown_deadline_sec = self.shutdown_deadline_sec,
                "--drain-timeout-sec is not below --shutdown-deadline-sec, so the deadline ends the drain first; raise both together"
            );
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Starting,
    StopRequested,
    DrainSupport,
    TerminalTeardown,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "startup",
            Phase::StopRequested => "stop-requested",
            Phase::DrainSupport => "drain-support",
            Phase::TerminalTeardown => "terminal-teardown",
        }
    }
}

/// How a shutdown phase ended (SD-PH-1..3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseOutcome {
    Completed,
    Abandoned,
    Forced,
}

#[derive(Debug)]
struct State {
    requested_at: Option<Instant>,
    phase: Phase,
    forced: bool,
}

/// One process's shutdown: the stop token, the deadline and the phase reached.
#[derive(Debug)]
pub struct Shutdown {
    token: CancellationToken,
    state: Mutex<State>,
    deadline: Duration,
    drain_timeout: Duration,
    pub drain_window: Duration,
    pub inflight_timeout: Duration,
    /// The signal watcher: it lives as long as the process, to see a repeated signal
    /// during any phase (SD-EX-4), so nothing waits for it.
    signals: tokio_util::task::TaskTracker,
}

/// Blocks every worker of the current runtime in a plain sleep (failpoint
/// `block_all_runtime_workers`): nothing async runs again, so only the deadline's own
/// thread can end the process.
fn block_runtime_workers() {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    tracing::warn!("failpoint: blocking every runtime worker");
    let tasks = tokio_util::task::TaskTracker::new();
    for _ in 0..runtime.metrics().num_workers() {
        tasks.spawn_on(async { std::thread::sleep(Duration::from_secs(3600)) }, &runtime);
    }
}

impl Shutdown {
    pub fn new(args: &ShutdownArgs) -> Arc<Self> {
        Arc::new(Self {
            token: CancellationToken::new(),
            state: Mutex::new(State {
                requested_at: None,
                phase: Phase::Starting,
                forced: false,
            }),
            deadline: Duration::from_secs(args.shutdown_deadline_sec),
            drain_timeout: Duration::from_secs(args.drain_timeout_sec),
            drain_window: Duration::from_secs(args.shutdown_drain_sec),
            inflight_timeout: Duration::from_secs(args.shutdown_timeout_sec),
            signals: tokio_util::task::TaskTracker::new(),
        })
    }

    /// Installs the SIGINT/SIGTERM handlers; call first thing in the runtime. On
    /// failure the process exits 1 with `failed to register termination signal handlers`.
    pub fn install(args: &ShutdownArgs) -> Arc<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let this = Self::new(args);
        // Tests: registration fails (failpoint `signal_register=return(err)`).
        let refused = crate::failpoint::action("signal_register") == Some(crate::failpoint::Action::Error);
        let registered = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(term), Ok(int)) if !refused => Some((term, int)),
            _ => None,
        };
        let Some((mut term, mut int)) = registered else {
            tracing::error!("failed to register termination signal handlers");
            eprintln!("failed to register termination signal handlers");
            std::process::exit(1);
        };
        let me = this.clone();
        this.signals.spawn(async move {
            let first = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            me.request(&format!("{first} received"));
            let (name, code) = tokio::select! {
                _ = term.recv() => ("SIGTERM", 143),
                _ = int.recv() => ("SIGINT", 130),
            };
            let phase = me.phase().name();
            tracing::warn!(
                signal = name,
                phase,
                "repeated termination signal received; abandoning graceful shutdown"
            );
            std::process::exit(code);
        });
        this
    }

    /// Cancelled at the first stop request.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    pub fn is_requested(&self) -> bool {
        self.token.is_cancelled()
    }

    /// A stop request (signal, or a public listener that stopped). Only the first counts.
    pub fn request(self: &Arc<Self>, why: &str) {
        let first = {
            let mut s = self.lock();
            if s.requested_at.is_some() {
                false
            } else {
                s.requested_at = Some(Instant::now());
                true
            }
        };
        if !first {
            tracing::info!(reason = why, "stop already requested; this request changes nothing");
            return;
        }
        tracing::info!(
            reason = why,
            deadline_sec = self.deadline.as_secs(),
            "stop requested; shutting down"
        );
        self.token.cancel();
        let me = self.clone();
        // SD-DL-3: a plain OS thread, so a saturated runtime cannot outlive the deadline.
        std::thread::Builder::new()
            .name("shutdown-deadline".into())
            .spawn(move || {
                std::thread::sleep(me.deadline);
                me.expire();
            })
            .ok();
        // Tests (SD-DL-3): every runtime worker blocks, as a wedged process's would.
        if crate::failpoint::is_set("block_all_runtime_workers") {
            block_runtime_workers();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn phase(&self) -> Phase {
        self.lock().phase
    }

    pub fn begin(&self, phase: Phase) {
        self.lock().phase = phase;
        tracing::debug!(phase = phase.name(), "shutdown phase started");
    }

    /// SD-DL-4: the deadline passed: log the phase reached and exit 1 at once. Whoever
    /// sees it first (the deadline thread, or a phase that ends late) ends the process;
    /// a second caller waits on the same `Once` until the exit happens.
    fn expire(&self) -> ! {
        static EXPIRED: std::sync::Once = std::sync::Once::new();
        EXPIRED.call_once(|| {
            let phase = self.phase().name();
            tracing::error!(
                phase,
                outcome = "Forced",
                "shutdown deadline expired; abandoning graceful shutdown"
            );
            std::process::exit(1);
        });
        std::process::exit(1)
    }

    /// Logs the phase record. A phase that ends past the deadline logs none: the
    /// process ends there, exactly as the deadline thread ends it (SD-PH-4).
    pub fn finish(&self, phase: Phase, outcome: PhaseOutcome) {
        if self.is_requested() && self.deadline_left().is_zero() {
            self.expire();
        }
        if outcome == PhaseOutcome::Forced {
            self.lock().forced = true;
        }
        let message = match phase {
            Phase::StopRequested => "shutdown stop-requested phase finished",
            Phase::DrainSupport => "shutdown drain-support phase finished",
            Phase::TerminalTeardown => "shutdown terminal-teardown phase finished",
            Phase::Starting => return,
        };
        tracing::info!(outcome = ?outcome, phase = phase.name(), "{message}");
    }

    /// Time left before the deadline (the whole deadline before any stop request).
    pub fn deadline_left(&self) -> Duration {
        match self.lock().requested_at {
            Some(at) => (at + self.deadline).saturating_duration_since(Instant::now()),
            None => self.deadline,
        }
    }

    /// Time left in drain-support: the drain timeout and the deadline, whichever ends first.
    /// The drain timeout, as bounded by the deadline.
    pub fn drain_timeout(&self) -> Duration {
        self.drain_timeout.min(self.deadline)
    }

    pub fn drain_left(&self) -> Duration {
        let at = self.lock().requested_at.unwrap_or_else(Instant::now);
        let end = at + self.drain_timeout.min(self.deadline);
        end.saturating_duration_since(Instant::now())
    }

    /// SD-DL-6/7: a drain step waits for the smaller of its own bound and what is left.
    pub fn step(&self, bound: Duration) -> Duration {
        bound.min(self.drain_left())
    }

    /// 0 after a graceful shutdown, 1 when a phase was forced (SD-EX-1/2).
    pub fn exit_code(&self) -> i32 {
        if self.lock().forced {
            1
        } else {
            0
        }
    }
}

/// What one service does in each phase of a clean stop. [`Shutdown::run_phases`] runs
/// the phases in order and logs each; every service has its own steps, and none has a
/// copy of the sequence.
pub trait StopSteps: Send {
    /// Stop-requested: readiness fails and the incarnation is marked terminating (D-4).
    fn stop_requested(&mut self) -> impl std::future::Future<Output = ()> + Send;
    /// Drain-support: hands work off and serves what was admitted; how far it got.
    fn drain_support(&mut self) -> impl std::future::Future<Output = PhaseOutcome> + Send;
    /// Terminal teardown: stops listeners and background work and releases storage.
    fn terminal_teardown(&mut self) -> impl std::future::Future<Output = PhaseOutcome> + Send;
}

impl Shutdown {
    /// The phase sequence of a clean stop (SD-PH-1..4): stop-requested, drain-support,
    /// terminal-teardown, each logged with its outcome. The deadline thread ends the
    /// process if a phase runs past the deadline.
    /// Each phase is a span (`shutdown.phase`, with `phase` and `outcome`), so a trace
    /// shows where a stop spent its time; the exporter is flushed after the last one
    /// ends (SD-TD-10, `telemetry::TelemetryGuard`).
    pub async fn run_phases(&self, steps: &mut impl StopSteps) {
        use tracing::Instrument;
        let span =
            |phase: Phase| tracing::info_span!("shutdown.phase", phase = phase.name(), outcome = tracing::field::Empty);
        self.begin(Phase::StopRequested);
        let phase = span(Phase::StopRequested);
        steps.stop_requested().instrument(phase.clone()).await;
        phase.record("outcome", "Completed");
        drop(phase);
        self.finish(Phase::StopRequested, PhaseOutcome::Completed);
        self.begin(Phase::DrainSupport);
        let phase = span(Phase::DrainSupport);
        let outcome = steps.drain_support().instrument(phase.clone()).await;
        phase.record("outcome", tracing::field::debug(&outcome));
        drop(phase);
        self.finish(Phase::DrainSupport, outcome);
        self.begin(Phase::TerminalTeardown);
        let phase = span(Phase::TerminalTeardown);
        let outcome = steps.terminal_teardown().instrument(phase.clone()).await;
        phase.record("outcome", tracing::field::debug(&outcome));
        drop(phase);
        self.finish(Phase::TerminalTeardown, outcome);
    }
}

/// SD-TD-2: terminal teardown's steps, in the order every service runs them. Each logs
/// a debug record as it starts (`shutdown teardown step started`, with `step`), so the
/// order shows in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeardownStep {
    /// Heartbeat and the loops (compaction, retention, GC, ...), 2 s each at most.
    BackgroundTasks,
    /// Work requests and commands had already started, within the in-flight bound.
    WorkInFlight,
    /// The stream runtime, Raft or the metadata client, registration, and internal gRPC
    /// with its transport drain.
    RuntimeAndLinks,
    /// WAL handles, caches and the metad database.
    Storage,
}

impl TeardownStep {
    pub fn name(self) -> &'static str {
        match self {
            TeardownStep::BackgroundTasks => "background tasks",
            TeardownStep::WorkInFlight => "work in flight",
            TeardownStep::RuntimeAndLinks => "runtime and links",
            TeardownStep::Storage => "storage",
        }
    }

    /// Logs this step's start.
    pub fn begin(self) {
        tracing::debug!(step = self.name(), "shutdown teardown step started");
    }
}

impl Shutdown {
    /// SD-DL-8: when a transport drain that starts now ends: 10 s from now, within the
    /// deadline less what storage needs to close.
    pub fn transport_drain_end(&self) -> tokio::time::Instant {
        let bound = crate::outgoing_calls::TRANSPORT_DRAIN.min(self.deadline_left().saturating_sub(STORAGE_RESERVE));
        tokio::time::Instant::now() + bound
    }

    /// SD-DL-8: the transport drain. Calls this process still has open to its peers get
    /// until `end` ([`Shutdown::transport_drain_end`]) before the connections close with
    /// the process, so their callers still get their answers. Abandoned when some were
    /// still open then.
    pub async fn transport_drain(&self, end: tokio::time::Instant) -> PhaseOutcome {
        use crate::outgoing_calls;
        let open = outgoing_calls::open();
        if tokio::time::timeout_at(end, outgoing_calls::all_ended()).await.is_err() {
            tracing::warn!(
                open = outgoing_calls::open(),
                "calls to peers did not end in the transport drain; closing them"
            );
            return PhaseOutcome::Abandoned;
        }
        tracing::debug!(calls = open, "calls to peers ended in the transport drain");
        PhaseOutcome::Completed
    }
}

/// What the transport drain leaves of the deadline for storage to close (a WAL's last
/// sync, metad's flush), so a drain that runs out does not make the deadline end the
/// process instead.
const STORAGE_RESERVE: Duration = Duration::from_secs(2);

/// How long background tasks get to end in terminal teardown (SD-TD-2).
pub const BACKGROUND_GRACE: Duration = Duration::from_secs(10);

/// Closes `tasks` and waits for them for [`BACKGROUND_GRACE`]; the ones still running
/// are left to end with the process (the deadline thread backs this).
pub async fn stop_background(tasks: &tokio_util::task::TaskTracker) {
    tasks.close();
    if tokio::time::timeout(BACKGROUND_GRACE, tasks.wait()).await.is_err() {
        tracing::warn!(
            task_kind = "background",
            grace_period = ?BACKGROUND_GRACE,
            "shutdown task exceeded grace period; aborting"
        );
    }
}

/// SD-TRG-2: a public listener that stops (failed or returned) before the shutdown
/// stopped it requests the shutdown; the process then stops as after a signal.
pub async fn watch_listener<F, E>(name: &'static str, serve: F, shutdown: Arc<Shutdown>, stopping: CancellationToken)
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let result = serve.await;
    if stopping.is_cancelled() {
        return;
    }
    match result {
        Ok(()) => tracing::error!(listener = name, "a public listener stopped; shutting down"),
        Err(e) => tracing::error!(listener = name, error = %e, "a public listener failed; shutting down"),
    }
    shutdown.request(&format!("the {name} listener stopped"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(deadline: u64, drain: u64) -> ShutdownArgs {
        ShutdownArgs {
            shutdown_deadline_sec: deadline,
            drain_timeout_sec: drain,
            shutdown_drain_sec: 5,
            shutdown_timeout_sec: 10,
        }
    }

    #[test]
    fn drain_steps_are_bounded_by_the_drain_timeout_and_the_deadline() {
        let s = Shutdown::new(&args(50, 30));
        s.request("test");
        assert!(s.step(Duration::from_secs(100)) <= Duration::from_secs(30));
        assert!(s.step(Duration::from_secs(100)) > Duration::from_secs(29));
        assert_eq!(s.step(Duration::from_secs(1)), Duration::from_secs(1));
        // SD-DL-6: a deadline below the drain timeout is the effective bound.
        let s = Shutdown::new(&args(5, 60));
        s.request("test");
        assert!(s.step(Duration::from_secs(100)) <= Duration::from_secs(5));
    }

    #[test]
    fn only_the_first_request_counts_and_outcomes_decide_the_exit() {
        let s = Shutdown::new(&args(50, 30));
        assert!(!s.is_requested());
        s.request("first");
        let at = s.lock().requested_at;
        s.request("second");
        // SD-TRG-8: a later request neither restarts nor extends the first one's deadline.
        assert_eq!(s.lock().requested_at, at, "SD-TRG-8: a later request changes nothing");
        s.finish(Phase::DrainSupport, PhaseOutcome::Abandoned);
        assert_eq!(s.exit_code(), 0, "SD-EX-1: Abandoned still exits 0");
        s.finish(Phase::TerminalTeardown, PhaseOutcome::Forced);
        // SD-EX-2: once any phase is Forced, the exit status is 1.
        assert_eq!(s.exit_code(), 1, "SD-EX-2");
    }
}
