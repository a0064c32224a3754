"""Durable state in PostgreSQL: the same tables and meanings as the SQLite store.

psycopg 3, synchronous: FleetState writes the store first and changes memory
only once a write is stored, from the event loop, in one call per change (as
with SQLite). A synchronous driver keeps that contract without making every
write path async; short connect and statement timeouts bound how long a
PostgreSQL outage can hold the loop. A lost connection is `StoreUnavailable`
(the API answers 503), logged once per outage, and reopened at the next write.

Several controllers may share one store; one leads, through the lease in the
`writer` row (`PgLease`, driven by leadership.py). Every write transaction is
fenced: it first reads the writer row under a share lock and goes on only if
the row still names this store's `epoch` with a lease not yet expired. A
deposed leader that has not noticed yet (paused, partitioned) therefore cannot
write, and a takeover waits for a write in flight to commit.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg
from psycopg.rows import dict_row

from llmgw.controller.store import (
    Backoff,
    Fenced,
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
        # Who writes, and how often it changed hands (the lease columns came in 2).
        """CREATE TABLE writer (
            id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, url TEXT)""",
        "INSERT INTO writer(id, epoch, url) VALUES (1, 0, NULL)",
    ],
    # The leader's lease: who holds it (one id per controller process) and until when,
    # in the server's clock, so controllers on hosts with skewed clocks agree.
    2: [
        "ALTER TABLE writer ADD COLUMN holder TEXT",
        "ALTER TABLE writer ADD COLUMN expires_at TIMESTAMPTZ",
        # Made on first use before (by a writer): a follower reads it from the start.
        "CREATE TABLE IF NOT EXISTS agent_credentials ("
        " node TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE,"
        " issued_at DOUBLE PRECISION NOT NULL, by TEXT NOT NULL)",
    ],
}
PG_SCHEMA_VERSION = max(MIGRATIONS)

# The fence: the first statement of every write transaction.
_FENCE = (
    "SELECT epoch, url, expires_at > clock_timestamp() AS live FROM writer WHERE id = 1 FOR SHARE"
)

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


def connect(url: str) -> psycopg.Connection[dict[str, Any]]:
    return psycopg.connect(
        url,
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


class PostgresStore:
    def __init__(self, url: str, *, advertise_url: str | None = None) -> None:
        self.url = url
        self.advertise_url = advertise_url
        # The lease epoch this store's writes are fenced by; 0: none, every write is
        # refused. Set by whoever holds the lease (leadership.py, `migrate`).
        self.epoch = 0
        # Told when a write was fenced, so the leader steps down at once.
        self.on_fenced: Callable[[], None] | None = None
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._failing_since: float | None = None
        try:
            self._migrate()
            self._connect()
        except psycopg.Error as exc:
            raise StateError(f"cannot use the PostgreSQL store: {_cause(exc)}") from exc

    def _connect(self) -> psycopg.Connection[dict[str, Any]]:
        """The connection, opened again after a loss."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self._open()
        return self._conn

    def _open(self) -> psycopg.Connection[dict[str, Any]]:
        return connect(self.url)

    def _migrate(self) -> None:
        """Apply what is missing in one transaction, under a lock so that
        controllers starting together do not race."""
        with self._open() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = conn.execute("SELECT max(version) AS v FROM schema_version").fetchone()
            version = (row or {}).get("v") or 0
            if version > PG_SCHEMA_VERSION:
                raise StateError(
                    f"the PostgreSQL store has schema version {version}, newer than this "
                    f"controller knows ({PG_SCHEMA_VERSION}): it was written by a newer llmgw; "
                    "run that version (or newer) instead"
                )
            for v in range(version + 1, PG_SCHEMA_VERSION + 1):
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
                self._fence(conn)
                yield conn
        except Fenced:
            if self.on_fenced is not None:
                self.on_fenced()
            raise
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

    def _fence(self, conn: psycopg.Connection[dict[str, Any]]) -> None:
        """Go on only while this store's epoch holds a live lease. The share lock
        keeps the row, so a takeover waits until this transaction is over."""
        row = conn.execute(_FENCE).fetchone() or {}
        if self.epoch and row.get("epoch") == self.epoch and row.get("live"):
            return
        leader = row.get("url") if row.get("live") else None
        raise Fenced(
            "state not stored: this controller is not the leader"
            + (f" (epoch {row.get('epoch')} is led by {leader})" if leader else "")
            + (f"; its lease (epoch {self.epoch}) was lost" if self.epoch else ""),
            leader,
        )

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

    def credentials(self) -> dict[str, tuple[str, float, str]]:
        """node -> (digest, issued_at, by)."""
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


