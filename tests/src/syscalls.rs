//! The write and sync system calls a running process makes, traced by strace.
//!
//! A SIGKILL test cannot tell an acknowledgement that waited on fdatasync from one that
//! did not: the page cache outlives the process. What power loss would show, a write
//! acknowledged before it was synced, shows here in the order of the calls: within each
//! request's window (sent → answered) the durable log must be written and then synced.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// strace attached to every thread of one process, recording to a file.
pub struct SyscallTrace {
    strace: std::process::Child,
    out: PathBuf,
    err: PathBuf,
}

/// One completed call on a file.
#[derive(Debug, Clone)]
pub struct Call {
    pub name: String,
    /// The file the descriptor named (strace `-y`).
    pub path: String,
    /// Wall-clock seconds when it began and when it returned.
    pub start: f64,
    pub end: f64,
}

impl Call {
    pub fn is_sync(&self) -> bool {
        self.name == "fdatasync" || self.name == "fsync"
    }
}

/// Seconds since the epoch, on the clock strace stamps calls with.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

impl SyscallTrace {
    /// Attaches strace to every thread of `pid` (and those it starts); returns once all
    /// are attached. Fails the test with a message when strace cannot attach.
    pub async fn attach(pid: u32, dir: &Path) -> SyscallTrace {
        let out = dir.join(format!("strace-{pid}.txt"));
        let err = dir.join(format!("strace-{pid}.err"));
        let strace = std::process::Command::new("strace")
            .args(["-f", "-ttt", "-T", "-y", "-s", "0"])
            .args(["-e", "trace=write,pwrite64,writev,pwritev,pwritev2,fdatasync,fsync"])
            .arg("-o")
            .arg(&out)
            .args(["-p", &pid.to_string()])
            .stderr(std::fs::File::create(&err).expect("strace log"))
            .spawn()
            .expect("this test needs strace (scripts/install-deps.sh installs it)");
        let mut trace = SyscallTrace {
            strace,
            out,
            err: err.clone(),
        };
        // `strace: Process N attached with T threads`, once all are.
        crate::wait_for("strace attached to every thread", Duration::from_secs(20), || {
            let said = std::fs::read_to_string(&err).unwrap_or_default();
            if let Ok(Some(status)) = trace.strace.try_wait() {
                panic!("strace could not attach to {pid} ({status}): {said}");
            }
            async move { said.contains(&format!("Process {pid} attached")).then_some(()) }
        })
        .await;
        trace
    }

    /// Detaches and returns the calls made on files (sockets and pipes left out).
    pub fn finish(mut self) -> Vec<Call> {
        crate::signal(self.strace.id(), nix::sys::signal::Signal::SIGINT);
        self.strace.wait().expect("strace exits");
        let text = std::fs::read_to_string(&self.out).expect("strace output");
        let calls = parse(&text);
        if calls.is_empty() {
            // A trace of nothing is strace's failure, not the process's: say what it saw.
            let said = std::fs::read_to_string(&self.err).unwrap_or_default();
            let head: String = text.chars().take(2000).collect();
            eprintln!("strace traced no call on a file; its log: {said:?}; its output began: {head:?}");
        }
        calls
    }
}

/// Parses `strace -f -ttt -T -y` output, joining calls split by another thread's.
fn parse(text: &str) -> Vec<Call> {
    let mut pending: std::collections::HashMap<&str, (String, String, f64)> = Default::default();
    let mut calls = Vec::new();
    for line in text.lines() {
        // `1185  1796674539.760108 pwrite64(...)`: strace pads the thread id to a width,
        // so fields are split on runs of spaces.
        let Some((tid, after)) = line.trim_start().split_once(' ') else {
            continue;
        };
        let Some((stamp, rest)) = after.trim_start().split_once(' ') else {
            continue;
        };
        let Ok(stamp) = stamp.parse::<f64>() else { continue };
        let (name, path, start) = if rest.starts_with("<... ") {
            let Some(started) = pending.remove(tid) else {
                continue;
            };
            started
        } else {
            let Some((name, args)) = rest.split_once('(') else {
                continue;
            };
            // `3</path/file>`: the descriptor and what it names.
            let path = args
                .split_once('<')
                .and_then(|(_, p)| p.split_once('>'))
                .map(|(p, _)| p.to_string())
                .unwrap_or_default();
            if rest.ends_with("<unfinished ...>") {
                pending.insert(tid, (name.to_string(), path, stamp));
                continue;
            }
            (name.to_string(), path, stamp)
        };
        // `= 0 <0.000461>`: a call that failed says `= -1 E...`.
        let Some((result, took)) = rest.rsplit_once(" = ").map(|(_, r)| r).and_then(|r| r.split_once(" <")) else {
            continue;
        };
        if result.starts_with('-') || !path.starts_with('/') {
            continue;
        }
        let took: f64 = took.trim_end_matches('>').parse().unwrap_or(0.0);
        calls.push(Call {
            name,
            path,
            start,
            end: start + took,
        });
    }
    calls.sort_by(|a, b| a.start.total_cmp(&b.start));
    calls
}

/// How many times, within `[from, to]`, a write to a file `wal` accepts returned and a
/// sync of that same file then began and returned: each is a write made durable before
/// `to`.
pub fn synced_writes(calls: &[Call], wal: impl Fn(&str) -> bool, from: f64, to: f64) -> usize {
    let inside: Vec<&Call> = calls
        .iter()
        .filter(|c| c.start >= from && c.end <= to && wal(&c.path))
        .collect();
    let mut unsynced: Vec<&Call> = Vec::new();
    let mut pairs = 0;
    for call in inside {
        if call.is_sync() {
            let before = unsynced.len();
            unsynced.retain(|w| !(w.path == call.path && w.end <= call.start));
            if unsynced.len() < before {
                pairs += 1;
            }
        } else {
            unsynced.push(call);
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_split_calls_and_pairs_writes_with_later_syncs() {
        let text = "\
7  100.000000 pwrite64(9</w/seg>, \"\"..., 4096, 0) = 4096 <0.000010>
8 100.000100 fdatasync(9</w/seg> <unfinished ...>
7 100.000150 write(4<socket:[1]>, \"\"..., 9) = 9 <0.000005>
8 100.000400 <... fdatasync resumed>) = 0 <0.000300>
8 100.001000 fdatasync(9</w/seg>) = 0 <0.000100>
7 100.002000 pwrite64(9</w/seg>, \"\"..., 4096, 4096) = -1 ENOSPC (No space left on device) <0.000010>
";
        let calls = parse(text);
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert_eq!(calls[1].name, "fdatasync");
        assert!((calls[1].end - 100.0004).abs() < 1e-6);
        let wal = |p: &str| p.starts_with("/w/");
        // The second sync covers no new write: one write made durable.
        assert_eq!(synced_writes(&calls, wal, 99.0, 101.0), 1);
        // A window that ends before the sync returned has none.
        assert_eq!(synced_writes(&calls, wal, 99.0, 100.0003), 0);
        // A sync before the write does not count.
        assert_eq!(synced_writes(&calls[1..], wal, 99.0, 101.0), 0);
    }
}
