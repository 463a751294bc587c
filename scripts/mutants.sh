#!/usr/bin/env bash
# Mutation testing of the modules whose decisions the tests must pin down (issue 61):
# for each, cargo-mutants changes the code one mutant at a time and runs that crate's
# unit tests; a mutant the tests do not catch is a behaviour no test checks. Prints each
# module's score (caught / (caught + missed)) and keeps the lists of survivors under
# target/mutants/<module>/. Slow (minutes per module): not part of CI.
#
#   scripts/mutants.sh                 every module below
#   scripts/mutants.sh failover_plan   the modules whose name contains this
#   WEIR_MUTANTS_BUDGET_SEC=900        the time bound per module (default 1200)
#   WEIR_MUTANTS_JOBS=2                mutants built and tested at once (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null 2>&1 || cargo install --locked cargo-mutants
budget="${WEIR_MUTANTS_BUDGET_SEC:-1200}"
jobs="${WEIR_MUTANTS_JOBS:-1}"
only="${1:-}"
out_root="${CARGO_TARGET_DIR:-target}/mutants"
# Mutants build in a target directory of their own. Cargo names a workspace's
# artifacts by paths relative to it, so mutated copies built into the shared one would
# replace its artifacts with mutants that a later build there, seeing older sources,
# keeps using (and a build there meanwhile would test mutants against the original).
# For the same reason, run one mutants.sh at a time per CARGO_TARGET_DIR: two runs
# sharing it build each other's mutants and report false survivors.
export CARGO_TARGET_DIR="$out_root/target"
# name | package | files (space-separated globs); each runs the package's unit tests (--lib)
modules=(
  "failover_plan|weir-meta|meta/src/failover_plan.rs"
  "placement|weir-meta|meta/src/placement.rs"
  "drain_plan|weir-meta|meta/src/drain_plan.rs"
  "model_apply|weir-meta|meta/src/model/apply/*.rs"
  "catch_up|weir-meta|meta/src/catch_up.rs"
  "takeover_agents|weir-meta|meta/src/model/takeover_agents.rs"
  "wal_object|weir-streamd|streamd/src/wal/object.rs streamd/src/wal/object_writer.rs"
  "wal_file|weir-streamd|streamd/src/wal/file.rs streamd/src/wal/file_writer.rs streamd/src/wal/direct.rs"
  "wal_commit|weir-streamd|streamd/src/wal/group_commit.rs streamd/src/wal/writer.rs streamd/src/wal/stall.rs streamd/src/wal/mod.rs"
  "wal_record|weir-streamd|streamd/src/wal/record.rs"
  "takeover|weir-streamd|streamd/src/node/takeover.rs streamd/src/node/reconcile.rs"
  "gateway_errors|weir-gatewayd|gatewayd/src/kafka/errors.rs"
  "error_code|weir-shared|shared/src/error_code.rs"
)
printf '%-16s %8s %8s %8s %8s %7s\n' module caught missed timeout unviable score
for m in "${modules[@]}"; do
  IFS='|' read -r name package files <<<"$m"
  [ -n "$only" ] && [[ "$name" != *"$only"* ]] && continue
  out="$out_root/$name"
  mkdir -p "$out"
  args=(--package "$package" --output "$out" --no-shuffle --jobs "$jobs" --test-tool cargo -- --lib)
  file_args=()
  for f in $files; do file_args+=(--file "$f"); done
  # cargo-mutants exits non-zero when mutants survive; the counts say how it went.
  timeout "$budget" cargo mutants "${file_args[@]}" "${args[@]}" >"$out/log.txt" 2>&1 || true
  # grep -c prints 0 and fails on an empty list: one number either way.
  count() {
    local n=0
    [ -f "$out/mutants.out/$1.txt" ] && n=$(grep -c . "$out/mutants.out/$1.txt" || true)
    echo "${n:-0}"
  }
  caught=$(count caught) missed=$(count missed) timeouts=$(count timeout) unviable=$(count unviable)
  total=$((caught + missed))
  score="–"
  [ "$total" -gt 0 ] && score="$((100 * caught / total)) %"
  printf '%-16s %8s %8s %8s %8s %7s\n' "$name" "$caught" "$missed" "$timeouts" "$unviable" "$score"
done
echo "survivors: $out_root/<module>/mutants.out/missed.txt"
