"""What `llmgw controller migrate` copies, at the store: a dump of every durable table
loads into an empty store of the other backend and dumps the same, with credentials
and enrollment tokens copied as stored (digests) and the stores' own bookkeeping left
behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.controller.core.records import (
    Backoff,
    ClientKey,
    EnrollToken,
    IssuedCredential,
    LeaveReason,
    ReplicaRecord,
    ShardRecord,
    StartCount,
    StateDump,
    TenantLimit,
    UsageCount,
)
from llmgw.controller.store.base import StateStore
from llmgw.controller.store.sqlite import Store
from llmgw.wire import (
    AdminFlag,
    AdminInfo,
    EventReason,
    EventView,
    ModelRevision,
    ModelSpec,
    ReplicaState,
    StartKind,
)
from tests.store.conftest import StoreFactory

SPEC = ModelSpec.model_validate(
    {"name": "m", "source": "/models/m", "engine": "fake", "min_replicas": 1}
)
TOKEN = EnrollToken("tok001", "d-tok", 1.0, "alice", expires_at=900.0, uses=3, description="rack 4")
OPEN_TOKEN = EnrollToken("tok002", "d-open", 2.0, "bob")
CLIENT_KEY = ClientKey("k1", "acme", "d-key", ("llama-*", "chat"), 3.0, "alice", 99.0, 12.0)
LIMITS = [
    TenantLimit("acme", None, 60, None, 1000, "month", "alice", 4.0),
    TenantLimit("acme", "chat", None, 500, None, None, "bob", 5.0),
]
USAGE = [UsageCount(3600.0, "acme", "chat", 3, 30, 20, 1, 2), UsageCount(7200.0, "beta", "m", 1)]
DECISIONS = [
    EventView(
        id=7,
        at=20.0,
        object="model/m",
        reason=EventReason.PLACED,
        message="placed r1",
        count=3,
        first_at=12.0,
    ),
    EventView(id=8, at=21.0, object="node/n2", reason=EventReason.ENROLLED, message="enrolled"),
]


def fill(store: StateStore) -> None:
    """One of every durable record, each field away from its default."""
    store.add_nodes([("n1", 1.0), ("n2", 2.0), ("n5", 3.0)])
    cordon = AdminInfo(flag=AdminFlag.CORDONED, reason="disk", by="ops", at=4.0)
    store.set_admin("n1", cordon, action="cordon", by="ops", at=4.0)
    revision = ModelRevision(revision=1, at=5.0, by="alice", change="created", spec=SPEC)
    store.put_models([SPEC], at=5.0, revisions=[revision])
    shard = ShardRecord(node="n1", rank=0, gpus=("GPU-a",))
    store.put_replicas(
        [
            ReplicaRecord(
                "r1",
                "m",
                ReplicaState.DRAINING,
                (shard,),
                6.0,
                revision=1,
                leaving="reclaimed for big (priority 9)",
                leave_reason=LeaveReason.RECLAIM,
                reclaimed_for="big",
            ),
            ReplicaRecord(
                "r2",
                "m",
                ReplicaState.SLEEPING,
                (shard,),
                7.0,
                revision=1,
                asleep_since=7.5,
                start=StartKind.WARM,
            ),
        ]
    )
    store.put_backoff(Backoff("m", 2, 50.0, "crashed"))
    store.add_events(DECISIONS, gone=(), keep_after=0.0)
    store.put_enroll_token(TOKEN)
    store.put_enroll_token(OPEN_TOKEN)
    store.put_credential("n1", "d-n1", at=8.0, by="enroll")
    store.credential_reported("n1", at=8.5)
    assert store.enroll("n2", "d-n2", at=9.0, by="enroll", pending=True, token=TOKEN.id)
    store.allow_enroll("n5", by="alice", at=10.0)
    store.put_client_key(CLIENT_KEY)
    for limit in LIMITS:
        store.put_limit(limit)
    assert store.add_usage("gw", "run", 1, USAGE, at=7300.0)
    store.count_start("m", StartKind.HOT, 1, 0.4, at=11.0)
    store.count_start("m", StartKind.HOT, 1, 0.6, at=12.0)
    store.count_start("m", StartKind.COLD, 0, 30.5, at=13.0)


@pytest.fixture
def other_store(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[StateStore]:
    """An empty store of the backend this test's store is not."""
    if backend == "postgresql":
        store: StateStore = Store(tmp_path / "copy")
    else:
        from llmgw.controller.store.postgres import PostgresStore, take_lease

        store = PostgresStore(request.getfixturevalue("pg_url"))
        assert take_lease(store, holder="copy", ttl_s=3600) is not None
    yield store
    store.close()


