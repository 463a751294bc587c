#!/usr/bin/env python3
"""The data lifecycle's Kafka APIs from real Python clients against a Weir gateway (run
by tests/tests/lifecycle.rs, issue 16).

Usage: lifecycle_clients.py HOST:PORT. Exits non-zero with a message on the first failure.
DeleteRecords with confluent-kafka: produce 100 records, delete to 40, then the low
watermark, ListOffsets earliest and a consumer from the beginning all start at 40; an
offset past the high watermark is OFFSET_OUT_OF_RANGE. kafka-python: delete to 70.
Configs with confluent-kafka: AlterConfigs refuses cleanup.policy=compact with
INVALID_CONFIG; IncrementalAlterConfigs SETs and DELETEs retention.ms and refuses APPEND.
"""
import sys
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic,
                                  OffsetSpec)
from kafka import KafkaAdminClient
from kafka import TopicPartition as PyTopicPartition

BOOT = sys.argv[1]
TOPIC = "deletable"
N = 100


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)


def low_high(consumer):
    return consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10, cached=False)


def configs(admin):
    for f in admin.create_topics([NewTopic("configured", num_partitions=1, replication_factor=1)]).values():
        f.result(30)

    def config(name):
        described = admin.describe_configs([ConfigResource("topic", "configured")])
        return list(described.values())[0].result(30)[name].value

    def refused(futures, what):
        try:
            list(futures.values())[0].result(30)
        except Exception as e:
            code = e.args[0].code() if e.args and hasattr(e.args[0], "code") else None
            check(code == KafkaError.INVALID_CONFIG, f"{what}: INVALID_CONFIG, got {e!r}")
            return
        check(False, f"{what} is refused")

    compact = ConfigResource("topic", "configured", set_config={"cleanup.policy": "compact"})
    refused(admin.alter_configs([compact]), "AlterConfigs cleanup.policy=compact")
    check(config("cleanup.policy") == "delete", "cleanup.policy stays delete")

    def incremental(op, value=None):
        entry = ConfigEntry("retention.ms", value, incremental_operation=op)
        return admin.incremental_alter_configs([ConfigResource("topic", "configured", incremental_configs=[entry])])

    list(incremental(AlterConfigOpType.SET, "60000").values())[0].result(30)
    check(config("retention.ms") == "60000", f"IncrementalAlterConfigs SET: {config('retention.ms')}")
    list(incremental(AlterConfigOpType.DELETE).values())[0].result(30)
    check(config("retention.ms") == "-1", f"IncrementalAlterConfigs DELETE: {config('retention.ms')}")
    refused(incremental(AlterConfigOpType.APPEND, "1"), "IncrementalAlterConfigs APPEND")


def main():
    admin = AdminClient({"bootstrap.servers": BOOT, "broker.address.family": "v4"})
    for f in admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)]).values():
        f.result(30)
    producer = Producer({"bootstrap.servers": BOOT, "broker.address.family": "v4", "acks": "all"})
    deadline = time.time() + 60
    sent = 0
    while sent < N and time.time() < deadline:
        try:
            producer.produce(TOPIC, value=f"v{sent}".encode(), partition=0)
            sent += 1
        except BufferError:
            producer.poll(0.1)
    check(producer.flush(60) == 0, "every record acknowledged")

    consumer = Consumer({"bootstrap.servers": BOOT, "broker.address.family": "v4", "group.id": "dr",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    check(low_high(consumer) == (0, N), f"watermarks before: {low_high(consumer)}")

    futures = admin.delete_records([TopicPartition(TOPIC, 0, 40)])
    deleted = list(futures.values())[0].result(30)
    check(deleted.low_watermark == 40, f"DeleteRecords answers low watermark 40, got {deleted.low_watermark}")
    check(low_high(consumer) == (40, N), f"watermarks after: {low_high(consumer)}")
    earliest = admin.list_offsets({TopicPartition(TOPIC, 0): OffsetSpec.earliest()})
    info = list(earliest.values())[0].result(30)
    check(info.offset == 40, f"ListOffsets earliest is 40, got {info.offset}")

    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values = []
    deadline = time.time() + 30
    while len(values) < N - 40 and time.time() < deadline:
        m = consumer.poll(1.0)
        if m is None:
            continue
        check(m.error() is None, f"consume: {m.error()}")
        values.append((m.offset(), m.value().decode()))
    check(values[:2] == [(40, "v40"), (41, "v41")], f"a read from 0 resumes at 40: {values[:2]}")
    check(len(values) == N - 40, f"{N - 40} records after the start, got {len(values)}")
    consumer.close()

    past = admin.delete_records([TopicPartition(TOPIC, 0, N + 5)])
    try:
        list(past.values())[0].result(30)
        check(False, "DeleteRecords past the high watermark is refused")
    except Exception as e:  # confluent-kafka raises KafkaException carrying the error
        code = e.args[0].code() if e.args and hasattr(e.args[0], "code") else None
        check(code == KafkaError.OFFSET_OUT_OF_RANGE, f"OFFSET_OUT_OF_RANGE past the high watermark, got {e!r}")

    py = KafkaAdminClient(bootstrap_servers=BOOT, request_timeout_ms=30000)
    result = py.delete_records({PyTopicPartition(TOPIC, 0): 70})
    lows = [meta["low_watermark"] for meta in result.values()]
    check(lows == [70], f"kafka-python DeleteRecords answers low watermark 70, got {result}")
    check(low_high(Consumer({"bootstrap.servers": BOOT, "group.id": "dr2"})) == (70, N), "watermarks after kafka-python")
    configs(admin)
    print("lifecycle clients: ok", flush=True)


main()
