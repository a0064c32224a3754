"""Durable state in SQLite (WAL): what must survive a controller restart.

Node admin flags with reason, who and when (and their history), the names of
nodes ever seen, model specs, replica records and per-model failure backoff.
Agent reports are soft state and never written here.

Writes are rare (operator actions, replica transitions), so the store is plain
synchronous sqlite3 used from the event loop; every mutation is one transaction.

State you can trust: a file that cannot be opened as this controller's state
(empty, damaged, unreadable, in a directory it cannot write) raises
`StateError` at start, with a message saying what to do. While running, a write
that could not be stored raises `StoreUnavailable` (the API answers 503), so
nothing is acknowledged that a restart would lose. SQLite keeps writing to a
file that was deleted or replaced under it, so every write first checks that
the path still names the file that is open.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmgw.wire import AdminEvent, AdminFlag, AdminInfo, ModelSpec, ReplicaState

if TYPE_CHECKING:
    from llmgw.controller.stores.base import StateDump

log = logging.getLogger("llmgw.controller.store")

# The schema this code knows (both backends). Version 1: the tables below with
# drain deadlines (force_at). A store whose schema is newer is refused at start.
SCHEMA_VERSION = 1

STATE_FILE = "controller.sqlite3"
SQLITE_MAGIC = b"SQLite format 3\x00"
RESTORE_HINT = (
    "restore it from a backup, or start with --reset-state to move it aside and start "
    "with empty state on purpose"
)


class StateError(Exception):
    """The state cannot be opened: the controller must not start (message for a person)."""


class StoreUnavailable(Exception):
    """A write was not stored (message names the cause); nothing in memory changed."""


class Fenced(StoreUnavailable):
    """A write refused because this controller does not hold the leader's lease (any
    more): `leader` is the URL of the controller that does, when one does."""

    def __init__(self, message: str, leader: str | None) -> None:
        super().__init__(message)
        self.leader = leader


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
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
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
    epoch = 1  # one controller per file: it is always the writer

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / STATE_FILE
        _check_state_file(state_dir, self.path)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StateError(f"cannot open the state file {self.path}: {exc}") from exc
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: an acknowledged cordon survives power loss, not only a crash.
            self._db.execute("PRAGMA synchronous=FULL")
            damage = [r[0] for r in self._db.execute("PRAGMA quick_check(5)")]
            if damage != ["ok"]:
                raise StateError(
                    f"state file {self.path} is damaged ({'; '.join(damage)}): {RESTORE_HINT}"
                )
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StateError(_open_failure(self.path, exc)) from exc
        except StateError:
            self._db.close()
            raise
        st = os.stat(self.path)
        # What the path must still name at every write (see `_check_file`).
        self._identity = (st.st_dev, st.st_ino)
        self._size = st.st_size
        self._lost: str | None = None  # set once the file is gone: writes stay refused
        self._failing_since: float | None = None  # start of the current write outage
        # Told how long each write transaction took and whether it failed (metrics).
        self.on_write: Callable[[float, bool], None] | None = None

    @classmethod
    def reset(cls, state_dir: Path) -> Path | None:
        """`--reset-state`: move the state file (and its WAL) aside, never delete it.
        Returns where it went, or None when there was nothing to move."""
        path = state_dir / STATE_FILE
        if not path.exists():
            return None
        aside = path.with_name(f"{STATE_FILE}.reset-{time.strftime('%Y%m%dT%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):
            part = Path(f"{path}{suffix}")
            if part.exists():
                part.rename(f"{aside}{suffix}")
        return aside

    def _migrate(self) -> None:
        """Bring the schema to SCHEMA_VERSION in one transaction; refuse a newer one."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            has_version = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'"
            ).fetchone()
            row = (
                db.execute("SELECT version FROM schema_version").fetchone() if has_version else None
            )
            version = row[0] if row else 0
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"state file {self.path} has schema version {version}, newer than this "
                    f"controller knows ({SCHEMA_VERSION}): it was written by a newer llmgw; "
                    "run that version (or newer) instead"
                )
            if version < SCHEMA_VERSION:
                # Version 0 (state from before versions existed) and new files alike:
                # every table, then the columns added since the first release.
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                for table in ("node_admin", "admin_events"):
                    columns = {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}
                    if "force_at" not in columns:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN force_at REAL")
                db.execute("DELETE FROM schema_version")
                db.execute("INSERT INTO schema_version(version) VALUES (?)", (SCHEMA_VERSION,))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; any failure to store it is `StoreUnavailable`."""
        self._check_file()
        t0 = time.perf_counter()
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    # The failure that brought us here is the one to report.
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            if self.on_write is not None:
                self.on_write(time.perf_counter() - t0, True)
            self._failed(f"state not stored: cannot write {self.path}: {exc}")
        if self.on_write is not None:
            self.on_write(time.perf_counter() - t0, False)
        self._check_file()  # replaced during the write: it was not stored where it counts
        if self._failing_since is not None:
            log.warning(
                "state writes to %s work again (failed for %.0f s)",
                self.path,
                time.monotonic() - self._failing_since,
            )
            self._failing_since = None

    def _failed(self, why: str) -> None:
        """Log once per outage, then refuse the write."""
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.error("%s; writes are refused (503) until it works again", why)
        raise StoreUnavailable(why)

    def _check_file(self) -> None:
        """The path must still name the open file, and it must not have shrunk
        (SQLite never shrinks it here): otherwise a write would 'succeed' into a
        file that a restart never sees. A lost file stays lost until a restart."""
        if self._lost is None:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._lost = "was deleted"
            except OSError as exc:
                self._lost = f"cannot be checked ({exc.strerror})"
            else:
                if (st.st_dev, st.st_ino) != self._identity:
                    self._lost = "was replaced by another file"
                elif st.st_size < self._size:
                    self._lost = f"was truncated ({self._size} -> {st.st_size} bytes)"
                else:
                    self._size = st.st_size
        if self._lost is not None:
            self._failed(
                f"state not stored: the state file {self.path} {self._lost} while the "
                "controller was running; restore it from a backup and restart the controller"
            )

    # -- everything, for `migrate` -------------------------------------------------

    def dump(self) -> StateDump:
        from llmgw.controller.stores.base import StateDump

        events = [_event(r) for r in self._db.execute("SELECT * FROM admin_events ORDER BY id")]
        models = {
            r["name"]: (ModelSpec.model_validate_json(r["spec"]), r["updated_at"])
            for r in self._db.execute("SELECT * FROM models")
        }
        return StateDump(
            nodes=self.known_nodes(),
            admin=self.admin(),
            events=events,
            models=models,
            replicas=self.replicas(),
            backoffs=self.backoffs(),
        )

    def load(self, state: StateDump) -> None:
        """Write a dump into this (empty) store in one transaction."""
        with self._tx() as db:
            db.executemany("INSERT INTO nodes(name, first_seen) VALUES (?, ?)", state.nodes.items())
            for name, info in state.admin.items():
                db.execute(_ADMIN_UPSERT, _admin_row(name, info))
            db.executemany(
                "INSERT INTO admin_events(node, action, reason, by, at, force_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(e.node, e.action, e.reason, e.by, e.at, e.force_at) for e in state.events],
            )
            for spec, at in state.models.values():
                db.execute(
                    "INSERT INTO models(name, spec, updated_at) VALUES (?, ?, ?)",
                    (spec.name, spec.model_dump_json(), at),
                )
            db.executemany(_REPLICA_UPSERT, [replica_row(r) for r in state.replicas.values()])
            db.executemany(
                "INSERT INTO model_backoff(model, failures, retry_at, last_failure)"
                " VALUES (?, ?, ?, ?)",
                [
                    (b.model, b.failures, b.retry_at, b.last_failure)
                    for b in state.backoffs.values()
                ],
            )

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
        return {r["name"]: admin_from_row(r) for r in self._db.execute("SELECT * FROM node_admin")}

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
        """Set (or clear, for flag NONE) a node's admin flag and log the event.

        `first_seen`: the node is not saved yet; it is saved in the same
        transaction, so a cordoned node is known after any crash."""
        with self._tx() as db:
            if first_seen is not None:
                db.execute(
                    "INSERT OR IGNORE INTO nodes(name, first_seen) VALUES (?, ?)",
                    (name, first_seen),
                )
            if info.flag is AdminFlag.NONE:
                db.execute("DELETE FROM node_admin WHERE name=?", (name,))
            else:
                db.execute(_ADMIN_UPSERT, _admin_row(name, info))
            db.execute(
                "INSERT INTO admin_events(node, action, reason, by, at, force_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (name, action, info.reason, by, at, info.force_at),
            )

    def history(self, name: str, limit: int = 50) -> list[AdminEvent]:
        rows = self._db.execute(
            "SELECT * FROM admin_events WHERE node=? ORDER BY id DESC LIMIT ?", (name, limit)
        )
        return [_event(r) for r in rows]

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
            r["id"]: replica_from_row(r)
            for r in self._db.execute("SELECT * FROM replicas ORDER BY id")
        }

    def put_replicas(self, records: Iterable[ReplicaRecord]) -> None:
        with self._tx() as db:
            db.executemany(_REPLICA_UPSERT, [replica_row(r) for r in records])

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


def _check_state_file(state_dir: Path, path: Path) -> None:
    """What sqlite3 would not say: an empty file is not 'no state', and a file
    that is not SQLite is not ours to overwrite."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(
            f"cannot create the state directory {state_dir}: {exc.strerror}; "
            "choose a writable --state-dir"
        ) from exc
    if not os.access(state_dir, os.W_OK | os.X_OK):
        raise StateError(
            f"the state directory {state_dir} is not writable: the controller could not save "
            "anything; make it writable or choose another --state-dir"
        )
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        log.info("no state file at %s: starting with empty state (first start)", path)
        return
    except OSError as exc:
        raise StateError(
            f"cannot read the state file {path}: {exc.strerror}; fix its permissions, "
            f"or {RESTORE_HINT}"
        ) from exc
    if not head:
        raise StateError(
            f"state file {path} is empty (0 bytes), so the fleet's cordons, models and "
            f"replicas are gone: {RESTORE_HINT}"
        )
    if head != SQLITE_MAGIC:
        raise StateError(f"state file {path} is not a SQLite database: {RESTORE_HINT}")


