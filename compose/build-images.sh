#!/usr/bin/env bash
# Builds the `weir` image (metad, streamd, gatewayd, weir, s3s-fs) from binaries built
# on this host, on the base image named by $WEIR_BASE_IMAGE (default
# weir-base:bookworm). The base is used when present, pulled when a registry answers,
# and otherwise made here from Debian packages with debootstrap + `docker import`, so
# the same compose file works with or without a container registry.
set -euo pipefail
cd "$(dirname "$0")/.."

base="${WEIR_BASE_IMAGE:-weir-base:bookworm}"
image="${WEIR_IMAGE:-weir:dev}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/weir/target}"
target="$CARGO_TARGET_DIR"
profile="${WEIR_PROFILE:-debug}"
tools="${WEIR_TOOLS_DIR:-/var/cache/weir/tools}"

if [ "$profile" = release ]; then
  cargo build --release --bin metad --bin streamd --bin gatewayd --bin weir
else
  cargo build --workspace --all-targets   # the same units the tests build: no extra RocksDB build
fi

if ! docker image inspect "$base" >/dev/null 2>&1; then
  if ! docker pull "$base" >/dev/null 2>&1; then
    echo "build-images: $base is not here and no registry has it; creating it with debootstrap" >&2
    command -v debootstrap >/dev/null || {
      sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
      $sudo apt-get install -y -qq debootstrap >/dev/null
    }
    rootfs="$(mktemp -d /tmp/weir-rootfs.XXXXXX)"
    trap 'rm -rf "$rootfs"' EXIT
    # The binaries link glibc and libstdc++ of this host's Debian release.
    debootstrap --variant=minbase --include=ca-certificates,curl bookworm "$rootfs" \
      "${WEIR_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >/dev/null
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' - "$base" >/dev/null
  fi
fi

# The first admin token's secret, for the bootstrapping metad only (DEP-8).
if [ ! -s compose/admin-token ]; then
  (umask 077; echo "weir_$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" > compose/admin-token)
  echo "build-images: wrote a new admin token secret to compose/admin-token"
fi

# The cluster's CA and every service's certificate (issue 18), made once and kept, so
# clients keep trusting the CA; never committed. Each names the service's name on the
# compose network (where its peers reach it) and `spiffe://weir/ROLE/ID`; gateways
# also localhost and 127.0.0.1, where their ports are published. `operator-compose` is
# for `weir` inside metad-1 (compose/test.sh).
weir="$target/$profile/weir"
certs=compose/certs
[ -s "$certs/ca.pem" ] || "$weir" certs ca --dir "$certs" >/dev/null
issue() { # ROLE ID FILE-STEM [extra flags]
  local role=$1 id=$2 stem=$3; shift 3
  [ -s "$certs/$stem.pem" ] || "$weir" certs issue --dir "$certs" --role "$role" --id "$id" "$@" >/dev/null
}
for i in 1 2 3; do
  issue metad "$i" "metad-$i" --dns "metad-$i"
  issue streamd "streamd-$i" "streamd-streamd-$i" --dns "streamd-$i"
done
for g in gatewayd-1 gatewayd-2; do
  issue gatewayd "$g" "gatewayd-$g" --dns "$g" --dns localhost --ip 127.0.0.1
done
issue operator compose operator-compose

stage="$(mktemp -d /tmp/weir-image.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin"
for b in metad streamd gatewayd weir; do cp "$target/$profile/$b" "$stage/bin/"; done
s3s="$(command -v s3s-fs || echo "$tools/bin/s3s-fs")"
cp "$s3s" "$stage/bin/"
# Debug info is most of a debug build's size; the image does not need it.
strip --strip-debug "$stage"/bin/* 2>/dev/null || true
cp compose/Dockerfile "$stage/"
DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE=$base" -t "$image" "$stage" >/dev/null
echo "build-images: built $image on $base"
