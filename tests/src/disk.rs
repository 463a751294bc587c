//! What the disk under a directory does, for benchmarks that quote Weir's figures as a
//! ratio of it.

use std::io::Write;
use std::time::{Duration, Instant};

/// 4 KiB write + fdatasync in a loop for 3 s: syncs per second.
pub fn raw_sync_rate(dir: &std::path::Path) -> f64 {
    let mut f = std::fs::File::create(dir.join("raw")).expect("raw file");
    let block = vec![7u8; 4096];
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(3) {
        f.write_all(&block).expect("write");
        f.sync_data().expect("fdatasync");
        n += 1;
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// 256 MiB written in 1 MiB blocks, then one fdatasync: MB per second.
pub fn sequential_bandwidth(dir: &std::path::Path) -> f64 {
    let mut f = std::fs::File::create(dir.join("seq")).expect("seq file");
    let block = vec![7u8; 1 << 20];
    let started = Instant::now();
    for _ in 0..256 {
        f.write_all(&block).expect("write");
    }
    f.sync_data().expect("fdatasync");
    256.0 / started.elapsed().as_secs_f64()
}
