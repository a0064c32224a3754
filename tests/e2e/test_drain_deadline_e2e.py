"""A drain deadline is the controller's: real `llmgw controller`, agent and
fake engine processes, and `llmgw ctl drain --force-after`, which exits at once.

- With no client connected, the drain is forced when due: the engine stops and
  the node ends drained, with `drain forced (deadline)` in its history.
- The deadline survives a controller killed with SIGKILL before it is due: the
  restarted controller forces it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.procs import Cluster, wait_until

pytestmark = pytest.mark.slow

CONTROLLER_ARGS = ["--reconcile-interval", "0.2"]
# One node, and a model that fills it: a stand-in can never be placed, so the
# drain waits until its deadline forces it.
MODEL = {
    "name": "m",
    "source": "org/m",
    "min_replicas": 1,
    "gpus_per_shard": 2,
    "engine": "fake",
    "engine_args": ["--load-seconds", "0.2", "--host", "127.0.0.1"],
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster")
    try:
        c.start_controller(*CONTROLLER_ARGS)
        c.start_agent("n1")
        c.apply([MODEL])

        def serving() -> bool:
            reps = c.get("/v1/replicas")
            return len(reps) == 1 and reps[0]["state"] == "ready"

        wait_until(serving, timeout=30, what="a ready replica", diagnose=c.logs)
        yield c
    finally:
        c.close()


def node(c: Cluster) -> dict[str, Any]:
    return c.get("/v1/nodes/n1")


def drain_with_deadline(c: Cluster, seconds: float) -> float:
    # Its one replica has nowhere else to go: the deadline drops the model below its
    # minimum, which ctl refuses without --yes (the pre-check --force passes too).
    out = c.ctl("drain", "n1", "--reason", "e2e: PSU", "--force-after", str(seconds), "--yes")
    assert "n1" in out
    force_at = node(c)["row"]["admin"]["force_at"]
    assert force_at is not None
    listing = c.ctl("nodes")
    assert "force at" in listing and "UTC" in listing, listing
    return float(force_at)


def wait_forced(c: Cluster) -> dict[str, Any]:
    def drained() -> dict[str, Any] | None:
        detail = c.try_get("/v1/nodes/n1")
        return detail if detail and detail["row"]["admin"]["drained"] else None

    return wait_until(drained, timeout=20, what="the deadline to force the drain", diagnose=c.logs)


def assert_forced_by_deadline(c: Cluster, detail: dict[str, Any], force_at: float) -> None:
    events = {e["action"]: e for e in detail["history"]}
    forced = events["drain forced (deadline)"]
    assert forced["by"] == "llmgw"
    assert forced["at"] >= force_at  # not early
    assert events["drain"]["force_at"] == force_at
    wait_until(lambda: not c.engine_pids(), timeout=20, what="the engine to stop")


def test_a_deadline_is_forced_on_time_with_no_client_connected(cluster: Cluster) -> None:
    c = cluster
    force_at = drain_with_deadline(c, 2)
    time.sleep(1)  # not due: still waiting for a stand-in that cannot be placed
    row = node(c)["row"]
    assert row["state"] == "draining" and not row["admin"]["force"] and c.engine_pids()
    detail = wait_forced(c)
    assert time.time() - force_at < 5  # on time: within a few reconcile passes
    assert_forced_by_deadline(c, detail, force_at)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_deadline_survives_a_controller_restart(cluster: Cluster, sig: int) -> None:
    c = cluster
    force_at = drain_with_deadline(c, 3)
    c.kill_controller(sig)
    while time.time() < force_at + 0.5:  # due while no controller runs
        time.sleep(0.1)
    assert c.engine_pids()  # nobody forced it meanwhile
    c.start_controller()
    detail = wait_forced(c)
    assert_forced_by_deadline(c, detail, force_at)
