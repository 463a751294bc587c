#!/usr/bin/env bash
# Builds the release binaries the way that used to let failpoints in (`--workspace`
# unifies the test crate's `failpoints` feature into every binary) and fails if any of
# them still carries a failpoint: their environment variables' prefix, WEIR_FAILPOINT_.
# Issue 61. Slow (a release build), so not part of CI: run it before a release.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
cargo build --release --workspace --bins
found=0
for bin in weir metad streamd gatewayd; do
  path="$target/release/$bin"
  [ -x "$path" ] || { echo "check-release-failpoints: $path was not built" >&2; exit 1; }
  if grep -q --binary-files=text WEIR_FAILPOINT_ "$path"; then
    echo "check-release-failpoints: $path carries failpoints (WEIR_FAILPOINT_)" >&2
    found=1
  fi
done
[ "$found" = 0 ] && echo "check-release-failpoints: no release binary carries a failpoint"
exit "$found"
