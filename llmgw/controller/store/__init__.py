"""The store: where the controller keeps durable state, `--store sqlite:DIR` (the
embedded default, one controller) or `--store postgresql://...` (shared by several).
The lowest layer above `core`: it imports nothing else of the controller.

    __init__.py   open either (`open_store`, `open_lease`), and the names the rest imports
    base.py       `StateStore`, the interface both give
    errors.py     StateError, StoreUnavailable, Fenced
    sql.py        every query, run by both backends
    rows.py       every record as a row and back
    session.py    a connection in either dialect; the schema migration
    schema.py     the numbered migrations (one schema version)
    sqlite.py     SQLite: the file, its checks, `--reset-state`
    postgres.py   PostgreSQL: the connection, the fence, the lease
    marker.py     the marker a SQLite state directory keeps
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from llmgw.controller.store.base import StateStore
from llmgw.controller.store.errors import Fenced, StateError, StoreUnavailable
from llmgw.controller.store.schema import SCHEMA_VERSION
from llmgw.controller.store.sqlite import RESTORE_HINT, STATE_FILE, Store

if TYPE_CHECKING:
    from llmgw.controller.core.settings import ControllerSettings
    from llmgw.controller.store.postgres import PgLease

__all__ = [
    "RESTORE_HINT",
    "SCHEMA_VERSION",
    "STATE_FILE",
    "Fenced",
    "StateError",
    "StateStore",
    "Store",
    "StoreSpec",
    "StoreUnavailable",
    "describe",
    "open_lease",
    "open_store",
    "parse_store",
    "store_spec",
]

StoreSpec = tuple[str, str]  # ("sqlite", DIR) or ("postgresql", URL)


def parse_store(spec: str) -> StoreSpec:
    """`sqlite:DIR` or `postgresql://...` (also `postgres://`); ValueError says what is wanted."""
    if spec.startswith(("postgresql://", "postgres://")):
        return ("postgresql", spec)
    if spec.startswith("sqlite:"):
        path = spec.removeprefix("sqlite:")
        if path:
            return ("sqlite", path)
    raise ValueError(f"--store wants sqlite:DIR or postgresql://..., got {spec!r}")


def store_spec(settings: ControllerSettings) -> StoreSpec:
    return parse_store(settings.store) if settings.store else ("sqlite", str(settings.state_dir))


def open_store(spec: StoreSpec, advertise_url: str | None = None) -> StateStore:
    """Open (and migrate) the store; `StateError` says why it cannot be used.
    `advertise_url`: this controller's URL, recorded as the store's writer."""
    kind, where = spec
    if kind == "sqlite":
        return Store(Path(where))
    from llmgw.controller.store.postgres import PostgresStore  # psycopg only when used

    return PostgresStore(where, advertise_url=advertise_url)


def open_lease(spec: StoreSpec, settings: ControllerSettings) -> PgLease | None:
    """The leader's lease in a PostgreSQL store; None for SQLite (one controller, it leads)."""
    kind, where = spec
    if kind == "sqlite":
        return None
    from llmgw.controller.store.postgres import PgLease, new_holder

    return PgLease(
        where, holder=new_holder(), advertise_url=settings.url, ttl_s=settings.lease_ttl_s
    )


def describe(spec: StoreSpec) -> str:
    """For logs: never print a password."""
    kind, where = spec
    if kind == "sqlite":
        return f"SQLite in {where}"
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(where)
    except Exception as exc:  # a malformed URL is reported when opened
        raise StateError(f"bad PostgreSQL URL: {exc}") from exc
    return f"PostgreSQL {info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
