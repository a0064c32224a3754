"""The reconcile loop against a simulated fleet: placement, failure backoff,
lost nodes, drains that move work, restarts that lose nothing, and passes whose
work is bounded whatever the specs ask for."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from fleet_factories import FakeClock, gpu, location, make_fleet, report

import llmgw.scheduler
from llmgw.controller.loop import picture
from llmgw.controller.loop.drains import due_drains
from llmgw.controller.loop.picture import snapshot_in_steps
from llmgw.controller.loop.reconcile import Reconciler, drain_plan, snapshot
from llmgw.scheduler import Placement, Unplaceable, place
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
        self.gpu_class: dict[str, str] = {}  # nodes whose cards are not the default class
        self.failing: set[str] = set()  # nodes whose engines crash
        self.down: set[str] = set()
        self.busy: set[str] = set()  # nodes whose every card something else took
        self.fleet = make_fleet(state_dir, clock, backoff_base_s=10.0, **settings)
        self.reconciler = Reconciler(self.fleet)

    def restart_controller(self) -> None:
        """As after SIGKILL: only what the store holds survives."""
        self.fleet.facts.flush()
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
        cls = self.gpu_class.get(node)
        gpus = [gpu(node, i, cls) for i in range(8)] if cls else None
        if node in self.busy:
            gpus = [gpu(node, i, in_use=True) for i in range(8)]
        self.fleet.ingest(report(node, gpus=gpus, replicas=shards, storage=storage))

    def step(self, ready: bool = True, seconds: float = 1.0) -> None:
        """One report interval: every live agent reports, then one tick."""
        self.clock.advance(seconds)
        for node in self.nodes:
            if node not in self.down:
                self.report(node, ready)
        self.reconciler.tick()

    def replicas(self, model: str = "llama") -> list[tuple[str, ReplicaState, tuple[str, ...]]]:
        return sorted(
            (r.id, r.state, r.nodes) for r in self.fleet.facts.records.values() if r.model == model
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
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    sim.step()
    return sim


def test_replicas_of_a_model_spread_over_nodes(tmp_path: Path, clock: FakeClock) -> None:
    """Issue 21: both replicas of a model landed on the first node of an idle fleet."""
    sim = sim_with(tmp_path, clock)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    assert sorted(nodes for _, _, nodes in sim.replicas()) == [("gpu1",), ("gpu2",)]
    sim.step()
    [view] = sim.fleet.model_views()
    assert (view.ready, view.nodes) == (2, 2)
    # A drain's stand-in avoids the node that runs the other replica too.
    sim.fleet.facts.set_flag("gpu1", AdminFlag.DRAINING, "BIOS update", "ops")
    sim.step()
    stand_in = [nodes for _, s, nodes in sim.replicas() if s is ReplicaState.STARTING]
    assert stand_in == [("gpu3",)]


def test_a_model_view_counts_the_nodes_under_its_serving_replicas(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = sim_with(tmp_path, clock, n=1)  # one node: both replicas on it
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    [view] = sim.fleet.model_views()
    assert (view.ready, view.starting, view.nodes) == (0, 2, 0)  # starting ones serve nothing
    sim.step()
    [view] = sim.fleet.model_views()
    assert (view.ready, view.nodes) == (2, 1)


def test_places_the_minimum_and_marks_ready(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock)
    sim.fleet.facts.put_models([MODEL])
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
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1, "gpus_per_shard": 8})])
    sim.step()
    assert [nodes for _, _, nodes in sim.replicas()] == [("gpu3",)]


def test_assignments_reach_the_agent_with_cards(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock)
    sim.fleet.facts.put_models(
        [MODEL.model_copy(update={"min_replicas": 1, "engine_args": ["--x"]})]
    )
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
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1})])
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
    assert sim.fleet.facts.backoffs["llama"].failures >= 3


def test_backoff_clears_once_a_replica_is_ready(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    sim.failing.add("gpu1")
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    sim.step()
    assert "llama" in sim.fleet.facts.backoffs
    sim.failing.clear()
    for _ in range(30):
        sim.step()
    assert [s for _, s, _ in sim.replicas()] == [ReplicaState.READY]
    assert "llama" in sim.fleet.facts.backoffs, "ready, but not for backoff_reset_s yet"
    clock.advance(sim.fleet.facts.settings.backoff_reset_s)
    sim.step()
    assert "llama" not in sim.fleet.facts.backoffs


def test_unplaceable_model_says_why(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    big = ModelSpec(name="big", source="s", min_replicas=1, gpus_per_shard=8, shards=3)
    sim.fleet.facts.put_models([big])
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
    sim.fleet.facts.set_flag(victim, AdminFlag.DRAINING, "BIOS update", "ops")
    sim.step()  # stand-ins start; originals keep serving
    assert sim.serving() >= 2
    assert all(rid in {r for r, _, _ in sim.replicas()} for rid in before)
    for _ in range(5):
        sim.step()
        assert sim.serving() >= 2
    left = [rid for rid, _, nodes in sim.replicas() if victim in nodes]
    assert left == []
    row = sim.fleet.rows.row(victim)
    assert row.state == "cordoned" and row.admin.drained and row.admin.reason == "BIOS update"
    assert len(sim.replicas()) == 2


def test_a_drain_that_cannot_place_waits_and_says_why(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    sim.fleet.facts.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops")
    for _ in range(3):
        sim.step()
    row = sim.fleet.rows.row("gpu1")
    assert row.state == "draining" and row.drain_blocked and "llama" in row.drain_blocked
    assert len(sim.replicas()) == 1


def test_force_drain_stops_at_once(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    sim.fleet.facts.set_flag("gpu1", AdminFlag.DRAINING, "fire", "ops", force=True)
    sim.step()
    assert sim.fleet.assignments_for("gpu1") == []
    assert sim.fleet.rows.row("gpu1").admin.drained


def test_a_forced_drain_leaves_its_stand_ins_ordinary_replicas(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A stand-in still loading when the drain is forced is kept, and no longer
    names the original that was stopped (as when a drain completes normally)."""
    sim = sim_with(tmp_path, clock, n=2)
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1, "gpus_per_shard": 8})])
    sim.step()
    [(original, _, (node,))] = sim.replicas()
    sim.fleet.facts.set_flag(node, AdminFlag.DRAINING, "swap", "ops")
    sim.step(ready=False)
    [stand_in] = [r for r in sim.fleet.facts.records.values() if r.replaces == original]
    sim.fleet.facts.set_flag(node, AdminFlag.DRAINING, "swap", "ops", force=True)
    sim.step(ready=False)
    assert sim.fleet.rows.row(node).admin.drained
    assert list(sim.fleet.facts.records) == [stand_in.id]
    assert sim.fleet.facts.records[stand_in.id].replaces is None
    sim.restart_controller()  # and so it is stored
    assert sim.fleet.facts.records[stand_in.id].replaces is None


