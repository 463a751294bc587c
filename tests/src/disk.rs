//! What the disk under a directory does, for benchmarks that quote Weir's figures as a
//! ratio of it.

use std::io::Write;
use std::time::{Duration, Instant};

/// 4 KiB write + fdatasync in a loop for 3 s: syncs per second.
pub fn raw_sync_rate(dir: &std::path::Path) -> f64 {
    raw_sync(dir).rate
}

/// What 4 KiB write + fdatasync in a loop did: its rate and latency.
pub struct RawSync {
    pub rate: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

/// 4 KiB write + fdatasync in a loop for 3 s, appending to a new file (the file grows,
/// as a WAL that is not preallocated does).
pub fn raw_sync(dir: &std::path::Path) -> RawSync {
    let mut f = std::fs::File::create(dir.join("raw")).expect("raw file");
    let block = vec![7u8; 4096];
    let started = Instant::now();
    let mut lat = Vec::new();
    while started.elapsed() < Duration::from_secs(3) {
        let t = Instant::now();
        f.write_all(&block).expect("write");
        f.sync_data().expect("fdatasync");
        lat.push(t.elapsed());
    }
    let rate = lat.len() as f64 / started.elapsed().as_secs_f64();
    lat.sort();
    let pct = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    RawSync {
        rate,
        p50: pct(0.5),
        p99: pct(0.99),
        max: lat[lat.len() - 1],
    }
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
