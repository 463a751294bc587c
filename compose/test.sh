#!/usr/bin/env bash
# The compose stack end to end (issue 8): build the images without a registry, start
# the stack, produce and consume with kcat through the published Kafka port (SASL_SSL)
# and with curl through HTTPS, both with the bootstrap admin token, SIGKILL a streamd (`docker kill`) and read every acknowledged
# message back, stop another with `docker-compose stop` (exit 0, three phase records),
# and `docker-compose down`. Bounded in time; cleans up after itself even on failure.
# Checks DEP-1, DEP-2 and DEP-3 (grace periods set and above deadlines, statically, with
# a negative case; a SIGKILLed node recovered by takeover), DEP-6 and DEP-7 (one
# `docker-compose stop`: the binary as PID 1 gets SIGTERM, exits 0 with three phase
# records), DEP-8 (only the bootstrap metad gets the admin secret), INV-2 after
# `docker kill`, and DEP-5 (a streamd paused past the node timeout is fenced, exits
# 75, and is restarted by its restart policy at a new epoch).
set -euo pipefail
cd "$(dirname "$0")"

project="weirtest$$"
export COMPOSE_PROJECT_NAME="$project"
# Short liveness timing so failover is quick; ports away from a developer's own.
export WEIR_HEARTBEAT_INTERVAL_SEC=1 WEIR_NODE_TIMEOUT_SEC=3
export WEIR_KAFKA_PORT_1=29092 WEIR_KAFKA_PORT_2=29093 WEIR_HTTP_PORT_1=28080 WEIR_HTTP_PORT_2=28081
compose=(docker-compose -f docker-compose.yml)
kafka="127.0.0.1:$WEIR_KAFKA_PORT_1"
http="https://127.0.0.1:$WEIR_HTTP_PORT_1"

log() { echo "compose/test: $*"; }
fail() { log "FAILED: $*"; "${compose[@]}" ps || true; "${compose[@]}" logs --tail 40 || true; exit 1; }
cleanup() { "${compose[@]}" down -v --remove-orphans -t 10 >/dev/null 2>&1 || true; }
trap cleanup EXIT
# Everything below is bounded: each wait has its own limit, and the whole run 15 min.
( sleep 900; log "timed out"; kill -TERM $$ ) & watchdog=$!
trap 'kill $watchdog 2>/dev/null || true; cleanup' EXIT

# wait_until SECONDS DESCRIPTION COMMAND...
wait_until() {
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || fail "$what within ${limit}s"
    sleep 1
  done
}

log "static check of grace periods"
python3 check-grace.py docker-compose.yml
python3 check-grace.py docker-compose.yml docker-compose.object-wal.yml
bad="$(mktemp /tmp/weir-bad-compose.XXXXXX.yml)"
sed 's/stop_grace_period: 60s/stop_grace_period: 30s/' docker-compose.yml > "$bad"
if python3 check-grace.py "$bad" 2>/dev/null; then rm -f "$bad"; fail "a 30 s grace under a 50 s deadline passed the check"; fi
rm -f "$bad"

log "building images"
./build-images.sh

# The stack is secure by default (issue 18): HTTPS and Kafka SASL_SSL with a token.
# Clients trust the CA build-images.sh made and use the bootstrap admin token.
secret="$(cat admin-token)"
ca="certs/ca.pem"
kc() { kcat -b "$kafka" -X security.protocol=SASL_SSL -X sasl.mechanisms=PLAIN -X sasl.username=admin \
  -X "sasl.password=$secret" -X "ssl.ca.location=$ca" "$@"; }
c() { curl --cacert "$ca" -H "Authorization: Bearer $secret" "$@"; }
# `weir` inside metad-1 reaches metad over mTLS with the operator's certificate.
operator="--cluster-ca /run/secrets/ca --cluster-cert /run/secrets/operator-cert --cluster-key /run/secrets/operator-key"
export secret ca kafka; export -f kc c   # for the `bash -c` conditions below

