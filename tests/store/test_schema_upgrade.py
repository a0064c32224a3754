"""Databases made by the code before one SQL layer open and migrate, on both backends:
every record reads back with its meaning, the schema reaches SCHEMA_VERSION, and
the store writes (which needs the tables that code never made in SQLite)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from llmgw.controller.core.records import Backoff, LeaveReason
from llmgw.controller.store.base import StateStore
from llmgw.controller.store.postgres import PostgresStore, take_lease
from llmgw.controller.store.schema import MIGRATIONS, SCHEMA_VERSION, AddColumn
from llmgw.controller.store.sql import HISTORY_KEPT
from llmgw.controller.store.sqlite import STATE_FILE, Store
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


def test_schema_6_lowers_node_names_stored_before(tmp_path: Path) -> None:
    """Reports name nodes in lower case from schema 6 on: a store from before keeps
    its nodes, credentials, flags, history and replicas under the lowered names."""
    store = Store(tmp_path)
    store.close()
    db = sqlite3.connect(tmp_path / STATE_FILE)
    db.executemany(
        "INSERT INTO nodes(name, first_seen) VALUES (?, ?)",
        [("GPU-A01", 1.0), ("Gpu-B", 2.0), ("gpu-b", 3.0)],
    )
    db.execute(
        "INSERT INTO node_admin(name, flag, reason, by, at) VALUES ('GPU-A01', 'cordoned', 'r', 'ops', 5)"
    )
    db.execute(
        "INSERT INTO admin_events(node, action, by, at) VALUES ('GPU-A01', 'cordon', 'ops', 5)"
    )
    db.execute(
        "INSERT INTO agent_credentials(node, digest, issued_at, by) VALUES ('GPU-A01', 'd', 4, 'e')"
    )
    shards = '[{"node": "GPU-A01", "rank": 0, "gpus": ["GPU-5c1b"]}]'
    db.execute(
        "INSERT INTO replicas(id, model, state, shards, created_at) VALUES ('r1', 'm', 'ready', ?, 6)",
        (shards,),
    )
    db.execute("DELETE FROM schema_version WHERE version >= 6")  # back to schema 5
    db.commit()
    db.close()

    again = Store(tmp_path)
    # Gpu-B stays as it was: its lowered name is another node's.
    assert again.known_nodes() == {"gpu-a01": 1.0, "Gpu-B": 2.0, "gpu-b": 3.0}
    assert set(again.admin()) == {"gpu-a01"}
    assert set(again.credentials()) == {"gpu-a01"}
    assert [e.action for e in again.history("gpu-a01")] == ["cordon"]
    shard = again.replicas()["r1"].shards[0]
    assert (shard.node, shard.gpus) == ("gpu-a01", ("GPU-5c1b",)), "GPU UUIDs keep their case"
    again.close()
    assert versions(tmp_path / STATE_FILE) == list(range(1, SCHEMA_VERSION + 1))


def test_schema_7_gives_leaving_replicas_stored_before_their_reason(tmp_path: Path) -> None:
    """Why a replica leaves is data from schema 7 on: a replica stored before, with
    only its text, gets its reason (and a reclaim its model) once, by the migration."""
    store = Store(tmp_path)
    store.close()
    db = sqlite3.connect(tmp_path / STATE_FILE)
    rows = [
        ("r1", "reclaimed for chat-big (priority 10)"),
        ("r2", "scale down to 1: idle"),
        ("r3", None),
    ]
    for rid, leaving in rows:
        db.execute(
            "INSERT INTO replicas(id, model, state, shards, created_at, leaving)"
            " VALUES (?, 'm', 'draining', '[]', 6, ?)",
            (rid, leaving),
        )
    db.execute("DELETE FROM schema_version WHERE version >= 7")
    db.commit()
    db.close()

    again = Store(tmp_path)
    got = {rid: (r.leave_reason, r.reclaimed_for, r.leaving) for rid, r in again.replicas().items()}
    again.close()
    assert got == {
        "r1": (LeaveReason.RECLAIM, "chat-big", "reclaimed for chat-big (priority 10)"),
        "r2": (LeaveReason.SCALE_DOWN, None, "scale down to 1: idle"),
        "r3": (None, None, None),
    }
    assert versions(tmp_path / STATE_FILE) == list(range(1, SCHEMA_VERSION + 1))


def test_bounded_tables_schema_keeps_known_credentials_and_cuts_long_histories(
    tmp_path: Path,
) -> None:
    """The schema that bounds tables: a credential of a node known before counts as
    reported (it never expires), one of a node never seen does not, and each node's
    history is cut to its newest HISTORY_KEPT."""
    version = 1 + next(
        i
        for i, steps in enumerate(MIGRATIONS)
        if AddColumn("agent_credentials", "reported_at", "DOUBLE PRECISION") in steps
    )
    Store(tmp_path).close()
    db = sqlite3.connect(tmp_path / STATE_FILE)
    db.execute("INSERT INTO nodes(name, first_seen) VALUES ('n1', 1.0)")
    db.executemany(
        "INSERT INTO agent_credentials(node, digest, issued_at, by) VALUES (?, ?, 4, 'e')",
        [("n1", "d1"), ("ghost", "d2")],
    )
    db.executemany(
        "INSERT INTO admin_events(node, action, by, at) VALUES (?, 'cordon', 'ops', ?)",
        [("n1", float(i)) for i in range(HISTORY_KEPT + 20)] + [("n2", 1.0)],
    )
    db.execute("UPDATE agent_credentials SET reported_at = NULL")
    db.execute("DELETE FROM schema_version WHERE version >= ?", (version,))
    db.commit()
    db.close()

    again = Store(tmp_path)
    assert again.unreported_credentials() == {"ghost": 4.0}
    kept = again.history("n1", limit=10 * HISTORY_KEPT)
    assert [e.at for e in kept] == [float(i) for i in reversed(range(20, HISTORY_KEPT + 20))]
    assert len(again.history("n2")) == 1
    again.close()
