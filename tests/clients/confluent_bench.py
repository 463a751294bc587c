"""Issue 17's client-side method with confluent-kafka (librdkafka through Python).

Driven by the `kafka_clients` bench, which starts the stack and creates the topics:

    confluent_bench.py BOOTSTRAP produce TOPIC SIZE COUNT
    confluent_bench.py BOOTSTRAP consume TOPIC SIZE COUNT
    confluent_bench.py BOOTSTRAP latency TOPIC RATE SECONDS

Each prints one JSON line; produce and consume give the client's CPU time (`cpu_s`, its
Python and librdkafka threads) over the phase. Produce: acks=all, linger 5 ms, keys
spread over the topic's partitions. Consume: every partition from the beginning;
`first_ms` is the time to the first message (connection, metadata, ListOffsets), and
MB/s counts from that message on, as kafka-consumer-perf-test separates its setup from
its fetch time. Latency: single 1 KiB messages at RATE per second.

`WEIR_BENCH_PRODUCER` picks the producer: `plain` (the default), `idempotent`, or
`transactional` (issue 23: a transactional id, each 1,000 messages one committed
transaction; `WEIR_BENCH_TXN_MESSAGES` changes the size).
"""

import json
import os
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition, OFFSET_BEGINNING


def client(bootstrap):
    """The settings every client of the bench shares; TLS when WEIR_BENCH_CA names a CA."""
    conf = {"bootstrap.servers": bootstrap, "broker.address.family": "v4"}
    ca = os.environ.get("WEIR_BENCH_CA")
    if ca:
        conf.update({"security.protocol": "SSL", "ssl.ca.location": ca})
    return conf


def producer_kind():
    kind = os.environ.get("WEIR_BENCH_PRODUCER", "plain")
    if kind == "idempotent":
        return {"enable.idempotence": True}
    if kind == "transactional":
        return {"transactional.id": "bench-confluent", "transaction.timeout.ms": 60000}
    return {}


def produce(bootstrap, topic, size, count):
    p = Producer({
        **client(bootstrap),
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 2_000_000,
        **producer_kind(),
    })
    per_txn = int(os.environ.get("WEIR_BENCH_TXN_MESSAGES", "1000"))
    transactional = "transactional.id" in producer_kind()
    if transactional:
        p.init_transactions(60)
        p.begin_transaction()
    failed = []

    def done(err, _msg):
        if err is not None:
            failed.append(str(err))

    payload = b"x" * size
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(count):
        while True:
            try:
                p.produce(topic, payload, key=str(i % 64), on_delivery=done)
                break
            except BufferError:
                p.poll(0.001)
        if i % 1000 == 0:
            p.poll(0)
        if transactional and (i + 1) % per_txn == 0:
            p.commit_transaction(60)
            p.begin_transaction()
    if transactional:
        p.commit_transaction(60)
    left = p.flush(120)
    secs = time.perf_counter() - started
    if left or failed:
        sys.exit(f"produce: {left} not delivered, {len(failed)} failed: {failed[:3]}")
    return {
        "msg_s": count / secs,
        "mb_s": count * size / secs / 1e6,
        "secs": secs,
        "cpu_s": time.process_time() - cpu,
    }


def consume(bootstrap, topic, size, count):
    c = Consumer({
        **client(bootstrap),
        "group.id": "bench-confluent",
        "enable.auto.commit": False,
        # librdkafka 2.x stops fetching a partition for this long whenever its local
        # queue is over `queued.min.messages` (100,000), which the Python loop behind it
        # reaches with small messages; at the default 1,000 ms a run's rate then halved
        # or not by chance. Kafka's Java consumer has no such pause.
        "fetch.queue.backoff.ms": 10,
    })
    # Every partition of the topic (the bench's WEIR_BENCH_PARTITIONS spreads keys).
    partitions = c.list_topics(topic, timeout=30).topics[topic].partitions
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(partitions)])
    started, cpu = time.perf_counter(), time.process_time()
    first, first_batch = None, 0
    n = 0
    deadline = started + 120
    while n < count:
        msgs = c.consume(num_messages=10_000, timeout=1.0)
        for m in msgs:
            if m.error():
                sys.exit(f"consume: {m.error()}")
        if msgs and first is None:
            # Fetch time counts from here, so the messages already here do not count.
            first, first_batch = time.perf_counter(), len(msgs)
        n += len(msgs)
        if time.perf_counter() > deadline:
            sys.exit(f"consume: {n} of {count} in 120 s")
    end = time.perf_counter()
    c.close()
    fetch_secs = end - first
    fetched = n - first_batch
    if fetched == 0:
        # Everything came in the first batch: there is no fetch time apart from setup.
        fetch_secs, fetched = end - started, n
    return {
        "msg_s": fetched / fetch_secs,
        "mb_s": fetched * size / fetch_secs / 1e6,
        "first_ms": (first - started) * 1e3,
        "total_mb_s": count * size / (end - started) / 1e6,
        "cpu_s": time.process_time() - cpu,
    }


def latency(bootstrap, topic, rate, seconds):
    p = Producer({**client(bootstrap), "acks": "all", "linger.ms": 0})
    payload = b"x" * 1024
    # Steady state: connection and metadata are set up before timing.
    p.produce(topic, payload)
    if p.flush(30):
        sys.exit("latency: the warm-up message was not acknowledged")
    lat = []

    def done(err, _msg, sent):
        if err is not None:
            sys.exit(f"latency: {err}")
        lat.append(time.perf_counter() - sent)

    period = 1.0 / rate
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        due = start + i * period
        while (now := time.perf_counter()) < due:
            p.poll(min(due - now, 0.0005))
        sent = time.perf_counter()
        p.produce(topic, payload, on_delivery=lambda e, m, s=sent: done(e, m, s))
        p.poll(0)
    p.flush(30)
    lat.sort()

    def pct(q):
        return lat[min(int(len(lat) * q), len(lat) - 1)] * 1e3

    return {"p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": lat[-1] * 1e3, "n": len(lat)}


def main():
    bootstrap, what = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    if what == "produce":
        out = produce(bootstrap, args[0], int(args[1]), int(args[2]))
    elif what == "consume":
        out = consume(bootstrap, args[0], int(args[1]), int(args[2]))
    elif what == "latency":
        out = latency(bootstrap, args[0], int(args[1]), float(args[2]))
    else:
        sys.exit(f"unknown phase {what!r}: produce, consume or latency")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