@pytest.mark.parametrize("restart", [False, True], ids=["running", "after a restart"])
def test_a_drain_deadline_is_forced_when_due(
    tmp_path: Path, clock: FakeClock, restart: bool
) -> None:
    """A drain that cannot finish waits until its deadline, then is forced by the
    controller itself; the deadline is durable, so a restart keeps it."""
    sim = sim_with(tmp_path, clock, n=1)
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    sim.fleet.facts.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops", force_after_s=30)
    row = sim.fleet.rows.row("gpu1")
    assert row.admin.force_at == sim.fleet.facts.wall() + 30 and not row.admin.force
    for _ in range(5):
        sim.step(seconds=5)  # 25 s: not due
    assert sim.fleet.rows.row("gpu1").drain_blocked and len(sim.replicas()) == 1
    if restart:
        sim.restart_controller()
        assert sim.fleet.facts.admin_info("gpu1").force_at == row.admin.force_at
    sim.step(seconds=6)  # 31 s
    assert sim.fleet.assignments_for("gpu1") == []
    assert sim.replicas() == [] or all(n != ("gpu1",) for _, _, n in sim.replicas())
    assert sim.fleet.rows.row("gpu1").admin.drained
    actions = [e.action for e in sim.fleet.rows.detail("gpu1").history]
    assert actions[:3] == ["drained", "drain forced (deadline)", "drain"]
    assert sim.fleet.rows.detail("gpu1").history[2].force_at == row.admin.force_at


