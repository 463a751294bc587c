"""Issue 59: the introspection admin APIs through a real client, kafka-python 3 (the
confluent-kafka Python binding has no list_transactions, describe_producers or
delete_consumer_group_offsets): list_transactions and describe_transactions show an
open transaction, describe_producers the producer writing it, and delete_group_offsets
removes a group's committed offset. Usage: admin_introspection.py BOOTSTRAP"""

import sys

from confluent_kafka import Producer
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import NoError
from kafka.structs import OffsetAndMetadata

BOOT = sys.argv[1]
TOPIC, TXN, GROUP = "intro", "intro-tx", "intro-g"
TP = TopicPartition(TOPIC, 0)


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def state(s):
    return str(getattr(s, "value", s))


admin = KafkaAdminClient(bootstrap_servers=BOOT)
admin.create_topics([NewTopic(TOPIC, 1, 1)])

# An open transaction with one record written.
p = Producer({"bootstrap.servers": BOOT, "transactional.id": TXN})
p.init_transactions(30)
p.begin_transaction()
p.produce(TOPIC, b"in-flight")
check(p.flush(30) == 0, "the transactional record was written")

listed = {t.transactional_id: t for ts in admin.list_transactions().values() for t in ts}
check(TXN in listed and state(listed[TXN].state) == "Ongoing", f"list_transactions shows {TXN} ongoing: {listed}")
pid = listed[TXN].producer_id
desc = admin.describe_transactions([TXN])[TXN]
check(
    state(desc.state) == "Ongoing" and desc.producer_id == pid and desc.producer_epoch >= 0,
    f"describe_transactions describes {TXN}: {desc}",
)
producers = admin.describe_producers([TP])[TP].active_producers
check(
    any(a.producer_id == pid and a.current_transaction_start_offset == 0 for a in producers),
    f"describe_producers shows the producer and where its open transaction starts: {producers}",
)
p.commit_transaction(30)
listed = {t.transactional_id: t for ts in admin.list_transactions().values() for t in ts}
check(
    TXN not in listed or state(listed[TXN].state) != "Ongoing",
    f"once committed, {TXN} is no longer ongoing: {listed}",
)

# A committed offset of a group with no member subscribed, then deleted (OffsetDelete).
c = KafkaConsumer(bootstrap_servers=BOOT, group_id=GROUP, enable_auto_commit=False)
c.assign([TP])
c.commit({TP: OffsetAndMetadata(1, "", -1)})
c.close()
before = admin.list_group_offsets({GROUP: None})[GROUP]
check(TP in before and before[TP].offset == 1, f"the group committed offset 1: {before}")
deleted = admin.delete_group_offsets(GROUP, [TP])
check(deleted.get(TP) is NoError, f"delete_group_offsets deleted it: {deleted}")
after = admin.list_group_offsets({GROUP: None})[GROUP]
check(TP not in after or after[TP].offset == -1, f"the group has no offset left: {after}")
