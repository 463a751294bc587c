//! Which ranges a pass rewrites, and in what batches.
//!
//! In each maximal run of consecutive ranges smaller than the target, a window is
//! merged only when its largest range is no larger than the rest together, so every
//! rewrite of a byte at least doubles the range holding it: a byte is rewritten at most
//! log2(target / upload size) times, and a stream keeps about ceil(bytes / target)
//! ranges plus a few per size class below it.

use std::ops::Range;
use weir_meta::model::ObjectRange;

/// Most ranges one window replaces (a stream's swap in one log entry).
pub const MAX_RUN: usize = 1_000;

/// Cuts `planned` into batches whose windows hold at most `budget` bytes (a stream
/// larger than that is a batch of its own).
pub fn batches<T>(planned: Vec<(T, Vec<Vec<ObjectRange>>)>, budget: u64) -> Vec<Vec<(T, Vec<Vec<ObjectRange>>)>> {
    let mut out: Vec<Vec<(T, Vec<Vec<ObjectRange>>)>> = Vec::new();
    let mut bytes = 0u64;
    for (stream, windows) in planned {
        let size: u64 = windows.iter().flatten().map(|r| r.len).sum();
        if out.is_empty() || (bytes + size > budget && !out.last().is_some_and(|b| b.is_empty())) {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        out.last_mut().expect("pushed above").push((stream, windows));
    }
    out
}

/// The windows of `ranges` (a stream's ranges in offset order) worth merging.
pub fn plan(ranges: &[ObjectRange], target: u64) -> Vec<Range<usize>> {
    let mut windows = Vec::new();
    let mut i = 0;
    while i < ranges.len() {
        if ranges[i].len >= target {
            i += 1;
            continue;
        }
        let run_end = (i..ranges.len())
            .find(|&j| ranges[j].len >= target)
            .unwrap_or(ranges.len());
        split_dominated(ranges, i..run_end, &mut windows);
        i = run_end;
    }
    // Each window is one swap in a log entry; long ones are cut.
    windows
        .into_iter()
        .flat_map(|w| {
            let (start, end) = (w.start, w.end);
            (start..end)
                .step_by(MAX_RUN)
                .map(move |s| s..(s + MAX_RUN).min(end))
                .filter(|w| w.len() >= 2)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Adds `run` to `out` when no range in it outweighs the others together; otherwise
/// leaves the heaviest range alone and looks at what is on either side of it.
fn split_dominated(ranges: &[ObjectRange], run: Range<usize>, out: &mut Vec<Range<usize>>) {
    if run.len() < 2 {
        return;
    }
    let total: u64 = ranges[run.clone()].iter().map(|r| r.len).sum();
    let (heaviest, max) = run
        .clone()
        .map(|i| (i, ranges[i].len))
        .max_by_key(|&(i, len)| (len, std::cmp::Reverse(i)))
        .expect("a run of at least two");
    if max <= total - max {
        out.push(run);
    } else {
        split_dominated(ranges, run.start..heaviest, out);
        split_dominated(ranges, heaviest + 1..run.end, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_shared::ids::{ObjectKey, Offset};

    #[test]
    fn a_pass_reads_its_sources_in_batches_within_the_memory_budget() {
        // Streams whose windows hold 40, 40, 30, 100 and 10 bytes, a budget of 80.
        let planned: Vec<(usize, Vec<Vec<ObjectRange>>)> = [40u64, 40, 30, 100, 10]
            .iter()
            .enumerate()
            .map(|(i, &len)| (i, vec![ranges(&[len / 2, len - len / 2])]))
            .collect();
        let got: Vec<Vec<usize>> = batches(planned, 80)
            .into_iter()
            .map(|b| b.into_iter().map(|(i, _)| i).collect())
            .collect();
        // A stream over the budget is a batch of its own; no stream is split or lost.
        assert_eq!(got, vec![vec![0, 1], vec![2], vec![3], vec![4]]);
    }

    fn ranges(lens: &[u64]) -> Vec<ObjectRange> {
        lens.iter()
            .enumerate()
            .map(|(i, &len)| ObjectRange {
                key: ObjectKey(format!("data/{i}")),
                start: Offset(i as u64),
                end: Offset(i as u64 + 1),
                pos: 0,
                len,
                crc: 0,
                max_timestamp: 0,
                txns: Default::default(),
            })
            .collect()
    }

    #[test]
    fn small_uploads_are_merged_and_full_ranges_are_left_alone() {
        assert_eq!(plan(&ranges(&[10, 10, 10, 10]), 100), vec![0..4]);
        // A full range splits runs; a lone small range is left.
        assert_eq!(
            plan(&ranges(&[10, 10, 100, 10, 200, 10, 10, 10]), 100),
            vec![0..2, 5..8]
        );
        assert!(plan(&ranges(&[100, 5, 100]), 100).is_empty());
    }

    #[test]
    fn a_range_that_outweighs_the_rest_is_not_rewritten_for_them() {
        // 60 > 5 + 5: the big partial waits until the small ones add up.
        assert_eq!(plan(&ranges(&[60, 5, 5]), 100), vec![1..3]);
        assert_eq!(plan(&ranges(&[60, 30, 30]), 100), vec![0..3]);
        // Dominance is checked on each side of the heaviest range.
        assert_eq!(plan(&ranges(&[4, 4, 90, 1]), 100), vec![0..2]);
    }

    #[test]
    fn long_runs_are_cut_into_commands_of_at_most_max_run_ranges() {
        let windows = plan(&ranges(&vec![1; MAX_RUN * 2 + 1]), 1 << 30);
        assert_eq!(windows, vec![0..MAX_RUN, MAX_RUN..2 * MAX_RUN]);
    }

    #[test]
    fn repeated_compaction_rewrites_each_byte_a_bounded_number_of_times() {
        // Simulate: every round one upload of 1 or 2 units arrives, then the plan runs and each
        // window becomes one range of the window's size (cut at the target).
        let target = 64;
        let mut lens: Vec<u64> = Vec::new();
        let mut rewritten = 0u64;
        for upload in 0..4096u64 {
            // Uploads vary a little in size, as they do.
            lens.push(1 + upload % 2);
            let windows = plan(&ranges(&lens), target);
            // D-20's bound, counted before the pass: ceil(bytes / target) ranges, one per
            // size class between the smallest upload and the target (log2(64 / 1) + 1),
            // and the one upload the pass has yet to merge.
            let bytes: u64 = lens.iter().sum();
            assert!(
                lens.len() as u64 <= bytes.div_ceil(target) + 7 + 1,
                "round {upload}: {} ranges for {bytes} bytes: {lens:?}",
                lens.len()
            );
            for w in windows.iter().rev() {
                let total: u64 = lens[w.clone()].iter().sum();
                rewritten += total;
                let mut pieces = vec![target; (total / target) as usize];
                if !total.is_multiple_of(target) {
                    pieces.push(total % target);
                }
                lens.splice(w.clone(), pieces);
            }
        }
        let bytes: u64 = lens.iter().sum();
        assert_eq!(bytes, 4096 * 3 / 2);
        assert!(
            rewritten <= bytes * 8,
            "each byte rewritten at most log2(64) + 2 times: {rewritten}"
        );
        assert!(
            lens.len() as u64 <= bytes.div_ceil(target) + 8,
            "ranges stay near bytes / target: {}",
            lens.len()
        );
    }
}
