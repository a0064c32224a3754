"""The store's contract, run against SQLite and a real PostgreSQL alike: every
record survives a reopen with the same meaning, schemas are versioned, and a
lost connection is a refused write that heals by itself."""

from __future__ import annotations

import time

import psycopg
import pytest

from llmgw.controller.core.records import (
    Backoff,
    ClientKey,
    EnrollToken,
    ReplicaRecord,
    ShardRecord,
)
from llmgw.controller.store.errors import Fenced, StateError, StoreUnavailable
from llmgw.controller.store.postgres import PgLease, PostgresStore, take_lease
from llmgw.controller.store.schema import SCHEMA_VERSION
from llmgw.controller.store.sql import HISTORY_KEPT
from llmgw.wire import AdminFlag, AdminInfo, EventReason, EventView, ModelSpec, ReplicaState
from tests.store.conftest import StoreFactory

SPEC = ModelSpec.model_validate(
    {"name": "m", "source": "/models/m", "engine": "fake", "min_replicas": 1}
)


def replica(
    rid: str, node: str = "n1", state: ReplicaState = ReplicaState.STARTING
) -> ReplicaRecord:
    return ReplicaRecord(
        id=rid,
        model="m",
        state=state,
        shards=(ShardRecord(node=node, rank=0, gpus=("GPU-a", "GPU-b")),),
        created_at=100.0,
        replaces=None,
    )


def test_every_record_survives_a_reopen(open_store: StoreFactory) -> None:
    store = open_store()
    store.add_nodes([("n1", 1.0), ("n2", 2.0)])
    store.add_nodes([("n1", 9.0)])  # a first sighting is never overwritten
    cordon = AdminInfo(flag=AdminFlag.CORDONED, reason="disk", by="ops", at=10.0)
    drain = AdminInfo(flag=AdminFlag.DRAINING, reason="move", by="ops", at=11.0, force_at=99.5)
    store.set_admin("n1", cordon, action="cordon", by="ops", at=10.0)
    store.set_admin("n2", drain, action="drain", by="ops", at=11.0)
    store.set_admin("n3", cordon, action="cordon", by="ops", at=12.0, first_seen=12.0)
    store.put_models([SPEC], at=5.0)
    store.put_replicas([replica("r1"), replica("r2", "n2")])
    store.put_replicas([replica("r1", state=ReplicaState.READY)])
    store.put_backoff(Backoff("m", 2, 50.0, "crashed"))
    store.close()

    again = open_store()
    assert again.known_nodes() == {"n1": 1.0, "n2": 2.0, "n3": 12.0}
    assert again.admin() == {"n1": cordon, "n2": drain, "n3": cordon}
    assert [e.action for e in again.history("n1")] == ["cordon"]
    assert again.history("n2")[0].force_at == 99.5
    assert again.models() == {"m": SPEC}
    assert again.replicas()["r1"].state is ReplicaState.READY
    assert again.replicas()["r2"].shards == replica("r2", "n2").shards
    assert again.backoffs() == {"m": Backoff("m", 2, 50.0, "crashed")}


def test_clearing_and_deleting(open_store: StoreFactory) -> None:
    store = open_store()
    store.add_nodes([("n1", 1.0), ("n2", 1.0)])
    info = AdminInfo(flag=AdminFlag.CORDONED, reason="x", by="ops", at=1.0)
    store.set_admin("n1", info, action="cordon", by="ops", at=1.0)
    store.set_admin("n1", AdminInfo(), action="uncordon", by="ops", at=2.0)
    assert store.admin() == {}
    assert [e.action for e in store.history("n1")] == ["uncordon", "cordon"]
    assert [e.action for e in store.history("n1", limit=1)] == ["uncordon"]
    store.put_models([SPEC], at=1.0)
    store.put_backoff(Backoff("m", 1, 5.0, None))
    assert store.delete_model("m") is True
    assert store.delete_model("m") is False
    assert store.backoffs() == {}, "a model's backoff goes with it"
    store.put_replicas([replica("r1"), replica("r2", "n2")])
    store.delete_replicas(["r1"])
    assert set(store.replicas()) == {"r2"}
    store.put_backoff(Backoff("other", 1, 5.0, None))
    store.clear_backoff("other")
    assert store.backoffs() == {}
    store.forget_node("n2", ["r2"], by="ops", at=3.0)
    assert store.known_nodes() == {"n1": 1.0} and store.replicas() == {}
    assert store.history("n2")[0].action == "forget"


