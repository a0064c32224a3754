"""The reconcile loop against a simulated fleet: placement, failure backoff,
lost nodes, drains that move work, and restarts that lose nothing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from fleet_factories import FakeClock, location, make_fleet, report

from llmgw.controller.reconcile import Reconciler, drain_plan
from llmgw.wire import AdminFlag, ModelSpec, ReplicaState

MODEL = ModelSpec(name="llama", source="meta/llama-8b", min_replicas=2, gpus_per_shard=4)


class Sim:
    """A controller's fleet plus agents that do what they are told."""

    def __init__(
        self, state_dir: Path, clock: FakeClock, nodes: list[str], **settings: float
    ) -> None:
        self.state_dir, self.clock, self.settings = state_dir, clock, settings
        self.nodes = list(nodes)
        self.weights: dict[str, list[str]] = {}
        self.failing: set[str] = set()  # nodes whose engines crash
        self.down: set[str] = set()
        self.fleet = make_fleet(state_dir, clock, backoff_base_s=10.0, **settings)
        self.reconciler = Reconciler(self.fleet)

    def restart_controller(self) -> None:
        """As after SIGKILL: only what the store holds survives."""
        self.fleet.flush()
        self.fleet = make_fleet(self.state_dir, self.clock, backoff_base_s=10.0, **self.settings)
        self.reconciler = Reconciler(self.fleet)

    def report(self, node: str, ready: bool = True) -> None:
        assigned = self.fleet.assignments_for(node)
        shards = [
            {
                "id": a.replica_id,
                "model": a.model,
                "rank": a.rank,
                "state": "failed" if node in self.failing else ("ready" if ready else "starting"),
                "gpus": a.gpus,
                "idle_seconds": 0.0,
                "error": "CUDA out of memory" if node in self.failing else None,
            }
            for a in assigned
        ]
        storage = [location("/models", self.weights[node])] if node in self.weights else None
        self.fleet.ingest(report(node, replicas=shards, storage=storage))

    def step(self, ready: bool = True, seconds: float = 1.0) -> None:
        """One report interval: every live agent reports, then one tick."""
        self.clock.advance(seconds)
        for node in self.nodes:
            if node not in self.down:
                self.report(node, ready)
        self.reconciler.tick()

    def replicas(self, model: str = "llama") -> list[tuple[str, ReplicaState, tuple[str, ...]]]:
        return sorted(
            (r.id, r.state, r.nodes) for r in self.fleet.records.values() if r.model == model
        )

    def serving(self, model: str = "llama") -> int:
        """Replicas answering requests (ready, or draining but not yet stopped)."""
        return next(v.ready for v in self.fleet.model_views() if v.spec.name == model)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def sim_with(tmp_path: Path, clock: FakeClock, n: int = 4, **settings: float) -> Sim:
    sim = Sim(tmp_path, clock, [f"gpu{i}" for i in range(1, n + 1)], **settings)
    for node in sim.nodes:
        sim.report(node)
    return sim


def sim_serving(tmp_path: Path, clock: FakeClock) -> Sim:
    """Four nodes with MODEL applied and two steps run: its replicas placed and serving."""
    sim = sim_with(tmp_path, clock)
    sim.fleet.put_models([MODEL])
    sim.step()
    sim.step()
    return sim


def test_places_the_minimum_and_marks_ready(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock)
    sim.fleet.put_models([MODEL])
    sim.step(ready=False)
    assert [s for _, s, _ in sim.replicas()] == [ReplicaState.STARTING] * 2
    assert sim.fleet.summary().replicas.starting == 2
    sim.step()
    assert [s for _, s, _ in sim.replicas()] == [ReplicaState.READY] * 2
    sim.step()
    assert len(sim.replicas()) == 2  # no more than asked


def test_prefers_nodes_holding_the_weights(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock)
    sim.weights["gpu3"] = ["meta/llama-8b"]
    sim.report("gpu3")
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1, "gpus_per_shard": 8})])
    sim.step()
    assert [nodes for _, _, nodes in sim.replicas()] == [("gpu3",)]


