#!/usr/bin/env bash
# Installs what building and testing Weir needs beyond the Rust toolchain, on Debian/Ubuntu.
# Idempotent: does nothing when everything is present.
set -euo pipefail

need=()
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)   # bindgen, for RocksDB
dpkg -s clang >/dev/null 2>&1 || need+=(clang)
command -v g++ >/dev/null 2>&1 || need+=(g++)                    # RocksDB is C++
command -v kcat >/dev/null 2>&1 || need+=(kcat)                  # a real Kafka client (librdkafka 2.0)
command -v strace >/dev/null 2>&1 || need+=(strace)              # syscall order: acks after fdatasync
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)    # the compose base image, without a registry
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
# Real Kafka clients for the Kafka-protocol tests.
python3 -c "import confluent_kafka, kafka, yaml" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check confluent-kafka==2.12.1 kafka-python==2.2.15 PyYAML==6.0.2
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy 2>/dev/null || true

tools="${WEIR_TOOLS_DIR:-/var/cache/weir/tools}"
# The newest kafka-python, beside the pinned one: static membership (KIP-345) needs 2.3+.
# Tests put it first on PYTHONPATH where they use it.
if [ ! -f "$tools/py/kafka-python-3/kafka/version.py" ]; then
  mkdir -p "$tools/py"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$tools/py/kafka-python-3" kafka-python==3.0.12
fi

# The S3-protocol server the tests run against (real SigV4, ready in 0.1 s).
if [ ! -x "$tools/bin/s3s-fs" ] && ! command -v s3s-fs >/dev/null 2>&1; then
  mkdir -p "$tools"
  CARGO_TARGET_DIR="$tools/target" cargo install --locked s3s-fs@0.14.1 --features binary --root "$tools"
  rm -rf "$tools/target"
fi