log "starting the stack"
"${compose[@]}" up -d
healthy() { [ "$(docker inspect -f '{{.State.Health.Status}}' "${project}_$1_1")" = healthy ]; }
for s in metad-1 metad-2 metad-3 streamd-1 streamd-2 streamd-3 gatewayd-1 gatewayd-2; do
  wait_until 120 "$s healthy" healthy "$s"
done

log "only the bootstrap metad got the admin token's secret, and the token exists (DEP-8)"
docker exec "${project}_metad-1_1" test -s /run/secrets/admin-token || fail "metad-1 has the secret"
if docker exec "${project}_metad-2_1" printenv WEIR_BOOTSTRAP_ADMIN_TOKEN_FILE >/dev/null 2>&1; then
  fail "metad-2 was given the bootstrap token"
fi
wait_until 30 "admin token issued" bash -c \
  "docker exec ${project}_metad-1_1 weir $operator --metad metad-1:7400 --json tokens list | grep -q '\"admin\"'"

log "inside the network every gRPC call is mTLS: weir without a certificate gets nothing (D-21)"
if docker exec "${project}_metad-1_1" weir --metad metad-1:7400 --timeout-sec 3 nodes list >/dev/null 2>&1; then
  fail "weir without a certificate reached metad"
fi
docker exec "${project}_metad-1_1" weir $operator --metad metad-2:7400 nodes list | grep -q streamd-3 || fail "weir with the operator certificate lists nodes"

log "Kafka SASL_SSL through the published port (kcat) and HTTPS (curl), with the admin token"
wait_until 30 "the admin token known to the gateways" kc -L
kc -L | grep -q "2 brokers" || fail "Metadata lists both gateways"
kcat -b "$kafka" -X security.protocol=SASL_SSL -X sasl.mechanisms=SCRAM-SHA-512 -X sasl.username=admin \
  -X "sasl.password=$secret" -X "ssl.ca.location=$ca" -L | grep -q "2 brokers" || fail "SCRAM-SHA-512 with the admin token"
if kcat -b "$kafka" -L -m 5 >/dev/null 2>&1; then fail "a plaintext Kafka client got metadata"; fi
if curl -s -o /dev/null --max-time 5 "http://127.0.0.1:$WEIR_HTTP_PORT_1/readyz"; then fail "plaintext HTTP was answered"; fi
[ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$ca" "$http/v1/streams")" = 401 ] || fail "a request without a token was not 401"
python3 - "$kafka" "$ca" "$secret" <<'PY'
import sys
from kafka.admin import KafkaAdminClient, NewTopic
KafkaAdminClient(bootstrap_servers=sys.argv[1], security_protocol="SASL_SSL", ssl_cafile=sys.argv[2],
                 sasl_mechanism="PLAIN", sasl_plain_username="admin", sasl_plain_password=sys.argv[3],
                 ).create_topics([NewTopic("orders", 3, 1)])
PY
wait_until 60 "orders/0..2 open" bash -c "for p in 0 1 2; do c -sf $http/v1/streams/orders%2F\$p/records/tail || exit 1; done"
seq 1 1000 | sed 's/.*/k&:v&/' | kc -P -t orders -K: -X acks=all -X enable.idempotence=true
# The records of `orders` read back: how many, if they are v1..vN each once and in
# produce order within each partition (the producers are idempotent), else what is wrong.
count() {
  kc -C -t orders -o beginning -e -q -f '%p %s\n' 2>/dev/null | python3 -c '
import sys
seen, last = [], {}
for line in sys.stdin:
    p, v = line.split()
    n = int(v[1:])
    if n <= last.get(p, 0):
        sys.exit(print(f"v{n} after v{last[p]} in partition {p}"))
    last[p] = n
    seen.append(n)
print(len(seen) if sorted(seen) == list(range(1, len(seen) + 1)) else f"{len(seen)} records, not v1..v{len(seen)} once each")'
}
[ "$(count)" = 1000 ] || fail "consume 1000 records, got $(count)"
c -sf -X POST "$http/v1/streams" -H 'content-type: application/json' -d '{"stream":"hello"}' >/dev/null
wait_until 60 "hello open" c -sf "$http/v1/streams/hello/records/tail"
c -sf -X POST "$http/v1/streams/hello/records" -H 'content-type: application/json' \
  -d '{"records":[{"body":"hi from compose"}]}' >/dev/null || fail "HTTP append"