def test_a_dump_loads_into_the_other_backend_whole(
    open_store: StoreFactory, other_store: StateStore
) -> None:
    source = open_store()
    fill(source)
    dump = source.dump()
    assert dump.decisions == DECISIONS
    assert dump.credentials == {
        "n1": IssuedCredential("n1", "d-n1", 8.0, "enroll", reported_at=8.5),
        "n2": IssuedCredential("n2", "d-n2", 9.0, "enroll", pending=True, token="tok001"),
    }
    assert dump.enroll_tokens == [
        EnrollToken("tok001", "d-tok", 1.0, "alice", 900.0, 3, 1, "rack 4"),
        OPEN_TOKEN,
    ]
    assert dump.enroll_allowed == {"n5": ("alice", 10.0)}
    assert dump.client_keys == [CLIENT_KEY], "a client key as stored: its digest"
    assert dump.limits == LIMITS and dump.usage == USAGE
    assert dump.starts == [
        StartCount("m", StartKind.COLD, 0, 1, 30.5, 13.0),
        StartCount("m", StartKind.HOT, 1, 2, 0.6, 12.0),
    ], "counted, the last time kept"
    assert dump.replicas["r2"].start is StartKind.WARM
    assert [r.revision for r in dump.revisions["m"]] == [1]
    assert other_store.dump().empty()
    before = other_store.revision

    other_store.load(dump)

    assert other_store.dump() == dump
    assert other_store.revision == before + 1, "one transaction; the source's count stays behind"
    # What the controller reads at start, from the copy.
    assert other_store.credentials() == {
        "n1": ("d-n1", 8.0, "enroll"),
        "n2": ("d-n2", 9.0, "enroll"),
    }
    assert other_store.pending_credentials() == {"n2": 9.0}
    assert other_store.unreported_credentials() == {"n2": 9.0}, "n1 reported: it never expires"
    assert other_store.events(100) == DECISIONS
    assert not other_store.enroll("n6", "d-n6", at=950.0, by="t", pending=False, token="tok001"), (
        "the copied token keeps its expiry"
    )
    assert other_store.enroll("n6", "d-n6", at=10.0, by="t", pending=False, token="tok001")
    assert [t.used for t in other_store.enroll_tokens()] == [2, 0], "and its count of uses"


@pytest.mark.parametrize(
    "only",
    [
        StateDump(decisions=DECISIONS[:1]),
        StateDump(credentials={"n1": IssuedCredential("n1", "d", 1.0, "enroll")}),
        StateDump(enroll_tokens=[OPEN_TOKEN]),
        StateDump(enroll_allowed={"n1": ("alice", 1.0)}),
        StateDump(client_keys=[CLIENT_KEY]),
        StateDump(limits=LIMITS[:1]),
        StateDump(usage=USAGE[:1]),
    ],
)
def test_a_store_holding_any_of_them_is_not_empty(only: StateDump) -> None:
    assert not only.empty()
    assert StateDump().empty()


def test_the_counts_name_no_digest() -> None:
    dump = StateDump(
        credentials={"n1": IssuedCredential("n1", "secret-digest", 1.0, "enroll")},
        enroll_tokens=[EnrollToken("tok", "token-digest", 1.0, "alice")],
        client_keys=[ClientKey("k", "acme", "key-digest", ("*",), 1.0, "alice")],
    )
    counts = dump.counts()
    assert "1 node credentials" in counts and "1 enrollment tokens" in counts
    assert "1 client keys" in counts
    assert "digest" not in counts
