"""Durable state in SQLite (WAL): what must survive a controller restart.

Node admin flags with reason, who and when (and their history), the names of
nodes ever seen, model specs, replica records and per-model failure backoff.
Agent reports are soft state and never written here.

Writes are rare (operator actions, replica transitions), so the store is plain
synchronous sqlite3 used from the event loop; every mutation is one transaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from llmgw.wire import AdminEvent, AdminFlag, AdminInfo, ModelSpec, ReplicaState

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    first_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS node_admin (
    name TEXT PRIMARY KEY,
    flag TEXT NOT NULL,
    reason TEXT,
    by TEXT,
    at REAL,
    drained INTEGER NOT NULL DEFAULT 0,
    force INTEGER NOT NULL DEFAULT 0,
    force_at REAL
);
CREATE TABLE IF NOT EXISTS admin_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    action TEXT NOT NULL,
    reason TEXT,
    by TEXT NOT NULL,
    at REAL NOT NULL,
    force_at REAL
);
CREATE INDEX IF NOT EXISTS admin_events_node ON admin_events(node, id);
CREATE TABLE IF NOT EXISTS models (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS replicas (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    state TEXT NOT NULL,
    shards TEXT NOT NULL,
    created_at REAL NOT NULL,
    error TEXT,
    replaces TEXT
);
CREATE TABLE IF NOT EXISTS model_backoff (
    model TEXT PRIMARY KEY,
    failures INTEGER NOT NULL,
    retry_at REAL NOT NULL,
    last_failure TEXT
);
"""


@dataclass(frozen=True)
class ShardRecord:
    node: str
    rank: int
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class ReplicaRecord:
    id: str
    model: str
    state: ReplicaState
    shards: tuple[ShardRecord, ...]
    created_at: float
    error: str | None = None
    replaces: str | None = None  # drain: the replica this one stands in for

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.shards)

    @property
    def gpu_count(self) -> int:
        return sum(len(s.gpus) for s in self.shards)

    def with_state(self, state: ReplicaState, error: str | None = None) -> ReplicaRecord:
        return replace(self, state=state, error=error if error is not None else self.error)


@dataclass(frozen=True)
class Backoff:
    model: str
    failures: int
    retry_at: float  # unix time
    last_failure: str | None