def _open_failure(path: Path, exc: sqlite3.DatabaseError) -> str:
    if isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc):
        return (
            f"cannot open the state file {path} ({exc}): check that it and its directory "
            "are writable"
        )
    return f"state file {path} is damaged ({exc}): {RESTORE_HINT}"


_ADMIN_UPSERT = (
    "INSERT OR REPLACE INTO node_admin(name, flag, reason, by, at, drained, force, force_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_REPLICA_UPSERT = (
    "INSERT OR REPLACE INTO replicas(id, model, state, shards, created_at, error, replaces)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


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


def replica_row(rec: ReplicaRecord) -> tuple[object, ...]:
    """A replica as the columns of its row (both backends)."""
    shards = json.dumps(
        [{"node": s.node, "rank": s.rank, "gpus": list(s.gpus)} for s in rec.shards]
    )
    return (rec.id, rec.model, rec.state.value, shards, rec.created_at, rec.error, rec.replaces)


def replica_from_row(r: Mapping[str, Any]) -> ReplicaRecord:
    return ReplicaRecord(
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


def _event(r: Mapping[str, Any]) -> AdminEvent:
    return AdminEvent(
        node=r["node"],
        action=r["action"],
        reason=r["reason"],
        by=r["by"],
        at=r["at"],
        force_at=r["force_at"],
    )


def admin_from_row(r: Mapping[str, Any]) -> AdminInfo:
    return AdminInfo(
        flag=AdminFlag(r["flag"]),
        reason=r["reason"],
        by=r["by"],
        at=r["at"],
        drained=bool(r["drained"]),
        force=bool(r["force"]),
        force_at=r["force_at"],
    )
