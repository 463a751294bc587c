//! Directories that survive a crash: creating a directory changes its parent, and that
//! change is durable only once the parent is fsynced. `std::fs::create_dir_all` syncs
//! nothing, so a crash right after a node's first start could lose the whole tree it
//! made, and with it a WAL whose appends were already acknowledged.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Fsyncs a directory, making the entries created or renamed in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and every missing ancestor, fsyncing each new directory and the parent
/// it was created in. Returns the directories it created, outermost first. Another
/// process creating the same directory meanwhile is not an error.
pub fn create_dir_all(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.exists() {
        missing.push(at.to_path_buf());
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p,
            _ => break,
        }
    }
    missing.reverse();
    for d in &missing {
        match std::fs::create_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("cannot create {}: {e}", d.display()))),
        }
        sync_dir(d)?;
        let parent = d
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        sync_dir(parent)?;
    }
    Ok(missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Issue 20, defect 3: every directory made on the way to a WAL is created (and its
    // parent synced), not only the last one.
    #[test]
    fn creates_every_missing_ancestor_outermost_first_and_only_those() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("wal");
        let deep = root.join("streamd-1").join("00000000000000000001");
        let made = create_dir_all(&deep).expect("create");
        assert_eq!(made, vec![root.clone(), root.join("streamd-1"), deep.clone()]);
        assert!(deep.is_dir());
        // Existing directories are left alone, and nothing is reported for them.
        assert!(create_dir_all(&deep).expect("again").is_empty());
        let sibling = root.join("streamd-2");
        assert_eq!(create_dir_all(&sibling).expect("sibling"), vec![sibling.clone()]);
    }

    #[test]
    fn a_file_in_the_way_is_an_error_naming_the_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("taken");
        std::fs::write(&file, b"x").expect("write");
        let err = create_dir_all(&file.join("wal")).expect_err("a file is not a directory");
        assert!(err.to_string().contains("taken"), "{err}");
    }
}
