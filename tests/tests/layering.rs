//! The layering check (`scripts/check-layering.sh`, issue 63) run on a copy of the
//! sources: it passes on them as they are, and fails, naming the file, on each kind of
//! arrow it exists to refuse.

use std::path::{Path, PathBuf};
use std::process::Command;

const CRATES: &[&str] = &["shared", "proto", "meta", "metad", "streamd", "gatewayd", "cli"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir").flatten() {
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("copy");
        }
    }
}

/// A copy of every crate's `src/`.
fn sources() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    for c in CRATES {
        copy_dir(&workspace().join(c).join("src"), &dir.path().join(c).join("src"));
    }
    dir
}

fn append(root: &Path, file: &str, text: &str) {
    let path = root.join(file);
    let mut code = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    code.push_str(text);
    std::fs::write(&path, code).expect("write");
}

/// The check's exit and what it said.
fn check(root: &Path) -> (bool, String) {
    let out = Command::new("bash")
        .arg(workspace().join("scripts/check-layering.sh"))
        .env("WEIR_LAYERING_SOURCES", root)
        .output()
        .expect("bash runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn assert_refused(file: &str, text: &str, why: &str) {
    let copy = sources();
    append(copy.path(), file, text);
    let (ok, said) = check(copy.path());
    assert!(!ok, "the check passed with {text:?} in {file}: {said}");
    assert!(said.contains(why) && said.contains(file), "{file}: {said}");
}

#[test]
fn the_layering_check_passes_on_the_sources_as_they_are() {
    let copy = sources();
    let (ok, said) = check(copy.path());
    assert!(ok, "{said}");
}

#[test]
fn the_layering_check_refuses_a_core_file_naming_a_coordinator() {
    assert_refused(
        "streamd/src/node/read.rs",
        "\nfn _probe() -> usize { std::mem::size_of::<crate::coordinators::groups::Groups>() }\n",
        "storage core names a coordinator",
    );
}

#[test]
fn the_layering_check_refuses_a_coordinator_reaching_into_the_node() {
    assert_refused(
        "streamd/src/coordinators/state_stream.rs",
        "\n#[allow(unused_imports)]\nuse crate::node::Node;\n",
        "coordinator reaches into the node",
    );
}

#[test]
fn the_layering_check_refuses_partition_state_naming_the_node() {
    assert_refused(
        "streamd/src/partition/txns.rs",
        "\n#[allow(unused_imports)]\nuse crate::node::Node;\n",
        "partition state names the node above it",
    );
}

#[test]
fn the_layering_check_refuses_a_kafka_handler_taking_the_connection() {
    assert_refused(
        "gatewayd/src/kafka/produce.rs",
        "\n#[allow(unused_imports)]\nuse super::conn::Session;\n",
        "Kafka handler imports the connection module",
    );
}

#[test]
fn the_layering_check_refuses_sibling_files_importing_each_other() {
    // The WAL's handle (`writer.rs`) names the stall; the stall naming the handle back
    // closes a circle of two siblings.
    assert_refused(
        "streamd/src/wal/stall.rs",
        "\n#[allow(unused_imports)]\nuse super::writer::WalWriter;\n",
        "import each other in a circle",
    );
}
