"""Issue 59: a confluent-kafka producer that tries to send RATE bytes a second of 1 KiB
records for SECONDS, then prints what was acknowledged in that time and the throttles
the gateway reported (librdkafka's throttle callback, from `throttle_time_ms`).
Usage: quota_producer.py BOOTSTRAP USER SECRET TOPIC SECONDS RATE"""

import json
import os
import sys
import time

from confluent_kafka import Producer

BOOT, USER, SECRET, TOPIC = sys.argv[1:5]
SECONDS, RATE = float(sys.argv[5]), float(sys.argv[6])
VALUE = b"q" * 1024

throttles = []
acked = [0]
errors = []


def on_delivery(err, msg):
    if err is None:
        acked[0] += len(msg.value())
    else:
        errors.append(str(err))


p = Producer(
    {
        "bootstrap.servers": BOOT,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": USER,
        "sasl.password": SECRET,
        "acks": "all",
        # Small requests, so what is acknowledged by the end is not one large batch
        # more or less.
        "batch.size": 65536,
        "linger.ms": 5,
        "throttle_cb": lambda e: throttles.append(e.throttle_time),
    }
)
start = time.monotonic()
sent = 0
while True:
    now = time.monotonic() - start
    if now >= SECONDS:
        break
    while sent < RATE * now:
        try:
            p.produce(TOPIC, VALUE, on_delivery=on_delivery)
        except BufferError:
            break
        sent += len(VALUE)
    p.poll(0.005)
elapsed = time.monotonic() - start
print(
    json.dumps(
        {
            "acked_bytes": acked[0],
            "sent_bytes": sent,
            "seconds": elapsed,
            "throttles": len(throttles),
            "max_throttle_s": max(throttles, default=0.0),
            "errors": errors[:5],
        }
    ),
    flush=True,
)
# What is still queued is not waited for.
p.purge()
os._exit(0)