def test_assignments_reach_the_agent_with_cards(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock)
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1, "engine_args": ["--x"]})])
    sim.step()
    (rid, _, (node,)) = sim.replicas()[0]
    [a] = sim.fleet.assignments_for(node)
    assert (a.replica_id, a.source, a.engine, a.engine_args, len(a.gpus)) == (
        rid,
        "meta/llama-8b",
        "vllm",
        ["--x"],
        4,
    )
    # the cards are now used: the summary and the next placement both see it
    gpus = sim.fleet.summary().gpus[0]
    assert gpus.used == 4


def test_a_crash_looping_engine_backs_off(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    sim.failing.add("gpu1")
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    placements = 0
    seen: set[str] = set()
    for _ in range(200):  # 200 s
        sim.step()
        for rid, _, _ in sim.replicas():
            if rid not in seen:
                seen.add(rid)
                placements += 1
    # base 10 s doubling: placed at ~0, 10, 30, 70, 150 s -> about 5, never 200
    assert 3 <= placements <= 7
    view = sim.fleet.model_views()[0]
    assert view.last_failure and "CUDA out of memory" in view.last_failure
    assert sim.fleet.backoffs["llama"].failures >= 3


def test_backoff_clears_once_a_replica_is_ready(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    sim.failing.add("gpu1")
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    sim.step()
    assert "llama" in sim.fleet.backoffs
    sim.failing.clear()
    for _ in range(30):
        sim.step()
    assert [s for _, s, _ in sim.replicas()] == [ReplicaState.READY]
    assert "llama" not in sim.fleet.backoffs


def test_unplaceable_model_says_why(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    big = ModelSpec(name="big", source="s", min_replicas=1, gpus_per_shard=8, shards=3)
    sim.fleet.put_models([big])
    sim.step()
    summary = sim.fleet.summary()
    assert summary.unplaceable == ["big"]
    reason = summary.unplaceable_reasons["big"]
    assert "3 nodes" in reason and "ib-a" in reason


def test_drain_moves_every_replica_without_dropping_below_minimum(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = sim_serving(tmp_path, clock)
    victim = sim.replicas()[0][2][0]
    before = {rid for rid, _, nodes in sim.replicas() if victim in nodes}
    sim.fleet.set_flag(victim, AdminFlag.DRAINING, "BIOS update", "ops")
    sim.step(ready=False)  # stand-ins start; originals keep serving
    assert sim.serving() >= 2
    assert all(rid in {r for r, _, _ in sim.replicas()} for rid in before)
    for _ in range(5):
        sim.step()
        assert sim.serving() >= 2
    left = [rid for rid, _, nodes in sim.replicas() if victim in nodes]
    assert left == []
    row = sim.fleet.row(victim)
    assert row.state == "cordoned" and row.admin.drained and row.admin.reason == "BIOS update"
    assert len(sim.replicas()) == 2


def test_a_drain_that_cannot_place_waits_and_says_why(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    sim.fleet.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops")
    for _ in range(3):
        sim.step()
    row = sim.fleet.row("gpu1")
    assert row.state == "draining" and row.drain_blocked and "llama" in row.drain_blocked
    assert len(sim.replicas()) == 1


def test_force_drain_stops_at_once(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    sim.fleet.set_flag("gpu1", AdminFlag.DRAINING, "fire", "ops", force=True)
    sim.step()
    assert sim.fleet.assignments_for("gpu1") == []
    assert sim.fleet.row("gpu1").admin.drained


@pytest.mark.parametrize("restart", [False, True], ids=["running", "after a restart"])
def test_a_drain_deadline_is_forced_when_due(
    tmp_path: Path, clock: FakeClock, restart: bool
) -> None:
    """A drain that cannot finish waits until its deadline, then is forced by the
    controller itself; the deadline is durable, so a restart keeps it."""
    sim = sim_with(tmp_path, clock, n=1)
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    row = sim.fleet.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops", force_after_s=30)
    assert row.admin.force_at == sim.fleet.wall() + 30 and not row.admin.force
    for _ in range(5):
        sim.step(seconds=5)  # 25 s: not due
    assert sim.fleet.row("gpu1").drain_blocked and len(sim.replicas()) == 1
    if restart:
        sim.restart_controller()
        assert sim.fleet.admin_info("gpu1").force_at == row.admin.force_at
    sim.step(seconds=6)  # 31 s
    assert sim.fleet.assignments_for("gpu1") == []
    assert sim.replicas() == [] or all(n != ("gpu1",) for _, _, n in sim.replicas())
    assert sim.fleet.row("gpu1").admin.drained
    actions = [e.action for e in sim.fleet.detail("gpu1").history]
    assert actions[:3] == ["drained", "drain forced (deadline)", "drain"]
    assert sim.fleet.detail("gpu1").history[2].force_at == row.admin.force_at


def test_a_new_drain_or_uncordon_drops_the_deadline(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    sim.fleet.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops", force_after_s=10)
    assert sim.fleet.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops").admin.force_at is None
    sim.fleet.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops", force_after_s=10)
    sim.fleet.set_flag("gpu1", AdminFlag.NONE, None, "ops")
    clock.advance(20)
    assert sim.fleet.due_drains(sim.fleet.wall()) == []


def test_uncordon_mid_drain_keeps_the_replicas(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1, "gpus_per_shard": 8})])
    sim.step()
    node = sim.replicas()[0][2][0]
    sim.fleet.set_flag(node, AdminFlag.DRAINING, "x", "ops")
    sim.step(ready=False)
    assert len(sim.replicas()) == 2
    sim.fleet.set_flag(node, AdminFlag.NONE, None, "ops")
    sim.step(ready=False)
    assert [(s, n) for _, s, n in sim.replicas()] == [(ReplicaState.READY, (node,))]


def test_controller_killed_mid_drain_finishes_after_restart(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = sim_serving(tmp_path, clock)
    victim = sim.replicas()[0][2][0]
    sim.fleet.set_flag(victim, AdminFlag.DRAINING, "BIOS", "ops")
    sim.step(ready=False)
    mid = sim.replicas()
    sim.restart_controller()
    assert sim.replicas() == mid  # nothing lost, nothing added
    for _ in range(5):
        sim.step()
    assert len(sim.replicas()) == 2
    assert not any(victim in nodes for _, _, nodes in sim.replicas())
    assert sim.fleet.row(victim).admin.drained


def test_restart_neither_duplicates_nor_loses_replicas(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_serving(tmp_path, clock)
    before = sim.replicas()
    sim.restart_controller()
    for _ in range(3):
        sim.step()
    assert sim.replicas() == before


def test_replicas_on_a_lost_node_are_replaced_and_orphans_dropped(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = sim_with(tmp_path, clock, n=2, replace_after_s=60.0)
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1, "gpus_per_shard": 8})])
    sim.step()
    (rid, _, (node,)) = sim.replicas()[0]
    sim.down.add(node)
    for _ in range(30):
        sim.step(seconds=2)
    assert sim.replicas()[0][0] == rid  # unreachable but not yet long enough
    for _ in range(30):
        sim.step(seconds=2)
    [(new_id, _, (new_node,))] = sim.replicas()
    assert new_id != rid and new_node != node
    sim.down.clear()
    sim.step()
    assert sim.fleet.assignments_for(node) == []  # its agent stops the orphan


def test_deleting_a_model_stops_its_replicas(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock)
    sim.fleet.put_models([MODEL])
    sim.step()
    sim.fleet.delete_model("llama")
    sim.step()
    assert sim.replicas() == []
    assert all(sim.fleet.assignments_for(n) == [] for n in sim.nodes)


def test_drain_plan_names_models_that_would_fall_short(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 2, "gpus_per_shard": 8})])
    sim.step()
    sim.step()
    plan = drain_plan(sim.fleet, ["gpu1"])
    assert plan.replicas_to_move == 1
    [impact] = plan.impacts
    assert impact.model == "llama" and impact.verdict == "below_minimum"


