"""Every query of the store, written once and run by both backends.

A backend (stores/sqlite.py, stores/postgres.py) gives a connection, how to begin
and commit a write transaction (and what its failures mean), and how to read; this
module gives the rest, with the row mappings of stores/rows.py. Queries are written
with `?` placeholders, run through a `Session` (stores/session.py) that puts them in
the driver's style. Both dialects accept `INSERT … ON CONFLICT … DO UPDATE`, so
upserts are one text.

Every write transaction also moves the store's revision by one (`store_revision`),
in the same transaction: what the marker beside a SQLite file is compared with.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import ClassVar

from llmgw.controller.core.records import (
    Backoff,
    ClientKey,
    EnrollToken,
    ReplicaRecord,
    StartCount,
    StateDump,
)
from llmgw.controller.core.revisions import KEPT as KEPT_REVISIONS
from llmgw.controller.store.rows import (
    admin_event_from_row,
    admin_from_row,
    admin_row,
    backoff_row,
    client_key_from_row,
    client_key_row,
    credential_from_row,
    credential_row,
    decision_from_row,
    decision_row,
    replica_from_row,
    replica_row,
    revision_row,
    start_from_row,
    start_row,
    token_from_row,
    token_row,
)
from llmgw.controller.store.session import Dialect, Params, Row, Session
from llmgw.controller.store.tenant_sql import TenantTables
from llmgw.wire import (
    AdapterSpec,
    AdminEvent,
    AdminFlag,
    AdminInfo,
    EventView,
    ModelRevision,
    ModelSpec,
    StartKind,
)

__all__ = ["HISTORY_KEPT", "REVISION", "SqlStore"]

# Each node's admin history keeps its newest entries, as many as a node's detail shows.
HISTORY_KEPT = 50


# -- queries ----------------------------------------------------------------------

_NODE_ADD = "INSERT INTO nodes(name, first_seen) VALUES (?, ?) ON CONFLICT DO NOTHING"
_ADMIN_UPSERT = (
    "INSERT INTO node_admin(name, flag, reason, by, at, drained, force, force_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET"
    " flag=excluded.flag, reason=excluded.reason, by=excluded.by, at=excluded.at,"
    " drained=excluded.drained, force=excluded.force, force_at=excluded.force_at"
)
_EVENT_ADD = (
    "INSERT INTO admin_events(node, action, reason, by, at, force_at) VALUES (?, ?, ?, ?, ?, ?)"
)
_HISTORY_TRIM = (  # (node, node): what is past the node's newest HISTORY_KEPT goes
    "DELETE FROM admin_events WHERE node = ? AND id <= (SELECT id FROM admin_events"
    f" WHERE node = ? ORDER BY id DESC LIMIT 1 OFFSET {HISTORY_KEPT})"
)
_MODEL_UPSERT = (
    "INSERT INTO models(name, spec, updated_at) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET spec=excluded.spec, updated_at=excluded.updated_at"
)
_ADAPTER_UPSERT = (
    "INSERT INTO adapters(name, spec, updated_at) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET spec=excluded.spec, updated_at=excluded.updated_at"
)
_REVISION_ADD = (
    "INSERT INTO model_revisions(model, revision, at, by, change, spec)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (model, revision) DO NOTHING"
)
# Revisions kept per model: the newest KEPT.
_REVISIONS_TRIM = "DELETE FROM model_revisions WHERE model = ? AND revision <= ?"
_REPLICA_UPSERT = (
    "INSERT INTO replicas(id, model, state, shards, created_at, error, replaces, revision,"
    " leaving, leave_reason, reclaimed_for, asleep_since, start_kind, engine_key)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET"
    " model=excluded.model, state=excluded.state, shards=excluded.shards,"
    " created_at=excluded.created_at, error=excluded.error, replaces=excluded.replaces,"
    " revision=excluded.revision, leaving=excluded.leaving,"
    " leave_reason=excluded.leave_reason, reclaimed_for=excluded.reclaimed_for,"
    " asleep_since=excluded.asleep_since, start_kind=excluded.start_kind,"
    " engine_key=excluded.engine_key"
)
# A start that reached ready: counted, and how long it took kept as the last.
_START_COUNT = (
    "INSERT INTO model_starts(model, kind, level, count, last_s, last_at)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (model, kind, level) DO UPDATE SET"
    " count = model_starts.count + excluded.count, last_s = excluded.last_s,"
    " last_at = excluded.last_at"
)
_BACKOFF_UPSERT = (
    "INSERT INTO model_backoff(model, failures, retry_at, last_failure) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (model) DO UPDATE SET failures=excluded.failures,"
    " retry_at=excluded.retry_at, last_failure=excluded.last_failure"
)
_DECISION_ADD = (
    "INSERT INTO events(id, at, object, reason, message, count, first_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
)
_CREDENTIAL_ADD = (
    "INSERT INTO agent_credentials(node, digest, issued_at, by, pending, token, reported_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_TOKEN_ADD = (
    "INSERT INTO enroll_tokens(id, digest, created_at, by, expires_at, uses, used, description)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_ALLOW_UPSERT = (
    "INSERT INTO enroll_allowed(node, by, at) VALUES (?, ?, ?)"
    " ON CONFLICT (node) DO UPDATE SET by=excluded.by, at=excluded.at"
)
_CLIENT_KEY_ADD = (
    "INSERT INTO client_keys(id, tenant, digest, models, created_at, by, expires_at, last_used)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
# One use of an enrollment token, taken only while it is unexpired and not used up.
_TOKEN_USE = (
    "UPDATE enroll_tokens SET used = used + 1 WHERE id = ?"
    " AND (uses IS NULL OR used < uses) AND (expires_at IS NULL OR expires_at > ?)"
)
_REVISION_BUMP = "UPDATE store_revision SET revision = revision + 1 WHERE id = 1"
REVISION = "SELECT revision FROM store_revision WHERE id = 1"


class SqlStore(TenantTables):
    """The `StateStore` methods over a backend's `_transaction` and `_read`.
    Every method is one transaction."""

    dialect: ClassVar[Dialect]
    epoch: int
    # The revision of the last write this store committed (or found at open).
    revision = 0

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        """Begin, yield, commit; a failure to store is `StoreUnavailable`."""
        raise NotImplementedError
        yield  # pragma: no cover

    def _read(self, query: str, params: Params = ()) -> list[Row]:
        raise NotImplementedError

    def _committed(self, revision: int) -> None:
        """Told after each write is committed (SQLite moves its marker)."""

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        with self._transaction() as s:
            yield s
            s.run(_REVISION_BUMP)
            revision = int(s.rows(REVISION)[0]["revision"])
        self.revision = revision
        self._committed(revision)

    # -- everything, for `migrate` -----------------------------------------------------

    def dump(self) -> StateDump:
        """Every table but the store's own bookkeeping, which a copy would falsify:
        `writer` (this store's lease and epoch: copied, it would fence the target's
        first leader or name a leader that is not there), `store_revision` (this
        database's own count of writes, what a SQLite marker is checked against) and
        `schema_version` (the target has its own, from its migrations)."""
        return StateDump(
            nodes=self.known_nodes(),
            admin=self.admin(),
            events=[
                admin_event_from_row(r)
                for r in self._read("SELECT * FROM admin_events ORDER BY id")
            ],
            models={
                r["name"]: (ModelSpec.model_validate_json(r["spec"]), r["updated_at"])
                for r in self._read("SELECT * FROM models")
            },
            replicas=self.replicas(),
            backoffs=self.backoffs(),
            revisions=self.revisions(),
            decisions=[
                decision_from_row(r) for r in self._read("SELECT * FROM events ORDER BY id")
            ],
            credentials={
                r["node"]: credential_from_row(r)
                for r in self._read("SELECT * FROM agent_credentials ORDER BY node")
            },
            enroll_tokens=self.enroll_tokens(),
            enroll_allowed=self.enroll_allowed(),
            client_keys=self.client_keys(),
            adapters={
                r["name"]: (AdapterSpec.model_validate_json(r["spec"]), r["updated_at"])
                for r in self._read("SELECT * FROM adapters")
            },
            limits=self.limits(),
            usage=list(self.usage_counts()),
            starts=self.starts(),
        )

    def load(self, state: StateDump) -> None:
        """Write a dump into this (empty) store in one transaction."""
        with self._tx() as s:
            s.run_many(_NODE_ADD, state.nodes.items())
            s.run_many(_ADMIN_UPSERT, [admin_row(n, i) for n, i in state.admin.items()])
            s.run_many(
                _EVENT_ADD,
                [(e.node, e.action, e.reason, e.by, e.at, e.force_at) for e in state.events],
            )
            s.run_many(
                _MODEL_UPSERT,
                [(spec.name, spec.model_dump_json(), at) for spec, at in state.models.values()],
            )
            s.run_many(_REPLICA_UPSERT, [replica_row(r) for r in state.replicas.values()])
            s.run_many(_BACKOFF_UPSERT, [backoff_row(b) for b in state.backoffs.values()])
            s.run_many(
                _REVISION_ADD, [revision_row(r) for rs in state.revisions.values() for r in rs]
            )
            s.run_many(_DECISION_ADD, [decision_row(e) for e in state.decisions])
            # Credentials and tokens as stored: digests, never a secret.
            s.run_many(_CREDENTIAL_ADD, [credential_row(c) for c in state.credentials.values()])
            s.run_many(_TOKEN_ADD, [token_row(t) for t in state.enroll_tokens])
            s.run_many(_ALLOW_UPSERT, [(n, by, at) for n, (by, at) in state.enroll_allowed.items()])
            s.run_many(_CLIENT_KEY_ADD, [client_key_row(k) for k in state.client_keys])
            s.run_many(
                _ADAPTER_UPSERT,
                [(a.name, a.model_dump_json(), at) for a, at in state.adapters.values()],
            )
            self.load_tenants(s, state.limits, state.usage)
            s.run_many(_START_COUNT, [start_row(c) for c in state.starts])

    # -- nodes --------------------------------------------------------------------------

    def known_nodes(self) -> dict[str, float]:
        return {r["name"]: r["first_seen"] for r in self._read("SELECT * FROM nodes")}

    def add_nodes(self, nodes: Iterable[tuple[str, float]]) -> None:
        with self._tx() as s:
            s.run_many(_NODE_ADD, nodes)

    def forget_node(self, name: str, replica_ids: Iterable[str], *, by: str, at: float) -> None:
        """Forget a node in one transaction: its name, admin flag, history and the
        given replicas go. The forget itself stays, the one line of the name's
        history, so a node that takes the name again shows no cordon of the old one."""
        with self._tx() as s:
            s.run("DELETE FROM nodes WHERE name = ?", (name,))
            s.run("DELETE FROM node_admin WHERE name = ?", (name,))
            s.run("DELETE FROM admin_events WHERE node = ?", (name,))
            s.run_many("DELETE FROM replicas WHERE id = ?", [(i,) for i in replica_ids])
            _add_history(s, name, "forget", None, by, at)

    # -- admin flags ----------------------------------------------------------------------

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
        """Set (or clear, for flag NONE) a node's admin flag and log the event.

        `first_seen`: the node is not saved yet; it is saved in the same
        transaction, so a cordoned node is known after any crash."""
        with self._tx() as s:
            if first_seen is not None:
                s.run(_NODE_ADD, (name, first_seen))
            if info.flag is AdminFlag.NONE:
                s.run("DELETE FROM node_admin WHERE name = ?", (name,))
            else:
                s.run(_ADMIN_UPSERT, admin_row(name, info))
            _add_history(s, name, action, info.reason, by, at, info.force_at)

    def history(self, name: str, limit: int = HISTORY_KEPT) -> list[AdminEvent]:
        rows = self._read(
            "SELECT * FROM admin_events WHERE node = ? ORDER BY id DESC LIMIT ?", (name, limit)
        )
        return [admin_event_from_row(r) for r in rows]

    # -- models ---------------------------------------------------------------------------

    def models(self) -> dict[str, ModelSpec]:
        return {
            r["name"]: ModelSpec.model_validate_json(r["spec"])
            for r in self._read("SELECT name, spec FROM models ORDER BY name")
        }

    def put_models(
        self, specs: Iterable[ModelSpec], at: float, revisions: Iterable[ModelRevision] = ()
    ) -> None:
        """The specs, and the revisions they create, in one transaction."""
        revisions = list(revisions)
        with self._tx() as s:
            s.run_many(_MODEL_UPSERT, [(spec.name, spec.model_dump_json(), at) for spec in specs])
            s.run_many(_REVISION_ADD, [revision_row(r) for r in revisions])
            s.run_many(
                _REVISIONS_TRIM, [(r.spec.name, r.revision - KEPT_REVISIONS) for r in revisions]
            )

    def revisions(self) -> dict[str, list[ModelRevision]]:
        out: dict[str, list[ModelRevision]] = {}
        for r in self._read("SELECT * FROM model_revisions ORDER BY model, revision"):
            out.setdefault(r["model"], []).append(
                ModelRevision(
                    revision=r["revision"],
                    at=r["at"],
                    by=r["by"],
                    change=r["change"],
                    spec=ModelSpec.model_validate_json(r["spec"]),
                )
            )
        return out

    def delete_model(self, name: str) -> bool:
        with self._tx() as s:
            deleted = s.run("DELETE FROM models WHERE name = ?", (name,)) > 0
            s.run("DELETE FROM model_backoff WHERE model = ?", (name,))
            s.run("DELETE FROM model_revisions WHERE model = ?", (name,))
            s.run("DELETE FROM model_starts WHERE model = ?", (name,))
        return deleted

    # -- how replicas started (schema 14) ---------------------------------------------------

    def starts(self) -> list[StartCount]:
        rows = self._read("SELECT * FROM model_starts ORDER BY model, kind, level")
        return [start_from_row(r) for r in rows]

    def count_start(
        self, model: str, kind: StartKind, level: int, seconds: float | None, *, at: float
    ) -> None:
        with self._tx() as s:
            s.run(_START_COUNT, start_row(StartCount(model, kind, level, 1, seconds, at)))

    # -- adapters -------------------------------------------------------------------------

    def adapters(self) -> dict[str, AdapterSpec]:
        return {
            r["name"]: AdapterSpec.model_validate_json(r["spec"])
            for r in self._read("SELECT name, spec FROM adapters ORDER BY name")
        }

    def put_adapters(self, specs: Iterable[AdapterSpec], at: float) -> None:
        with self._tx() as s:
            s.run_many(_ADAPTER_UPSERT, [(a.name, a.model_dump_json(), at) for a in specs])

    def delete_adapter(self, name: str) -> bool:
        with self._tx() as s:
            return s.run("DELETE FROM adapters WHERE name = ?", (name,)) > 0

    # -- events ---------------------------------------------------------------------------

    def events(self, limit: int) -> list[EventView]:
        """The newest `limit` events, oldest first."""
        rows = self._read("SELECT * FROM events ORDER BY id DESC LIMIT ?", (limit,))
        return [decision_from_row(r) for r in reversed(rows)]

    def add_events(
        self, events: Iterable[EventView], *, gone: Iterable[int], keep_after: float
    ) -> None:
        """Write events, delete those `gone` (counted into a newer one, or past their
        reason's bound) and those last seen before `keep_after`."""
        with self._tx() as s:
            s.run_many("DELETE FROM events WHERE id = ?", [(i,) for i in gone])
            s.run_many(_DECISION_ADD, [decision_row(e) for e in events])
            s.run("DELETE FROM events WHERE at < ?", (keep_after,))

    # -- replicas -------------------------------------------------------------------------

    def replicas(self) -> dict[str, ReplicaRecord]:
        return {
            r["id"]: replica_from_row(r) for r in self._read("SELECT * FROM replicas ORDER BY id")
        }

    def put_replicas(self, records: Iterable[ReplicaRecord]) -> None:
        with self._tx() as s:
            s.run_many(_REPLICA_UPSERT, [replica_row(r) for r in records])

    def delete_replicas(self, ids: Iterable[str]) -> None:
        with self._tx() as s:
            s.run_many("DELETE FROM replicas WHERE id = ?", [(i,) for i in ids])

    # -- backoff --------------------------------------------------------------------------

    def backoffs(self) -> dict[str, Backoff]:
        return {
            r["model"]: Backoff(r["model"], r["failures"], r["retry_at"], r["last_failure"])
            for r in self._read("SELECT * FROM model_backoff")
        }

    def put_backoff(self, b: Backoff) -> None:
        with self._tx() as s:
            s.run(_BACKOFF_UPSERT, backoff_row(b))

    def clear_backoff(self, model: str) -> None:
        with self._tx() as s:
            s.run("DELETE FROM model_backoff WHERE model = ?", (model,))

    # -- node credentials (issued by enrollment; only their SHA-256 is kept) ----------------

    def credentials(self) -> dict[str, tuple[str, float, str]]:
        """node -> (digest, issued_at, by)."""
        return {
            r["node"]: (r["digest"], r["issued_at"], r["by"])
            for r in self._read("SELECT * FROM agent_credentials")
        }

    def put_credential(self, node: str, digest: str, *, at: float, by: str) -> None:
        with self._tx() as s:
            s.run(_CREDENTIAL_ADD, (node, digest, at, by, 0, None, None))

    def unreported_credentials(self) -> dict[str, float]:
        """Credentials issued whose node has not reported with them -> issued_at,
        oldest first."""
        rows = self._read(
            "SELECT node, issued_at FROM agent_credentials WHERE reported_at IS NULL"
            " ORDER BY issued_at, node"
        )
        return {r["node"]: r["issued_at"] for r in rows}

    def credential_reported(self, node: str, *, at: float) -> None:
        """The node reported with its credential for the first time."""
        with self._tx() as s:
            s.run(
                "UPDATE agent_credentials SET reported_at = ? WHERE node = ?"
                " AND reported_at IS NULL",
                (at, node),
            )

    def expire_credentials(self, nodes: Iterable[str]) -> None:
        """Delete credentials that never reported (one that reported meanwhile stays)."""
        with self._tx() as s:
            s.run_many(
                "DELETE FROM agent_credentials WHERE node = ? AND reported_at IS NULL",
                [(n,) for n in nodes],
            )

    def delete_credential(self, node: str) -> bool:
        with self._tx() as s:
            return s.run("DELETE FROM agent_credentials WHERE node = ?", (node,)) > 0

    # -- bounded enrollment: tokens with an expiry and a use limit, approval, allowances --

    def enroll(
        self, node: str, digest: str, *, at: float, by: str, pending: bool, token: str | None
    ) -> bool:
        """Issue a node's credential in one transaction with one use of `token` (when
        given) and the node's allowance; False, with nothing written, when the token
        has expired or is used up (another controller or request took its last use)."""
        try:
            with self._tx() as s:
                if token is not None and s.run(_TOKEN_USE, (token, at)) == 0:
                    raise _Spent
                s.run("DELETE FROM enroll_allowed WHERE node = ?", (node,))
                s.run(_CREDENTIAL_ADD, (node, digest, at, by, int(pending), token, None))
        except _Spent:
            return False
        return True

    def pending_credentials(self) -> dict[str, float]:
        """Nodes enrolled and not approved yet -> when they enrolled."""
        rows = self._read("SELECT node, issued_at FROM agent_credentials WHERE pending = 1")
        return {r["node"]: r["issued_at"] for r in rows}

    def approve_credential(self, node: str, *, by: str, at: float) -> bool:
        """Approve a pending credential, recorded in the node's admin history."""
        with self._tx() as s:
            done = s.run(
                "UPDATE agent_credentials SET pending = 0 WHERE node = ? AND pending = 1", (node,)
            )
            if done:
                _add_history(s, node, "approve", None, by, at)
        return done > 0

    def enroll_tokens(self) -> list[EnrollToken]:
        rows = self._read("SELECT * FROM enroll_tokens ORDER BY created_at, id")
        return [token_from_row(r) for r in rows]

    def put_enroll_token(self, t: EnrollToken) -> None:
        with self._tx() as s:
            s.run(_TOKEN_ADD, token_row(t))

    def delete_enroll_token(self, token_id: str) -> bool:
        with self._tx() as s:
            return s.run("DELETE FROM enroll_tokens WHERE id = ?", (token_id,)) > 0

    def enroll_allowed(self) -> dict[str, tuple[str, float]]:
        """Nodes that reported before and that an admin allows to enroll -> (by, at)."""
        return {r["node"]: (r["by"], r["at"]) for r in self._read("SELECT * FROM enroll_allowed")}

    def allow_enroll(self, node: str, *, by: str, at: float) -> None:
        """Allow one enrollment of a known node, recorded in its admin history."""
        with self._tx() as s:
            s.run(_ALLOW_UPSERT, (node, by, at))
            _add_history(s, node, "allow enrollment", None, by, at)

    # -- tenants' client keys (digests only) ------------------------------------------

    def client_keys(self) -> list[ClientKey]:
        rows = self._read("SELECT * FROM client_keys ORDER BY created_at, id")
        return [client_key_from_row(r) for r in rows]

    def put_client_key(self, k: ClientKey) -> None:
        with self._tx() as s:
            s.run(_CLIENT_KEY_ADD, client_key_row(k))

    def delete_client_key(self, key_id: str) -> bool:
        with self._tx() as s:
            return s.run("DELETE FROM client_keys WHERE id = ?", (key_id,)) > 0

    def client_keys_used(self, used: Iterable[tuple[str, float]]) -> None:
        """When keys were last used (key id, unix time); a time never goes back."""
        with self._tx() as s:
            s.run_many(
                "UPDATE client_keys SET last_used = ? WHERE id = ?"
                " AND (last_used IS NULL OR last_used < ?)",
                [(at, key_id, at) for key_id, at in used],
            )


class _Spent(Exception):
    """An enrollment token's use was not there to take: the transaction is rolled back."""


def _add_history(
    s: Session,
    node: str,
    action: str,
    reason: str | None,
    by: str,
    at: float,
    force_at: float | None = None,
) -> None:
    """One entry of a node's admin history; the oldest past HISTORY_KEPT goes."""
    s.run(_EVENT_ADD, (node, action, reason, by, at, force_at))
    s.run(_HISTORY_TRIM, (node, node))
