"""Incremental fetch sessions (KIP-227) with kafka-python (issue 22).

Consumer A reads partition 0 through a fetch session for a while. Consumer B then
opens a session over partitions 1..N-1 on a gateway that keeps one session and lets an
older, smaller session be evicted after <eviction s>: B's evicts A's. A's next
incremental fetch is answered FETCH_SESSION_ID_NOT_FOUND; A starts over and reads on.
Both read every record exactly once. The caller checks the gateway's fetch counters.

Usage: fetch_sessions.py <bootstrap> <topic> <partitions> <records per partition> <eviction s>
"""
import sys
import time

import kafka
from kafka import KafkaConsumer, TopicPartition

BOOT, TOPIC = sys.argv[1], sys.argv[2]
PARTITIONS, PER_PARTITION = int(sys.argv[3]), int(sys.argv[4])
EVICTION = float(sys.argv[5])


def consumer(partitions):
    c = KafkaConsumer(
        bootstrap_servers=BOOT,
        client_id=f"sessions-{partitions[0]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        # Small fetches: many round trips, so sessions are used and evicted midway.
        max_partition_fetch_bytes=2048,
    )
    c.assign([TopicPartition(TOPIC, p) for p in partitions])
    c.seek_to_beginning()
    return c


def read(c, seen, until):
    for records in c.poll(timeout_ms=100).values():
        for r in records:
            key = (r.partition, r.offset)
            if key in seen:
                sys.exit(f"FAIL: {key} read twice")
            seen.add(key)
    return len(seen) >= until


def main():
    print(f"kafka-python {kafka.__version__}", flush=True)
    a_seen, b_seen = set(), set()
    a = consumer([0])
    started = time.time()
    # A fetches (through its session) until that session is old enough to be evicted.
    while len(a_seen) < PER_PARTITION // 4 or time.time() < started + EVICTION * 1.5:
        read(a, a_seen, PER_PARTITION)
        if time.time() > started + 60:
            sys.exit("FAIL: A read too little before B started")
    b = consumer(list(range(1, PARTITIONS)))
    deadline = time.time() + 120
    while not (len(a_seen) >= PER_PARTITION and len(b_seen) >= PER_PARTITION * (PARTITIONS - 1)):
        read(a, a_seen, PER_PARTITION)
        read(b, b_seen, PER_PARTITION * (PARTITIONS - 1))
        if time.time() > deadline:
            sys.exit(f"FAIL: read {len(a_seen)} + {len(b_seen)} records in time")
    if len(a_seen) != PER_PARTITION or len(b_seen) != PER_PARTITION * (PARTITIONS - 1):
        sys.exit(f"FAIL: read {len(a_seen)} + {len(b_seen)} records")
    a.close()
    b.close()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
