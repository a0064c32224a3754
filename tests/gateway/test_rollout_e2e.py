"""Rollouts end to end (issue 21 items 1 and 2): a real controller, four agents with
two fake cards each, fake engines and the gateway with its SMG child, with a client
sending requests all along.

- A changed spec rolls out with zero failed requests and never fewer ready
  replicas than the minimum; `ctl rollout status --wait` follows it, `history`
  lists it, `undo` rolls back the same way.
- A new revision whose engine exits at start stalls the rollout; the old
  replicas keep serving.
- A controller SIGKILLed mid-rollout resumes it after a restart; nothing is
  placed twice.

The first two share one cluster and gateway (`fleet`, built once for the module: a
controller, four agents and the gateway take about 10 s to bring up), each rolling a
model of its own, so that either also runs alone. The third kills its controller:
it has its own.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import (
    CONTROLLER_ARGS,
    ENGINE_ARGS,
    Gateway,
    Load,
    gateway_fleet,
    model,
    wait_cluster_ready,
)

pytestmark = pytest.mark.slow

NODES = ["gpu1", "gpu2", "gpu3", "gpu4"]


def chat(load_seconds: str = "0.3", *extra: str, name: str = "chat") -> dict[str, Any]:
    spec = model(name, min_replicas=2)
    args = list(ENGINE_ARGS)
    args[args.index("--load-seconds") + 1] = load_seconds
    return {**spec, "engine_args": [*args, *extra]}


def replicas(c: Cluster, name: str = "chat") -> list[dict[str, Any]]:
    return [r for r in c.get("/v1/replicas") if r["model"] == name]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Gateway]]:
    """The controller, four agents with two cards each and the gateway, for the
    module's tests that roll a model of their own under traffic."""
    with gateway_fleet(tmp_path_factory.mktemp("rollout") / "cluster", NODES) as fleet:
        yield fleet


def serve(c: Cluster, gw: Gateway, name: str) -> None:
    """Declare `name` (min 2) and wait until the gateway routes to both replicas."""
    c.apply([chat(name=name)])
    gw.wait_serving(name)

    def both_routed() -> bool:
        endpoints = c.get("/v1/endpoints")["endpoints"]
        return sum(e["model"] == name for e in endpoints) == 2

    wait_until(both_routed, timeout=30, what=f"two endpoints of {name}")


class Lowest:
    """The fewest ready replicas of `name` the controller counted, sampled all along."""

    def __init__(self, c: Cluster, name: str = "chat") -> None:
        self.c, self.name, self.low, self._stop = c, name, 99, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            view = next(m for m in self.c.get("/v1/models") if m["spec"]["name"] == self.name)
            self.low = min(self.low, view["ready"])
            self._stop.wait(0.1)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.low


def rollout_status(c: Cluster, *args: str, name: str = "chat") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        c.ctl_argv("rollout", "status", name, *args),
        capture_output=True,
        text=True,
        timeout=150,
        env=c.env(),
    )