def test_events_keep_their_count_and_gone_ones_are_deleted(open_store: StoreFactory) -> None:
    store = open_store()
    placed = EventView(id=1, at=5.0, object="model/m", reason=EventReason.PLACED, message="p")
    lost = EventView(id=2, at=6.0, object="node/n1", reason=EventReason.NODE_LOST, message="l")
    store.add_events([placed, lost], gone=(), keep_after=0.0)
    counted = lost.model_copy(update={"id": 3, "at": 9.0, "count": 2, "first_at": 6.0})
    store.add_events([counted], gone=[2], keep_after=0.0)
    store.close()
    again = open_store()
    assert again.events(10) == [placed, counted]
    again.add_events([], gone=[], keep_after=7.0)  # last seen before: gone
    assert again.events(10) == [counted]


def test_a_nodes_history_keeps_its_newest_at_the_bound(open_store: StoreFactory) -> None:
    store = open_store()
    store.add_nodes([("n1", 1.0), ("n2", 1.0)])
    cordon = AdminInfo(flag=AdminFlag.CORDONED, reason="x", by="ops", at=1.0)
    store.set_admin("n2", cordon, action="cordon", by="ops", at=1.0)
    for i in range(HISTORY_KEPT + 10):
        store.set_admin(
            "n1", cordon.model_copy(update={"at": float(i)}), action="cordon", by="ops", at=float(i)
        )
    kept = store.history("n1", limit=10 * HISTORY_KEPT)
    assert [e.at for e in kept] == [float(i) for i in reversed(range(10, HISTORY_KEPT + 10))]
    assert len(store.history("n2")) == 1, "another node's is its own"
    store.forget_node("n1", [], by="ops", at=500.0)
    assert [(e.action, e.at) for e in store.history("n1")] == [("forget", 500.0)]


def test_credentials_say_whether_their_node_reported(open_store: StoreFactory) -> None:
    store = open_store()
    store.put_credential("n1", "d1", at=5.0, by="e")
    assert store.enroll("n2", "d2", at=6.0, by="e", pending=False, token=None)
    assert store.unreported_credentials() == {"n1": 5.0, "n2": 6.0}
    store.credential_reported("n2", at=7.0)
    store.credential_reported("n2", at=8.0)  # the first time stays
    store.close()
    again = open_store()
    assert again.unreported_credentials() == {"n1": 5.0}
    again.expire_credentials(["n1", "n2"])  # n2 reported: it stays
    assert again.credentials() == {"n2": ("d2", 6.0, "e")}
    assert again.dump().credentials["n2"].reported_at == 7.0


def test_node_credentials_survive_a_reopen_and_revoke(open_store: StoreFactory) -> None:
    store = open_store()
    assert store.credentials() == {}
    store.put_credential("n1", "digest-1", at=5.0, by="enroll")
    store.close()
    again = open_store()
    assert again.credentials() == {"n1": ("digest-1", 5.0, "enroll")}
    assert again.delete_credential("n1") is True
    assert again.delete_credential("n1") is False
    assert again.credentials() == {}


