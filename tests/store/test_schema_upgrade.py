"""Databases made by the code before one SQL layer open and migrate, on both backends:
every record reads back with its meaning, the schema reaches SCHEMA_VERSION, and
the store writes (which needs the tables that code never made in SQLite)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from llmgw.controller.records import Backoff
from llmgw.controller.stores.base import StateStore
from llmgw.controller.stores.postgres import PostgresStore, take_lease
from llmgw.controller.stores.schema import SCHEMA_VERSION
from llmgw.controller.stores.sqlite import STATE_FILE, Store
from llmgw.wire import AdminFlag, AdminInfo, ReplicaState
from tests.store import legacy_schemas as legacy


def check_everything_reads_and_writes(store: StateStore) -> None:
    assert store.known_nodes() == {"n1": 1.0, "n2": 2.0}
    assert store.admin() == {
        "n1": AdminInfo(flag=AdminFlag.DRAINING, reason="move", by="ops", at=10.0, force_at=99.5)
    }
    assert [(e.action, e.force_at) for e in store.history("n1")] == [("drain", 99.5)]
    assert list(store.models()) == ["m"]
    assert store.replicas()["r1"].state is ReplicaState.READY
    assert store.replicas()["r1"].nodes == ("n2",)
    assert store.backoffs() == {"m": Backoff("m", 2, 50.0, "crashed")}
    assert store.credentials() == {"n2": ("digest-2", 4.0, "enroll")}
    # Credentials from before approval existed are approved; nothing else is there.
    assert store.pending_credentials() == {}
    assert store.enroll_tokens() == [] and store.enroll_allowed() == {}
    cordon = AdminInfo(flag=AdminFlag.CORDONED, reason="r", by="ops", at=20.0)
    store.set_admin("n2", cordon, action="cordon", by="ops", at=20.0)
    store.put_credential("n1", "digest-1", at=21.0, by="enroll")
    assert store.admin()["n2"] == cordon
    assert [e.action for e in store.history("n2")] == ["cordon"]


def sqlite_v1(state_dir: Path, *, credentials: bool) -> Path:
    state_dir.mkdir()
    path = state_dir / STATE_FILE
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(legacy.SQLITE_V1)
    if credentials:
        db.execute(legacy.SQLITE_CREDENTIALS)
    for query, params in legacy.ROWS:
        if credentials or "agent_credentials" not in query:
            db.execute(query, params)
    db.commit()
    db.close()
    return path


def versions(path: Path) -> list[int]:
    db = sqlite3.connect(path)
    try:
        return [r[0] for r in db.execute("SELECT version FROM schema_version ORDER BY version")]
    finally:
        db.close()


def test_a_sqlite_file_from_before_opens_and_migrates(tmp_path: Path) -> None:
    path = sqlite_v1(tmp_path / "state", credentials=True)
    store = Store(path.parent)
    check_everything_reads_and_writes(store)
    store.close()
    assert versions(path) == list(range(1, SCHEMA_VERSION + 1))
    again = Store(path.parent)  # a second open migrates nothing
    assert again.credentials().keys() == {"n1", "n2"}
    again.close()
    assert versions(path) == list(range(1, SCHEMA_VERSION + 1))


def test_a_sqlite_file_that_never_issued_a_credential_gets_the_table(tmp_path: Path) -> None:
    path = sqlite_v1(tmp_path / "state", credentials=False)
    store = Store(path.parent)
    assert store.credentials() == {}
    store.put_credential("n1", "d", at=1.0, by="enroll")
    assert store.credentials() == {"n1": ("d", 1.0, "enroll")}
    store.close()


def test_a_sqlite_file_from_before_versions_gains_drain_deadlines(tmp_path: Path) -> None:
    """Version 0: the tables without force_at and no schema_version at all."""
    (tmp_path / "state").mkdir()
    path = tmp_path / "state" / STATE_FILE
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE nodes (name TEXT PRIMARY KEY, first_seen REAL NOT NULL);"
        "CREATE TABLE node_admin (name TEXT PRIMARY KEY, flag TEXT NOT NULL, reason TEXT,"
        " by TEXT, at REAL, drained INTEGER NOT NULL DEFAULT 0,"
        " force INTEGER NOT NULL DEFAULT 0);"
        "CREATE TABLE admin_events (id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL,"
        " action TEXT NOT NULL, reason TEXT, by TEXT NOT NULL, at REAL NOT NULL);"
        "INSERT INTO node_admin(name, flag, reason, by, at) VALUES ('n1', 'cordoned', 'x', 'o', 1);"
    )
    db.commit()
    db.close()
    store = Store(path.parent)
    assert store.admin()["n1"].force_at is None
    drain = AdminInfo(flag=AdminFlag.DRAINING, reason="y", by="o", at=2.0, force_at=9.0)
    store.set_admin("n1", drain, action="drain", by="o", at=2.0)
    assert store.admin()["n1"] == drain
    store.close()


def test_a_postgresql_store_from_before_opens_and_migrates(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for statement in legacy.POSTGRES_V2:
            conn.execute(statement)
        for query, params in legacy.ROWS:
            conn.execute(query.replace("?", "%s"), params)
    store = PostgresStore(pg_url)
    assert take_lease(store, holder="t", ttl_s=600) is not None
    check_everything_reads_and_writes(store)
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        got = [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY 1")]
    assert got == list(range(1, SCHEMA_VERSION + 1))
