#!/usr/bin/env python3
"""A consume-transform-produce pipeline with confluent-kafka transactions against a Weir
gateway (issue 23; run by tests/tests/kafka/transactions.rs).

Usage: txn_pipeline.py HOST:PORT IN OUT N [HOLD_FILE]. The input topic IN (created by
the caller) gets N records. The pipeline reads them in a group with read_committed, and for each
batch runs two transactions: the first produces the transformed batch into OUT, sends
the batch's offsets, and aborts; the second does the same and commits. Then:
- a read_committed consumer reads exactly the committed output, once, in order (each
  output partition holds its input partition's records, transformed, in order);
- a read_uncommitted consumer reads both copies;
- the group's committed offsets are the input's end (the aborted offsets were dropped).
It prints "progress K" after each committed transaction, so a test can kill a node
mid-pipeline; with HOLD_FILE, the third committed transaction stops after its records
are acknowledged, prints "holding", and goes on (to EndTxn) once that file exists.

`txn_pipeline.py HOST:PORT zombie OUT` and `... successor OUT`: a transactional
producer left open (killed by the test), then its successor with the same id, which
fences it and whose committed records alone a read_committed consumer sees; and a
zombie that outlives its successor, whose late writes and commit are refused.
Exits non-zero with a message on the first failure.
"""
import os
import sys
import time
from collections import Counter

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

BOOT = sys.argv[1]
HOLD = sys.argv[5] if len(sys.argv) > 5 else None
COUNTS = {"committed": 0, "aborted": 0, "faults": 0, "held": False}
GROUP = "pipeline"
BATCH = 50


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)


def feed():
    p = Producer({"bootstrap.servers": BOOT, "enable.idempotence": True, "linger.ms": 5})
    for i in range(N):
        p.produce(IN, key=str(i), value=f"in-{i}", partition=i % 2)
    check(p.flush(60) == 0, "the input was produced")


def rewind(consumer):
    """After an aborted transaction, go back to the group's committed offsets."""
    for tp in consumer.committed(consumer.assignment(), 30):
        if tp.offset < 0:
            tp.offset = OFFSET_BEGINNING
        consumer.seek(tp)


def transaction(producer, consumer, batch, positions, commit):
    """One transaction over `batch`; False when it had to be aborted (a fault)."""
    try:
        producer.begin_transaction()
        for m in batch:
            producer.produce(OUT, key=m.key(), value=m.value().decode().replace("in-", "out-"),
                             partition=m.partition())
        while True:
            try:
                producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 60)
                break
            except KafkaException as e:
                # CONCURRENT_TRANSACTIONS while the last transaction's markers are still
                # being written (a partition's owner failed over, say): retried.
                if not e.args[0].retriable():
                    raise
                print(f"send_offsets retried: {e}", flush=True)
                time.sleep(0.1)
        if commit and HOLD and COUNTS["committed"] == 2 and not COUNTS["held"]:
            check(producer.flush(60) == 0, "the held transaction's records were acknowledged")
            COUNTS["held"] = True
            print("holding", flush=True)
            while not os.path.exists(HOLD):
                time.sleep(0.05)
        if not commit:
            # Written before the abort (an abort purges what the client still holds),
            # so a read_uncommitted consumer sees the aborted copy.
            check(producer.flush(60) == 0, "the aborted transaction's records were acknowledged")
            producer.abort_transaction(60)
            return True
        while True:
            try:
                producer.commit_transaction(60)
                return True
            except KafkaException as e:
                if not e.args[0].retriable():
                    raise
                print(f"commit retried: {e}", flush=True)
    except KafkaException as e:
        if not e.args[0].txn_requires_abort():
            raise
        print(f"transaction aborted by a fault: {e}", flush=True)
        COUNTS["faults"] += 1
        producer.abort_transaction(60)
        return False


def pipeline():
    consumer = Consumer({
        "bootstrap.servers": BOOT, "group.id": GROUP, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "isolation.level": "read_committed",
    })
    producer = Producer({
        "bootstrap.servers": BOOT, "transactional.id": "pipeline-1", "linger.ms": 5,
        "transaction.timeout.ms": 60000,
    })
    producer.init_transactions(60)
    consumer.subscribe([IN])
    done = set()
    deadline = time.time() + 240
    while len(done) < N and time.time() < deadline:
        batch = consumer.consume(BATCH, 1.0)
        batch = [m for m in batch if m.error() is None]
        if not batch:
            continue
        positions = consumer.position(consumer.assignment())
        # Every other transaction is aborted: the batch once aborted, then committed.
        if not transaction(producer, consumer, batch, positions, False):
            rewind(consumer)
            continue
        COUNTS["aborted"] += 1
        if not transaction(producer, consumer, batch, positions, True):
            rewind(consumer)
            continue
        COUNTS["committed"] += 1
        print(f"progress {COUNTS['committed']}", flush=True)
        done.update((m.partition(), m.offset()) for m in batch)
    consumer.close()
    check(len(done) == N, f"the pipeline committed {len(done)} of {N} records")
    print(f"pipeline: {COUNTS['committed']} transactions committed, {COUNTS['aborted']} aborted", flush=True)