def test_an_enrollment_takes_one_use_of_its_token_in_its_transaction(
    open_store: StoreFactory,
) -> None:
    store = open_store()
    store.put_enroll_token(EnrollToken("abc123", "d-tok", 1.0, "alice", expires_at=100.0, uses=2))
    store.put_enroll_token(EnrollToken("old000", "d-old", 1.0, "alice", expires_at=10.0))
    assert store.enroll("n1", "d1", at=5.0, by="t", pending=True, token="abc123")
    assert store.enroll("n2", "d2", at=6.0, by="t", pending=False, token="abc123")
    # Used up, and expired: nothing written, not even the credential.
    assert not store.enroll("n3", "d3", at=7.0, by="t", pending=False, token="abc123")
    assert not store.enroll("n3", "d3", at=10.0, by="t", pending=False, token="old000")
    assert store.enroll("n3", "d3", at=10.0, by="static", pending=False, token=None)
    store.add_nodes([("n4", 1.0)])
    store.allow_enroll("n4", by="alice", at=8.0)
    assert store.enroll_allowed() == {"n4": ("alice", 8.0)}
    assert store.enroll("n4", "d4", at=9.0, by="t", pending=False, token=None)
    store.close()
    again = open_store()
    assert again.enroll_allowed() == {}, "an allowance is used up by its enrollment"
    assert [(t.id, t.used) for t in again.enroll_tokens()] == [("abc123", 2), ("old000", 0)]
    assert set(again.credentials()) == {"n1", "n2", "n3", "n4"}
    assert again.pending_credentials() == {"n1": 5.0}
    assert again.approve_credential("n1", by="alice", at=11.0) is True
    assert again.approve_credential("n1", by="alice", at=12.0) is False
    assert again.pending_credentials() == {}
    assert [(e.action, e.by) for e in again.history("n1")] == [("approve", "alice")]
    assert again.delete_enroll_token("abc123") and not again.delete_enroll_token("abc123")


def test_client_keys_survive_a_reopen_and_last_use_never_goes_back(
    open_store: StoreFactory,
) -> None:
    store = open_store()
    key = ClientKey("k1", "acme", "d-k1", ("llama-*", "chat"), 1.0, "alice", expires_at=50.0)
    store.put_client_key(key)
    store.put_client_key(ClientKey("k2", "beta", "d-k2", ("*",), 2.0, "bob"))
    store.client_keys_used([("k1", 20.0), ("k2", 30.0)])
    store.client_keys_used([("k1", 10.0), ("gone", 5.0)])  # older: kept at 20
    store.close()
    again = open_store()
    assert again.client_keys() == [
        ClientKey("k1", "acme", "d-k1", ("llama-*", "chat"), 1.0, "alice", 50.0, 20.0),
        ClientKey("k2", "beta", "d-k2", ("*",), 2.0, "bob", None, 30.0),
    ]
    assert again.delete_client_key("k1") and not again.delete_client_key("k1")
    assert [k.id for k in again.client_keys()] == ["k2"]