class Store:
    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / "controller.sqlite3"
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: an acknowledged cordon survives power loss, not only a crash.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self._add_missing_columns()
        # Told how long each write transaction took and whether it failed (metrics).
        self.on_write: Callable[[float, bool], None] | None = None

    def _add_missing_columns(self) -> None:
        """State written before drain deadlines existed gets their columns."""
        for table in ("node_admin", "admin_events"):
            columns = {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if "force_at" not in columns:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN force_at REAL")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        t0 = time.perf_counter()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            if self.on_write is not None:
                self.on_write(time.perf_counter() - t0, True)
            raise
        if self.on_write is not None:
            self.on_write(time.perf_counter() - t0, False)

    # -- nodes ----------------------------------------------------------------

    def known_nodes(self) -> dict[str, float]:
        return {r["name"]: r["first_seen"] for r in self._db.execute("SELECT * FROM nodes")}

    def add_nodes(self, nodes: Iterable[tuple[str, float]]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT OR IGNORE INTO nodes(name, first_seen) VALUES (?, ?)", list(nodes)
            )

    def forget_node(self, name: str, replica_ids: Iterable[str], *, by: str, at: float) -> None:
        """Forget a node in one transaction: its name, admin flag and the given
        replicas go; the event stays in its history."""
        with self._tx() as db:
            db.execute("DELETE FROM nodes WHERE name=?", (name,))
            db.execute("DELETE FROM node_admin WHERE name=?", (name,))
            db.executemany("DELETE FROM replicas WHERE id=?", [(i,) for i in replica_ids])
            db.execute(
                "INSERT INTO admin_events(node, action, reason, by, at) VALUES (?, ?, ?, ?, ?)",
                (name, "forget", None, by, at),
            )

    # -- admin flags ------------------------------------------------------------

    def admin(self) -> dict[str, AdminInfo]:
        return {
            r["name"]: AdminInfo(
                flag=AdminFlag(r["flag"]),
                reason=r["reason"],
                by=r["by"],
                at=r["at"],
                drained=bool(r["drained"]),
                force=bool(r["force"]),
                force_at=r["force_at"],
            )
            for r in self._db.execute("SELECT * FROM node_admin")
        }

    def set_admin(
        self,
        name: str,
        info: AdminInfo,
        *,
        action: str,
        by: str,
        at: float,
    ) -> None:
        """Set (or clear, for flag NONE) a node's admin flag and log the event."""
        with self._tx() as db:
            if info.flag is AdminFlag.NONE:
                db.execute("DELETE FROM node_admin WHERE name=?", (name,))
            else:
                db.execute(
                    "INSERT OR REPLACE INTO node_admin(name, flag, reason, by, at, drained, force,"
                    " force_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        name,
                        info.flag.value,
                        info.reason,
                        info.by,
                        info.at,
                        int(info.drained),
                        int(info.force),
                        info.force_at,
                    ),
                )
            db.execute(
                "INSERT INTO admin_events(node, action, reason, by, at, force_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (name, action, info.reason, by, at, info.force_at),
            )

    def history(self, name: str, limit: int = 50) -> list[AdminEvent]:
        rows = self._db.execute(
            "SELECT * FROM admin_events WHERE node=? ORDER BY id DESC LIMIT ?", (name, limit)
        )
        return [
            AdminEvent(
                node=r["node"],
                action=r["action"],
                reason=r["reason"],
                by=r["by"],
                at=r["at"],
                force_at=r["force_at"],
            )
            for r in rows
        ]

    # -- models -------------------------------------------------------------------

    def models(self) -> dict[str, ModelSpec]:
        return {
            r["name"]: ModelSpec.model_validate_json(r["spec"])
            for r in self._db.execute("SELECT name, spec FROM models ORDER BY name")
        }

    def put_models(self, specs: Iterable[ModelSpec], at: float) -> None:
        with self._tx() as db:
            for spec in specs:
                db.execute(
                    "INSERT OR REPLACE INTO models(name, spec, updated_at) VALUES (?, ?, ?)",
                    (spec.name, spec.model_dump_json(), at),
                )

    def delete_model(self, name: str) -> bool:
        with self._tx() as db:
            deleted = db.execute("DELETE FROM models WHERE name=?", (name,)).rowcount > 0
            db.execute("DELETE FROM model_backoff WHERE model=?", (name,))
        return deleted

    # -- replicas ---------------------------------------------------------------------

    def replicas(self) -> dict[str, ReplicaRecord]:
        return {
            r["id"]: ReplicaRecord(
                id=r["id"],
                model=r["model"],
                state=ReplicaState(r["state"]),
                shards=tuple(
                    ShardRecord(node=s["node"], rank=s["rank"], gpus=tuple(s["gpus"]))
                    for s in json.loads(r["shards"])
                ),
                created_at=r["created_at"],
                error=r["error"],
                replaces=r["replaces"],
            )
            for r in self._db.execute("SELECT * FROM replicas ORDER BY id")
        }

    def put_replicas(self, records: Iterable[ReplicaRecord]) -> None:
        with self._tx() as db:
            for rec in records:
                shards = json.dumps(
                    [{"node": s.node, "rank": s.rank, "gpus": list(s.gpus)} for s in rec.shards]
                )
                db.execute(
                    "INSERT OR REPLACE INTO replicas(id, model, state, shards, created_at, error,"
                    " replaces) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        rec.id,
                        rec.model,
                        rec.state.value,
                        shards,
                        rec.created_at,
                        rec.error,
                        rec.replaces,
                    ),
                )

    def delete_replicas(self, ids: Iterable[str]) -> None:
        with self._tx() as db:
            db.executemany("DELETE FROM replicas WHERE id=?", [(i,) for i in ids])

    # -- backoff -----------------------------------------------------------------------

    def backoffs(self) -> dict[str, Backoff]:
        return {
            r["model"]: Backoff(r["model"], r["failures"], r["retry_at"], r["last_failure"])
            for r in self._db.execute("SELECT * FROM model_backoff")
        }

    def put_backoff(self, b: Backoff) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO model_backoff(model, failures, retry_at, last_failure)"
                " VALUES (?, ?, ?, ?)",
                (b.model, b.failures, b.retry_at, b.last_failure),
            )

    def clear_backoff(self, model: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM model_backoff WHERE model=?", (model,))

    # -- node credentials (issued by enrollment; only their SHA-256 is kept) ---------------

    def _credentials_table(self) -> None:
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS agent_credentials ("
            " node TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE,"
            " issued_at REAL NOT NULL, by TEXT NOT NULL)"
        )

    def credentials(self) -> dict[str, tuple[str, float, str]]:
        """node -> (digest, issued_at, by)."""
        self._credentials_table()
        return {
            r["node"]: (r["digest"], r["issued_at"], r["by"])
            for r in self._db.execute("SELECT * FROM agent_credentials")
        }

    def put_credential(self, node: str, digest: str, *, at: float, by: str) -> None:
        self._credentials_table()
        with self._tx() as db:
            db.execute(
                "INSERT INTO agent_credentials(node, digest, issued_at, by) VALUES (?, ?, ?, ?)",
                (node, digest, at, by),
            )

    def delete_credential(self, node: str) -> bool:
        self._credentials_table()
        with self._tx() as db:
            return db.execute("DELETE FROM agent_credentials WHERE node=?", (node,)).rowcount > 0
