#!/usr/bin/env python3
"""Real Python Kafka clients against a Weir gateway (run by tests/tests/kafka.rs).

Usage: kafka_clients.py HOST:PORT. Exits non-zero with a message on the first failure.
kafka-python: admin create/describe/delete, DescribeLogDirs, acks=all producer, a consumer group that
commits and a restarted member that resumes after the commit. confluent-kafka: an
idempotent producer and a group consumer reading everything exactly once.
"""
import sys
import time

from confluent_kafka import Consumer, Producer
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

BOOT = sys.argv[1]
N = 1000


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)


def wait_topic(admin, name, partitions):
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            d = admin.describe_topics([name])
            if d and d[0]["error_code"] == 0 and len(d[0]["partitions"]) == partitions:
                return
        except Exception:
            pass
        time.sleep(0.2)
    check(False, f"topic {name} visible with {partitions} partitions")


def kafka_python():
    admin = KafkaAdminClient(bootstrap_servers=BOOT, request_timeout_ms=30000)
    admin.create_topics([NewTopic("py", num_partitions=3, replication_factor=1, topic_configs={"retention.ms": "3600000"})])
    wait_topic(admin, "py", 3)
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "py")])
    text = str(configs)
    check("retention.ms" in text and "3600000" in text, f"describe_configs shows retention.ms: {text}")

    producer = KafkaProducer(bootstrap_servers=BOOT, acks="all", retries=10)
    futures = [producer.send("py", key=f"k{i % 13}".encode(), value=f"v{i}".encode()) for i in range(N)]
    producer.flush(60)
    acked = [f.get(timeout=60) for f in futures]
    check(len(acked) == N, "every kafka-python send acknowledged")
    producer.close()

    # Issue 59: DescribeLogDirs (v0, kafka-python's only version) lists every partition
    # of the topic once, under the streamd that owns it.
    dirs = admin.describe_log_dirs()
    listed = sorted(
        p[0]
        for err, _dir, topics in dirs.log_dirs
        if err == 0
        for name, parts in topics
        if name == "py"
        for p in parts
    )
    check(listed == [0, 1, 2], f"describe_log_dirs lists py's partitions once: {dirs}")

    first = KafkaConsumer(
        "py", bootstrap_servers=BOOT, group_id="pyg", enable_auto_commit=False,
        auto_offset_reset="earliest", consumer_timeout_ms=20000,
    )
    seen = []
    for m in first:
        seen.append(m.value.decode())
        if len(seen) == 400:
            break
    first.commit()
    first.close()
    check(len(seen) == 400, f"first member read 400, got {len(seen)}")

    second = KafkaConsumer(
        "py", bootstrap_servers=BOOT, group_id="pyg", enable_auto_commit=False,
        auto_offset_reset="earliest", consumer_timeout_ms=8000,
    )
    rest = [m.value.decode() for m in second]
    second.close()
    both = seen + rest
    check(len(both) == N and len(set(both)) == N, f"resumed after the commit: {len(seen)} + {len(rest)} records, {len(set(both))} distinct")

    groups = [g[0] if isinstance(g, tuple) else g.group for g in admin.list_consumer_groups()]
    check("pyg" in groups, f"ListGroups shows the group: {groups}")
    described = admin.describe_consumer_groups(["pyg"])[0]
    check(described.state == "Empty" and described.protocol_type == "consumer", f"DescribeGroups: {described}")
    cluster = admin.describe_cluster()
    check(len(cluster["brokers"]) == 1, f"DescribeCluster: {cluster}")
    deleted = admin.delete_consumer_groups(["pyg"])
    check(all(err.errno == 0 for _, err in deleted), f"DeleteGroups: {deleted}")
    check(not admin.list_consumer_group_offsets("pyg"), "no offsets after the group is deleted")

    admin.delete_topics(["py"])
    deadline = time.time() + 30
    while "py" in admin.list_topics() and time.time() < deadline:
        time.sleep(0.2)
    check("py" not in admin.list_topics(), "topic deleted")
    admin.close()
    print("kafka-python OK", flush=True)


def confluent():
    producer = Producer({"bootstrap.servers": BOOT, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                         "compression.type": "zstd"})
    errors = []
    for i in range(N):
        producer.produce("conf", key=str(i), value=f"c{i}", on_delivery=lambda err, msg: err and errors.append(err))
        producer.poll(0)
    left = producer.flush(60)
    check(left == 0 and not errors, f"idempotent producer delivered everything: {left} left, errors {errors[:3]}")

    consumer = Consumer({
        "bootstrap.servers": BOOT, "group.id": "confg", "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe(["conf"])
    values = []
    deadline = time.time() + 60
    while len(values) < N and time.time() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        check(m.error() is None, f"consume error {m.error()}")
        values.append(m.value().decode())
    consumer.commit(asynchronous=False)
    consumer.close()
    check(len(values) == N and len(set(values)) == N, f"confluent consumer read {len(values)} ({len(set(values))} distinct) of {N}")
    print("confluent-kafka OK", flush=True)


if __name__ == "__main__":
    kafka_python()
    confluent()
