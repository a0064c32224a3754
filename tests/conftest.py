"""Fixtures every test directory may use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.procs import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Real llmgw processes for one test (`tests.e2e.procs.Cluster`), all stopped
    after it, the engines they started included. A module that needs its cluster
    set up a particular way defines its own `cluster`."""
    c = Cluster(tmp_path / "cluster")
    try:
        yield c
    finally:
        c.close()
