//! Background tasks known by kind and name, so a teardown can say what it aborts
//! (SD-TD-3, SD-TD-4, OBS-12). Every task gets the same grace, all at once: a kind of
//! tasks stalled on a peer costs the teardown one grace, not one per task, and each
//! task still has the whole grace to release what it holds. Those still running when it
//! ends are aborted, each named in its own warn record, all at the same moment.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::AbortHandle;
use tokio_util::task::TaskTracker;

/// SD-TD-3: the stop grace of one background task.
pub const TASK_GRACE: Duration = Duration::from_secs(2);

/// A task running on a [`KindTasks`].
struct Running {
    kind: &'static str,
    name: String,
    stream: Option<String>,
    abort: AbortHandle,
}

/// Background tasks by kind (`uploader`, `compaction`, `gc`, ...) and name.
#[derive(Clone, Default)]
pub struct KindTasks {
    tracker: TaskTracker,
    running: Arc<Mutex<Registry>>,
}

/// The tasks that may still run, and when to drop the finished ones from the list.
#[derive(Default)]
struct Registry {
    tasks: Vec<Running>,
    prune_at: usize,
    /// Set by [`KindTasks::stop`]: a task spawned later is aborted at once.
    stopped: bool,
}

impl KindTasks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `task` as a task of `kind` named `name`, about `stream` when it has one.
    pub fn spawn<F>(
        &self,
        kind: &'static str,
        name: impl Into<String>,
        stream: Option<String>,
        task: F,
    ) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = self.tracker.spawn(task);
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.stopped {
            // Too late: the teardown has given every task its grace already.
            handle.abort();
            return handle;
        }
        // Finished tasks leave the list once it doubled since the last pass, so it
        // holds about what may still run, at a constant cost per spawn.
        if running.tasks.len() >= running.prune_at {
            running.tasks.retain(|r| !r.abort.is_finished());
            running.prune_at = (2 * running.tasks.len()).max(64);
        }
        running.tasks.push(Running {
            kind,
            name: name.into(),
            stream,
            abort: handle.abort_handle(),
        });
        handle
    }

    /// Waits up to `grace` for every task spawned so far, then aborts the rest, each
    /// logged at warn, and lets them drop what they hold. Returns how many were aborted.
    pub async fn stop(&self, grace: Duration) -> usize {
        self.tracker.close();
        let ended = tokio::time::timeout(grace, self.tracker.wait()).await.is_ok();
        let late: Vec<Running> = {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            running.stopped = true;
            running.tasks.drain(..).filter(|r| !r.abort.is_finished()).collect()
        };
        if ended {
            return 0;
        }
        for r in &late {
            tracing::warn!(
                stream = r.stream.as_deref().unwrap_or(""),
                task_kind = r.kind,
                task = %r.name,
                grace_period = ?grace,
                "shutdown task exceeded grace period; aborting"
            );
            r.abort.abort();
        }
        // Aborted tasks end at their next poll and drop what they hold (blocking work
        // they started, such as a file read, runs to its end regardless).
        let _ = tokio::time::timeout(Duration::from_millis(100), self.tracker.wait()).await;
        late.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SD-TD-3, SD-TD-4: tasks that end in their grace are not named; two stalled ones
    /// share one grace (the stop takes one grace, where one each would take two) and
    /// are each aborted.
    #[tokio::test]
    async fn stalled_tasks_share_one_grace_and_are_aborted() {
        let grace = Duration::from_secs(1);
        let tasks = KindTasks::new();
        let (quick_tx, quick_rx) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("uploader", "uploader", None, async move {
            let _ = quick_rx.await;
        });
        let stalled = Arc::new(());
        for name in ["gc", "compaction"] {
            let held = stalled.clone();
            tasks.spawn("background", name, Some("s-0".into()), async move {
                let _held = held;
                std::future::pending::<()>().await
            });
        }
        drop(quick_tx);
        let started = std::time::Instant::now();
        assert_eq!(tasks.stop(grace).await, 2);
        let took = started.elapsed();
        // SD-TD-4: the two stalled tasks of one kind share one grace, not one each.
        assert!(took >= grace && took < 2 * grace, "one grace for both: {took:?}");
        // SD-TD-3, SD-TD-4: past the grace each stalled task is aborted: both dropped what they held.
        for _ in 0..100 {
            if Arc::strong_count(&stalled) == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(Arc::strong_count(&stalled), 1);
    }

    /// A task spawned after the stop never runs on past it: it is aborted at once.
    #[tokio::test]
    async fn a_task_spawned_after_the_stop_is_aborted() {
        let tasks = KindTasks::new();
        assert_eq!(tasks.stop(Duration::from_millis(10)).await, 0);
        let late = tasks.spawn("takeover", "late", None, std::future::pending::<()>());
        assert!(late.await.expect_err("aborted").is_cancelled());
    }

    /// Finished tasks do not pile up in the list.
    #[tokio::test]
    async fn finished_tasks_leave_the_list() {
        let tasks = KindTasks::new();
        for i in 0..100 {
            tasks.spawn("takeover", format!("t-{i}"), None, async {});
            tokio::task::yield_now().await;
        }
        assert!(tasks.running.lock().expect("lock").tasks.len() <= 64);
        assert_eq!(tasks.stop(Duration::from_secs(1)).await, 0);
    }
}