def test_dump_and_load_copy_everything(
    open_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from llmgw.controller.store.sqlite import Store

    store = open_store()
    store.add_nodes([("n1", 1.0)])
    store.set_admin(
        "n1",
        AdminInfo(flag=AdminFlag.CORDONED, reason="r", by="b", at=2.0),
        action="cordon",
        by="b",
        at=2.0,
    )
    store.put_models([SPEC], at=3.0)
    store.put_replicas([replica("r1")])
    store.put_backoff(Backoff("m", 1, 4.0, "x"))
    dump = store.dump()
    copy = Store(tmp_path_factory.mktemp("copy"))
    copy.load(dump)
    assert copy.dump() == dump
    copy.close()


def test_a_schema_newer_than_the_code_is_refused(open_store: StoreFactory, backend: str) -> None:
    store = open_store()
    store.close()
    if backend == "sqlite":
        import sqlite3

        from llmgw.controller.store.sqlite import Store

        path = store.path  # type: ignore[attr-defined]
        db = sqlite3.connect(path)
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
        db.commit()
        db.close()
        with pytest.raises(StateError, match="newer than this controller knows"):
            Store(path.parent)
    else:
        url = store.url  # type: ignore[attr-defined]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO schema_version(version) VALUES (%s)", (SCHEMA_VERSION + 1,))
        with pytest.raises(StateError, match="newer than this controller knows"):
            PostgresStore(url)


def test_a_lost_postgresql_connection_refuses_one_write_then_heals(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    take_lease(store, holder="t", ttl_s=600)
    store.add_nodes([("n1", 1.0)])
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    with pytest.raises(StoreUnavailable, match="PostgreSQL"):
        store.add_nodes([("n2", 2.0)])
    store.add_nodes([("n3", 3.0)])  # reconnects by itself
    assert set(store.known_nodes()) == {"n1", "n3"}
    store.close()


def test_an_unreachable_postgresql_is_a_clear_start_error(tmp_path: object) -> None:
    with pytest.raises(StateError, match="cannot use the PostgreSQL store"):
        PostgresStore("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")


def lease(url: str, who: str, ttl_s: float = 600) -> PgLease:
    return PgLease(url, holder=who, advertise_url=f"http://{who}:7460", ttl_s=ttl_s)


def test_one_lease_at_a_time_and_each_taking_bumps_the_epoch(pg_url: str) -> None:
    PostgresStore(pg_url).close()  # the schema
    a, b = lease(pg_url, "ctl-a"), lease(pg_url, "ctl-b", ttl_s=0.5)
    first = a.acquire()
    assert first is not None
    assert b.acquire() is None, "a live lease is not taken"
    assert b.leader()[:2] == (first, "http://ctl-a:7460") and 0 < b.leader()[2] <= 600
    assert a.renew(first)
    a.release(first)  # a clean stop: the next one leads at once
    assert b.leader() == (first, None, 0.0)
    second = b.acquire()
    assert second == first + 1
    assert not a.renew(first), "a deposed holder cannot renew"
    time.sleep(0.8)  # b's short TTL runs out: a may take it back
    assert b.leader() == (second, None, 0.0)
    assert a.acquire() == second + 1
    a.close()
    b.close()


def test_writes_are_fenced_by_the_epoch(pg_url: str) -> None:
    """A store whose epoch lost the lease cannot write, even on a live connection
    that has not noticed anything; the refusal names the leader."""
    old = PostgresStore(pg_url, advertise_url="http://ctl-a:7460")
    assert take_lease(old, holder="ctl-a", ttl_s=0.5) is not None
    old.add_nodes([("n1", 1.0)])
    told: list[bool] = []
    old.on_fenced = lambda: told.append(True)
    time.sleep(0.8)  # the lease expired: not even its own holder writes past the TTL
    with pytest.raises(Fenced, match="not the leader"):
        old.add_nodes([("n2", 2.0)])
    new = PostgresStore(pg_url, advertise_url="http://ctl-b:7460")
    assert take_lease(new, holder="ctl-b", ttl_s=600) == old.epoch + 1
    with pytest.raises(Fenced, match=r"led by http://ctl-b:7460") as refused:
        old.set_admin(
            "n1",
            AdminInfo(flag=AdminFlag.CORDONED, reason="r", by="x", at=1.0),
            action="cordon",
            by="x",
            at=1.0,
        )
    assert refused.value.leader == "http://ctl-b:7460"
    assert isinstance(refused.value, StoreUnavailable)  # so the API answers 503
    assert told == [True, True]
    new.add_nodes([("n3", 3.0)])
    assert set(new.known_nodes()) == {"n1", "n3"}
    assert new.admin() == {}, "the fenced cordon changed nothing"
    unfenced = PostgresStore(pg_url)  # epoch 0: holds no lease, writes nothing
    with pytest.raises(Fenced):
        unfenced.add_nodes([("n4", 4.0)])
    for s in (old, new, unfenced):
        s.close()
