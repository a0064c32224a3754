"""Issue 13's failover matrix, as real processes: three controllers on one
PostgreSQL, six agents with fake GPUs running fake engines, replicas placed and
ready. The leader is killed with SIGKILL three times:

(a) in a steady state;
(b) during a burst of cordons and applies from a client given all three URLs;
(c) mid-drain of two nodes whose replicas must move: stand-ins placed by the
    old leader are still loading at the kill (a free node is left where a
    second stand-in would go if the new leader placed one); one drain has a
    deadline that falls due during the failover, the other none.

After each kill: exactly one leader among the live controllers, with the next
epoch; throughout the failover (sampled every 0.2 s from whichever controller
leads) no node is unreachable, no model has more replicas than declared and no
GPU is held by two replicas; once settled every model has exactly its declared
replicas, each running as real engine processes on GPUs of its own; every write
acknowledged so far is stored exactly once, an unacknowledged one whole or not at
all. The killed controller is restarted as a follower before the next kill, so
each kill leaves two controllers to choose from.

One test on one cluster, in three phases: a cluster costs about 10 s to bring
to a steady state (nine processes and their replicas on two cores), three
times that as separate tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw import api
from llmgw.sync_client import SyncAdminClient
from llmgw.wire import ModelSpec
from tests.e2e.procs import environ_of, wait_until
from tests.leader.ha import LEASE_TTL_S, HaCluster
from tests.leader.watch import FailoverWatch, active_per_model, shared_gpus

pytestmark = pytest.mark.slow

NODES = [f"n{i}" for i in range(1, 7)]  # 2 fake H100s each: 12 GPUs
CONTROLLER_ARGS = ("--reconcile-interval", "0.2")
# After placement: "big" spreads over two nodes, "small" (one replica: a second
# would spread onto a node of its own) takes one more, and three stay free:
# two for the stand-ins of (c), one where a stand-in placed twice would go. "big"
# loads slowly, so a stand-in placed just before a kill is still loading when the
# next leader takes over (about 3 s later).
BIG = {
    "name": "big",
    "source": "org/big",
    "min_replicas": 2,
    "gpus_per_shard": 2,
    "engine": "fake",
    "engine_args": ["--load-seconds", "4", "--host", "127.0.0.1"],
}
SMALL = {
    "name": "small",
    "source": "org/small",
    "min_replicas": 1,
    "gpus_per_shard": 1,
    "engine": "fake",
    "engine_args": ["--load-seconds", "0.2", "--host", "127.0.0.1"],
}
# How long after a takeover the watch goes on: past the new leader's grace
# period for every node (3 intervals of 0.5 s plus 5 s), when a node that had
# not found the new leader would turn unreachable.
WATCH_AFTER_S = 3 * 0.5 + 5 + 1


class Ledger:
    """What the controllers acknowledged (or did not) so far, checked after each kill."""

    def __init__(self) -> None:
        self.cordons: dict[str, str] = {}  # reason (unique) -> node: acknowledged
        self.unsure_cordons: dict[str, str] = {}  # refused or unanswered: at most once
        self.models: dict[str, dict[str, Any]] = {}  # name -> spec: acknowledged
        self.unsure_applies: list[list[dict[str, Any]]] = []  # whole or not at all

    def check(self, c: HaCluster) -> None:
        models = {m["spec"]["name"]: m["spec"] for m in c.get("/v1/models")}
        assert len(c.get("/v1/models")) == len(models), "a model listed twice"
        for name, spec in self.models.items():
            assert name in models, f"acknowledged apply of {name} lost"
            assert models[name] == {**models[name], **spec}, (name, models[name])
        for specs in self.unsure_applies:
            present = [s["name"] in models for s in specs]
            assert all(present) or not any(present), f"half an apply stored: {specs}"
        reasons: dict[str, list[str]] = {}
        for node in NODES:
            history = c.get(f"/v1/nodes/{node}")["history"]
            reasons[node] = [e["reason"] for e in history if e["action"] == "cordon"]
        for reason, node in self.cordons.items():
            assert reasons[node].count(reason) == 1, (node, reason, reasons[node])
        for reason, node in self.unsure_cordons.items():
            assert reasons[node].count(reason) <= 1, (node, reason, reasons[node])


@pytest.fixture
def cluster(tmp_path: Path, pg_url: str) -> Iterator[HaCluster]:
    c = HaCluster(tmp_path / "ha", pg_url, controllers=3)
    try:
        c.start(0, *CONTROLLER_ARGS, role="leader")
        c.start(1, role="follower")
        c.start(2, role="follower")
        for name in NODES:
            c.start_agent(name)
        yield c
    finally:
        c.close()


def settled(c: HaCluster) -> list[dict[str, Any]] | None:
    """The replicas, once every model has its declared number ready and nothing
    is moving; None before."""
    models = c.leader_get("/v1/models")
    reps = c.leader_get("/v1/replicas")
    if models is None or reps is None:
        return None
    declared = {m["spec"]["name"]: m["spec"]["min_replicas"] for m in models}
    # A stand-in is an ordinary replica once its drain is done, forced or not.
    ready = [r for r in reps if r["state"] == "ready" and not r.get("replaces")]
    if len(ready) != len(reps):
        return None
    counts = active_per_model(reps)
    return reps if all(counts[m] == n for m, n in declared.items()) else None


def wait_settled(c: HaCluster) -> list[dict[str, Any]]:
    reps = wait_until(
        lambda: settled(c),
        timeout=30,
        what="every model's replicas ready",
        diagnose=lambda: f"{c.leader_get('/v1/replicas')}\n{c.logs()}",
    )
    assert not shared_gpus(reps), reps
    # The engines that really run are those replicas, each on GPUs of its own.
    ids = {r["id"] for r in reps}
    wait_until(
        lambda: set(c.engine_pids()) == ids,
        timeout=20,
        what="the engines running to be the replicas listed",
        diagnose=lambda: f"{sorted(c.engine_pids())} vs {sorted(ids)}\n{c.logs()}",
    )
    holders: dict[str, str] = {}
    for rid, pids in c.engine_pids().items():
        for pid in pids:
            for gpu in environ_of(pid).get("CUDA_VISIBLE_DEVICES", "").split(","):
                assert holders.setdefault(gpu, rid) == rid, f"GPU {gpu}: {rid} and {holders[gpu]}"
    return reps


def kill_leader(c: HaCluster, watch: FailoverWatch, phase: str) -> tuple[int, int, float, float]:
    """SIGKILL the leader; wait for exactly one new leader, with the next epoch,
    named by every live controller. Returns the old and the new leader, when the
    kill was, and how long the takeover took as the watch saw it (from the kill
    to its first sample of a new leader)."""
    old = c.wait_leader()
    epoch = c.health(old)["epoch"]  # type: ignore[index]
    killed_at = time.monotonic()
    c.kill(old)
    new = c.wait_leader(timeout=LEASE_TTL_S + 10)
    assert new != old
    live = [i for i in c.procs if c.procs[i].poll() is None]
    assert sorted(live) == sorted(set(range(3)) - {old}), live
    assert c.leaders() == [new], f"{phase}: exactly one leader"

    def all_agree() -> bool:
        healths = [c.health(i) for i in live]
        return all(
            h is not None and h["leader"] == c.urls[new] and h["epoch"] == epoch + 1
            for h in healths
        )

    wait_until(all_agree, timeout=5, what=f"{phase}: both name the new leader, epoch {epoch + 1}")
    seen = wait_until(lambda: watch.first_leader_after(killed_at), timeout=5, what="the watch")
    assert seen.leader == new and seen.epoch == epoch + 1, (phase, seen)
    return old, new, killed_at, seen.at - killed_at


def watch_through(c: HaCluster, watch: FailoverWatch, killed_at: float, phase: str) -> float:
    """Go on watching past the new leader's grace period; then the watch must have
    seen no breach, and the leader's listings at least once a second since the
    takeover. Returns that longest gap."""
    took = watch.first_leader_after(killed_at)
    assert took is not None
    while time.monotonic() < took.at + WATCH_AFTER_S:
        time.sleep(0.2)
    assert not watch.breaches, f"{phase}:\n" + "\n".join(watch.breaches) + "\n" + c.logs()
    gap = watch.longest_gap(took.at, time.monotonic())
    assert gap < 1.0, f"{phase}: no listing from the leader for {gap:.1f} s"
    ages = {r["name"]: r["report_age_s"] for r in c.get("/v1/nodes")}
    assert all(a is not None and a < 2 for a in ages.values()), f"{phase}: {ages}"
    return gap


class Burst:
    """One client given every controller's URL (as ctl is) writes without pause on
    a thread: cordons with unique reasons, and applies of two new models at once.
    Each write lands in the ledger as acknowledged or not."""

    def __init__(self, urls: list[str], ledger: Ledger) -> None:
        self.urls = urls
        self.ledger = ledger
        self.acked = 0
        self.unsure = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="burst", daemon=True)

    def __enter__(self) -> Burst:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with SyncAdminClient(self.urls) as admin:
            i = 0
            while not self._stop.is_set():
                if i % 3 == 2:
                    specs = [
                        {**SMALL, "name": f"burst-{i}-{half}", "min_replicas": 0}
                        for half in ("a", "b")
                    ]
                    call: Any = api.apply_models([ModelSpec.model_validate(s) for s in specs])
                else:
                    node, reason = NODES[i % len(NODES)], f"burst {i}"
                    call = api.cordon(node, reason)
                try:
                    admin(call)
                    ok = True
                except (api.ControllerError, api.ControllerUnreachable):
                    ok = False
                if i % 3 == 2:
                    if ok:
                        self.ledger.models.update({s["name"]: s for s in specs})
                    else:
                        self.ledger.unsure_applies.append(specs)
                elif ok:
                    self.ledger.cordons[reason] = node
                else:
                    self.ledger.unsure_cordons[reason] = node
                self.acked += ok
                self.unsure += not ok
                i += 1
                time.sleep(0.03)


def test_sigkill_of_the_leader_in_steady_state_in_a_burst_and_mid_drain(
    cluster: HaCluster,
) -> None:
    c = cluster
    ledger = Ledger()
    wait_until(
        lambda: (s := c.leader_get("/v1/summary")) and s["nodes"]["ready"] == len(NODES),
        timeout=30,
        what="six ready nodes",
        diagnose=c.logs,
    )
    c.apply([BIG, SMALL])
    ledger.models.update({"big": BIG, "small": SMALL})
    reps = wait_settled(c)
    ids = {r["id"] for r in reps}
    big_nodes = sorted(s["node"] for r in reps if r["model"] == "big" for s in r["shards"])
    used = {s["node"] for r in reps for s in r["shards"]}
    assert len(big_nodes) == 2 and len(set(NODES) - used) == 3, f"stand-ins need room: {reps}"
    takeovers: dict[str, float] = {}
    gaps: dict[str, float] = {}

    with FailoverWatch(c.urls, nodes=len(NODES)) as watch:
        # (a) Steady state; a cordon just before the kill, by ctl given all three
        # URLs with a follower's first (it goes to the leader whatever the order).
        urls = c.url
        c.url = ",".join(reversed(c.urls))
        c.ctl("cordon", "n6", "--reason", "steady: before the kill")
        c.url = urls
        ledger.cordons["steady: before the kill"] = "n6"
        old, _, killed_at, takeovers["steady"] = kill_leader(c, watch, "steady")
        gaps["steady"] = watch_through(c, watch, killed_at, "steady")
        assert old == 0
        c.ctl("cordon", "n5", "--reason", "steady: the first URL dead")
        ledger.cordons["steady: the first URL dead"] = "n5"
        assert {r["id"] for r in wait_settled(c)} == ids, "nothing placed again"
        ledger.check(c)
        c.start(old, role="follower")

        # (b) A burst of cordons and two-model applies, the leader killed inside it.
        with Burst(c.urls, ledger) as burst:
            wait_until(lambda: burst.acked >= 15, timeout=20, what="writes before the kill")
            old, _, killed_at, takeovers["burst"] = kill_leader(c, watch, "burst")
            before = burst.acked
            wait_until(lambda: burst.acked >= before + 15, timeout=20, what="writes after")
        assert burst.unsure, "the kill was inside the burst"
        gaps["burst"] = watch_through(c, watch, killed_at, "burst")
        ledger.check(c)
        assert {r["id"] for r in wait_settled(c)} == ids, "nothing placed again"
        c.start(old, role="follower")

        # (c) Mid-drain: both "big" nodes drain; their stand-ins go to the free
        # nodes and load for 4 s. One drain's deadline is due before any new
        # leader can take over (the lease outlives its holder by at least 3/4 of
        # its TTL), so that leader forces it; the other has no deadline and
        # completes when its stand-in is ready, under the new leader.
        forced, moved = big_nodes
        originals = {r["id"] for r in reps if r["model"] == "big"}
        with SyncAdminClient(c.urls) as admin:
            for node in NODES:  # the burst left them cordoned; the stand-ins need room
                admin(api.uncordon(node))
            admin(api.drain(moved, "mid-drain: no deadline"))
            admin(api.drain(forced, "mid-drain: deadline", force_after_s=2))

        def stand_ins() -> dict[str, dict[str, Any]] | None:
            found = {r["replaces"]: r for r in c.leader_get("/v1/replicas") or [] if r["replaces"]}
            return found if set(found) == originals else None

        placed = wait_until(stand_ins, timeout=5, what="both stand-ins placed", diagnose=c.logs)
        force_at = c.get(f"/v1/nodes/{forced}")["row"]["admin"]["force_at"]
        for node in (forced, moved):
            assert not c.get(f"/v1/nodes/{node}")["row"]["admin"]["drained"], node
        assert all(r["state"] != "ready" for r in placed.values()), "stand-ins still loading"
        killed_wall = time.time()
        assert killed_wall < force_at, "the kill must come before the deadline"
        _, _, killed_at, takeovers["mid-drain"] = kill_leader(c, watch, "mid-drain")

        def drained() -> dict[str, Any] | None:
            details = {n: c.leader_get(f"/v1/nodes/{n}") for n in (forced, moved)}
            done = all(d and d["row"]["admin"]["drained"] for d in details.values())
            return details if done else None

        details = wait_until(drained, timeout=20, what="both drains done", diagnose=c.logs)
        gaps["mid-drain"] = watch_through(c, watch, killed_at, "mid-drain")

    events = {n: {e["action"]: e for e in d["history"]} for n, d in details.items()}
    deadline = events[forced]["drain forced (deadline)"]
    assert deadline["by"] == "llmgw" and deadline["at"] >= force_at > killed_wall
    assert events[forced]["drain"]["force_at"] == force_at
    assert "drain forced (deadline)" not in events[moved]
    assert events[moved]["drained"]["at"] > killed_wall, "completed by the new leader"
    # The stand-ins the old leader placed are the replicas now: none placed again.
    final = wait_settled(c)
    big = {r["id"]: r for r in final if r["model"] == "big"}
    assert set(big) == {r["id"] for r in placed.values()}, (big, placed)
    assert not {s["node"] for r in big.values() for s in r["shards"]} & {forced, moved}
    assert not originals & set(c.engine_pids()), "the originals' engines stopped"
    ledger.check(c)
    print(
        f"takeover after SIGKILL (s): {takeovers}; longest listing gap after it (s): {gaps}; "
        f"burst: {len(ledger.cordons) - 1} cordons and {len(ledger.models) - 2} models "
        f"acknowledged, {len(ledger.unsure_cordons)} cordons and "
        f"{len(ledger.unsure_applies)} applies not"
    )
