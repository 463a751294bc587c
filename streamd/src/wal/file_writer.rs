//! The file WAL's writer: a thread of its own that blocks on the disk (issue 17),
//! writing each group with one write and one sync, and retrying a write the full
//! volume refused until space returns (issue 60).

use super::file::FileSink;
use super::group_commit::{Group, Log, Request};
use super::{SegmentId, WalError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The file WAL's writer thread: blocks for the first waiting request, takes every
/// other one already waiting, writes and syncs them as one, answers them; until `stop`.
pub(super) fn run_file(mut file: FileSink, mut rx: mpsc::Receiver<Request>, mut log: Log, stop: &CancellationToken) {
    while let Some(first) = rx.blocking_recv() {
        if stop.is_cancelled() {
            break;
        }
        let group = Group::gather(first, &mut rx);
        let reclaim = group.reclaim || log.has_reported();
        if !group.waiters.is_empty() {
            // Tests: a slow disk, so appends that arrive meanwhile pile up for the next group.
            if !weir_shared::failpoint::pause_blocking("wal_persist", stop) {
                break;
            }
            let Some(result) = persist_until_space(&mut file, &group, &mut log, stop) else {
                break;
            };
            log.settle(group, result);
        }
        if reclaim {
            reclaim_segments(&mut file, &mut log);
        }
    }
    // Appends still queued are answered "stopped" as their senders drop.
    drop(rx);
    file.close();
}

/// Deletes the segments whose records the reported committed ends now cover.
fn reclaim_segments(file: &mut FileSink, log: &mut Log) {
    log.take_reported();
    for segment in log.reclaimable(file.active_segment()) {
        if !log.deleted(segment, file.delete(segment)) {
            break;
        }
    }
    log.forget_reclaimed();
}

/// Writes `group`; on a full volume (issue 60) retries the same write, backing off,
/// while reclaiming what uploads free, until it is written or fails otherwise. New
/// appends are refused meanwhile ([`WalWriter::check`]), and the ones already queued
/// wait behind this group, so every stream's order holds. `None` at the stop.
fn persist_until_space(
    file: &mut FileSink,
    group: &Group,
    log: &mut Log,
    stop: &CancellationToken,
) -> Option<Result<(SegmentId, u64), WalError>> {
    let mut backoff = NO_SPACE_FIRST_RETRY;
    loop {
        let result = match log.failure() {
            Some(e) => Err(e.clone()),
            None => file.persist(group),
        };
        let Err(WalError::NoSpace(why)) = result else {
            log.space_returned();
            return Some(result);
        };
        log.out_of_space(why);
        reclaim_segments(file, log);
        if !sleep_unless_stopped(backoff, stop) {
            return None;
        }
        backoff = (backoff * 2).min(NO_SPACE_LAST_RETRY);
    }
}

/// Blocks the writer thread for `wait`, looking at `stop` every few milliseconds (the
/// thread cannot take the stop's wake-up from its queue without taking appends); false
/// at the stop.
fn sleep_unless_stopped(wait: std::time::Duration, stop: &CancellationToken) -> bool {
    let until = std::time::Instant::now() + wait;
    while !stop.is_cancelled() {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(std::time::Duration::from_millis(20)));
    }
    false
}

/// How soon a write refused for want of space is tried again, at first and at most.
const NO_SPACE_FIRST_RETRY: std::time::Duration = std::time::Duration::from_millis(50);
const NO_SPACE_LAST_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
