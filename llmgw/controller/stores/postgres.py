"""Durable state in PostgreSQL: the same tables and meanings as the SQLite store.

psycopg 3, synchronous: FleetState writes the store first and changes memory
only once a write is stored, from the event loop, in one call per change (as
with SQLite). A synchronous driver keeps that contract without making every
write path async; short connect and statement timeouts bound how long a
PostgreSQL outage can hold the loop. A lost connection is `StoreUnavailable`
(the API answers 503), logged once per outage, and reopened at the next write.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg
from psycopg.rows import dict_row

from llmgw.controller.store import (
    SCHEMA_VERSION,
    Backoff,
    ReplicaRecord,
    StateError,
    StoreUnavailable,
    _event,
    admin_from_row,
    replica_from_row,
    replica_row,
)
from llmgw.controller.stores.base import StateDump
from llmgw.wire import AdminEvent, AdminFlag, AdminInfo, ModelSpec

log = logging.getLogger("llmgw.controller.store")

# One writer at a time: a session advisory lock, held by the connection every write
# goes through. It goes with the session, so a controller whose connection was
# lost cannot write again before it holds the lock again.
WRITER_LOCK = 7460002
MIGRATE_LOCK = 7460001
CONNECT_TIMEOUT_S = 3
STATEMENT_TIMEOUT_MS = 5000

# Version N's statements, applied in order to reach SCHEMA_VERSION.
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE nodes (name TEXT PRIMARY KEY, first_seen DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE node_admin (
            name TEXT PRIMARY KEY, flag TEXT NOT NULL, reason TEXT, by TEXT,
            at DOUBLE PRECISION, drained INTEGER NOT NULL DEFAULT 0,
            force INTEGER NOT NULL DEFAULT 0, force_at DOUBLE PRECISION)""",
        """CREATE TABLE admin_events (
            id BIGSERIAL PRIMARY KEY, node TEXT NOT NULL, action TEXT NOT NULL,
            reason TEXT, by TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,
            force_at DOUBLE PRECISION)""",
        "CREATE INDEX admin_events_node ON admin_events(node, id)",
        """CREATE TABLE models (
            name TEXT PRIMARY KEY, spec TEXT NOT NULL, updated_at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE replicas (
            id TEXT PRIMARY KEY, model TEXT NOT NULL, state TEXT NOT NULL, shards TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL, error TEXT, replaces TEXT)""",
        """CREATE TABLE model_backoff (
            model TEXT PRIMARY KEY, failures INTEGER NOT NULL,
            retry_at DOUBLE PRECISION NOT NULL, last_failure TEXT)""",
        # Who writes: the controller holding WRITER_LOCK, and how often it changed hands.
        """CREATE TABLE writer (
            id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, url TEXT)""",
        "INSERT INTO writer(id, epoch, url) VALUES (1, 0, NULL)",
    ],
}

_ADMIN_UPSERT = (
    "INSERT INTO node_admin(name, flag, reason, by, at, drained, force, force_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET"
    " flag=EXCLUDED.flag, reason=EXCLUDED.reason, by=EXCLUDED.by, at=EXCLUDED.at,"
    " drained=EXCLUDED.drained, force=EXCLUDED.force, force_at=EXCLUDED.force_at"
)
_REPLICA_UPSERT = (
    "INSERT INTO replicas(id, model, state, shards, created_at, error, replaces)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET"
    " model=EXCLUDED.model, state=EXCLUDED.state, shards=EXCLUDED.shards,"
    " created_at=EXCLUDED.created_at, error=EXCLUDED.error, replaces=EXCLUDED.replaces"
)
_EVENT_INSERT = (
    "INSERT INTO admin_events(node, action, reason, by, at, force_at)"
    " VALUES (%s, %s, %s, %s, %s, %s)"
)
_NODE_INSERT = "INSERT INTO nodes(name, first_seen) VALUES (%s, %s) ON CONFLICT DO NOTHING"


def _admin_row(name: str, info: AdminInfo) -> tuple[object, ...]:
    return (
        name,
        info.flag.value,
        info.reason,
        info.by,
        info.at,
        int(info.drained),
        int(info.force),
        info.force_at,
    )