c -sf "$http/v1/streams/hello/records?seq_num=0" | grep -q "hi from compose" || fail "HTTP read"

log "docker kill the streamd owning orders/0: its partitions are served again, nothing lost"
owner() { c -sf "$http/v1/streams/orders%2F0" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["state"], d["owner"]["node"], d["owner"]["epoch"])'; }
before="$(owner)"
victim="$(cut -d' ' -f2 <<<"$before")"
docker kill "${project}_${victim}_1" >/dev/null
seq 1001 1500 | sed 's/.*/k&:v&/' | kc -P -t orders -K: -X acks=all -X enable.idempotence=true -X message.timeout.ms=120000
# Served again by another node (`docker kill` is a stop by hand: no restart follows).
moved() { now="$(owner)" && [ "${now%% *}" = open ] && [ "$now" != "$before" ]; }
wait_until 120 "orders/0 served again" moved
[ "$(count)" = 1500 ] || fail "every acknowledged record after the kill: got $(count) of 1500"

log "docker pause a streamd past the node timeout: fenced, it exits 75, Docker restarts it at a new epoch (DEP-5)"
# The row of node $1 in /admin/nodes: "<epoch> <fenced>".
row() { c -sf "$http/admin/nodes" | python3 -c 'import json,sys; r=[n for n in json.load(sys.stdin)["nodes"] if n["node_id"]==sys.argv[1]][0]; print(int(r["epoch"]), str(r["fenced"]).lower())' "$1"; }
# Not the node killed above: `docker kill` counts as stopping it by hand, which the
# restart policy leaves stopped. Nor the one stopped below.
other="streamd-1"; [ "$victim" = streamd-1 ] && other="streamd-2"
paused="streamd-3"; [ "$victim" = streamd-3 ] && paused="streamd-2"
container="${project}_${paused}_1"
epoch="$(row "$paused" | cut -d' ' -f1)"
since="$(date +%s)"
docker pause "$container" >/dev/null
fenced() { [ "$(row "$paused")" = "$epoch true" ]; }
wait_until 60 "$paused fenced while paused" fenced
docker unpause "$container" >/dev/null
died() { docker events --since "$since" --until "$(date +%s)" --filter "container=$container" --filter event=die --format '{{.Actor.Attributes.exitCode}}' | grep -qx 75; }
wait_until 60 "$paused exited 75 (fenced)" died
newer() { read -r e f <<<"$(row "$paused")"; [ "$e" -gt "$epoch" ] && [ "$f" = false ]; }
wait_until 120 "$paused restarted by Docker at a new epoch" newer
[ "$(count)" = 1500 ] || fail "every record after the pause: got $(count)"

log "docker-compose stop of another streamd: exit 0 and the three phase records"
"${compose[@]}" stop "$other" >/dev/null
code="$(docker inspect -f '{{.State.ExitCode}}' "${project}_${other}_1")"
[ "$code" = 0 ] || fail "$other exited $code"
logs="$(docker logs "${project}_${other}_1" 2>&1)"
for phase in stop-requested drain-support terminal-teardown; do
  grep -q "\"message\":\"shutdown $phase phase finished\"" <<<"$logs" || fail "$other logged no $phase record"
done
[ "$(count)" = 1500 ] || fail "every record after the stop: got $(count)"

log "docker-compose down leaves nothing running"
"${compose[@]}" down -v -t 60 >/dev/null
left="$(docker ps -q --filter "label=com.docker.compose.project=$project")"
[ -z "$left" ] || fail "containers still running: $left"
log "passed"
