"""Replicas end to end: a real `llmgw controller`, real `llmgw agent` processes
with simulated GPUs, and real fake engines (`engine: fake`) that they start.

- A drain moves every replica off the node, never letting the model drop below
  its minimum, and the engines on the drained node really stop.
- A controller killed with SIGKILL mid-drain finishes the drain after a
  restart on the same state dir, with no replica duplicated or lost.
- An agent restart (SIGTERM, then SIGKILL) keeps its engine running: same pid,
  same replica, still ready, nothing new placed.
- A crash-looping engine backs off exponentially, and `ctl models` shows why.

Waits poll with deadlines; no assertion depends on a sleep.
"""

from __future__ import annotations

import collections
import itertools
import signal
import subprocess
import time
from typing import Any

import httpx
import pytest

from tests.e2e.procs import Cluster, pid_alive, wait_until

pytestmark = pytest.mark.slow

# Engines listen on loopback only (the last --host wins in the fake engine's
# argv) and load quickly.
ENGINE_ARGS = ["--load-seconds", "0.3", "--host", "127.0.0.1"]
CONTROLLER_ARGS = ["--reconcile-interval", "0.5", "--backoff-base", "1", "--backoff-cap", "60"]


def model(name: str, min_replicas: int, engine_args: list[str] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"org/{name}",
        "min_replicas": min_replicas,
        "gpus_per_shard": 1,
        "engine": "fake",
        "engine_args": engine_args or ENGINE_ARGS,
    }


def nodes_of(replica: dict[str, Any]) -> set[str]:
    return {s["node"] for s in replica["shards"]}


def serving(replica: dict[str, Any]) -> bool:
    """Every shard's engine says it is ready (the agent's word, not the record's)."""
    return bool(replica["shards"]) and all(s["state"] == "ready" for s in replica["shards"])


def of_model(replicas: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in replicas if r["model"] == name]


def start_fleet(c: Cluster, names: list[str], **agent_opts: Any) -> None:
    c.start_controller(*CONTROLLER_ARGS)
    for name in names:
        c.start_agent(name, **agent_opts)

    def all_ready() -> bool:
        return c.get("/v1/summary")["nodes"]["ready"] == len(names)

    wait_until(all_ready, timeout=30, what=f"{len(names)} ready nodes", diagnose=c.logs)


def wait_ready(c: Cluster, name: str, count: int, timeout: float = 30) -> list[dict[str, Any]]:
    """Wait until exactly `count` replicas of `name` exist, all ready and serving."""

    def check() -> list[dict[str, Any]] | None:
        mine = of_model(c.get("/v1/replicas"), name)
        ok = len(mine) == count and all(r["state"] == "ready" and serving(r) for r in mine)
        return mine if ok else None

    return wait_until(
        check, timeout=timeout, what=f"{count} ready replica(s) of {name}", diagnose=c.logs
    )


def node_row(c: Cluster, node: str) -> dict[str, Any]:
    return next(r for r in c.get("/v1/nodes") if r["name"] == node)


def busiest(replicas: list[dict[str, Any]]) -> str:
    counts = collections.Counter(n for r in replicas for n in nodes_of(r))
    return sorted(counts, key=lambda n: (-counts[n], n))[0]


def assert_engines_gone(c: Cluster, node: str, replica_ids: set[str], pids: set[int]) -> None:
    """The engines of these replicas stopped for real, and the node's agent forgot them."""

    def gone() -> bool:
        live = {rid for rid in c.engine_pids() if rid in replica_ids}
        return not live and not any(pid_alive(p) for p in pids) and not c.engine_records(node)

    wait_until(gone, timeout=20, what=f"the engines of {sorted(replica_ids)} to exit")