class PostgresStore:
    def __init__(self, url: str, *, advertise_url: str | None = None) -> None:
        self.url = url
        self.advertise_url = advertise_url
        self.epoch = 0  # the writer epoch this store holds (see WRITER_LOCK)
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._failing_since: float | None = None
        try:
            self._migrate()
            self._connect()
        except psycopg.Error as exc:
            raise StateError(f"cannot use the PostgreSQL store: {_cause(exc)}") from exc
        except StoreUnavailable as exc:
            raise StateError(str(exc)) from exc

    def _connect(self) -> psycopg.Connection[dict[str, Any]]:
        """The connection, opened again after a loss, holding the writer lock."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            conn = self._open()
            row = conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (WRITER_LOCK,)).fetchone()
            if not (row and row["ok"]):
                holder = conn.execute("SELECT epoch, url FROM writer WHERE id = 1").fetchone() or {}
                conn.close()
                raise StoreUnavailable(
                    f"another controller writes to this PostgreSQL store (epoch "
                    f"{holder.get('epoch')}, at {holder.get('url') or 'an unknown URL'}); "
                    "one controller per store: stop the other one first"
                )
            bumped = conn.execute(
                "UPDATE writer SET epoch = epoch + 1, url = %s WHERE id = 1 RETURNING epoch",
                (self.advertise_url,),
            ).fetchone()
            self.epoch = int(bumped["epoch"]) if bumped else 0
            self._conn = conn
        return self._conn

    def _open(self) -> psycopg.Connection[dict[str, Any]]:
        return psycopg.connect(
            self.url,
            autocommit=True,
            row_factory=dict_row,
            connect_timeout=CONNECT_TIMEOUT_S,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
            # statement_timeout is the server's: these bound a server that vanished
            # from the network (TCP only; a Unix socket fails at once).
            tcp_user_timeout=STATEMENT_TIMEOUT_MS,
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=2,
        )

    def _migrate(self) -> None:
        """Apply what is missing in one transaction, under a lock so that
        controllers starting together do not race."""
        with self._open() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = conn.execute("SELECT max(version) AS v FROM schema_version").fetchone()
            version = (row or {}).get("v") or 0
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"the PostgreSQL store has schema version {version}, newer than this "
                    f"controller knows ({SCHEMA_VERSION}): it was written by a newer llmgw; "
                    "run that version (or newer) instead"
                )
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[v]:
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version(version) VALUES (%s)", (v,))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    # -- plumbing --------------------------------------------------------------------

    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        """One write transaction; a lost or refusing server is `StoreUnavailable`."""
        try:
            conn = self._connect()
            with conn.transaction():
                yield conn
        except (psycopg.Error, StoreUnavailable) as exc:
            why = f"state not stored: PostgreSQL: {_cause(exc)}"
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.error("%s; writes are refused (503) until it works again", why)
            raise StoreUnavailable(why) from exc
        if self._failing_since is not None:
            log.warning(
                "state writes to PostgreSQL work again (failed for %.0f s)",
                time.monotonic() - self._failing_since,
            )
            self._failing_since = None

    def _read(self, query: str, params: tuple[object, ...] = ()) -> list[dict[str, Any]]:
        try:
            return self._connect().execute(query, params).fetchall()
        except (psycopg.Error, StoreUnavailable) as exc:
            raise StoreUnavailable(f"cannot read state: PostgreSQL: {_cause(exc)}") from exc

    # -- everything, for `migrate` ------------------------------------------------------

    def dump(self) -> StateDump:
        return StateDump(
            nodes=self.known_nodes(),
            admin=self.admin(),
            events=[_event(r) for r in self._read("SELECT * FROM admin_events ORDER BY id")],
            models={
                r["name"]: (ModelSpec.model_validate_json(r["spec"]), r["updated_at"])
                for r in self._read("SELECT * FROM models")
            },
            replicas=self.replicas(),
            backoffs=self.backoffs(),
        )

    def load(self, state: StateDump) -> None:
        with self._tx() as db, db.cursor() as cur:
            cur.executemany(_NODE_INSERT, list(state.nodes.items()))
            cur.executemany(_ADMIN_UPSERT, [_admin_row(n, i) for n, i in state.admin.items()])
            cur.executemany(
                _EVENT_INSERT,
                [(e.node, e.action, e.reason, e.by, e.at, e.force_at) for e in state.events],
            )
            cur.executemany(
                "INSERT INTO models(name, spec, updated_at) VALUES (%s, %s, %s)",
                [(s.name, s.model_dump_json(), at) for s, at in state.models.values()],
            )
            cur.executemany(_REPLICA_UPSERT, [replica_row(r) for r in state.replicas.values()])
            cur.executemany(
                "INSERT INTO model_backoff(model, failures, retry_at, last_failure)"
                " VALUES (%s, %s, %s, %s)",
                [
                    (b.model, b.failures, b.retry_at, b.last_failure)
                    for b in state.backoffs.values()
                ],
            )

    # -- nodes ------------------------------------------------------------------------------

    def known_nodes(self) -> dict[str, float]:
        return {r["name"]: r["first_seen"] for r in self._read("SELECT * FROM nodes")}

    def add_nodes(self, nodes: Iterable[tuple[str, float]]) -> None:
        with self._tx() as db, db.cursor() as cur:
            cur.executemany(_NODE_INSERT, list(nodes))

    def forget_node(self, name: str, replica_ids: Iterable[str], *, by: str, at: float) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM nodes WHERE name=%s", (name,))
            db.execute("DELETE FROM node_admin WHERE name=%s", (name,))
            db.execute("DELETE FROM replicas WHERE id = ANY(%s)", (list(replica_ids),))
            db.execute(_EVENT_INSERT, (name, "forget", None, by, at, None))

    # -- admin flags ------------------------------------------------------------------------

    def admin(self) -> dict[str, AdminInfo]:
        return {r["name"]: admin_from_row(r) for r in self._read("SELECT * FROM node_admin")}

    def set_admin(
        self,
        name: str,
        info: AdminInfo,
        *,
        action: str,
        by: str,
        at: float,
        first_seen: float | None = None,
    ) -> None:
        with self._tx() as db:
            if first_seen is not None:
                db.execute(_NODE_INSERT, (name, first_seen))
            if info.flag is AdminFlag.NONE:
                db.execute("DELETE FROM node_admin WHERE name=%s", (name,))
            else:
                db.execute(_ADMIN_UPSERT, _admin_row(name, info))
            db.execute(_EVENT_INSERT, (name, action, info.reason, by, at, info.force_at))

    def history(self, name: str, limit: int = 50) -> list[AdminEvent]:
        rows = self._read(
            "SELECT * FROM admin_events WHERE node=%s ORDER BY id DESC LIMIT %s", (name, limit)
        )
        return [_event(r) for r in rows]

    # -- models -----------------------------------------------------------------------------

    def models(self) -> dict[str, ModelSpec]:
        return {
            r["name"]: ModelSpec.model_validate_json(r["spec"])
            for r in self._read("SELECT name, spec FROM models ORDER BY name")
        }

    def put_models(self, specs: Iterable[ModelSpec], at: float) -> None:
        with self._tx() as db, db.cursor() as cur:
            cur.executemany(
                "INSERT INTO models(name, spec, updated_at) VALUES (%s, %s, %s)"
                " ON CONFLICT (name) DO UPDATE SET spec=EXCLUDED.spec, updated_at=EXCLUDED.updated_at",
                [(s.name, s.model_dump_json(), at) for s in specs],
            )

    def delete_model(self, name: str) -> bool:
        with self._tx() as db:
            deleted = db.execute("DELETE FROM models WHERE name=%s", (name,)).rowcount > 0
            db.execute("DELETE FROM model_backoff WHERE model=%s", (name,))
        return deleted

    # -- replicas -------------------------------------------------------------------------------

    def replicas(self) -> dict[str, ReplicaRecord]:
        return {
            r["id"]: replica_from_row(r) for r in self._read("SELECT * FROM replicas ORDER BY id")
        }

    def put_replicas(self, records: Iterable[ReplicaRecord]) -> None:
        with self._tx() as db, db.cursor() as cur:
            cur.executemany(_REPLICA_UPSERT, [replica_row(r) for r in records])

    def delete_replicas(self, ids: Iterable[str]) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM replicas WHERE id = ANY(%s)", (list(ids),))

    # -- backoff ----------------------------------------------------------------------------------

    def backoffs(self) -> dict[str, Backoff]:
        return {
            r["model"]: Backoff(r["model"], r["failures"], r["retry_at"], r["last_failure"])
            for r in self._read("SELECT * FROM model_backoff")
        }

    def put_backoff(self, b: Backoff) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO model_backoff(model, failures, retry_at, last_failure)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (model) DO UPDATE SET"
                " failures=EXCLUDED.failures, retry_at=EXCLUDED.retry_at,"
                " last_failure=EXCLUDED.last_failure",
                (b.model, b.failures, b.retry_at, b.last_failure),
            )

    def clear_backoff(self, model: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM model_backoff WHERE model=%s", (model,))

    # -- node credentials (issued by enrollment; only their SHA-256 is kept) ------------------------

    def _credentials_table(self) -> None:
        # Created on first use, as the SQLite store does (it came after schema 1).
        with self._tx() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS agent_credentials ("
                " node TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE,"
                " issued_at DOUBLE PRECISION NOT NULL, by TEXT NOT NULL)"
            )

    def credentials(self) -> dict[str, tuple[str, float, str]]:
        """node -> (digest, issued_at, by)."""
        self._credentials_table()
        return {
            r["node"]: (r["digest"], r["issued_at"], r["by"])
            for r in self._read("SELECT * FROM agent_credentials")
        }

    def put_credential(self, node: str, digest: str, *, at: float, by: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO agent_credentials(node, digest, issued_at, by)"
                " VALUES (%s, %s, %s, %s)",
                (node, digest, at, by),
            )

    def delete_credential(self, node: str) -> bool:
        with self._tx() as db:
            cur = db.execute("DELETE FROM agent_credentials WHERE node=%s", (node,))
            return (cur.rowcount or 0) > 0


def _cause(exc: Exception) -> str:
    """The server's (or libpq's) own words, on one line."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
