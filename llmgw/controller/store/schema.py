"""The one schema of both backends: a numbered list of migrations, applied in order.

Types are ones both dialects read the same way (SQLite maps DOUBLE PRECISION to
REAL, BIGINT to INTEGER); the one word they spell differently, an auto-numbered
key, is `{serial}`. Every step is safe on a database that already has part of it,
because the databases made before this list had diverged: SQLite files at version 1
have no `writer` table (PostgreSQL's version 1 does), SQLite files from before
versions existed (0) may lack `force_at`, and `agent_credentials` was made on
first use. `AddColumn` is an ALTER that is skipped when the column exists;
`LowerNodeNames` and `LeaveReasons` are rewrites done in Python (`session`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "AddColumn", "LeaveReasons", "LowerNodeNames", "Step"]


@dataclass(frozen=True)
class AddColumn:
    table: str
    column: str
    type: str


@dataclass(frozen=True)
class LowerNodeNames:
    """Node names are kept in lower case from schema 6 on (`llmgw.wire.NodeName`): a
    name stored before is lowered wherever it appears, unless its lowered form is
    taken already (that row stays as it was, for an operator to forget)."""


@dataclass(frozen=True)
class LeaveReasons:
    """From schema 7 on, why a replica leaves is kept as data (`records.LeaveReason`)
    beside its human text: a row stored before, whose text is all there is, gets its
    reason from that text, once (`session.leave_reasons`)."""


Step = str | AddColumn | LowerNodeNames | LeaveReasons

# MIGRATIONS[v - 1]: the steps from version v - 1 to v.
MIGRATIONS: list[list[Step]] = [
    # 1: the fleet's records.
    [
        "CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY,"
        " first_seen DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS node_admin (name TEXT PRIMARY KEY, flag TEXT NOT NULL,"
        " reason TEXT, by TEXT, at DOUBLE PRECISION, drained INTEGER NOT NULL DEFAULT 0,"
        " force INTEGER NOT NULL DEFAULT 0, force_at DOUBLE PRECISION)",
        "CREATE TABLE IF NOT EXISTS admin_events (id {serial}, node TEXT NOT NULL,"
        " action TEXT NOT NULL, reason TEXT, by TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,"
        " force_at DOUBLE PRECISION)",
        "CREATE INDEX IF NOT EXISTS admin_events_node ON admin_events(node, id)",
        "CREATE TABLE IF NOT EXISTS models (name TEXT PRIMARY KEY, spec TEXT NOT NULL,"
        " updated_at DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS replicas (id TEXT PRIMARY KEY, model TEXT NOT NULL,"
        " state TEXT NOT NULL, shards TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,"
        " error TEXT, replaces TEXT)",
        "CREATE TABLE IF NOT EXISTS model_backoff (model TEXT PRIMARY KEY,"
        " failures INTEGER NOT NULL, retry_at DOUBLE PRECISION NOT NULL, last_failure TEXT)",
        # Drain deadlines came after the first SQLite files.
        AddColumn("node_admin", "force_at", "DOUBLE PRECISION"),
        AddColumn("admin_events", "force_at", "DOUBLE PRECISION"),
    ],
    # 2: who writes (PostgreSQL's lease: the epoch, the holder, until when in the
    # server's clock) and the node credentials enrollment issues (only SHA-256 kept).
    [
        "CREATE TABLE IF NOT EXISTS writer (id INTEGER PRIMARY KEY CHECK (id = 1),"
        " epoch BIGINT NOT NULL, url TEXT)",
        "INSERT INTO writer(id, epoch, url) VALUES (1, 0, NULL) ON CONFLICT DO NOTHING",
        AddColumn("writer", "holder", "TEXT"),
        AddColumn("writer", "expires_at", "TIMESTAMPTZ"),
        "CREATE TABLE IF NOT EXISTS agent_credentials (node TEXT PRIMARY KEY,"
        " digest TEXT NOT NULL UNIQUE, issued_at DOUBLE PRECISION NOT NULL, by TEXT NOT NULL)",
    ],
    # 3: the last committed revision: one more with every write transaction, so a
    # database can be compared with a record of it kept elsewhere.
    [
        "CREATE TABLE IF NOT EXISTS store_revision (id INTEGER PRIMARY KEY CHECK (id = 1),"
        " revision BIGINT NOT NULL)",
        "INSERT INTO store_revision(id, revision) VALUES (1, 0) ON CONFLICT DO NOTHING",
    ],
    # 4: rollouts: each model's revisions (the spec its engines were started with,
    # who changed it and what), and the revision each replica runs.
    [
        "CREATE TABLE IF NOT EXISTS model_revisions (model TEXT NOT NULL,"
        " revision INTEGER NOT NULL, at DOUBLE PRECISION NOT NULL, by TEXT NOT NULL,"
        " change TEXT NOT NULL, spec TEXT NOT NULL, PRIMARY KEY (model, revision))",
        AddColumn("replicas", "revision", "INTEGER"),
    ],
    # 5: events: what the controller decided by itself (ids given by the controller,
    # one writer at a time, so they increase across restarts and failovers).
    [
        "CREATE TABLE IF NOT EXISTS events (id BIGINT PRIMARY KEY, at DOUBLE PRECISION NOT NULL,"
        " object TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL)",
        # Why a replica leaves by the loop's own decision (a scale-down), so that a
        # restarted controller goes on stopping it instead of taking it back.
        AddColumn("replicas", "leaving", "TEXT"),
    ],
    # 6: bounded enrollment. Enrollment tokens made by `ctl credentials token create`
    # (SHA-256 kept; an expiry and a use limit, NULL for none); nodes an admin allows
    # to enroll although they reported before; a credential that awaits approval
    # (pending 1; credentials issued before are approved) and the token that made it.
    [
        "CREATE TABLE IF NOT EXISTS enroll_tokens (id TEXT PRIMARY KEY,"
        " digest TEXT NOT NULL UNIQUE, created_at DOUBLE PRECISION NOT NULL,"
        " by TEXT NOT NULL, expires_at DOUBLE PRECISION, uses INTEGER,"
        " used INTEGER NOT NULL DEFAULT 0, description TEXT)",
        "CREATE TABLE IF NOT EXISTS enroll_allowed (node TEXT PRIMARY KEY, by TEXT NOT NULL,"
        " at DOUBLE PRECISION NOT NULL)",
        AddColumn("agent_credentials", "pending", "INTEGER NOT NULL DEFAULT 0"),
        AddColumn("agent_credentials", "token", "TEXT"),
        LowerNodeNames(),
    ],
    # 7: why a replica leaves, as data beside its text: the reason (`LeaveReason`)
    # and the model a reclaim makes room for.
    [
        AddColumn("replicas", "leave_reason", "TEXT"),
        AddColumn("replicas", "reclaimed_for", "TEXT"),
        LeaveReasons(),
    ],
    # 8: bounded tables. Repeated events counted as one (how many times; the first
    # time, NULL when once: `at` is the last). When a node first reported with its
    # credential (NULL: never; one that never does expires), those of nodes known
    # before counted as reported. Each node's admin history cut to its newest 50
    # (stores/sql.py HISTORY_KEPT).
    [
        AddColumn("events", "count", "INTEGER NOT NULL DEFAULT 1"),
        AddColumn("events", "first_at", "DOUBLE PRECISION"),
        AddColumn("agent_credentials", "reported_at", "DOUBLE PRECISION"),
        "UPDATE agent_credentials SET reported_at = issued_at"
        " WHERE reported_at IS NULL AND node IN (SELECT name FROM nodes)",
        "DELETE FROM admin_events WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER()"
        " OVER (PARTITION BY node ORDER BY id DESC) AS n FROM admin_events) AS ranked"
        " WHERE n > 50)",
    ],
    # 9: tenants' client keys (`ctl keys`): only the SHA-256 of each key is kept, with
    # the model patterns it allows (JSON list), its expiry and when it was last used.
    [
        "CREATE TABLE IF NOT EXISTS client_keys (id TEXT PRIMARY KEY, tenant TEXT NOT NULL,"
        " digest TEXT NOT NULL UNIQUE, models TEXT NOT NULL,"
        " created_at DOUBLE PRECISION NOT NULL, by TEXT NOT NULL,"
        " expires_at DOUBLE PRECISION, last_used DOUBLE PRECISION)",
    ],
    # 10: the warm tier (issue 32): when a sleeping replica's engines were told to
    # sleep (NULL while the gateways let go of it), so a restart neither wakes it
    # nor tells it again.
    [
        AddColumn("replicas", "asleep_since", "DOUBLE PRECISION"),
    ],
    # 11 (issue 34): tokens metered per tenant and model, summed per hour (`hour`: its
    # first second) over every gateway; the last batch counted of each gateway's run,
    # so that a batch sent again (its answer lost, or a failover between) counts once.
    [
        "CREATE TABLE IF NOT EXISTS tenant_usage (hour DOUBLE PRECISION NOT NULL,"
        " tenant TEXT NOT NULL, model TEXT NOT NULL, requests BIGINT NOT NULL DEFAULT 0,"
        " prompt_tokens BIGINT NOT NULL DEFAULT 0, completion_tokens BIGINT NOT NULL DEFAULT 0,"
        " errors BIGINT NOT NULL DEFAULT 0, rate_limited BIGINT NOT NULL DEFAULT 0,"
        " PRIMARY KEY (hour, tenant, model))",
        "CREATE TABLE IF NOT EXISTS usage_batches (gateway TEXT PRIMARY KEY,"
        " run TEXT NOT NULL, seq BIGINT NOT NULL, at DOUBLE PRECISION NOT NULL)",
    ],
    # 12 (issue 34): tenants' limits (`ctl limits`); model '' for all the tenant's models.
    [
        "CREATE TABLE IF NOT EXISTS tenant_limits (tenant TEXT NOT NULL,"
        " model TEXT NOT NULL DEFAULT '', rpm BIGINT, tpm BIGINT, budget BIGINT, per TEXT,"
        " by TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, PRIMARY KEY (tenant, model))",
    ],
    # 13: LoRA adapters (issue 33): declared beside models, served by their base's replicas.
    [
        "CREATE TABLE IF NOT EXISTS adapters (name TEXT PRIMARY KEY, spec TEXT NOT NULL,"
        " updated_at DOUBLE PRECISION NOT NULL)",
    ],
    # 14: how replicas start (issue 32 item 5): each replica's kind of start, decided
    # at placement (warm, cold; NULL before), and per model the starts that reached
    # ready by kind (`wire.StartKind`) and sleep level (0 but for hot), with how long
    # the last one took.
    [
        AddColumn("replicas", "start_kind", "TEXT"),
        "CREATE TABLE IF NOT EXISTS model_starts (model TEXT NOT NULL, kind TEXT NOT NULL,"
        " level INTEGER NOT NULL DEFAULT 0, count BIGINT NOT NULL DEFAULT 0,"
        " last_s DOUBLE PRECISION, last_at DOUBLE PRECISION, PRIMARY KEY (model, kind, level))",
    ],
    # 15 (issue 36): each replica's engine key, made at placement, which its agent
    # gives its engines (VLLM_API_KEY) and the gateways present; NULL for a replica
    # placed before, whose engines run without one until it is replaced.
    [
        AddColumn("replicas", "engine_key", "TEXT"),
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)