def test_a_new_drain_or_uncordon_drops_the_deadline(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    sim.fleet.facts.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops", force_after_s=10)
    sim.fleet.facts.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops")
    assert sim.fleet.rows.row("gpu1").admin.force_at is None
    sim.fleet.facts.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops", force_after_s=10)
    sim.fleet.facts.set_flag("gpu1", AdminFlag.NONE, None, "ops")
    clock.advance(20)
    assert due_drains(sim.fleet.facts.admin, sim.fleet.facts.wall()) == []


def test_uncordon_mid_drain_keeps_the_replicas(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1, "gpus_per_shard": 8})])
    sim.step()
    node = sim.replicas()[0][2][0]
    sim.fleet.facts.set_flag(node, AdminFlag.DRAINING, "x", "ops")
    sim.step(ready=False)
    assert len(sim.replicas()) == 2
    sim.fleet.facts.set_flag(node, AdminFlag.NONE, None, "ops")
    sim.step(ready=False)
    assert [(s, n) for _, s, n in sim.replicas()] == [(ReplicaState.READY, (node,))]


def test_controller_killed_mid_drain_finishes_after_restart(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = sim_serving(tmp_path, clock)
    victim = sim.replicas()[0][2][0]
    sim.fleet.facts.set_flag(victim, AdminFlag.DRAINING, "BIOS", "ops")
    sim.step(ready=False)
    mid = sim.replicas()
    sim.restart_controller()
    assert sim.replicas() == mid  # nothing lost, nothing added
    for _ in range(5):
        sim.step()
    assert len(sim.replicas()) == 2
    assert not any(victim in nodes for _, _, nodes in sim.replicas())
    assert sim.fleet.rows.row(victim).admin.drained


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
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1, "gpus_per_shard": 8})])
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
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    sim.fleet.facts.delete_model("llama")
    sim.step()
    assert sim.replicas() == []
    assert all(sim.fleet.assignments_for(n) == [] for n in sim.nodes)


def test_drain_plan_names_models_that_would_fall_short(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 2, "gpus_per_shard": 8})])
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
    sim.fleet.facts.set_flag(victim, AdminFlag.DRAINING, "BIOS", "ops")
    for _ in range(5):
        sim.step()
    assert sim.fleet.rows.row(victim).admin.drained
    assert all(r.replaces is None for r in sim.fleet.facts.records.values())
    hosts = sorted({n for _, _, nodes in sim.replicas() for n in nodes})
    plan = drain_plan(sim.fleet, hosts)
    assert plan.replicas_to_move == 2
    # A stand-in recorded before this fix (its original gone) counts too.
    sim.fleet.facts.put_replicas(
        dataclasses.replace(r, replaces="gone") for r in list(sim.fleet.facts.records.values())
    )
    assert drain_plan(sim.fleet, hosts).replicas_to_move == 2


