//! How fast a compaction pass reads and writes. A pass rewrites whatever was uploaded
//! since the last one, and a backlog (a node restarted, or a burst of ingest) written
//! at the disk's full speed took the disk and both cores from appends: the produce p99
//! went from 2 ms to 22–56 ms while 600 MB were rewritten in under 10 s (issue 17). So
//! a pass goes no faster than `--compaction-max-bytes-per-sec`, like Kafka's
//! `log.cleaner.io.max.bytes.per.second`, except that it always gets the rate it needs
//! to finish within most of an interval: the ranges bound (D-20) counts on a pass
//! ending before the next is due, whatever the limit.

use std::time::Duration;

/// The part of an interval a pass is paced to fill; the rest is slack for its log
/// entries and for reads slower than the pace.
const INTERVAL_SHARE: f64 = 0.8;

/// The rate for a pass that reads `source_bytes` and writes as many, given the
/// configured `limit` (0: none) and the interval between passes.
pub fn pass_rate(limit: u64, source_bytes: u64, interval: Duration) -> u64 {
    if limit == 0 {
        return 0;
    }
    let needed = (2 * source_bytes) as f64 / (interval.as_secs_f64() * INTERVAL_SHARE);
    limit.max(needed.ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_goes_at_the_limit_unless_it_would_not_end_within_the_interval() {
        let minute = Duration::from_secs(60);
        assert_eq!(
            pass_rate(32 << 20, 64 << 20, minute),
            32 << 20,
            "a small pass at the limit"
        );
        // 600 MB read and written in 48 s needs 25 MB/s: still the limit.
        assert_eq!(pass_rate(32 << 20, 600_000_000, minute), 32 << 20);
        // 2 GB would take 2 minutes at the limit: raised to end in 48 s.
        assert_eq!(pass_rate(32 << 20, 2_000_000_000, minute), 83_333_334);
        assert_eq!(pass_rate(0, 2_000_000_000, minute), 0, "no limit stays none");
    }
}
