#!/usr/bin/env bash
# Checks the workspace's layering: the services that follow the metadata log (streamd,
# gatewayd) depend on weir-meta, never on metad, so they link neither Raft (openraft)
# nor its storage (RocksDB); and weir-meta itself links neither.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for crate in weir-meta weir-streamd weir-gatewayd; do
  tree=$(cargo tree -p "$crate" -e normal --prefix none --offline 2>/dev/null || cargo tree -p "$crate" -e normal --prefix none)
  for forbidden in openraft rocksdb librocksdb-sys weir-metad; do
    if grep -q "^$forbidden v" <<<"$tree"; then
      echo "check-layering: $crate depends on $forbidden; it must follow metad through weir-meta" >&2
      status=1
    fi
  done
done
[ "$status" -eq 0 ] && echo "check-layering: weir-meta, weir-streamd and weir-gatewayd link no Raft or RocksDB" >&2
exit "$status"