def test_drain_moves_every_replica_without_dropping_below_minimum(cluster: Cluster) -> None:
    c = cluster
    start_fleet(c, ["n1", "n2", "n3"])
    c.apply([model("m", 2)])
    before = wait_ready(c, "m", 2)
    # Spread: one replica per node, so the drain moves one and the other keeps serving.
    assert len({n for r in before for n in nodes_of(r)}) == 2, before
    node = busiest(before)
    moving = {r["id"] for r in before if node in nodes_of(r)}
    assert moving

    # The engines on that node, seen two ways: the agent's state file and /proc.
    on_node = {e["replica_id"]: e["pid"] for e in c.engine_records(node)}
    assert set(on_node) == moving
    procs = c.engine_pids()
    assert all(procs[rid] == {on_node[rid]} for rid in moving), (procs, on_node)

    drain = subprocess.Popen(
        c.ctl_argv("drain", node, "--reason", "e2e: move the work", "--wait", "--timeout", "60"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=c.env(),
    )
    try:
        low_ready, low_serving, samples = 99, 99, 0
        stand_ins: dict[str, str] = {}  # stand-in id -> the replica it replaces
        deadline = time.monotonic() + 75
        while drain.poll() is None:
            assert time.monotonic() < deadline, f"ctl drain --wait did not return\n{c.logs()}"
            view = next(m for m in c.get("/v1/models") if m["spec"]["name"] == "m")
            replicas = of_model(c.get("/v1/replicas"), "m")
            low_ready = min(low_ready, view["ready"])
            low_serving = min(low_serving, sum(serving(r) for r in replicas))
            stand_ins.update({r["id"]: r["replaces"] for r in replicas if r["replaces"]})
            samples += 1
            time.sleep(0.1)
        out = drain.communicate(timeout=10)[0]
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.wait()
    assert drain.returncode == 0, f"{out}\n{c.logs()}"
    assert f"drained: {node}" in out, out
    assert samples >= 3, "the drain was not observed while it ran"

    # Never below the minimum: neither as the controller counts nor in engines serving.
    assert low_ready >= 2, low_ready
    assert low_serving >= 2, low_serving

    # The node ends cordoned, marked drained, with nothing on it.
    row = next(r for r in c.ctl_json("nodes") if r["name"] == node)
    assert row["state"] == "cordoned"
    assert row["admin"]["flag"] == "cordoned" and row["admin"]["drained"] is True
    assert row["admin"]["reason"] == "e2e: move the work"
    assert row["replicas"] == 0

    # Every replica moved: each original had a stand-in elsewhere, and the
    # stand-ins are what serves now.
    after = of_model(c.ctl_json("replicas"), "m")
    assert len(after) == 2 and all(r["state"] == "ready" and serving(r) for r in after)
    assert all(node not in nodes_of(r) for r in after)
    assert sorted(stand_ins.values()) == sorted(moving)
    kept = {r["id"] for r in before} - moving
    assert {r["id"] for r in after} == set(stand_ins) | kept
    views = {m["spec"]["name"]: m for m in c.ctl_json("models")}
    assert views["m"]["ready"] == 2 and views["m"]["satisfied"] is True
    # The stand-ins are ordinary replicas now: the next drain's pre-check moves them.
    assert all(r["replaces"] is None for r in after)
    hosts = sorted({n for r in after if r["id"] in stand_ins for n in nodes_of(r)})
    plan = c.ctl("drain", *hosts, "--dry-run")
    assert f"moves {len(moving)} replica(s)" in plan, plan

    # And the engines on the drained node are really gone.
    assert_engines_gone(c, node, moving, set(on_node.values()))


def test_controller_killed_mid_drain_finishes_after_restart(cluster: Cluster) -> None:
    c = cluster
    start_fleet(c, ["n1", "n2", "n3"])
    # Engines that load for a while keep the drain open long enough to kill it.
    c.apply([model("m", 2, ["--load-seconds", "2.5", "--host", "127.0.0.1"])])
    before = wait_ready(c, "m", 2)
    node = busiest(before)
    moving = {r["id"] for r in before if node in nodes_of(r)}
    pids = {e["pid"] for e in c.engine_records(node)}
    c.ctl("drain", node, "--reason", "e2e: controller dies mid-drain")

    def stand_ins_placed() -> list[dict[str, Any]] | None:
        replicas = of_model(c.get("/v1/replicas"), "m")
        replaced = {r["replaces"] for r in replicas if r["replaces"]}
        return replicas if replaced == moving else None

    mid = wait_until(stand_ins_placed, timeout=20, what="stand-ins for the drained replicas")
    stand_ins = {r["id"] for r in mid if r["replaces"]}
    # Really mid-drain: the originals still there, their stand-ins not ready yet.
    assert moving <= {r["id"] for r in mid}
    assert all(r["state"] == "starting" for r in mid if r["id"] in stand_ins), mid
    ids_before_kill = {r["id"] for r in mid}

    assert c.kill_controller(signal.SIGKILL) == -signal.SIGKILL
    c.start_controller()

    seen: set[str] = set()

    def drained() -> bool:
        rows = c.try_get("/v1/nodes")
        replicas = c.try_get("/v1/replicas")
        if rows is None or replicas is None:
            return False
        seen.update(r["id"] for r in of_model(replicas, "m"))
        row = next(r for r in rows if r["name"] == node)
        return bool(row["admin"]["drained"])

    wait_until(drained, timeout=45, what=f"{node} to finish draining", diagnose=c.logs)

    # Nothing new was placed after the restart: no duplicate of a replica or stand-in.
    assert seen <= ids_before_kill, seen - ids_before_kill
    final = wait_ready(c, "m", 2)
    assert {r["id"] for r in final} == (ids_before_kill - moving)
    assert stand_ins <= {r["id"] for r in final}
    assert all(node not in nodes_of(r) for r in final)
    row = node_row(c, node)
    assert row["admin"]["flag"] == "cordoned" and row["replicas"] == 0
    assert_engines_gone(c, node, moving, pids)
    # One engine per surviving replica, none lost, none twice.
    engines = c.engine_pids()
    assert {rid: len(p) for rid, p in engines.items()} == {r["id"]: 1 for r in final}


def test_agent_restart_keeps_its_engines(cluster: Cluster) -> None:
    c = cluster
    start_fleet(c, ["n1"])
    c.apply([model("m", 1)])
    (replica,) = wait_ready(c, "m", 1)
    rid = replica["id"]
    (record,) = c.engine_records("n1")
    pid, port = record["pid"], record["port"]
    assert c.engine_pids() == {rid: {pid}}

    for restart, sig in enumerate((signal.SIGTERM, signal.SIGKILL), start=1):
        code = c.stop_agent("n1", sig)
        assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL), c.logs()
        assert pid_alive(pid), f"the engine died with the agent ({sig.name})"
        c.start_agent("n1")
        adopted = f"adopted engine {rid}/0 pid {pid}"
        wait_until(
            lambda: c.agent_log("n1").count(adopted) == restart,  # noqa: B023
            timeout=20,
            what=f"the agent to adopt its engine after {sig.name}",
            diagnose=c.logs,
        )
        adopted_at = time.monotonic()

        def fresh_report() -> bool:
            age = node_row(c, "n1")["report_age_s"]
            return age is not None and age < time.monotonic() - adopted_at - 0.3  # noqa: B023

        # Two report intervals past the adoption, so the controller has heard
        # what the new agent says about the engine.
        wait_until(fresh_report, timeout=20, what="a report from the restarted agent")
        replicas = c.get("/v1/replicas")
        assert [r["id"] for r in replicas] == [rid], f"a replica was placed anew: {replicas}"
        assert replicas[0]["state"] == "ready" and serving(replicas[0])
        assert c.engine_pids() == {rid: {pid}}
        assert [e["pid"] for e in c.engine_records("n1")] == [pid]
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200

    views = {m["spec"]["name"]: m for m in c.ctl_json("models")}
    assert views["m"]["ready"] == 1 and views["m"]["failed"] == 0


