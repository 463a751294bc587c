#!/usr/bin/env python3
"""Python Kafka clients over SASL_SSL against a Weir gateway (run by tests/tests/tls.rs).

Usage: tls_clients.py HOST:PORT CA_PEM USER PASSWORD MECHANISM (PLAIN, SCRAM-SHA-256 or
SCRAM-SHA-512). Exits non-zero with a message on the first failure. kafka-python and
confluent-kafka each produce with acks=all to the topic `tls-<mechanism>` (which must
exist) and read back everything produced, over TLS with that SASL mechanism, trusting
only the given CA; a client that does not trust it, and one with a wrong password, get
nothing.
"""
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

BOOT, CA, USER, PASSWORD, MECHANISM = sys.argv[1:6]
N = 200
TOPIC = "tls-" + MECHANISM.lower()


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)


def confluent_conf(**extra):
    conf = {
        "bootstrap.servers": BOOT,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "sasl.username": USER,
        "sasl.password": PASSWORD,
        "ssl.ca.location": CA,
        "broker.address.family": "v4",
    }
    conf.update(extra)
    return conf


def python_conf():
    return dict(
        bootstrap_servers=BOOT,
        security_protocol="SASL_SSL",
        sasl_mechanism=MECHANISM,
        sasl_plain_username=USER,
        sasl_plain_password=PASSWORD,
        ssl_cafile=CA,
        # The certificate names localhost and 127.0.0.1; the bootstrap is 127.0.0.1.
        ssl_check_hostname=True,
    )


def kafka_python():
    producer = KafkaProducer(acks="all", retries=10, **python_conf())
    futures = [producer.send(TOPIC, value=f"py-{i}".encode()) for i in range(N)]
    producer.flush(60)
    check(len([f.get(timeout=60) for f in futures]) == N, "every kafka-python send acknowledged over SASL_SSL")
    producer.close()


def confluent():
    acked = []
    p = Producer(confluent_conf(**{"acks": "all", "linger.ms": 5, "enable.idempotence": True}))
    for i in range(N):
        p.produce(TOPIC, value=f"ck-{i}".encode(), on_delivery=lambda e, m: acked.append(e is None))
    p.flush(60)
    check(len(acked) == N and all(acked), f"every confluent-kafka send acknowledged over SASL_SSL ({len(acked)})")


def read_back():
    c = Consumer(confluent_conf(**{
        "group.id": "tls-readers-" + MECHANISM.lower(), "auto.offset.reset": "earliest", "enable.auto.commit": False,
    }))
    c.subscribe([TOPIC])
    seen = []
    deadline = time.time() + 60
    while len(seen) < 2 * N and time.time() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            seen.append(m.value().decode())
    c.close()
    check(sorted(seen) == sorted([f"py-{i}" for i in range(N)] + [f"ck-{i}" for i in range(N)]),
          f"confluent-kafka read back each record once over SASL_SSL ({len(seen)} read)")

    k = KafkaConsumer(auto_offset_reset="earliest", consumer_timeout_ms=20000, **python_conf())
    k.assign([TopicPartition(TOPIC, 0)])
    got = []
    for m in k:
        got.append(m.value.decode())
        if len(got) == 2 * N:
            break
    k.close()
    check(len(got) == 2 * N, f"kafka-python read back everything over SASL_SSL ({len(got)} read)")


def refused():
    # Without the CA (the system's roots only), the handshake fails: no metadata.
    untrusted = confluent_conf()
    del untrusted["ssl.ca.location"]
    try:
        AdminClient(untrusted).list_topics(timeout=5)
        check(False, "a client that does not trust the CA got metadata")
    except KafkaException:
        pass
    try:
        AdminClient(confluent_conf(**{"sasl.password": "wrong"})).list_topics(timeout=5)
        check(False, "a wrong password got metadata")
    except KafkaException:
        pass


kafka_python()
confluent()
read_back()
refused()
print("OK", flush=True)
