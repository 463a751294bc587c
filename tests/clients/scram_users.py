"""Issue 59: SCRAM users managed with confluent-kafka's AdminClient against a gateway
with --auth. Usage: scram_users.py BOOTSTRAP ADMIN_SECRET ALICE_SECRET

`ops` is an admin token, `alice` a token with read and write scopes; both were
issued with SCRAM credentials of their secrets. Exits non-zero, saying what failed."""

import sys
import time

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

BOOT, ADMIN_SECRET, ALICE_SECRET = sys.argv[1:4]
TOPIC = "scram-users"
NEW_PASSWORD = b"alice-new-password"


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def sasl(mechanism, user, password):
    return {
        "bootstrap.servers": BOOT,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


# Producers are kept to the end: one freed while librdkafka still calls back into it
# raises its error at whatever line runs next.
KEEP = []


def produces(mechanism, user, password):
    """Whether a producer logging in so gets one record acknowledged (a refused login
    times the record out)."""
    delivered = []

    def on_delivery(e, _msg):
        delivered.append(e)

    conf = sasl(mechanism, user, password)
    conf.update({"message.timeout.ms": 6000})
    p = Producer(conf)
    KEEP.append(p)
    p.produce(TOPIC, value=f"{mechanism}-{user}".encode(), on_delivery=on_delivery)
    p.flush(8)
    return delivered == [None]


def logs_in(mechanism, user, password):
    """Whether a client logging in so is answered Metadata (a refused login is not)."""
    try:
        AdminClient(sasl(mechanism, user, password)).list_topics(timeout=5)
        return True
    except KafkaException:
        return False


def error_code(future):
    try:
        future.result(timeout=30)
        return None
    except KafkaException as e:
        return e.args[0].code()


def described(admin, user):
    got = admin.describe_user_scram_credentials([user])[user].result(timeout=30)
    return {(i.mechanism, i.iterations) for i in got.scram_credential_infos}


admin = AdminClient(sasl("PLAIN", "ops", ADMIN_SECRET))
admin.create_topics([NewTopic(TOPIC, 1)])[TOPIC].result(timeout=30)
deadline = time.time() + 60
while TOPIC not in admin.list_topics(timeout=10).topics and time.time() < deadline:
    time.sleep(0.2)

# Both mechanisms, as the token was issued.
check(
    described(admin, "alice") == {(ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 4096)},
    "describe_user_scram_credentials shows alice's two credentials",
)
check(produces("SCRAM-SHA-256", "alice", ALICE_SECRET), "alice logs in with SCRAM-SHA-256 and her secret")

# A new SHA-256 password: it logs in, the old one no longer does, SHA-512 is untouched.
info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192)
done = admin.alter_user_scram_credentials([UserScramCredentialUpsertion("alice", info, NEW_PASSWORD, b"alice-salt-0123")])
check(error_code(done["alice"]) is None, "alter_user_scram_credentials sets alice's SCRAM-SHA-256 password")
check(produces("SCRAM-SHA-256", "alice", NEW_PASSWORD.decode()), "alice logs in with the new password")
check(not logs_in("SCRAM-SHA-256", "alice", ALICE_SECRET), "the old SCRAM-SHA-256 password is refused")
check(produces("SCRAM-SHA-512", "alice", ALICE_SECRET), "SCRAM-SHA-512 is untouched")

# Removing SHA-512: described no more, and its login refused.
done = admin.alter_user_scram_credentials([UserScramCredentialDeletion("alice", ScramMechanism.SCRAM_SHA_512)])
check(error_code(done["alice"]) is None, "alter_user_scram_credentials removes alice's SCRAM-SHA-512")
check(described(admin, "alice") == {(ScramMechanism.SCRAM_SHA_256, 8192)}, "only SCRAM-SHA-256 is described")
check(not logs_in("SCRAM-SHA-512", "alice", ALICE_SECRET), "the removed mechanism is refused")
everyone = admin.describe_user_scram_credentials().result(timeout=30)
check({"ops", "alice"} <= set(everyone), f"describing every user lists ops and alice: {sorted(everyone)}")

# Errors, with Kafka's codes.
missing = admin.describe_user_scram_credentials(["nobody"])["nobody"]
check(error_code(missing) == KafkaError.RESOURCE_NOT_FOUND, "an unknown user is RESOURCE_NOT_FOUND")
done = admin.alter_user_scram_credentials([UserScramCredentialUpsertion("bob", info, b"pw", b"bob-salt")])
check(error_code(done["bob"]) == KafkaError.RESOURCE_NOT_FOUND, "a password for a user with no token is refused")
low = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000)
done = admin.alter_user_scram_credentials([UserScramCredentialUpsertion("alice", low, b"pw", b"salt")])
check(error_code(done["alice"]) == KafkaError.UNACCEPTABLE_CREDENTIAL, "too few iterations are UNACCEPTABLE_CREDENTIAL")
as_alice = AdminClient(sasl("SCRAM-SHA-256", "alice", NEW_PASSWORD.decode()))
done = as_alice.alter_user_scram_credentials([UserScramCredentialUpsertion("alice", info, b"mine", b"salt-alice")])
check(
    error_code(done["alice"]) == KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    "a user without the admin scope changes no credential",
)
done = as_alice.alter_user_scram_credentials([UserScramCredentialUpsertion("alice", low, b"mine", b"salt-alice")])
check(
    error_code(done["alice"]) == KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    "authorization is checked before the credential, as Kafka does",
)
check(produces("SCRAM-SHA-256", "alice", NEW_PASSWORD.decode()), "and her password is unchanged")
print("scram users: all checks passed")