def test_a_crash_looping_engine_backs_off(cluster: Cluster) -> None:
    c = cluster
    start_fleet(c, ["n1"])
    crash_args = ["--fail-after", "0", "--exit-code", "3", "--host", "127.0.0.1"]
    c.apply([model("crash", 1, crash_args)])

    created: dict[str, float] = {}

    def four_placed() -> bool:
        for r in of_model(c.get("/v1/replicas"), "crash"):
            created.setdefault(r["id"], r["created_at"])
        return len(created) >= 4

    # With --backoff-base 1: waits of 1, 2, 4 s after the 1st, 2nd, 3rd failure.
    wait_until(four_placed, timeout=40, what="four placements", every=0.05, diagnose=c.logs)
    times = sorted(created.values())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Each placement waits at least base * 2^(failures - 1) after the one before.
    for k, gap in enumerate(gaps[:3]):
        assert gap >= 2**k - 0.01, f"placement {k + 2} came {gap:.2f}s after the one before"
    # Not a placement storm: over 20 s at most 5 tries (1 + 2 + 4 + 8 < 20 < 1 + 2 + 4 + 8 + 16).
    assert sum(t - times[0] < 20 for t in times) <= 5

    views = {m["spec"]["name"]: m for m in c.ctl_json("models")}
    crash = views["crash"]
    assert crash["satisfied"] is False and crash["ready"] == 0
    assert crash["last_failure"] and "exited with code 3" in crash["last_failure"]
    assert "simulated failure" in crash["last_failure"]  # the tail of the engine's log


def test_an_agent_that_reports_rarely_starts_and_stops_engines_at_once(cluster: Cluster) -> None:
    """Assignments reach an agent as they change (its long poll of
    /v1/agent/assignments/NODE), and it reports an engine's new state at once: with
    reports a minute apart, a model's replica is ready, and its engine gone after the
    model is deleted, each within seconds. Before, each waited for a report."""
    c = cluster
    start_fleet(c, ["n1"], interval=60.0)
    c.apply([model("m", 1)])
    [replica] = wait_ready(c, "m", 1, timeout=25)
    pids = c.engine_pids()[replica["id"]]
    c.ctl("delete", "model", "m")
    assert_engines_gone(c, "n1", {replica["id"]}, pids)
    wait_until(lambda: not c.get("/v1/replicas"), timeout=20, what="the replica gone")