def test_a_rollout_and_its_undo_under_traffic_fail_no_request(
    fleet: tuple[Cluster, Gateway],
) -> None:
    c, gw = fleet
    serve(c, gw, "chat")
    first = {r["id"] for r in replicas(c)}
    load = Load(gw.url, "chat").start()
    low = Lowest(c)
    try:
        wait_until(lambda: load.ok >= 4, timeout=20, what="requests flowing", diagnose=gw.logs)
        c.apply([chat("0.4")])
        done = rollout_status(c, "--wait", "--timeout", "2m")
        assert done.returncode == 0, done.stdout + done.stderr + gw.logs()
        assert "revision 2 rolled out: 2 of 2 ready" in done.stdout, done.stdout
        assert "updating" in done.stdout, done.stdout  # it followed the progress
        second = replicas(c)
        assert not first & {r["id"] for r in second}, "every old replica replaced"
        assert {r["revision"] for r in second} == {2}
        served = load.ok
        wait_until(lambda: load.ok >= served + 4, timeout=20, what="requests after the rollout")

        history = c.ctl("rollout", "history", "chat")
        assert "created" in history and "--load-seconds 0.3" in history, history
        assert "engine_args:" in history and "0.4" in history, history

        out = c.ctl("rollout", "undo", "chat")
        assert "rolling back" in out and "now revision 3" in out, out
        done = rollout_status(c, "--wait", "--timeout", "2m")
        assert done.returncode == 0, done.stdout + done.stderr + gw.logs()
        assert {r["revision"] for r in replicas(c)} == {3}
        history = c.ctl("rollout", "history", "chat")
        assert "undo to revision 1" in history, history
        served = load.ok
        wait_until(lambda: load.ok >= served + 4, timeout=20, what="requests after the undo")
    finally:
        lowest = low.stop()
        load.stop()
    assert load.failures == [], "\n".join(load.failures[:10]) + "\n" + gw.logs()
    assert lowest >= 2, f"ready fell to {lowest} of minimum 2"
    models = c.ctl("models")
    assert "satisfied" in models and "updating" not in models, models
    # Every step is an event, as `kubectl get events` lists a rollout's.
    events = c.ctl("events", "--for", "model/chat")
    assert events.count("RolloutStep") >= 8, events  # 2 placed, 2 leave, 2 stopped, twice
    assert "revision 2: placed 1 replica(s)" in events and "revision 3:" in events, events


def test_a_stalled_rollout_leaves_the_old_replicas_serving(
    fleet: tuple[Cluster, Gateway],
) -> None:
    c, gw = fleet
    serve(c, gw, "stuck")
    first = {r["id"] for r in replicas(c, "stuck")}
    load = Load(gw.url, "stuck").start()
    try:
        wait_until(lambda: load.ok >= 4, timeout=20, what="requests flowing", diagnose=gw.logs)
        # The new engine exits as it loads.
        c.apply([chat("0.3", "--fail-after", "0.1", name="stuck")])
        done = rollout_status(c, "--wait", "--timeout", "90s", name="stuck")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "rollout stalled" in done.stdout, done.stdout
        assert "exit" in done.stdout, done.stdout  # the engine's own words, in the status
        served = load.ok
        wait_until(lambda: load.ok >= served + 4, timeout=20, what="requests while stalled")
    finally:
        load.stop()
    now = replicas(c, "stuck")
    assert first <= {r["id"] for r in now if r["state"] == "ready"}, now
    assert load.failures == [], "\n".join(load.failures[:10]) + "\n" + gw.logs()
    assert "rollout stalled" in c.ctl("models")


def test_a_controller_killed_mid_rollout_resumes_without_doubling(cluster: Cluster) -> None:
    c = cluster
    c.start_controller(*CONTROLLER_ARGS)
    for name in NODES:
        c.start_agent(name, gpus="2xH100-80GB")
    wait_cluster_ready(c, NODES)
    c.apply([chat("0.3")])
    wait_until(
        lambda: [r["state"] for r in replicas(c)] == ["ready", "ready"],
        timeout=30,
        what="two ready replicas",
    )
    first = {r["id"] for r in replicas(c)}
    c.apply([chat("3")])  # new engines load for 3 s: the kill lands mid-rollout

    def surge() -> set[str] | None:
        new = {r["id"] for r in replicas(c) if r["revision"] == 2}
        return new or None

    placed = wait_until(surge, timeout=20, what="the first new replica")
    c.kill_controller()
    c.start_controller(*CONTROLLER_ARGS)
    done = rollout_status(c, "--wait", "--timeout", "2m")
    assert done.returncode == 0, done.stdout + done.stderr + c.logs()
    final = replicas(c)
    assert len(final) == 2 and {r["revision"] for r in final} == {2}, final
    assert placed <= {r["id"] for r in final}, "the replica placed before the kill is kept"
    assert not first & {r["id"] for r in final}
    # Every engine the agents run is one of the final two, or an old one its agent
    # stops at its next report: none doubled.
    ids = {r["id"] for r in final}
    assert set(c.engine_pids()) <= ids | first, (c.engine_pids(), ids, first)
    wait_until(lambda: set(c.engine_pids()) == ids, timeout=15, what="only the final two engines")
