"""Durable state in SQLite (WAL): the embedded default, one controller per file.

Writes are rare (operator actions, replica transitions, first sightings in
batches), so the store is plain synchronous sqlite3 used from the event loop;
every mutation is one transaction (the queries: stores/sql.py).

State you can trust: a file that cannot be opened as this controller's state
(empty, damaged, unreadable, in a directory it cannot write) raises
`StateError` at start, with a message saying what to do. While running, a write
that could not be stored raises `StoreUnavailable` (the API answers 503), so
nothing is acknowledged that a restart would lose. SQLite keeps writing to a
file that was deleted or replaced under it, so every write first checks that
the path still names the file that is open.

A lost or damaged WAL is not a silent start from older state: each commit moves a
revision marker beside the file (stores/marker.py), and a start refuses a file whose
revision is behind its marker, or a missing file when the marker says it existed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from llmgw.controller.store.errors import StateError, StoreUnavailable
from llmgw.controller.store.marker import MARKER_SUFFIX, RevisionMarker
from llmgw.controller.store.session import SQLITE, Params, Row, Session, migrate
from llmgw.controller.store.sql import REVISION, SqlStore

__all__ = ["RESTORE_HINT", "STATE_FILE", "Store"]

log = logging.getLogger("llmgw.controller.store")

STATE_FILE = "controller.sqlite3"
SQLITE_MAGIC = b"SQLite format 3\x00"
RESTORE_HINT = (
    "restore it from a backup, or start with --reset-state to move it aside and start "
    "with empty state on purpose"
)


class Store(SqlStore):
    dialect = SQLITE
    epoch = 1  # one controller per file: it is always the writer

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / STATE_FILE
        existed = _check_state_file(state_dir, self.path)
        self._marker = RevisionMarker(_marker_path(self.path))
        _check_against_marker(self.path, existed, self._marker.read())
        if not existed:
            log.info("no state file at %s: starting with empty state (first start)", self.path)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StateError(f"cannot open the state file {self.path}: {exc}") from exc
        self._session = Session(self._db, SQLITE)
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
            self.revision = int(self._session.rows(REVISION)[0]["revision"])
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StateError(_open_failure(self.path, exc)) from exc
        except StateError:
            self._db.close()
            raise
        try:  # from here on, what this file holds is what the marker records
            self._marker.write(self.revision)
        except OSError as exc:
            self._db.close()
            raise StateError(
                f"cannot write the revision marker {self._marker.path}: {exc}; check that "
                "the state directory is writable and not full"
            ) from exc
        self._marker_failing = False  # logged once until a marker write works again
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
        """`--reset-state`: move the state file, its WAL and its revision marker
        aside, never delete them. Returns where they went, or None when there was nothing to move."""
        path = state_dir / STATE_FILE
        parts = [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm", MARKER_SUFFIX)]
        if not any(part.exists() for part in parts):
            return None
        aside = path.with_name(f"{STATE_FILE}.reset-{time.strftime('%Y%m%dT%H%M%S')}")
        for part in parts:
            if part.exists():
                part.rename(f"{aside}{part.name.removeprefix(STATE_FILE)}")
        return aside

    def _migrate(self) -> None:
        """Bring the schema to SCHEMA_VERSION in one transaction; refuse a newer one."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            migrate(self._session, f"state file {self.path}")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()
        self._marker.close()

    def _committed(self, revision: int) -> None:
        """Move the marker before the write is acknowledged. The write itself is
        stored, so a marker that cannot be written is logged, not refused: the next
        start then cannot tell a lost WAL from a good one."""
        try:
            self._marker.write(revision)
        except OSError as exc:
            if not self._marker_failing:
                self._marker_failing = True
                log.error(
                    "cannot write the revision marker %s (%s): a WAL lost in a crash from "
                    "now on would go unnoticed at the next start; free space in the state "
                    "directory",
                    self._marker.path,
                    exc,
                )
            return
        if self._marker_failing:
            self._marker_failing = False
            log.warning("the revision marker %s is written again", self._marker.path)

    def _read(self, query: str, params: Params = ()) -> list[Row]:
        return self._session.rows(query, params)

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        """One write transaction; any failure to store it is `StoreUnavailable`."""
        self._check_file()
        t0 = time.perf_counter()
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._session
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


def _check_state_file(state_dir: Path, path: Path) -> bool:
    """What sqlite3 would not say: an empty file is not 'no state', and a file
    that is not SQLite is not ours to overwrite. Whether the file exists."""
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
        return False
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
    return True


def _marker_path(path: Path) -> Path:
    return path.with_name(path.name + MARKER_SUFFIX)


def _check_against_marker(path: Path, existed: bool, marked: int | None) -> None:
    """Refuse a state file that lost acknowledged writes: missing while its marker
    exists, or at a revision below the marker's. Read-only, so a refused file and
    its WAL keep what they hold (for a restore)."""
    if marked is None:
        return  # a first start, or a state file from before markers: one is written
    marker = _marker_path(path)
    if not existed:
        raise StateError(
            f"state file {path} is missing, but {marker.name} beside it says it held "
            f"{marked} committed writes: it was deleted or moved since the last start; "
            f"{_marker_hint(marker)}"
        )
    found = _stored_revision(path)
    if found < marked:
        raise StateError(
            f"state file {path} is behind its last committed write (revision {found}, "
            f"{marker.name} says {marked}): acknowledged writes are lost, most likely with "
            f"its WAL {path.name}-wal (deleted, truncated or damaged after a crash); "
            f"{_marker_hint(marker)}"
        )


def _marker_hint(marker: Path) -> str:
    return (
        f"restore it from a backup and delete {marker.name}, or start with --reset-state "
        "to move it aside and start with empty state on purpose"
    )


def _stored_revision(path: Path) -> int:
    """The revision the file holds, read without changing it (a read-only
    connection never checkpoints or rewrites the WAL)."""
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StateError(f"cannot open the state file {path}: {exc}") from exc
    try:
        row = db.execute(REVISION).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return 0  # a file from before revisions (schema 3)
        raise StateError(_open_failure(path, exc)) from exc
    except sqlite3.DatabaseError as exc:
        raise StateError(_open_failure(path, exc)) from exc
    finally:
        db.close()
    return 0 if row is None else int(row[0])


def _open_failure(path: Path, exc: sqlite3.DatabaseError) -> str:
    if isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc):
        return (
            f"cannot open the state file {path} ({exc}): check that it and its directory "
            "are writable"
        )
    return f"state file {path} is damaged ({exc}): {RESTORE_HINT}"