def test_moved_replicas_count_in_the_next_drain_plan(tmp_path: Path, clock: FakeClock) -> None:
    """A finished drain leaves ordinary replicas behind: draining their nodes in
    turn must move them (the pre-check once ignored former stand-ins)."""
    sim = sim_serving(tmp_path, clock)
    victim = sim.replicas()[0][2][0]
    sim.fleet.set_flag(victim, AdminFlag.DRAINING, "BIOS", "ops")
    for _ in range(5):
        sim.step()
    assert sim.fleet.row(victim).admin.drained
    assert all(r.replaces is None for r in sim.fleet.records.values())
    hosts = sorted({n for _, _, nodes in sim.replicas() for n in nodes})
    plan = drain_plan(sim.fleet, hosts)
    assert plan.replicas_to_move == 2
    # A stand-in recorded before this fix (its original gone) counts too.
    sim.fleet.put_replicas(
        dataclasses.replace(r, replaces="gone") for r in list(sim.fleet.records.values())
    )
    assert drain_plan(sim.fleet, hosts).replicas_to_move == 2


def test_an_engine_that_crashes_while_draining_is_not_counted_ready(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A drain that waits (nowhere to move) must not hide a crash: the model
    falls short, the failure is kept, and the empty node ends drained."""
    sim = sim_with(tmp_path, clock, n=1)
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    sim.step()
    sim.fleet.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops")
    sim.step()
    assert sim.fleet.row("gpu1").drain_blocked
    sim.failing.add("gpu1")
    sim.step()
    [view] = sim.fleet.model_views()
    assert view.ready == 0 and not view.satisfied
    assert view.last_failure == "CUDA out of memory"
    assert sim.replicas() == []
    assert sim.fleet.row("gpu1").admin.drained


def test_cached_replies_follow_state_and_assignments(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    first = json.loads(sim.fleet.ingest_json(report("gpu1")))
    assert (first["state"], first["assignments"]) == ("ready", [])
    assert sim.fleet.ingest_json(report("gpu1")) == sim.fleet.ingest_json(report("gpu1"))
    sim.fleet.set_flag("gpu1", AdminFlag.CORDONED, "x", "ops")
    assert json.loads(sim.fleet.ingest_json(report("gpu1")))["admin_flag"] == "cordoned"
    sim.fleet.set_flag("gpu1", AdminFlag.NONE, None, "ops")
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.reconciler.tick()
    [assignment] = json.loads(sim.fleet.ingest_json(report("gpu1")))["assignments"]
    assert assignment["model"] == "llama" and len(assignment["gpus"]) == 4
    sim.fleet.put_models(
        [MODEL.model_copy(update={"min_replicas": 1, "source": "elsewhere/llama"})]
    )
    [assignment] = json.loads(sim.fleet.ingest_json(report("gpu1")))["assignments"]
    assert assignment["source"] == "elsewhere/llama"
    sim.fleet.delete_model("llama")
    sim.reconciler.tick()  # no gateway: stopped on the next pass
    assert json.loads(sim.fleet.ingest_json(report("gpu1")))["assignments"] == []


def test_leader_addresses_reach_followers_and_new_nodes_keep_cached_replies(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    sim.fleet.put_models(
        [ModelSpec(name="two", source="s", min_replicas=1, gpus_per_shard=8, shards=2)]
    )
    sim.step(ready=False)
    [rec] = sim.fleet.records.values()
    leader, follower = rec.shards[0].node, rec.shards[1].node

    def ingest(node: str, address: str | None = None) -> bytes:
        return sim.fleet.ingest_json(report(node).model_copy(update={"address": address}))

    def leader_address() -> str | None:
        [assignment] = json.loads(ingest(follower))["assignments"]
        return assignment["leader_address"]

    assert leader_address() is None
    ingest(leader, "10.0.0.1")
    assert leader_address() == "10.0.0.1"
    cached = ingest(follower)
    ingest("gpu9", "10.0.0.9")  # a new node, with an address, leads nothing
    assert ingest(follower) is cached


def test_a_forced_drain_survives_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    sim.fleet.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    sim.fleet.set_flag("gpu1", AdminFlag.DRAINING, "fire", "ops", force=True)
    sim.restart_controller()
    assert sim.fleet.admin_info("gpu1").force
    sim.step()
    assert sim.fleet.assignments_for("gpu1") == []
    assert sim.fleet.row("gpu1").admin.drained
