#!/usr/bin/env bash
# Checks the workspace's layering:
# - the services that follow the metadata log (streamd, gatewayd) depend on weir-meta,
#   never on metad, so they link neither Raft (openraft) nor its storage (RocksDB); and
#   weir-meta itself links neither;
# - streamd's layers (issue 63): the storage core never names a coordinator, the
#   coordinators reach the node only through `node/core_api.rs` (and implement
#   `node/coordination.rs`), and Kafka's state on a partition (`partition/`) names
#   nothing of the node above it;
# - gatewayd's Kafka handlers take a `Caller`, never the connection (`conn.rs`), so
#   the request dispatch there is the one place that knows every handler;
# - and no files of a crate import each other in a circle (check-import-cycles.py).
#
# WEIR_LAYERING_SOURCES=DIR checks the sources under DIR (a copy of the workspace's
# crates) instead, without the dependency check: the test of this script uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts=$PWD/scripts
status=0

if [ -z "${WEIR_LAYERING_SOURCES:-}" ]; then
  for crate in weir-meta weir-streamd weir-gatewayd; do
    tree=$(cargo tree -p "$crate" -e normal --prefix none --offline 2>/dev/null || cargo tree -p "$crate" -e normal --prefix none)
    for forbidden in openraft rocksdb librocksdb-sys weir-metad; do
      if grep -q "^$forbidden v" <<<"$tree"; then
        echo "check-layering: $crate depends on $forbidden; it must follow metad through weir-meta" >&2
        status=1
      fi
    done
  done
else
  cd "$WEIR_LAYERING_SOURCES"
fi

# Prints the lines of the given files that match $1 (a Perl regex) outside comments.
code_matching() {
  local pattern=$1
  shift
  grep -nP "$pattern" "$@" /dev/null | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' || true
}

# Fails the check, saying why, when $2 (what was found) is not empty.
refuse() {
  local why=$1 found=$2
  if [ -n "$found" ]; then
    echo "check-layering: $why:" >&2
    echo "$found" >&2
    status=1
  fi
}

# The storage core: every streamd file but the coordinators and the wiring above both.
core=$(find streamd/src -name '*.rs' -not -path 'streamd/src/coordinators/*' -not -name lib.rs \
  -not -name main.rs -not -path streamd/src/server.rs -not -path streamd/src/service.rs | sort)
# shellcheck disable=SC2086
refuse "streamd's storage core names a coordinator; ask through node/coordination.rs's traits instead" \
  "$(code_matching '\bcoordinators::' $core)"
# shellcheck disable=SC2046
refuse "a streamd coordinator reaches into the node; use node/core_api.rs's CoreApi (or implement node/coordination.rs)" \
  "$(code_matching 'crate::node::(?!core_api\b|coordination\b)' $(find streamd/src/coordinators -name '*.rs'))"
# shellcheck disable=SC2046
refuse "streamd's partition state names the node above it; it must stay pure state the core feeds" \
  "$(code_matching 'crate::(node|stream|wal|object|coordinators|service|server|metrics)\b' $(find streamd/src/partition -name '*.rs'))"
handlers=$(find gatewayd/src/kafka -name '*.rs' -not -name conn.rs -not -name mod.rs | sort)
# shellcheck disable=SC2086
refuse "a gatewayd Kafka handler imports the connection module; take a Caller (kafka/caller.rs) instead" \
  "$(code_matching '\bconn::' $handlers)"
# shellcheck disable=SC2046
python3 "$scripts/check-import-cycles.py" $(for c in shared proto meta metad streamd gatewayd cli; do [ -d "$c/src" ] && echo "$c"; done) || status=1

[ "$status" -eq 0 ] && echo "check-layering: weir-meta, weir-streamd and weir-gatewayd link no Raft or RocksDB; streamd's core names no coordinator; no Kafka handler takes the connection" >&2
exit "$status"
