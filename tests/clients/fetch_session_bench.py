"""What incremental fetch sessions (KIP-227) save a consumer of many idle partitions.

Creates a topic of N partitions on a running Weir (`weir dev`), assigns one
kafka-python consumer to all of them, and polls them idle for a while, once with
sessions and once without. Prints the consumer's average Fetch request and response
sizes and its bytes per second each way, from kafka-python's own metrics. Asserts
nothing.

Usage: python3 tests/clients/fetch_session_bench.py [bootstrap] [partitions] [seconds]
"""
import sys
import time

import kafka
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic

BOOT = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092"
PARTITIONS = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 20


def node_metric(metrics, name):
    """The sum over broker nodes of a kafka-python per-node metric."""
    return sum(v for group, values in metrics.items() if group.startswith("consumer-node-")
               for k, v in values.items() if k == name)


def run(topic, sessions):
    c = KafkaConsumer(
        bootstrap_servers=BOOT,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        enable_incremental_fetch_sessions=sessions,
    )
    c.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
    c.seek_to_end()
    end = time.time() + SECONDS
    while time.time() < end:
        c.poll(timeout_ms=200)
    m = c.metrics()
    figures = (
        node_metric(m, "request-size-avg"),
        node_metric(m, "incoming-byte-rate"),
        node_metric(m, "outgoing-byte-rate"),
        node_metric(m, "request-rate"),
    )
    c.close()
    return figures


def main():
    topic = f"fetch-session-bench-{int(time.time())}"
    admin = KafkaAdminClient(bootstrap_servers=BOOT)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    time.sleep(2)
    print(f"kafka-python {kafka.__version__}; {PARTITIONS} idle partitions, {SECONDS:.0f} s each")
    print(f"{'':<14}{'request B':>12}{'in B/s':>12}{'out B/s':>12}{'requests/s':>12}")
    for label, sessions in (("full fetches", False), ("sessions", True)):
        size, rx, tx, rate = run(topic, sessions)
        print(f"{label:<14}{size:>12.0f}{rx:>12.0f}{tx:>12.0f}{rate:>12.1f}")
    admin.delete_topics([topic])


if __name__ == "__main__":
    main()
