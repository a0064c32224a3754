"""Rollouts of a changed spec (issue 21 item 1) in a simulated fleet: revisions move
only with what the engine sees, new replicas come first, old ones leave one at a
time, never below the minimum; a failing new revision stalls with old ones
serving; a restart mid-rollout places nothing twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_factories import FakeClock
from loading_sim import BROKEN, LoadingSim
from test_reconcile import MODEL

from llmgw.controller.core.records import ReplicaRecord
from llmgw.controller.core.rollout import plan_rollout
from llmgw.wire import ModelSpec, ReplicaState, RolloutState

SPEC = MODEL.model_copy(update={"engine_args": ["--load-seconds", "5"]})
CHANGED = SPEC.model_copy(update={"engine_args": ["--load-seconds", "6"]})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def serving(tmp_path: Path, clock: FakeClock, spec: ModelSpec = SPEC, n: int = 4) -> LoadingSim:
    sim = LoadingSim(tmp_path, clock, [f"gpu{i}" for i in range(1, n + 1)])
    for node in sim.nodes:
        sim.report(node)
    sim.fleet.facts.put_models([spec], "alice")
    for _ in range(3):
        sim.step()
    assert [s for _, s, _ in sim.replicas()] == [ReplicaState.READY] * spec.min_replicas
    return sim


def revisions(sim: LoadingSim) -> dict[str, int]:
    return {r.id: r.revision for r in sim.fleet.facts.records.values()}


def rollout(sim: LoadingSim):  # type: ignore[no-untyped-def]
    [view] = sim.fleet.model_views()
    return view.rollout


def test_the_revision_moves_with_the_engine_fields_only(tmp_path: Path, clock: FakeClock) -> None:
    sim = serving(tmp_path, clock)
    assert sim.fleet.facts.model_revision("llama") == 1
    before = dict(revisions(sim))
    # Counts and rollout policy: no revision, nothing restarts or moves.
    sim.fleet.facts.put_models([SPEC.model_copy(update={"max_surge": 2})], "bob")
    for _ in range(3):
        sim.step()
    assert sim.fleet.facts.model_revision("llama") == 1 and revisions(sim) == before
    sim.fleet.facts.put_models([CHANGED], "carol")
    assert sim.fleet.facts.model_revision("llama") == 2
    [first, second] = sim.fleet.facts.model_revisions("llama")
    assert (first.revision, first.by, first.change) == (1, "alice", "created")
    assert (second.revision, second.by) == (2, "carol")
    assert second.change == "engine_args: --load-seconds 5 -> --load-seconds 6"
    # An old replica's engine keeps the arguments it was started with.
    for node in ("gpu1", "gpu2"):
        [a] = sim.fleet.assignments_for(node)
        assert a.engine_args == ["--load-seconds", "5"]


def test_a_rollout_surges_one_and_never_drops_below_the_minimum(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = serving(tmp_path, clock)
    old = set(revisions(sim))
    sim.fleet.facts.put_models([CHANGED], "carol")
    seen_ready, seen_total = [], []
    for _ in range(30):
        sim.step()
        views = {s.record.id: s for s in sim.fleet.replica_statuses().values()}
        # Serving: ready, or an old one leaving that the gateways still route to.
        seen_ready.append(sum(s.state is ReplicaState.READY for s in views.values()))
        seen_total.append(len(views))
        if not old & set(views) and len(views) == 2:
            break
    assert not old & set(revisions(sim)), "every old replica stopped"
    assert set(revisions(sim).values()) == {2}
    assert max(seen_total) == 3, "at most max_surge (1) above the desired count"
    assert min(seen_ready) >= 2 - 1, seen_ready  # one leaving at a time, out of routing
    view = rollout(sim)
    assert (view.state, view.updated, view.outdated, view.revision) == (
        RolloutState.COMPLETE,
        2,
        0,
        2,
    )
    for node in {n for r in sim.fleet.facts.records.values() for n in r.nodes}:
        for a in sim.fleet.assignments_for(node):
            assert a.engine_args == ["--load-seconds", "6"]


def test_never_fewer_ready_than_desired_minus_max_unavailable(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A leaving replica is out of routing at once: with max_unavailable 0 it only
    leaves once a new one is ready, so ready + leaving never drops below desired."""
    sim = serving(tmp_path, clock)
    sim.fleet.facts.put_models([CHANGED], "carol")
    low = 99
    for _ in range(30):
        sim.step()
        states = [s.state for s in sim.fleet.replica_statuses().values()]
        ready = states.count(ReplicaState.READY)
        low = min(low, ready + states.count(ReplicaState.DRAINING))
        assert ready >= 1
        if rollout(sim).state is RolloutState.COMPLETE:
            break
    assert rollout(sim).state is RolloutState.COMPLETE
    assert low >= 2