def read_all(isolation, want):
    c = Consumer({
        "bootstrap.servers": BOOT, "group.id": f"check-{isolation}", "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "isolation.level": isolation,
    })
    c.assign([TopicPartition(OUT, p, 0) for p in (0, 1)])
    got = {0: [], 1: []}
    deadline = time.time() + 60
    while sum(len(v) for v in got.values()) < want and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        check(m.error() is None, f"{isolation} consume error {m.error()}")
        got[m.partition()].append(m.value().decode())
    # Anything more would be output that must not be visible.
    end = time.time() + 2
    while time.time() < end:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got[m.partition()].append(m.value().decode())
    c.close()
    return got


def verify():
    expected = {p: [f"out-{i}" for i in range(N) if i % 2 == p] for p in (0, 1)}
    got = read_all("read_committed", N)
    for p in (0, 1):
        check(got[p] == expected[p],
              f"read_committed partition {p}: {len(got[p])} records, want {len(expected[p])} "
              f"in order (first difference at {next((i for i, (a, b) in enumerate(zip(got[p], expected[p])) if a != b), None)})")
    got = read_all("read_uncommitted", 2 * N)
    for p in (0, 1):
        if COUNTS["faults"] == 0:
            check(sorted(got[p]) == sorted(expected[p] * 2),
                  f"read_uncommitted partition {p} sees the aborted and the committed copy: {len(got[p])} records")
        else:
            # Transactions a fault aborted add copies of their own.
            seen = Counter(got[p])
            check(all(seen[v] >= 2 for v in expected[p]) and set(seen) == set(expected[p]),
                  f"read_uncommitted partition {p} sees at least the aborted and the committed copy")
    c = Consumer({"bootstrap.servers": BOOT, "group.id": GROUP, "isolation.level": "read_committed"})
    offsets = c.committed([TopicPartition(IN, p) for p in (0, 1)], 30)
    for tp in offsets:
        lo, hi = c.get_watermark_offsets(TopicPartition(IN, tp.partition), 30)
        check(tp.offset == hi, f"group offset of {IN}/{tp.partition} is {tp.offset}, the end is {hi}")
    c.close()
    print("transactional pipeline OK", flush=True)


def txn_producer(tid):
    p = Producer({"bootstrap.servers": BOOT, "transactional.id": tid, "linger.ms": 5,
                  "transaction.timeout.ms": 60000})
    p.init_transactions(60)
    return p


def produce_txn(p, prefix, count, commit):
    p.begin_transaction()
    for i in range(count):
        p.produce(OUT, value=f"{prefix}-{i}", partition=0)
    check(p.flush(60) == 0, f"{prefix} records acknowledged")
    if commit:
        p.commit_transaction(60)


def zombie():
    # Left open: the test SIGKILLs this process once it says so.
    produce_txn(txn_producer("zombie"), "zombie", 10, False)
    print("open", flush=True)
    time.sleep(600)


def successor():
    # The successor fences the killed zombie: its open transaction is aborted.
    produce_txn(txn_producer("zombie"), "successor", 10, True)
    # A zombie that lives on: fenced by its successor, its late writes are refused.
    old = txn_producer("late")
    produce_txn(old, "late-open", 5, False)
    produce_txn(txn_producer("late"), "late-successor", 5, True)
    refused = None
    try:
        old.produce(OUT, value="late-write", partition=0)
        old.flush(30)
        old.commit_transaction(30)
    except KafkaException as e:
        refused = e.args[0]
    check(refused is not None and (refused.fatal() or refused.txn_requires_abort()),
          f"the fenced zombie's late commit was refused: {refused}")
    got = read_all("read_committed", 15)
    want = [f"successor-{i}" for i in range(10)] + [f"late-successor-{i}" for i in range(5)]
    check(got[0] == want, f"read_committed sees only the successors' records: {got[0]}")
    got = read_all("read_uncommitted", 30)
    check(len(got[0]) == 30 and "late-write" not in got[0],
          f"read_uncommitted sees the aborted records too, and no late write: {len(got[0])}")
    print("zombie fenced OK", flush=True)


if __name__ == "__main__":
    try:
        if sys.argv[2] in ("zombie", "successor"):
            OUT = sys.argv[3]
            {"zombie": zombie, "successor": successor}[sys.argv[2]]()
            sys.exit(0)
        IN, OUT, N = sys.argv[2], sys.argv[3], int(sys.argv[4])
        feed()
        pipeline()
        verify()
    except KafkaException as e:
        check(False, f"kafka error: {e}")
