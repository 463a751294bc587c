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

/// A small ext4 volume loop-mounted at a directory (issue 60's full-disk tests), made
/// from an image file; unmounted and removed when dropped. Needs root: a test that
/// cannot mount it fails saying so, never passes unchecked.
pub struct LoopDisk {
    pub at: std::path::PathBuf,
    image: std::path::PathBuf,
}

impl LoopDisk {
    /// An ext4 volume of `mib` MiB with no root reserve, mounted at `at`.
    pub fn mount(at: &std::path::Path, mib: u64) -> LoopDisk {
        use std::process::Command;
        let image = at.with_extension("img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(mib << 20))
            .expect("image file");
        let made = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&image)
            .status()
            .expect("run mkfs.ext4 (e2fsprogs)");
        assert!(made.success(), "mkfs.ext4 {} failed", image.display());
        std::fs::create_dir_all(at).expect("mount point");
        let mounted = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(at)
            .status()
            .expect("run mount");
        assert!(
            mounted.success(),
            "this test needs root to loop-mount a {mib} MiB ext4 volume at {} (CI runs as root)",
            at.display()
        );
        LoopDisk {
            at: at.to_path_buf(),
            image,
        }
    }

    /// Free bytes an unprivileged writer can use.
    pub fn free_bytes(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(&self.at).expect("statvfs");
        st.blocks_available() * st.fragment_size()
    }

    /// Fills the volume from outside, with a file of its own, until `leave` bytes are
    /// free (another process filling the disk).
    pub fn fill_leaving(&self, leave: u64) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.at.join("filler"))
            .expect("filler file");
        let chunk = vec![0xa5u8; 256 << 10];
        while self.free_bytes() > leave + chunk.len() as u64 {
            f.write_all(&chunk).expect("filling the volume");
            f.sync_data().expect("sync the filler");
        }
    }

    /// Fills the volume from outside until a write fails for lack of space, then makes
    /// directories until that fails too: not a block is left for anything.
    pub fn fill_up(&self) {
        self.fill_leaving(0);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.at.join("filler"))
            .expect("filler file");
        let block = vec![0xa5u8; 4096];
        loop {
            match f.write_all(&block).and_then(|()| f.sync_data()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOSPC as i32) => break,
                Err(e) => panic!("filling the volume: {e}"),
            }
        }
        // ext4 keeps a reserve for metadata that new directories still draw on: use it
        // up too, so not even a directory can be made.
        for n in 0.. {
            match std::fs::create_dir(self.at.join(format!("filler-dir-{n}"))) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOSPC as i32) => break,
                Err(e) => panic!("filling the volume with directories: {e}"),
            }
        }
    }

    /// Removes the filler of [`LoopDisk::fill_leaving`].
    pub fn free_filler(&self) {
        std::fs::remove_file(self.at.join("filler")).expect("remove the filler");
        for entry in std::fs::read_dir(&self.at).expect("the volume").flatten() {
            if entry.file_name().to_string_lossy().starts_with("filler-dir-") {
                std::fs::remove_dir(entry.path()).expect("remove a filler directory");
            }
        }
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.at).status();
        let _ = std::fs::remove_file(&self.image);
    }
}