def test_max_unavailable_without_surge_stops_first(tmp_path: Path, clock: FakeClock) -> None:
    spec = SPEC.model_copy(update={"max_surge": 0, "max_unavailable": 1})
    sim = serving(tmp_path, clock, spec)
    sim.fleet.facts.put_models([spec.model_copy(update={"engine_args": ["-v"]})], "carol")
    totals = []
    for _ in range(30):
        sim.step()
        totals.append(len(sim.fleet.facts.records))
        if rollout(sim).state is RolloutState.COMPLETE:
            break
    assert rollout(sim).state is RolloutState.COMPLETE
    assert max(totals) == 2, "never above the desired count"


def test_a_failing_new_revision_stalls_and_the_old_replicas_keep_serving(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = serving(tmp_path, clock)
    old = set(revisions(sim))
    sim.fleet.facts.put_models([SPEC.model_copy(update={"engine_args": [BROKEN]})], "carol")
    for _ in range(8):
        sim.step()
    view = rollout(sim)
    assert view.state is RolloutState.STALLED
    assert view.message is not None and "unknown argument --exit-at-start" in view.message
    # The old replicas serve; none was stopped.
    ready = {r.id for r in sim.fleet.facts.records.values() if r.state is ReplicaState.READY}
    assert old <= ready
    assert view.outdated == 2 and view.updated == 0
    # Undo, as `ctl rollout undo` does: the old engine fields again, a new revision;
    # the old replicas are up to date again and the stall is over.
    sim.fleet.facts.put_models([SPEC], "carol")
    assert sim.fleet.facts.model_revision("llama") == 3
    for _ in range(3):
        sim.step()
    view = rollout(sim)
    assert view.state is RolloutState.COMPLETE and old <= set(revisions(sim))
    assert len(sim.fleet.facts.records) == 2


def test_no_room_for_a_surge_replica_waits_and_says_why(tmp_path: Path, clock: FakeClock) -> None:
    big = SPEC.model_copy(update={"gpus_per_shard": 8})  # a whole node each, two nodes
    sim = serving(tmp_path, clock, big, n=2)
    sim.fleet.facts.put_models([big.model_copy(update={"engine_args": ["-v"]})], "carol")
    for _ in range(3):
        sim.step()
    view = rollout(sim)
    assert view.state is RolloutState.WAITING
    assert view.message is not None and "needs 1 node with 8 free" in view.message
    records = list(sim.fleet.facts.records.values())
    assert len(records) == 2 and all(r.state is ReplicaState.READY for r in records)


def test_a_restart_mid_rollout_places_nothing_twice(tmp_path: Path, clock: FakeClock) -> None:
    sim = serving(tmp_path, clock)
    sim.fleet.facts.put_models([CHANGED], "carol")
    sim.step()  # the surge replica placed
    placed = set(revisions(sim))
    assert len(placed) == 3
    sim.restart_controller()
    sim.step()
    assert set(revisions(sim)) == placed, "nothing placed twice"
    for _ in range(30):
        sim.step()
        if rollout(sim).state is RolloutState.COMPLETE:
            break
    assert rollout(sim).state is RolloutState.COMPLETE
    assert set(revisions(sim).values()) == {2} and len(revisions(sim)) == 2


def record(i: int, state: ReplicaState) -> ReplicaRecord:
    return ReplicaRecord(id=f"r{i}", model="m", state=state, shards=(), created_at=float(i))


@pytest.mark.parametrize(
    ("surge", "unavailable", "new", "old", "leaving", "place", "leave"),
    [
        # Surge 1: one new first; an old one leaves once it is ready.
        (1, 0, [], ["ready", "ready"], 0, 1, 0),
        (1, 0, ["starting"], ["ready", "ready"], 0, 0, 0),
        (1, 0, ["ready"], ["ready", "ready"], 0, 0, 1),
        (1, 0, ["ready"], ["ready"], 1, 0, 0),  # the leaving one still holds cards
        (1, 0, ["ready"], ["ready"], 0, 1, 0),
        (1, 0, ["ready", "ready"], ["ready"], 0, 0, 1),
        # No surge, one unavailable: stop first, then place.
        (0, 1, [], ["ready", "ready"], 0, 0, 1),
        (0, 1, [], ["ready"], 0, 1, 0),
        # An old replica only starting serves nothing: it goes at once.
        (1, 0, [], ["starting", "ready"], 0, 1, 1),
    ],
)
def test_plan_rollout_counts(
    surge: int,
    unavailable: int,
    new: list[str],
    old: list[str],
    leaving: int,
    place: int,
    leave: int,
) -> None:
    spec = ModelSpec(
        name="m", source="m", min_replicas=2, max_surge=surge, max_unavailable=unavailable
    )
    news = [record(i, ReplicaState(s)) for i, s in enumerate(new)]
    olds = [record(10 + i, ReplicaState(s)) for i, s in enumerate(old)]
    plan = plan_rollout(spec, spec.min_replicas, news, olds, leaving, stalled=False)
    assert (plan.place, len(plan.leave)) == (place, leave)
    assert not plan_rollout(
        spec, spec.min_replicas, news, olds, leaving, stalled=True
    ).leave or all(s == "starting" for s in old)


def test_both_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot both be 0"):
        ModelSpec(name="m", source="m", max_surge=0, max_unavailable=0)