def test_an_engine_that_crashes_while_draining_is_not_counted_ready(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A drain that waits (nowhere to move) must not hide a crash: the model
    falls short, the failure is kept, and the empty node ends drained."""
    sim = sim_with(tmp_path, clock, n=1)
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    sim.step()
    sim.fleet.facts.set_flag("gpu1", AdminFlag.DRAINING, "swap", "ops")
    sim.step()
    assert sim.fleet.rows.row("gpu1").drain_blocked
    sim.failing.add("gpu1")
    sim.step()
    [view] = sim.fleet.model_views()
    assert view.ready == 0 and not view.satisfied
    assert view.last_failure == "CUDA out of memory"
    assert sim.replicas() == []
    assert sim.fleet.rows.row("gpu1").admin.drained


def test_cached_replies_follow_state_and_assignments(tmp_path: Path, clock: FakeClock) -> None:
    sim = sim_with(tmp_path, clock, n=1)
    first = json.loads(sim.fleet.ingest_json(report("gpu1")))
    assert (first["state"], first["assignments"]) == ("ready", [])
    assert sim.fleet.ingest_json(report("gpu1")) == sim.fleet.ingest_json(report("gpu1"))
    sim.fleet.facts.set_flag("gpu1", AdminFlag.CORDONED, "x", "ops")
    assert json.loads(sim.fleet.ingest_json(report("gpu1")))["admin_flag"] == "cordoned"
    sim.fleet.facts.set_flag("gpu1", AdminFlag.NONE, None, "ops")
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.reconciler.tick()
    [assignment] = json.loads(sim.fleet.ingest_json(report("gpu1")))["assignments"]
    assert assignment["model"] == "llama" and len(assignment["gpus"]) == 4
    sim.fleet.facts.put_models(
        [MODEL.model_copy(update={"min_replicas": 1, "source": "elsewhere/llama"})]
    )
    # A changed source is rolled out: the engine keeps what it was started with
    # until a replica of the new revision takes its place (this one never reported
    # ready, so it serves nothing and goes at once).
    [assignment] = json.loads(sim.fleet.ingest_json(report("gpu1")))["assignments"]
    assert assignment["source"] == MODEL.source
    sim.reconciler.tick()
    [assignment] = json.loads(sim.fleet.ingest_json(report("gpu1")))["assignments"]
    assert assignment["source"] == "elsewhere/llama"
    sim.fleet.facts.delete_model("llama")
    sim.reconciler.tick()  # no gateway: stopped on the next pass
    assert json.loads(sim.fleet.ingest_json(report("gpu1")))["assignments"] == []


def test_leader_addresses_reach_followers_and_new_nodes_keep_cached_replies(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    sim.fleet.facts.put_models(
        [ModelSpec(name="two", source="s", min_replicas=1, gpus_per_shard=8, shards=2)]
    )
    sim.step(ready=False)
    [rec] = sim.fleet.facts.records.values()
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
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 1})])
    sim.step()
    sim.fleet.facts.set_flag("gpu1", AdminFlag.DRAINING, "fire", "ops", force=True)
    sim.restart_controller()
    assert sim.fleet.facts.admin_info("gpu1").force
    sim.step()
    assert sim.fleet.assignments_for("gpu1") == []
    assert sim.fleet.rows.row("gpu1").admin.drained


# -- bounded passes (issue 10 item 3) ---------------------------------------------------

BIG = ModelSpec(name="big", source="x", min_replicas=10_000, gpus_per_shard=64, engine="fake")


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every placement attempt the scheduler makes (one replica each), by model."""
    made: list[str] = []
    real = llmgw.scheduler._Allocation.place

    def counting(self: llmgw.scheduler._Allocation, spec: ModelSpec) -> Placement | Unplaceable:
        made.append(spec.name)
        return real(self, spec)

    monkeypatch.setattr(llmgw.scheduler._Allocation, "place", counting)
    return made


def scheduler_says(sim: Sim, spec: ModelSpec, attempts: list[str] | None = None) -> str:
    """The reason the scheduler gives for `spec` on the fleet as it is (not counted)."""
    result = place(spec, snapshot(sim.fleet, sim.clock()))
    if attempts is not None:
        attempts.pop()
    assert isinstance(result, Unplaceable), result
    return result.reason


def reasons_everywhere(sim: Sim, model: str) -> set[str | None]:
    """What every view says about why `model` cannot be placed (the summary lists
    only models short of their minimum with none starting)."""
    [view] = [v for v in sim.fleet.model_views() if v.spec.name == model]
    return {
        sim.fleet.unplaceable_reasons.get(model),
        sim.fleet.summary().unplaceable_reasons.get(model),
        view.unplaceable_reason,
    }


def test_a_model_that_cannot_fit_is_tried_once_per_capacity_change(
    tmp_path: Path, clock: FakeClock, attempts: list[str]
) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    sim.fleet.facts.put_models([BIG])
    sim.step()
    assert attempts == ["big"]  # not 10,000 attempts
    assert reasons_everywhere(sim, "big") == {scheduler_says(sim, BIG, attempts)}
    attempts.clear()
    for _ in range(5):  # every agent reports, nothing changes
        sim.step()
    assert attempts == []
    sim.nodes.append("gpu3")  # a new node reports: capacity moved
    sim.step()
    assert attempts == ["big"]
    sim.fleet.facts.set_flag("gpu1", AdminFlag.CORDONED, "x", "ops")  # and again
    sim.step()
    sim.step()
    assert attempts == ["big", "big"]
    assert reasons_everywhere(sim, "big") == {scheduler_says(sim, BIG, attempts)}


def test_a_model_that_did_not_fit_is_placed_once_capacity_arrives(
    tmp_path: Path, clock: FakeClock, attempts: list[str]
) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    b200 = ModelSpec(name="b200", source="s", min_replicas=2, gpus_per_shard=8, gpu_class="B200")
    sim.fleet.facts.put_models([b200])
    sim.step()
    sim.step()
    assert reasons_everywhere(sim, "b200") == {
        "needs 1 node with 8 free B200; no ready node has GPUs of class B200;"
        " ready nodes have H100-SXM-80GB"
    }
    attempts.clear()
    sim.gpu_class["gpu3"] = "B200"
    sim.nodes.append("gpu3")
    sim.step()
    assert [nodes for _, _, nodes in sim.replicas("b200")] == [("gpu3",)]
    assert attempts == ["b200", "b200"]  # the first fits, the second does not
    sim.step()  # ready: the summary counts the model as short again
    assert reasons_everywhere(sim, "b200") == {
        "needs 1 node with 8 free B200; no ready node has a free one"
    }
    sim.gpu_class["gpu4"] = "B200"
    sim.nodes.append("gpu4")
    sim.step()
    assert sorted(nodes for _, _, nodes in sim.replicas("b200")) == [("gpu3",), ("gpu4",)]
    assert reasons_everywhere(sim, "b200") == {None}


def test_a_model_is_not_tried_again_for_its_other_missing_replicas_in_a_pass(
    tmp_path: Path, clock: FakeClock, attempts: list[str]
) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    many = MODEL.model_copy(update={"min_replicas": 10_000, "gpus_per_shard": 8})
    sim.fleet.facts.put_models([many])
    sim.step()
    assert attempts == ["llama"] * 3  # two fit, the third does not, the rest are not tried
    assert len(sim.replicas()) == 2
    # Its own placements moved capacity: one more look, then none until something changes.
    sim.step()
    sim.step()
    sim.step()
    assert attempts == ["llama"] * 4
    assert reasons_everywhere(sim, "llama") == {scheduler_says(sim, many, attempts)}


def test_a_pass_makes_at_most_its_attempts_and_the_next_goes_on_fairly(
    tmp_path: Path, clock: FakeClock, attempts: list[str]
) -> None:
    sim = sim_with(tmp_path, clock, n=4)
    sim.reconciler = Reconciler(sim.fleet, attempts_per_pass=5)
    one_gpu = {"gpus_per_shard": 1}
    a = MODEL.model_copy(update={"name": "a", "min_replicas": 12, **one_gpu})
    b = MODEL.model_copy(update={"name": "b", "min_replicas": 1, **one_gpu})
    sim.fleet.facts.put_models([a, b])
    counts = []
    for _ in range(4):
        sim.step(ready=False)
        counts.append((len(sim.replicas("a")), len(sim.replicas("b"))))
    # The first pass spends its 5 on "a"; the next starts after it, so "b" is not
    # kept waiting until "a" has all 12.
    assert counts == [(5, 0), (9, 1), (12, 1), (12, 1)]
    assert len(attempts) == 5 + 5 + 3
    assert reasons_everywhere(sim, "a") == {None} == reasons_everywhere(sim, "b")


async def test_the_event_loop_runs_between_the_slices_of_a_pass(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = sim_with(tmp_path, clock, n=4)
    sim.reconciler = Reconciler(sim.fleet, attempts_per_slice=4, slice_s=60.0, pass_s=60.0)
    sim.fleet.facts.put_models([MODEL.model_copy(update={"min_replicas": 20, "gpus_per_shard": 1})])
    seen: list[int] = []

    async def other_work() -> None:
        while True:
            seen.append(len(sim.fleet.facts.records))
            await asyncio.sleep(0)

    task = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    await sim.reconciler.run_pass()
    task.cancel()
    assert len(sim.replicas()) == 20
    # Another task ran after every slice, and each slice had committed its work.
    assert sorted(set(seen)) == [0, 4, 8, 12, 16, 20]


@pytest.mark.parametrize("change", ["cordoned", "cards busy"])
async def test_a_change_between_slices_is_seen_by_the_next(
    tmp_path: Path, clock: FakeClock, attempts: list[str], change: str
) -> None:
    """A node cordoned, or whose cards got busy, while the pass is yielding gets
    nothing more from it."""
    sim = sim_with(tmp_path, clock, n=2)
    sim.reconciler = Reconciler(sim.fleet, attempts_per_slice=4, slice_s=60.0, pass_s=60.0)
    many = MODEL.model_copy(update={"min_replicas": 16, "gpus_per_shard": 1})
    sim.fleet.facts.put_models([many])
    before_cordon: set[str] = set()

    async def operator() -> None:
        for _ in range(1_000_000):  # every turn of the loop, until the first slice commits
            await asyncio.sleep(0)
            if sim.fleet.facts.records:
                break
        before_cordon.update(sim.fleet.facts.records)
        if change == "cordoned":
            sim.fleet.facts.set_flag("gpu2", AdminFlag.CORDONED, "x", "ops")
        else:  # something outside the controller's knowledge took every card
            sim.busy.add("gpu2")  # and its agent keeps saying so
            sim.report("gpu2")

    task = asyncio.create_task(operator())
    await sim.reconciler.run_pass()
    await task
    after = [r for r in sim.fleet.facts.records.values() if r.id not in before_cordon]
    assert len(before_cordon) == 4 and len(after) == 8 - sum(
        r.nodes == ("gpu1",) for r in sim.fleet.facts.records.values() if r.id in before_cordon
    )
    assert all(r.nodes == ("gpu1",) for r in after)
    sim.step()
    assert reasons_everywhere(sim, "llama") == {scheduler_says(sim, many, attempts)}


def test_a_reconciler_needs_room_for_one_attempt(tmp_path: Path, clock: FakeClock) -> None:
    fleet = make_fleet(tmp_path, clock)
    with pytest.raises(ValueError, match="at least one placement attempt"):
        Reconciler(fleet, attempts_per_pass=0)
    with pytest.raises(ValueError, match="at least one placement attempt"):
        Reconciler(fleet, attempts_per_slice=0)


def test_capacity_version_moves_with_what_placement_reads_and_only_then(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = sim_with(tmp_path, clock, n=2)
    fleet = sim.fleet
    moves: list[str] = []

    def check(what: str, action: object = None) -> None:
        before = fleet.capacity_version
        if callable(action):
            action()
        fleet.facts.advance_time()
        if fleet.capacity_version != before:
            moves.append(what)

    check("unchanged report", lambda: sim.report("gpu1"))
    check("new node", lambda: sim.report("gpu3"))
    busy = [gpu("gpu1", i, in_use=i == 0) for i in range(8)]
    check("a card in use", lambda: fleet.ingest(report("gpu1", gpus=busy)))
    swapped = [*busy[:7], gpu("gpu1", 9)]  # same counts, another card
    check("a card swapped", lambda: fleet.ingest(report("gpu1", gpus=swapped)))
    check("weights", lambda: (sim.weights.update(gpu2=["m"]), sim.report("gpu2")))
    check("cordon", lambda: fleet.facts.set_flag("gpu2", AdminFlag.CORDONED, "x", "ops"))
    check("model", lambda: fleet.facts.put_models([MODEL]))
    check("placed", sim.reconciler.tick)
    check("time passes, nothing due", lambda: clock.advance(1))
    check("unreachable", lambda: clock.advance(60))
    check("forgotten", lambda: fleet.facts.forget_node("gpu3", "ops"))
    assert moves == [
        "new node",
        "a card in use",
        "a card swapped",
        "weights",
        "cordon",
        "model",
        "placed",
        "unreachable",
        "forgotten",
    ]


async def test_reports_between_slices_do_not_make_each_slice_rebuild_the_snapshot(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capacity moving under a pass (a busy fleet) costs no fleet-wide rebuild per
    slice: one snapshot per pass, and every model still gets its exact reason."""
    import llmgw.controller.loop.picture as picture

    built: list[int] = []
    real = picture.snapshot

    def counting(*args: object, **kwargs: object) -> object:
        built.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(picture, "snapshot", counting)
    sim = sim_with(tmp_path, clock, n=2)
    sim.reconciler = Reconciler(sim.fleet, attempts_per_slice=2, slice_s=60.0, pass_s=60.0)
    specs = [
        ModelSpec(name=f"m{g:02d}", source="s", min_replicas=1, gpus_per_shard=g)
        for g in range(9, 29)
    ]
    sim.fleet.facts.put_models(specs)

    async def churn() -> None:
        for i in range(10_000):
            flip = [gpu("gpu2", k, in_use=k == 7 and i % 2 == 0) for k in range(8)]
            sim.fleet.ingest(report("gpu2", gpus=flip))
            await asyncio.sleep(0)

    task = asyncio.create_task(churn())
    await sim.reconciler.run_pass()
    task.cancel()
    assert built == [1]
    assert all(
        sim.fleet.unplaceable_reasons[s.name].startswith(f"needs 1 node with {s.gpus_per_shard} ")
        for s in specs
    )
    # Next pass, with the fleet still: one look at each model on a fresh picture.
    sim.step()
    assert built == [1, 1]
    assert all(sim.fleet.unplaceable_reasons[s.name] == scheduler_says(sim, s) for s in specs)


def test_the_snapshot_kept_between_passes_is_the_fleet_as_it_is(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Only nodes whose capacity changed are rebuilt; what comes out is always what a
    fresh snapshot says."""
    sim = sim_with(tmp_path, clock, n=3)
    fleet, reconciler = sim.fleet, sim.reconciler

    def kept() -> list[object]:
        steps = snapshot_in_steps(fleet, reconciler.memory)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return list(done.value)

    changes = [
        lambda: None,
        lambda: fleet.facts.set_flag("gpu1", AdminFlag.CORDONED, "x", "ops"),
        lambda: fleet.ingest(report("gpu2", gpus=[gpu("gpu2", i, in_use=i < 3) for i in range(8)])),
        lambda: (fleet.facts.put_models([MODEL]), sim.step()),
        lambda: (sim.weights.update(gpu3=["meta/llama-8b"]), sim.report("gpu3")),
        lambda: fleet.facts.put_models(
            [MODEL.model_copy(update={"name": "other", "source": "x/y"})]
        ),
        lambda: (sim.weights.update(gpu3=["x/y"]), sim.report("gpu3")),
        lambda: sim.report("gpu4"),
        lambda: fleet.facts.forget_node("gpu4", "ops"),
        lambda: fleet.facts.remove_replicas(list(fleet.facts.records)),
        lambda: (clock.advance(60), fleet.facts.advance_time()),
    ]
    for change in changes:
        change()
        assert kept() == snapshot(fleet, clock())


async def test_a_pass_out_of_time_leaves_the_rest_to_the_next(
    tmp_path: Path, clock: FakeClock, attempts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its time a pass stops after the slice it is in (it always does one);
    the next goes on, on the same picture while nothing has moved."""
    # A picture extends its pass by as long as it took to build; a build preempted on
    # a busy machine (once in a clean-clone CI) outlasted the slice after it, and the
    # pass went on. Building takes no time here, so the pass is over after one slice.
    monkeypatch.setattr(picture, "time", SimpleNamespace(perf_counter=lambda: 0.0))
    sim = sim_with(tmp_path, clock, n=4)
    sim.reconciler = Reconciler(sim.fleet, attempts_per_slice=2, slice_s=60.0, pass_s=0.0)
    few = MODEL.model_copy(update={"min_replicas": 5, "gpus_per_shard": 1})
    never = [BIG.model_copy(update={"name": f"never-{i}", "min_replicas": 1}) for i in range(3)]
    sim.fleet.facts.put_models([few, *never])
    progress = []
    for _ in range(6):
        await sim.reconciler.run_pass()
        progress.append((len(sim.fleet.facts.records), len(sim.fleet.unplaceable_reasons)))
    # One slice (two attempts) a pass. Each pass starts after the model the last
    # one stopped in, so the three that never fit are not kept waiting for "llama";
    # looking at them again after "llama"'s placements (which only take cards
    # away) waits until "llama" has all five.
    assert progress == [(2, 0), (2, 2), (3, 3), (5, 3), (5, 3), (5, 3)]
    assert attempts == [
        *("llama", "llama", "never-0", "never-1", "never-2", "llama", "llama", "llama"),
        *("never-0", "never-1", "never-2"),
    ]
    attempts.clear()
    await sim.reconciler.run_pass()
    assert attempts == []
    for spec in never:
        assert reasons_everywhere(sim, spec.name) == {scheduler_says(sim, spec)}


def test_a_burst_of_placements_is_not_slowed_by_models_that_cannot_fit(
    tmp_path: Path, clock: FakeClock, attempts: list[str]
) -> None:
    """Placements only take cards away: models that did not fit are not tried
    again ahead of a model still being placed, only after it is done."""
    sim = sim_with(tmp_path, clock, n=4)
    sim.reconciler = Reconciler(sim.fleet, attempts_per_pass=6)
    burst = MODEL.model_copy(update={"min_replicas": 24, "gpus_per_shard": 1})
    never = [BIG.model_copy(update={"name": f"z{i}", "min_replicas": 1}) for i in range(3)]
    sim.fleet.facts.put_models([burst, *never])
    per_pass = []
    while len(sim.replicas()) < 24:
        sim.step(ready=False)
        per_pass.append(sorted(attempts))
        attempts.clear()
    # Six attempts a pass: 24 placements and a first look at each of the three.
    # Only once "llama" is done are the three looked at again (for their numbers).
    assert per_pass == [
        ["llama"] * 6,
        ["llama"] * 3 + ["z0", "z1", "z2"],
        ["llama"] * 6,
        ["llama"] * 6,
        ["llama"] * 3 + ["z0", "z1", "z2"],
    ]
    for _ in range(3):
        sim.step()
    assert len(attempts) <= 3  # at most one more look each, then none
    for spec in never:
        assert reasons_everywhere(sim, spec.name) == {scheduler_says(sim, spec)}