class PgLease:
    """The leader's lease in the `writer` row: taken when free or expired (the epoch
    goes up by one), renewed by its holder, released at a clean stop. Times are
    the server's (`clock_timestamp()`): controllers' clocks need not agree.

    Its own connection, apart from the store's writes: leadership.py calls it
    from a worker thread, so a PostgreSQL that hangs never holds the event loop."""

    def __init__(self, url: str, *, holder: str, advertise_url: str | None, ttl_s: float) -> None:
        self.url = url
        self.holder = holder  # one per controller process
        self.advertise_url = advertise_url
        self.ttl_s = ttl_s
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

    def _one(self, query: str, params: tuple[object, ...]) -> dict[str, Any] | None:
        """One statement; a connection found dead (PostgreSQL restarted) is opened
        again and the statement tried once more, so a restart costs no renewal."""
        for attempt in (1, 2):
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = connect(self.url)
            try:
                return self._conn.execute(query, params).fetchone()
            except psycopg.OperationalError:
                if attempt == 2 or not self._conn.broken:
                    raise
        return None

    def acquire(self) -> int | None:
        """The new epoch if the lease was free, expired or already ours; else None."""
        row = self._one(
            "UPDATE writer SET epoch = epoch + 1, holder = %s, url = %s,"
            " expires_at = clock_timestamp() + make_interval(secs => %s)"
            " WHERE id = 1 AND (holder IS NULL OR holder = %s"
            " OR expires_at IS NULL OR expires_at < clock_timestamp())"
            " RETURNING epoch",
            (self.holder, self.advertise_url, self.ttl_s, self.holder),
        )
        return int(row["epoch"]) if row else None

    def renew(self, epoch: int) -> bool:
        """Extend our lease by the TTL; False: it is not ours any more (deposed)."""
        row = self._one(
            "UPDATE writer SET expires_at = clock_timestamp() + make_interval(secs => %s)"
            " WHERE id = 1 AND holder = %s AND epoch = %s RETURNING epoch",
            (self.ttl_s, self.holder, epoch),
        )
        return row is not None

    def release(self, epoch: int) -> None:
        """Let the next controller take over at once (a clean stop)."""
        self._one(
            "UPDATE writer SET expires_at = clock_timestamp(), holder = NULL"
            " WHERE id = 1 AND holder = %s AND epoch = %s RETURNING epoch",
            (self.holder, epoch),
        )

    def leader(self) -> tuple[int, str | None, float]:
        """(epoch, URL of the live leader or None, seconds until its lease expires)."""
        query = (
            "SELECT epoch, url, EXTRACT(EPOCH FROM expires_at - clock_timestamp()) AS left_s"
            " FROM writer WHERE id = 1"
        )
        row = self._one(query, ()) or {}
        left = float(row.get("left_s") or 0.0)
        return int(row.get("epoch") or 0), (row.get("url") if left > 0 else None), max(0.0, left)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def take_lease(store: PostgresStore, *, holder: str, ttl_s: float) -> int | None:
    """Take the lease once, without renewing it, and fence `store`'s writes by it: for
    tools and tests that write for a while (a controller renews: leadership.py)."""
    lease = PgLease(store.url, holder=holder, advertise_url=store.advertise_url, ttl_s=ttl_s)
    try:
        epoch = lease.acquire()
    finally:
        lease.close()
    if epoch is not None:
        store.epoch = epoch
    return epoch


def _cause(exc: Exception) -> str:
    """The server's (or libpq's) own words, on one line."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
