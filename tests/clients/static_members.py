"""Static group membership (KIP-345) with kafka-python 3 (issue 22).

A static member that restarts within its session gets its partitions back without a
rebalance (the other member sees no revocation), and a second process with the same
group.instance.id fences the first (its commit fails with FencedInstanceIdError).

Usage: static_members.py <bootstrap> <topic> <partitions>
"""
import sys
import time

import kafka
from kafka import KafkaConsumer
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import FencedInstanceIdError
from kafka.structs import OffsetAndMetadata

BOOT, TOPIC, PARTITIONS = sys.argv[1], sys.argv[2], int(sys.argv[3])
GROUP = "py-statics"


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")
    print(f"ok: {what}", flush=True)


class Events(ConsumerRebalanceListener):
    """Counts rebalances that took partitions away (the eager protocol revokes all)."""

    def __init__(self):
        self.revocations = 0

    def on_partitions_revoked(self, revoked):
        if revoked:
            self.revocations += 1

    def on_partitions_assigned(self, assigned):
        pass


def member(instance, events):
    c = KafkaConsumer(
        bootstrap_servers=BOOT,
        group_id=GROUP,
        group_instance_id=instance,
        client_id=instance,
        session_timeout_ms=30000,
        heartbeat_interval_ms=500,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    c.subscribe([TOPIC], listener=events)
    return c


def poll_until(what, consumers, cond, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for c in consumers:
            c.poll(timeout_ms=100)
        if cond():
            print(f"ok: {what}", flush=True)
            return
    sys.exit(f"FAIL: {what} within {timeout} s")


def main():
    print(f"kafka-python {kafka.__version__}", flush=True)
    ea, eb = Events(), Events()
    a, b = member("py-a", ea), member("py-b", eb)
    poll_until(
        "two static members split the partitions",
        [a, b],
        lambda: len(a.assignment()) + len(b.assignment()) == PARTITIONS
        and a.assignment()
        and b.assignment(),
    )
    a_parts, b_revocations = set(a.assignment()), eb.revocations
    a.close()  # a static member does not send LeaveGroup

    a2 = member("py-a", Events())
    poll_until("the restarted member gets its partitions back", [a2, b], lambda: set(a2.assignment()) == a_parts)
    # A rebalance would reach b through its heartbeats (every 0.5 s) within a few.
    end = time.time() + 3
    while time.time() < end:
        b.poll(timeout_ms=100)
        a2.poll(timeout_ms=100)
    check(eb.revocations == b_revocations, "the other member saw no rebalance")

    a3 = member("py-a", Events())
    poll_until("a duplicate instance takes the partitions over", [a3, b], lambda: set(a3.assignment()) == a_parts)
    tp = next(iter(a_parts))
    try:
        a2.commit({tp: OffsetAndMetadata(0, "", -1)})
        sys.exit("FAIL: the replaced instance committed")
    except FencedInstanceIdError:
        check(True, "the replaced instance is fenced (FENCED_INSTANCE_ID)")
    a3.commit({tp: OffsetAndMetadata(0, "", -1)})
    check(True, "the current instance commits")
    for c in (a2, a3, b):
        c.close()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
