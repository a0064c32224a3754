"""Capacity follows demand (issue 22 items 1, 2 and 5): the autoscaler's rules on
their own, then in a simulated fleet whose engines report requests in flight:
up within seconds, down one replica at a time through the stop handshake after
the demand stayed lower, never below the minimum, noise that never flaps, and a
scale-down that a restart goes on with."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest
from fleet_factories import FakeClock
from loading_sim import LoadingSim
from pydantic import ValidationError

from llmgw.controller.core.autoscale import DOWN_WINDOW_S, UP_WINDOW_S, Autoscaler
from llmgw.controller.views.endpoints import GateView, LiveGateway
from llmgw.present import Meaning, model_words
from llmgw.wire import EventReason, ModelSpec, ModelView, ReplicaState, ScalingState

SPEC = ModelSpec(
    name="chat",
    source="org/chat",
    min_replicas=1,
    max_replicas=3,
    target_in_flight=2,
    scale_down_after_s=30,
    gpus_per_shard=4,
)


# -- the rules ---------------------------------------------------------------------------


def test_a_fixed_count_is_its_minimum_whatever_the_load() -> None:
    fixed = SPEC.model_copy(update={"max_replicas": None, "min_replicas": 2})
    scaler = Autoscaler()
    assert scaler.decide(fixed, 1000.0, 2, 0.0).desired == 2
    assert not fixed.autoscaled and fixed.most_replicas == 2


def test_up_at_once_and_never_above_the_maximum() -> None:
    scaler = Autoscaler()
    assert scaler.decide(SPEC, 0.0, 1, 0.0).desired == 1
    up = scaler.decide(SPEC, 5.0, 1, 1.0)  # mean of (0, 5) = 2.5 per target 2 -> 2
    assert (up.desired, up.changed) == (2, 1)
    assert scaler.decide(SPEC, 100.0, 2, 2.0).desired == 3  # capped by max_replicas
    assert "target 2 -> 3" in scaler.decide(SPEC, 100.0, 3, 3.0).why


def test_down_one_at_a_time_each_after_the_wait() -> None:
    scaler = Autoscaler()
    t = 0.0
    assert scaler.decide(SPEC, 6.0, 3, t).desired == 3
    seen = []
    while t < 200:
        t += 1.0
        seen.append((t, scaler.decide(SPEC, 0.0, 3, t).desired))
    downs = [(t, d) for (t, d), (_, before) in zip(seen[1:], seen, strict=False) if d < before]
    # The window must empty first (the mean reaches 0.9 x target for 2), then 30 s
    # pass for each step.
    assert [d for _, d in downs] == [2, 1]
    assert downs[1][0] - downs[0][0] == pytest.approx(SPEC.scale_down_after_s)
    assert downs[0][0] >= SPEC.scale_down_after_s
    assert seen[-1][1] == 1  # never below the minimum


def test_a_rise_during_the_wait_starts_it_again() -> None:
    scaler = Autoscaler()
    scaler.decide(SPEC, 6.0, 3, 0.0)
    t = 0.0
    for _ in range(10):  # quiet: the wait starts
        t += 1.0
        scaler.decide(SPEC, 0.0, 3, t)
    for _ in range(int(DOWN_WINDOW_S) + 2):  # load again until the window's mean needs 3
        t += 1.0
        assert scaler.decide(SPEC, 6.0, 3, t).desired == 3
    rise = t
    while t < rise + SPEC.scale_down_after_s:  # quiet again: the wait starts over
        t += 1.0
        assert scaler.decide(SPEC, 0.0, 3, t).desired == 3, t
    while t < rise + SPEC.scale_down_after_s + DOWN_WINDOW_S:
        t += 1.0
        last = scaler.decide(SPEC, 0.0, 3, t)
    assert last.desired == 2


def test_noise_around_a_target_does_not_flap() -> None:
    """An hour of in-flight counts drawn around 2 replicas' worth (mean 4, target 2):
    at most one change, never a down-and-up cycle."""
    rng = random.Random(7)
    spec = SPEC.model_copy(update={"max_replicas": 6})
    scaler = Autoscaler()
    desired, changes = [], 0
    for t in range(3600):
        noisy = max(0.0, rng.gauss(4.0, 1.2))
        d = scaler.decide(spec, noisy, 2, float(t))
        changes += d.changed != 0
        desired.append(d.desired)
    assert changes <= 1, changes
    assert set(desired) <= {2, 3}


def test_a_load_step_is_answered_within_the_short_window() -> None:
    """Quiet, then 6 in flight (3 replicas' worth at target 2), one sample a second:
    up within the short window, where one window for both ways took half of 10 s."""

    def seconds_to_three(scaler: Autoscaler) -> float:
        for t in range(20):
            scaler.decide(SPEC, 0.0, 1, float(t))
        for t in range(20, 60):
            if scaler.decide(SPEC, 6.0, 1, float(t)).desired == 3:
                return t - 20.0
        raise AssertionError("never scaled up")

    assert seconds_to_three(Autoscaler()) <= UP_WINDOW_S
    # The one-window rule (both windows the long one) waited for the mean to pass 4.
    assert seconds_to_three(Autoscaler(DOWN_WINDOW_S, up_at=1.0)) >= 0.5 * DOWN_WINDOW_S


def test_going_down_reads_the_long_window() -> None:
    # Three replicas busy, then quiet: a few quiet seconds say nothing yet.
    scaler = Autoscaler()
    for t in range(20):
        scaler.decide(SPEC, 6.0, 3, float(t))
    for t in range(20, 20 + int(UP_WINDOW_S) + 1):
        d = scaler.decide(SPEC, 0.0, 3, float(t))
    assert d.in_flight == 0.0  # the short window is quiet already
    assert d.desired == 3 and "down to" not in d.why  # the long one is not: no wait begun


def test_a_burst_may_add_a_replica_and_never_flaps() -> None:
    """Bursts: two busy seconds in every thirty on a load of 1.5 replicas' worth.
    The short window may answer the first burst; the long one and the wait keep it
    from going down and up again."""
    rng = random.Random(3)
    spec = SPEC.model_copy(update={"max_replicas": 6})
    scaler = Autoscaler()
    ups, went_down, cycles = 0, False, 0
    for t in range(3600):
        x = 12.0 if t % 30 < 2 else max(0.0, rng.gauss(3.0, 0.5))
        d = scaler.decide(spec, x, 2, float(t))
        ups += d.changed > 0
        cycles += d.changed > 0 and went_down
        went_down = went_down or d.changed < 0
    assert ups == 1 and cycles == 0, (ups, cycles)


def test_the_windows_are_checked() -> None:
    with pytest.raises(ValueError, match="scale-up window"):
        Autoscaler(up_window_s=20.0, down_window_s=10.0)
    with pytest.raises(ValueError, match="scale-up window"):
        Autoscaler(up_window_s=0.0)
    with pytest.raises(ValueError, match="flap"):
        Autoscaler(up_at=0.95)


def test_a_new_term_starts_at_the_count_it_has() -> None:
    assert Autoscaler().decide(SPEC, 0.0, 3, 0.0).desired == 3
    assert Autoscaler().decide(SPEC, 0.0, 7, 0.0).desired == 3  # within the bounds
    assert Autoscaler().decide(SPEC, 0.0, 0, 0.0).desired == 1


def test_min_zero_sleeps_when_unused_and_a_held_request_wakes_it_at_once() -> None:
    spec = SPEC.model_copy(update={"min_replicas": 0})
    scaler = Autoscaler()
    t = 0.0
    assert scaler.decide(spec, 0.0, 1, t).desired == 1  # a new term keeps what runs
    while t < 100:
        t += 1.0
        d = scaler.decide(spec, 0.0, 1, t)
    assert d.desired == 0 and d.why.startswith("asleep"), d
    assert d.state is ScalingState.ASLEEP
    # One request held by a gateway: one replica, in the same pass.
    t += 1.0
    woke = scaler.decide(spec, 0.0, 0, t, held=1)
    assert (woke.desired, woke.changed, woke.woke_at) == (1, 1, t)
    t += 4.0
    waking = scaler.decide(spec, 0.0, 1, t, held=3)
    assert waking.why == "waking for 4s: 3 request(s) held" and waking.held == 3
    assert waking.state is ScalingState.WAKING
    served = scaler.decide(spec, 1.0, 1, t + 1, serving=1)
    assert served.woke_at is None and not served.why.startswith("waking")
    assert served.state is ScalingState.FOLLOWING
    assert (
        Autoscaler().decide(SPEC.model_copy(update={"max_replicas": None}), 0, 1, 0).state is None
    )


def test_the_scaling_state_not_its_words_says_how_a_model_reads() -> None:
    """ctl and the console colour a model by its scaling state (issue 31 item 3)."""
    spec = SPEC.model_copy(update={"min_replicas": 0})

    def words(scaling: str, state: ScalingState | None, ready: int = 0) -> tuple[str, Meaning]:
        view = ModelView(
            spec=spec, ready=ready, starting=0, failed=0, satisfied=True, desired=ready,
            scaling=scaling, scaling_state=state,
        )  # fmt: skip
        return model_words(view)

    assert words("waking for 3s: 1 request(s) held", ScalingState.WAKING)[1] is Meaning.ATTENTION
    assert words("asleep: woken by its first request", ScalingState.ASLEEP)[1] is Meaning.MUTED
    # The same words under another state are read as that state.
    assert words("waking words", ScalingState.FOLLOWING) == (
        "satisfied: waking words",
        Meaning.FINE,
    )
    assert words("asleep words", None) == ("satisfied: asleep words", Meaning.FINE)


@pytest.mark.parametrize(
    ("update", "words"),
    [
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas (2) is below min_replicas (3)"),
        ({"target_in_flight": 0}, "target_in_flight"),
        ({"scale_down_after_s": -1}, "scale_down_after_s"),
        ({"scale_down_after_s": math.inf}, "scale_down_after_s"),
        ({"max_replicas": 10_001}, "max_replicas"),
        ({"priority": "high"}, "priority"),
    ],
)
def test_bad_combinations_are_refused(update: dict[str, object], words: str) -> None:
    fields = {**SPEC.model_dump(), **update}
    with pytest.raises(ValidationError, match=re.escape(words)):
        ModelSpec.model_validate(fields)


# -- in a fleet --------------------------------------------------------------------------


class DemandSim(LoadingSim):
    """Engines that report requests in flight: `load[model]`, spread evenly over
    the model's ready replicas (as a gateway spreads them)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.load: dict[str, int] = {}

    def traffic(self, replica_id: str, model: str) -> dict[str, object] | None:
        records = self.fleet.facts.records
        serving = [
            r
            for r in records.values()
            if r.model == model and r.state is ReplicaState.READY and r.leaving is None
        ]
        if replica_id not in {r.id for r in serving}:
            return {"requests_per_s": 0.0, "in_flight": 0}
        share = self.load.get(model, 0) / len(serving)
        return {"requests_per_s": share, "in_flight": math.ceil(share)}


def fleet(tmp_path: Path, spec: ModelSpec = SPEC) -> DemandSim:
    sim = DemandSim(tmp_path, FakeClock(), ["gpu1", "gpu2", "gpu3", "gpu4"])
    for node in sim.nodes:
        sim.report(node)
    sim.fleet.facts.put_models([spec], "alice")
    for _ in range(3):
        sim.step()
    return sim


def states(sim: DemandSim) -> list[ReplicaState]:
    return sorted(s.state for s in sim.fleet.replica_statuses().values())


def test_load_scales_up_within_seconds_spread_over_nodes(tmp_path: Path) -> None:
    sim = fleet(tmp_path)
    assert states(sim) == [ReplicaState.READY]
    sim.load["chat"] = 8
    for _ in range(6):
        sim.step()
    live = list(sim.fleet.facts.records.values())
    assert len(live) == 3, live
    assert len({r.nodes for r in live}) == 3, "spread: one replica per node"
    [view] = sim.fleet.model_views()
    assert view.desired == 3 and view.ready == 3, view
    assert "target 2 -> 3" in (view.scaling or "")
    assert view.scaling_state is ScalingState.FOLLOWING
    reasons = [e.reason for e in sim.fleet.facts.events(0, "model/chat").events]
    assert EventReason.SCALED_UP in reasons


def test_load_gone_scales_down_one_at_a_time_through_the_handshake(tmp_path: Path) -> None:
    sim = fleet(tmp_path)
    sim.load["chat"] = 8
    for _ in range(6):
        sim.step()
    sim.load["chat"] = 0
    sim.reconciler.gate = _LetsGoNextPass(sim)
    counts, leaving_seen = [], 0
    for _ in range(120):
        sim.step()
        live = list(sim.fleet.facts.records.values())
        leaving = [r for r in live if r.leaving is not None]
        assert len(leaving) <= 1, "one at a time"
        for r in leaving:
            # Out of routing first: marked stopping before it goes.
            assert r.state is ReplicaState.DRAINING and r.id in sim.fleet.facts.stopping
        leaving_seen += bool(leaving)
        counts.append(len(live))
    assert counts[-1] == 1, counts
    assert min(counts) == 1, "never below the minimum"
    assert leaving_seen >= 2
    messages = [e.message for e in sim.fleet.facts.events(0, "model/chat").events]
    assert sum("out of routing" in m for m in messages) == 2, messages
    assert sum(m.endswith(" stopped") for m in messages) == 2, messages


def test_a_leaving_replica_goes_on_leaving_after_a_restart(tmp_path: Path) -> None:
    sim = fleet(tmp_path, SPEC.model_copy(update={"min_replicas": 2, "max_replicas": None}))
    assert len(sim.fleet.facts.records) == 2
    # The operator lowers the count: one leaves, and the controller dies meanwhile.
    sim.fleet.facts.put_models([SPEC.model_copy(update={"max_replicas": None})], "alice")
    sim.reconciler.gate = _Holding()  # gateways still route to it: it cannot stop yet
    sim.step()
    [leaving] = [r for r in sim.fleet.facts.records.values() if r.leaving is not None]
    sim.restart_controller()
    assert sim.fleet.facts.records[leaving.id].leaving == leaving.leaving
    sim.reconciler.gate = _Holding()
    sim.step()  # not taken back as a cancelled drain would be
    assert sim.fleet.facts.records[leaving.id].state is ReplicaState.DRAINING
    sim.reconciler.gate = None  # the gateways let go
    sim.step()
    assert leaving.id not in sim.fleet.facts.records and len(sim.fleet.facts.records) == 1


def test_demand_back_before_the_stop_takes_the_replica_back(tmp_path: Path) -> None:
    sim = fleet(tmp_path)
    sim.load["chat"] = 8
    for _ in range(6):
        sim.step()
    sim.load["chat"] = 0
    hold = _Holding()
    sim.reconciler.gate = hold
    for _ in range(80):
        sim.step()
        if any(r.leaving for r in sim.fleet.facts.records.values()):
            break
    [leaving] = [r for r in sim.fleet.facts.records.values() if r.leaving is not None]
    sim.load["chat"] = 12
    for _ in range(int(DOWN_WINDOW_S)):
        sim.step()
    back = sim.fleet.facts.records[leaving.id]
    assert back.leaving is None and back.state is ReplicaState.READY
    assert leaving.id not in sim.fleet.facts.stopping, "back in routing"
    assert len(sim.fleet.facts.records) == 3, "taken back, not placed anew"


class _LetsGoNextPass:
    """A stop gate whose gateways take a replica out of routing when asked and
    have let go of it when asked again (by the next pass): one gateway that has
    applied every change up to the snapshot a step decides on, so a replica is
    marked stopping by one plan and let go by a later one."""

    def __init__(self, sim: DemandSim) -> None:
        self.sim = sim

    def view(self, now: float) -> GateView:
        facts = self.sim.fleet.facts
        applied = facts.revision
        return GateView(now, math.inf, (LiveGateway(applied, {}),), dict(facts.stopping))


class _Holding:
    """A stop gate whose gateways never let go (and report no traffic)."""

    def view(self, now: float) -> GateView:
        return GateView(now, math.inf, (LiveGateway(None, {}),))


class _SkewedReads(DemandSim):
    """Four requests always in flight on two replicas, read at two moments: the
    engines were scraped while three ran on the first and one on the second, the
    gateways a moment later, one on the first and three on the second."""

    def first_ready(self) -> list[str]:
        return sorted(r.id for r in self.fleet.facts.records.values())

    def traffic(self, replica_id: str, model: str) -> dict[str, object] | None:
        ids = self.first_ready()
        n = 3 if ids and replica_id == ids[0] else 1
        return {"requests_per_s": 1.0, "in_flight": n}


class _GatewaysRead:
    def __init__(self, sim: _SkewedReads) -> None:
        self.sim = sim

    def view(self, now: float) -> GateView:
        ids = self.sim.first_ready()
        in_flight = {rid: 1 if i == 0 else 3 for i, rid in enumerate(ids)}
        return GateView(now, math.inf, (LiveGateway(None, in_flight),), in_flight=in_flight)


def test_readings_taken_at_different_moments_are_not_added_up_twice(tmp_path: Path) -> None:
    """Issue 35 item 5: the higher count per replica, summed, read 6 for the 4 in
    flight (4 / target 2 = 2 replicas, 6 asks for 3). The figure stays within 4."""
    spec = SPEC.model_copy(update={"min_replicas": 2})
    sim = _SkewedReads(tmp_path, FakeClock(), ["gpu1", "gpu2", "gpu3", "gpu4"])
    for node in sim.nodes:
        sim.report(node)
    sim.fleet.facts.put_models([spec], "alice")
    for _ in range(3):
        sim.step()
    assert states(sim) == [ReplicaState.READY] * 2
    sim.reconciler.gate = _GatewaysRead(sim)
    for _ in range(10):
        sim.step()
        [view] = sim.fleet.model_views()
        assert view.in_flight <= 4, view
    assert view.desired == 2 and len(sim.fleet.facts.records) == 2, view
    assert "in flight 4, target 2 -> 2" in (view.scaling or ""), view


# -- reclaim by priority -----------------------------------------------------------------

LOW = ModelSpec(
    name="low",
    source="org/low",
    min_replicas=1,
    max_replicas=2,
    target_in_flight=2,
    scale_down_after_s=600,
    gpus_per_shard=8,
)
HIGH = ModelSpec(name="high", source="org/high", min_replicas=1, gpus_per_shard=8, priority=10)


def full_of_low(tmp_path: Path, low: ModelSpec = LOW) -> DemandSim:
    """Two nodes of 8 cards, both taken by `low` (scaled to 2 by its load)."""
    sim = DemandSim(tmp_path, FakeClock(), ["gpu1", "gpu2"])
    for node in sim.nodes:
        sim.report(node)
    sim.fleet.facts.put_models([low], "alice")
    sim.load["low"] = 8
    for _ in range(6):
        sim.step()
    assert len(sim.fleet.facts.records) == 2
    return sim


def test_a_short_higher_priority_model_reclaims_a_replica_above_a_lower_ones_minimum(
    tmp_path: Path,
) -> None:
    sim = full_of_low(tmp_path)
    sim.fleet.facts.put_models([LOW, HIGH], "alice")
    for _ in range(8):
        sim.step()
    models = {r.model for r in sim.fleet.facts.records.values()}
    assert models == {"low", "high"}, sim.fleet.facts.records
    [view] = [v for v in sim.fleet.model_views() if v.spec.name == "high"]
    assert view.satisfied
    low_events = [e.message for e in sim.fleet.facts.events(0, "model/low").events]
    assert any("reclaimed for high (priority 10)" in m for m in low_events), low_events
    # The lower model keeps its minimum, and does not take the room back while
    # its demand still asks for 2: there is none.
    for _ in range(10):
        sim.step()
    assert sorted(r.model for r in sim.fleet.facts.records.values()) == ["high", "low"]


def test_never_below_a_lower_models_minimum_nor_for_equal_priority(tmp_path: Path) -> None:
    at_min = LOW.model_copy(update={"min_replicas": 2})
    sim = full_of_low(tmp_path, at_min)
    sim.fleet.facts.put_models([at_min, HIGH], "alice")
    for _ in range(8):
        sim.step()
    assert {r.model for r in sim.fleet.facts.records.values()} == {"low"}
    assert "high" in sim.fleet.unplaceable_reasons

    sim = full_of_low(tmp_path / "equal")
    same = HIGH.model_copy(update={"priority": 0})
    sim.fleet.facts.put_models([LOW, same], "alice")
    for _ in range(8):
        sim.step()
    assert {r.model for r in sim.fleet.facts.records.values()} == {"low"}
