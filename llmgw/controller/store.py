"""The controller's store, as the rest of the controller imports it: the SQLite
store (the default) with its file name and schema version, the record types and
the errors a store raises. Each lives in its own module; this one only names them.

    records.py        ReplicaRecord, ShardRecord, Backoff, StateDump
    store_errors.py   StateError, StoreUnavailable, Fenced
    stores/sql.py     every query, run by both backends
    stores/rows.py    every record as a row and back
    stores/session.py  a connection in either dialect; the schema migration
    stores/schema.py  the numbered migrations (one schema version)
    stores/sqlite.py  SQLite: the file, its checks, `--reset-state`
    stores/postgres.py  PostgreSQL: the connection, the fence, the lease
"""

from __future__ import annotations

from llmgw.controller.records import Backoff, ReplicaRecord, ShardRecord, StateDump
from llmgw.controller.store_errors import Fenced, StateError, StoreUnavailable
from llmgw.controller.stores.schema import SCHEMA_VERSION
from llmgw.controller.stores.sqlite import RESTORE_HINT, STATE_FILE, Store

__all__ = [
    "RESTORE_HINT",
    "SCHEMA_VERSION",
    "STATE_FILE",
    "Backoff",
    "Fenced",
    "ReplicaRecord",
    "ShardRecord",
    "StateDump",
    "StateError",
    "Store",
    "StoreUnavailable",
]
