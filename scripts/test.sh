#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every unit, property, storage-suite
# and black-box process test. Every black-box test bounds itself with a timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/weir/target}"
export PATH="${WEIR_TOOLS_DIR:-/var/cache/weir/tools}/bin:$PATH"

cargo fmt --all -- --check
# Clippy keeps its own build directory: its units differ from a build's, and sharing
# one would make every switch rebuild RocksDB.
CARGO_TARGET_DIR="${CARGO_TARGET_DIR}-clippy" cargo clippy --workspace --all-targets -- -D warnings
# Builds every binary the black-box tests start (with the same features as the tests,
# so RocksDB is built once), then runs all tests.
cargo build --workspace --all-targets
cargo test --workspace -- --test-threads 2
# The compose stack end to end, where a Docker engine answers.
if docker info >/dev/null 2>&1 && command -v docker-compose >/dev/null; then
  compose/test.sh
else
  echo "scripts/test.sh: no Docker engine or docker-compose here; compose/test.sh not run" >&2
fi
