"""Console test fixtures: the real controller with a frozen clock (see
console_fixtures), fault injection between it and the console, a frozen
console clock, and SVG snapshots written to the top-level `snapshots/` folder
(reviewed like code)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import pytest_textual_snapshot
from console_fixtures import Faults, LiveController, fill_small
from console_pilot import Clock
from syrupy.location import PyTestLocation

from llmgw.console.app import ConsoleApp

SNAPSHOT_DIR = Path(__file__).resolve().parents[2] / "snapshots"


class TopLevelSVGExtension(pytest_textual_snapshot.SVGImageExtension):
    """pytest-textual-snapshot's SVG extension, but under `snapshots/<test file>/`
    at the repository root instead of `__snapshots__` beside the test."""

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        # Keep the per-test-file folder: syrupy matches snapshots to tests by it.
        return str(SNAPSHOT_DIR / test_location.basename)


@pytest.fixture(autouse=True)
def _snapshots_at_top_level(monkeypatch: pytest.MonkeyPatch) -> None:
    # Autouse fixtures are set up before `snap_compare`, which looks the
    # extension up by this module global when it is created.
    monkeypatch.setattr(pytest_textual_snapshot, "SVGImageExtension", TopLevelSVGExtension)


@pytest.fixture(scope="module")
def _fleet_to_read(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveController]:
    """One filled controller for the `reads_fleet` tests of a module, on each worker
    that runs some (not a module state in tests/conftest.py's sense: each worker may
    build its own). Filling one took about 0.6 s of every console test's setup."""
    live = LiveController(tmp_path_factory.mktemp("fleet") / "state").start()
    fill_small(live)
    yield live
    live.close()


@pytest.fixture
def controller(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveController]:
    """The small fleet, filled. A test marked `reads_fleet` gets its module's shared
    one, and fails if it changed it; any other test gets its own."""
    if request.node.get_closest_marker("reads_fleet"):
        shared: LiveController = request.getfixturevalue("_fleet_to_read")
        before = shared.fingerprint()
        yield shared
        after = shared.fingerprint()
        assert after == before, f"a reads_fleet test changed the shared fleet: {before} -> {after}"
        return
    live = LiveController(tmp_path / "state").start()
    fill_small(live)
    yield live
    live.close()


@pytest.fixture
def faults() -> Faults:
    return Faults()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_app(controller: LiveController, faults: Faults, clock: Clock) -> Callable[..., ConsoleApp]:
    def make(*, readonly: bool = False, refresh: float = 3600.0) -> ConsoleApp:
        # A long refresh: tests trigger polls explicitly with poll_now().
        client = controller.client(faults, user="tester")
        return ConsoleApp(client, readonly=readonly, refresh=refresh, clock=clock)

    return make
