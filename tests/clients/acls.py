"""Issue 59: ACLs managed with confluent-kafka's AdminClient against a gateway with
--auth, and enforced on Produce, Fetch and an HTTP append.
Usage: acls.py BOOTSTRAP HTTP_ADDR OPS_SECRET ALICE_SECRET BOB_SECRET

`ops` is an admin token; `alice` may read and write every topic by her scopes; `bob`
may only read topics starting `acl-`. Exits non-zero, saying what failed."""

import json
import sys
import urllib.error
import urllib.request
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

BOOT, HTTP, OPS, ALICE, BOB = sys.argv[1:6]
TOPIC = "acl-orders"
STREAM = "acl-stream"


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def conf(user, secret):
    return {
        "bootstrap.servers": BOOT,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": secret,
    }


# Clients are kept to the end: one freed while librdkafka still calls back into it
# raises its error at whatever line runs next.
KEEP = []


def produce(user, secret, value):
    """The delivery error of one record (None when acknowledged)."""
    delivered = []
    c = conf(user, secret)
    c.update({"message.timeout.ms": 8000, "acks": "all"})
    p = Producer(c)
    KEEP.append(p)
    p.produce(TOPIC, value=value.encode(), on_delivery=lambda e, _m: delivered.append(e))
    p.flush(12)
    check(len(delivered) == 1, f"{user}'s record {value!r} got a delivery report")
    return delivered[0]


def consume(user, secret, want):
    """Reads TOPIC from the start: ('records', values) once `want` values came, or
    ('error', code) at the first error."""
    c = conf(user, secret)
    c.update({"group.id": f"acl-{uuid.uuid4()}", "enable.auto.commit": False})
    consumer = Consumer(c)
    KEEP.append(consumer)
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values = []
    for _ in range(40):
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            return ("error", msg.error().code())
        values.append(msg.value().decode())
        if len(values) >= want:
            return ("records", values)
    return ("records", values)


def http_append(secret, body):
    req = urllib.request.Request(
        f"http://{HTTP}/v1/streams/{STREAM}/records",
        data=json.dumps({"records": [{"body": body}]}).encode(),
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def binding(principal, rtype, name, pattern, op, perm):
    return AclBinding(rtype, name, pattern, principal, "*", op, perm)


def key(b):
    return (b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type)


admin = AdminClient(conf("ops", OPS))
KEEP.append(admin)
for f in admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)]).values():
    f.result(30)
req = urllib.request.Request(
    f"http://{HTTP}/v1/streams",
    data=json.dumps({"stream": STREAM}).encode(),
    headers={"Authorization": f"Bearer {OPS}", "Content-Type": "application/json"},
    method="POST",
)
with urllib.request.urlopen(req, timeout=10) as r:
    check(r.status in (200, 201), "the HTTP stream was created")

# Before any ACL: alice's scopes let her write and read; bob's do not let him write.
check(produce("alice", ALICE, "a1") is None, "alice produces by her scopes")
check(consume("alice", ALICE, 1) == ("records", ["a1"]), "alice reads by her scopes")
status, body = http_append(ALICE, "h1")
check(status == 200, f"alice appends over HTTP by her scopes ({status} {body})")
err = produce("bob", BOB, "b0")
check(
    err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED,
    f"bob may not write without an ACL ({err})",
)

# ACLs: denies take from alice what her scopes grant; an allow gives bob what his lack.
U = ResourcePatternType
acls = [
    binding("User:alice", ResourceType.TOPIC, TOPIC, U.LITERAL, AclOperation.WRITE, AclPermissionType.DENY),
    binding("User:alice", ResourceType.TOPIC, "acl-", U.PREFIXED, AclOperation.READ, AclPermissionType.DENY),
    binding("User:alice", ResourceType.TOPIC, STREAM, U.LITERAL, AclOperation.WRITE, AclPermissionType.DENY),
    binding("User:bob", ResourceType.TOPIC, TOPIC, U.LITERAL, AclOperation.WRITE, AclPermissionType.ALLOW),
]
for b, f in admin.create_acls(acls).items():
    f.result(30)
check(True, "create_acls created four ACLs")

everything = AclBindingFilter(
    ResourceType.ANY, None, U.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
)
described = admin.describe_acls(everything).result(30)
check(
    sorted(map(key, described)) == sorted(map(key, acls)),
    f"describe_acls lists exactly the four ACLs ({described})",
)
bobs = admin.describe_acls(
    AclBindingFilter(ResourceType.TOPIC, TOPIC, U.MATCH, "User:bob", None, AclOperation.ANY, AclPermissionType.ANY)
).result(30)
check([key(b) for b in bobs] == [key(acls[3])], f"a filter narrows describe_acls to bob's ACL ({bobs})")

err = produce("alice", ALICE, "a2")
check(
    err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED,
    f"a DENY WRITE ACL refuses alice's Produce ({err})",
)
got = consume("alice", ALICE, 1)
check(
    got == ("error", KafkaError.TOPIC_AUTHORIZATION_FAILED),
    f"a prefixed DENY READ ACL refuses alice's Fetch ({got})",
)
status, body = http_append(ALICE, "h2")
check(
    status == 403 and body.get("error", {}).get("code") == "unauthorized",
    f"a DENY WRITE ACL on the stream refuses alice's HTTP append ({status} {body})",
)
check(produce("bob", BOB, "b1") is None, "an ALLOW WRITE ACL lets bob produce")

# Without ALTER on the cluster, alice may neither list nor change ACLs.
alice_admin = AdminClient(conf("alice", ALICE))
KEEP.append(alice_admin)
# librdkafka (2.12.1) drops DescribeAcls' top-level error code and answers an empty
# list, so the refusal shows as nothing listed while bob's ACL exists (the version
# sweep checks the code itself: CLUSTER_AUTHORIZATION_FAILED).
seen = alice_admin.describe_acls(everything).result(30)
check(seen == [], f"alice, without DESCRIBE on the cluster, is shown no ACL ({seen})")
try:
    for f in alice_admin.create_acls([acls[3]]).values():
        f.result(30)
    check(False, "alice may not create ACLs")
except KafkaException as e:
    check(
        e.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        f"create_acls without ALTER on the cluster is CLUSTER_AUTHORIZATION_FAILED ({e})",
    )
try:
    for f in alice_admin.delete_acls([everything]).values():
        f.result(30)
    check(False, "alice may not delete ACLs")
except KafkaException as e:
    check(
        e.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        f"delete_acls without ALTER on the cluster is CLUSTER_AUTHORIZATION_FAILED ({e})",
    )

# Deleting alice's ACLs gives her back what her scopes grant.
alices = AclBindingFilter(ResourceType.ANY, None, U.ANY, "User:alice", None, AclOperation.ANY, AclPermissionType.ANY)
deleted = [b for f in admin.delete_acls([alices]).values() for b in f.result(30)]
check(
    sorted(map(key, deleted)) == sorted(map(key, acls[:3])),
    f"delete_acls removed alice's three ACLs ({deleted})",
)
left = admin.describe_acls(everything).result(30)
check([key(b) for b in left] == [key(acls[3])], f"bob's ACL is left ({left})")
check(produce("alice", ALICE, "a3") is None, "alice produces again once the deny is gone")
got = consume("alice", ALICE, 3)
check(got == ("records", ["a1", "b1", "a3"]), f"alice reads every acknowledged record, in order ({got})")
status, body = http_append(ALICE, "h3")
check(status == 200, f"alice appends over HTTP again ({status} {body})")
