"""Fixtures every test directory may use, and how the suite is spread over cores.

The suite runs on four workers (`-n 4 --dist loadgroup` in pyproject.toml), twice the
cores: most tests wait on real processes rather than compute. A test goes to whichever
worker is free, except where a module keeps something for all its tests (a
module-scoped fixture: a cluster, a tmux server) or walks one cluster through steps in
order (the real-engine test): such a module is one group, run whole by one worker, so
its fixture is built once. Longest first: the real-engine walk, then the modules of
real processes (`slow`), then the rest, so that the last tests to be handed out are
short ones and the workers finish together.
"""

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


def _shares_module_state(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # pytest's own record of what a test uses
    if info is None:
        return False
    return any(
        defs and defs[-1].scope in ("module", "package", "class")
        for defs in info.name2fixturedefs.values()
    )


def _rank(item: pytest.Item) -> int:
    if item.get_closest_marker("real_engine"):
        return 0
    if item.get_closest_marker("slow"):
        return 1
    return 2


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    grouped = {
        item.nodeid.split("::", 1)[0]
        for item in items
        if item.get_closest_marker("real_engine") or _shares_module_state(item)
    }
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if module in grouped and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(module))
    # A stable sort: each module's tests keep their order (and their module fixture).
    items.sort(key=_rank)
