"""The schemas as the code before one SQL layer (main at 18e287e) made them, copied
verbatim, so that databases made by that code can be made here and opened by this one.

SQLite: `SCHEMA` then schema_version = 1, and `agent_credentials` once a credential
was issued; PostgreSQL: its migrations 1 and 2, one schema_version row each."""

from __future__ import annotations

SQLITE_V1 = """
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
INSERT INTO schema_version(version) VALUES (1);
"""
SQLITE_CREDENTIALS = (
    "CREATE TABLE IF NOT EXISTS agent_credentials ("
    " node TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE,"
    " issued_at REAL NOT NULL, by TEXT NOT NULL)"
)

POSTGRES_V2 = [
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
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
    """CREATE TABLE writer (
        id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, url TEXT)""",
    "INSERT INTO writer(id, epoch, url) VALUES (1, 0, NULL)",
    "INSERT INTO schema_version(version) VALUES (1)",
    "ALTER TABLE writer ADD COLUMN holder TEXT",
    "ALTER TABLE writer ADD COLUMN expires_at TIMESTAMPTZ",
    "CREATE TABLE IF NOT EXISTS agent_credentials ("
    " node TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE,"
    " issued_at DOUBLE PRECISION NOT NULL, by TEXT NOT NULL)",
    "INSERT INTO schema_version(version) VALUES (2)",
]

# One of every record, as that code wrote them (its own INSERTs), in either dialect
# (`?` placeholders; the PostgreSQL test converts them).
SPEC_JSON = '{"name":"m","source":"/models/m","engine":"fake","min_replicas":1}'
ROWS: list[tuple[str, tuple[object, ...]]] = [
    ("INSERT INTO nodes(name, first_seen) VALUES (?, ?)", ("n1", 1.0)),
    ("INSERT INTO nodes(name, first_seen) VALUES (?, ?)", ("n2", 2.0)),
    (
        "INSERT INTO node_admin(name, flag, reason, by, at, drained, force, force_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        ("n1", "draining", "move", "ops", 10.0, 0, 0, 99.5),
    ),
    (
        "INSERT INTO admin_events(node, action, reason, by, at, force_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        ("n1", "drain", "move", "ops", 10.0, 99.5),
    ),
    ("INSERT INTO models(name, spec, updated_at) VALUES (?, ?, ?)", ("m", SPEC_JSON, 5.0)),
    (
        "INSERT INTO replicas(id, model, state, shards, created_at, error, replaces)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        ("r1", "m", "ready", '[{"node": "n2", "rank": 0, "gpus": ["GPU-a"]}]', 3.0, None, None),
    ),
    (
        "INSERT INTO model_backoff(model, failures, retry_at, last_failure) VALUES (?, ?, ?, ?)",
        ("m", 2, 50.0, "crashed"),
    ),
    (
        "INSERT INTO agent_credentials(node, digest, issued_at, by) VALUES (?, ?, ?, ?)",
        ("n2", "digest-2", 4.0, "enroll"),
    ),
]
