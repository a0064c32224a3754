"""Durable state in PostgreSQL: the same tables, queries and meanings as the SQLite
store (stores/sql.py); this module gives the connection, the fence and the lease.

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

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from llmgw.controller.store.errors import Fenced, StateError, StoreUnavailable
from llmgw.controller.store.session import POSTGRESQL, Params, Row, Session, migrate
from llmgw.controller.store.sql import SqlStore

log = logging.getLogger("llmgw.controller.store")

MIGRATE_LOCK = 7460001
CONNECT_TIMEOUT_S = 3
STATEMENT_TIMEOUT_MS = 5000

# The fence: the first statement of every write transaction.
_FENCE = (
    "SELECT epoch, url, expires_at > clock_timestamp() AS live FROM writer WHERE id = 1 FOR SHARE"
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


class PostgresStore(SqlStore):
    dialect = POSTGRESQL

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
            migrate(Session(conn, POSTGRESQL), "the PostgreSQL store")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        """One write transaction; a lost or refusing server is `StoreUnavailable`."""
        try:
            conn = self._connect()
            with conn.transaction():
                self._fence(conn)
                yield Session(conn, POSTGRESQL)
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

    def _read(self, query: str, params: Params = ()) -> list[Row]:
        try:
            return Session(self._connect(), POSTGRESQL).rows(query, params)
        except (psycopg.Error, StoreUnavailable) as exc:
            raise StoreUnavailable(f"cannot read state: PostgreSQL: {_cause(exc)}") from exc


def new_holder() -> str:
    """This process's name in the lease row: one per run, never reused."""
    return uuid.uuid4().hex


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
