//! A child process under test: started with its stderr appended to a log file,
//! signalled, killed and reaped; shared by every service wrapper.

use crate::signal;
use nix::sys::signal::Signal;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

/// One service process and the file its log goes to.
pub struct Proc {
    pub name: String,
    pub log_path: PathBuf,
    child: Option<Child>,
    /// Where the current run's lines begin in the (appended) log.
    run_start: u64,
}

impl Proc {
    pub fn new(name: impl Into<String>, log_path: PathBuf) -> Self {
        Self {
            name: name.into(),
            log_path,
            child: None,
            run_start: 0,
        }
    }

    /// Spawns `command` with stdout and stderr appended to the log.
    pub fn spawn(&mut self, mut command: Command) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open process log");
        self.run_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let out = log.try_clone().expect("clone process log");
        let child = command
            .stdout(out)
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.name));
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running", self.name))
            .id()
    }

    /// SIGKILL, and reap the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn pause(&self) {
        signal(self.pid(), Signal::SIGSTOP);
    }

    pub fn resume(&self) {
        signal(self.pid(), Signal::SIGCONT);
    }

    pub fn term(&self) {
        signal(self.pid(), Signal::SIGTERM);
    }

    /// Waits up to `timeout` for the process to exit by itself; `None` if it is still
    /// running (it is left running).
    pub async fn exited_within(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return status.code();
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the process to exit by itself; returns its exit code. On timeout the
    /// process is killed (never leaked) and the test fails.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        self.child.as_ref()?;
        match self.exited_within(timeout).await {
            Some(code) => Some(code),
            None if self.child.is_none() => None,
            None => {
                self.kill();
                panic!("timed out after {timeout:?} waiting for {} to exit", self.name);
            }
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The log of the latest run only: what it wrote since it was last spawned.
    pub fn run_log_text(&self) -> String {
        let text = self.log_text();
        text.get(self.run_start as usize..).unwrap_or_default().to_string()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            signal(child.id(), Signal::SIGCONT);
        }
        self.kill();
    }
}

/// CPU time process `pid` has used so far, all threads, user and system (from
/// `/proc/<pid>/stat`, in the kernel's fixed 100 Hz `USER_HZ`); zero once it is gone.
pub fn cpu_time(pid: u32) -> std::time::Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return std::time::Duration::ZERO;
    };
    // Fields after the command name, which may hold spaces: state is field 3, utime 14.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    std::time::Duration::from_millis(ticks * 10)
}

/// Bytes process `pid` has sent to the storage layer so far, direct writes and pages it
/// dirtied alike, less those truncated before writeback (`/proc/<pid>/io`); zero once it
/// is gone.
pub fn bytes_written(pid: u32) -> u64 {
    let Ok(io) = std::fs::read_to_string(format!("/proc/{pid}/io")) else {
        return 0;
    };
    let field = |name: &str| -> u64 {
        io.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(": ")?.trim().parse().ok())
            .unwrap_or(0)
    };
    field("write_bytes").saturating_sub(field("cancelled_write_bytes"))
}

#[cfg(test)]
mod cpu_time_tests {
    #[test]
    fn a_process_cpu_time_grows_as_it_works() {
        let me = std::process::id();
        let before = super::cpu_time(me);
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(super::cpu_time(me) >= before + std::time::Duration::from_millis(50));
        assert_eq!(super::cpu_time(u32::MAX), std::time::Duration::ZERO, "no such process");
    }
}
