"""The store's connection, spoken in either backend's SQL, and its schema migration.

A `Session` runs the store's queries (stores/sql.py) on one DB-API connection,
sqlite3's or psycopg's alike. Queries are written with `?` placeholders;
`Dialect.sql` turns them into the driver's style, the one place that differs
between the two. `migrate` brings a store's schema (stores/schema.py) up to date
inside the caller's transaction.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

from llmgw.controller.store.errors import StateError
from llmgw.controller.store.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    AddColumn,
    LeaveReasons,
    LowerNodeNames,
)

__all__ = ["POSTGRESQL", "SQLITE", "Dialect", "Params", "Row", "Session", "migrate"]

Row = Mapping[str, Any]
Params = Sequence[object]


@dataclass(frozen=True)
class Dialect:
    name: str
    placeholder: str
    serial: str  # an auto-numbered primary key that never reuses a number
    column_exists: str  # (table, column) -> a row when the column exists

    def sql(self, query: str) -> str:
        """`query` with this driver's placeholders (no query here has a literal ? or %)."""
        if self.placeholder == "?":
            return query
        return _converted(query, self.placeholder)


@cache
def _converted(query: str, placeholder: str) -> str:
    return query.replace("?", placeholder)


SQLITE = Dialect(
    "sqlite",
    placeholder="?",
    serial="INTEGER PRIMARY KEY AUTOINCREMENT",
    column_exists="SELECT 1 FROM pragma_table_info(?) WHERE name = ?",
)
POSTGRESQL = Dialect(
    "postgresql",
    placeholder="%s",
    serial="BIGSERIAL PRIMARY KEY",
    column_exists="SELECT 1 FROM information_schema.columns"
    " WHERE table_schema = current_schema() AND table_name = ? AND column_name = ?",
)


class _Cursor(Protocol):
    rowcount: int

    def execute(self, query: str, params: Params = ..., /) -> Any: ...
    def executemany(self, query: str, params: Iterable[Params], /) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def close(self) -> None: ...


class _Connection(Protocol):
    def cursor(self) -> Any: ...


class Session:
    """One connection, spoken in its dialect (DB-API cursors: sqlite3 and psycopg alike)."""

    def __init__(self, conn: _Connection, dialect: Dialect) -> None:
        self._conn = conn
        self.dialect = dialect

    def run(self, query: str, params: Params = ()) -> int:
        """Execute one statement; how many rows it changed."""
        cur: _Cursor = self._conn.cursor()
        try:
            cur.execute(self.dialect.sql(query), params)
            return cur.rowcount
        finally:
            cur.close()

    def run_many(self, query: str, rows: Iterable[Params]) -> None:
        rows = list(rows)
        if not rows:
            return
        cur: _Cursor = self._conn.cursor()
        try:
            cur.executemany(self.dialect.sql(query), rows)
        finally:
            cur.close()

    def rows(self, query: str, params: Params = ()) -> list[Row]:
        cur: _Cursor = self._conn.cursor()
        try:
            cur.execute(self.dialect.sql(query), params)
            return cur.fetchall()
        finally:
            cur.close()


def migrate(s: Session, where: str) -> int:
    """Bring the schema to SCHEMA_VERSION (inside the caller's transaction); refuse a
    newer one. `where` names the store for a person. Returns the version found."""
    s.run("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    found = s.rows("SELECT max(version) AS v FROM schema_version")
    version = int((found[0]["v"] if found else None) or 0)
    if version > SCHEMA_VERSION:
        raise StateError(
            f"{where} has schema version {version}, newer than this controller knows "
            f"({SCHEMA_VERSION}): it was written by a newer llmgw; run that version "
            "(or newer) instead"
        )
    for v in range(version + 1, SCHEMA_VERSION + 1):
        for step in MIGRATIONS[v - 1]:
            if isinstance(step, AddColumn):
                if not s.rows(s.dialect.column_exists, (step.table, step.column)):
                    s.run(f"ALTER TABLE {step.table} ADD COLUMN {step.column} {step.type}")
            elif isinstance(step, LowerNodeNames):
                lower_node_names(s)
            elif isinstance(step, LeaveReasons):
                leave_reasons(s)
            else:
                s.run(step.format(serial=s.dialect.serial))
        s.run("INSERT INTO schema_version(version) VALUES (?)", (v,))
    return version


def lower_node_names(s: Session) -> None:
    """Schema 6: node names in lower case, as reports now name them (`LowerNodeNames`)."""
    for table, column in (
        ("nodes", "name"),
        ("node_admin", "name"),
        ("agent_credentials", "node"),
    ):
        taken = {r[column] for r in s.rows(f"SELECT {column} FROM {table}")}
        for name in sorted(taken):
            if name.lower() != name and name.lower() not in taken:
                s.run(f"UPDATE {table} SET {column} = ? WHERE {column} = ?", (name.lower(), name))
                taken.add(name.lower())
    s.run("UPDATE admin_events SET node = lower(node) WHERE node <> lower(node)")
    for r in s.rows("SELECT id, shards FROM replicas"):
        shards = json.loads(r["shards"])
        if any(shard["node"] != shard["node"].lower() for shard in shards):
            for shard in shards:
                shard["node"] = shard["node"].lower()
            s.run("UPDATE replicas SET shards = ? WHERE id = ?", (json.dumps(shards), r["id"]))


# How schema 5's reclaim wrote `leaving` (`reclaimed for M (priority P)`): read here
# once, by the migration to schema 7, and nowhere else.
_RECLAIMED = re.compile(r"reclaimed for (.+) \(priority -?\d+\)")


def leave_reasons(s: Session) -> None:
    """Schema 7: a leaving replica stored before gets its reason from its text (`LeaveReasons`):
    a reclaim, with the model it made room for, or else a scale-down (the only two
    reasons the loop wrote)."""
    for r in s.rows("SELECT id, leaving FROM replicas WHERE leaving IS NOT NULL"):
        found = _RECLAIMED.match(r["leaving"])
        reason, model = ("reclaim", found.group(1)) if found else ("scale-down", None)
        s.run(
            "UPDATE replicas SET leave_reason = ?, reclaimed_for = ? WHERE id = ?",
            (reason, model, r["id"]),
        )
