"""After a restart or a takeover, before the nodes report, every view keeps each
replica's last known state, marked unconfirmed and for how long (issue 36 item 6).

For up to one report interval a restart showed every serving replica `starting` and
every model short (ctl models, the console, `llmgw_model_satisfied`), firing every
model-short alert although no request failed. The loop still decides on what the
nodes said: until they report, it sees those replicas as starting, as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw import present, render
from llmgw.controller.loop.apply import take_snapshot
from llmgw.controller.metrics import FleetCollector
from llmgw.controller.views import model_views
from llmgw.wire import NodeState, ReplicaState
from tests.controller.fleet_factories import FakeClock
from tests.controller.test_reconcile import Sim, sim_serving


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def grace_of(sim: Sim) -> float:
    facts = sim.fleet.facts
    return max(facts.liveness.grace_s(entry) for entry in facts.nodes.values())


def satisfied_metric(sim: Sim) -> dict[str, float]:
    out = {}
    for family in FleetCollector(lambda: sim.fleet).collect():
        for s in family.samples:
            if s.name == "llmgw_model_satisfied":
                out[s.labels["model"]] = s.value
    return out


def test_a_restart_keeps_the_last_known_state_until_the_nodes_report(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = sim_serving(tmp_path, clock)
    (before,) = sim.fleet.model_views()
    assert before.ready == 2 and before.satisfied and before.unconfirmed == 0
    assert satisfied_metric(sim) == {"llama": 1.0}
    sim.restart_controller()
    sim.clock.advance(1.0)
    grace = grace_of(sim)

    # Nobody reported yet: ready as last known, unconfirmed, and for how long at most.
    (view,) = sim.fleet.model_views()
    assert (view.ready, view.starting, view.satisfied) == (2, 0, True)
    assert view.unconfirmed == 2 and view.unconfirmed_s is not None
    assert 0 < view.unconfirmed_s <= grace
    replicas = sim.fleet.replica_views()
    assert {r.state for r in replicas} == {ReplicaState.READY}
    assert all(r.unconfirmed_s == view.unconfirmed_s for r in replicas)
    summary = sim.fleet.summary()
    assert summary.models.satisfied == 1 and summary.models.short == 0
    assert summary.replicas.ready == 2 and summary.replicas.starting == 0
    assert satisfied_metric(sim) == {"llama": 1.0}
    # What ctl shows: the model's status and each replica's state say so.
    words, _ = present.model_words(view)
    assert words.startswith("satisfied (2 as last known, unconfirmed since the controller")
    text = render.replicas_table(replicas).format(width=300)
    assert "ready?" in text and "as last known" in text
    # The loop decides on what the nodes said: nothing yet.
    loop_sees = take_snapshot(sim.fleet, None).statuses
    assert {s.state for s in loop_sees.values()} == {ReplicaState.STARTING}

    # One node reports its engine ready: that replica is confirmed, the other not yet.
    first, second = sorted(replicas, key=lambda r: r.shards[0].node)
    sim.report(first.shards[0].node)
    by_id = {r.id: r for r in sim.fleet.replica_views()}
    assert by_id[first.id].unconfirmed_s is None and by_id[first.id].state is ReplicaState.READY
    assert by_id[second.id].unconfirmed_s is not None
    (view,) = sim.fleet.model_views()
    assert view.unconfirmed == 1 and view.ready == 2

    # A node that reports its engine starting again (restarted meanwhile) says so.
    sim.report(second.shards[0].node, ready=False)
    by_id = {r.id: r for r in sim.fleet.replica_views()}
    assert by_id[second.id].state is ReplicaState.STARTING
    assert by_id[second.id].unconfirmed_s is None
    (view,) = sim.fleet.model_views()
    assert (view.ready, view.starting, view.unconfirmed, view.unconfirmed_s) == (1, 1, 0, None)


def test_last_known_lasts_one_grace_then_the_silent_node_is_unreachable(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = sim_serving(tmp_path, clock)
    sim.restart_controller()
    replicas = sorted(sim.fleet.replica_views(), key=lambda r: r.shards[0].node)
    silent = replicas[1].shards[0].node
    grace = grace_of(sim)
    # Every node reports but one, past its grace from the start.
    steps = int(grace) + 2
    sim.down.add(silent)
    for i in range(steps):
        shown = {r.id: r for r in sim.fleet.replica_views()}[replicas[1].id]
        if shown.unconfirmed_s is None:
            break
        assert shown.state is ReplicaState.READY and shown.unconfirmed_s <= grace - i + 0.01
        sim.step()
    assert sim.fleet.facts.state_of(silent, sim.clock()) is NodeState.UNREACHABLE
    shown = {r.id: r for r in sim.fleet.replica_views()}[replicas[1].id]
    assert shown.unconfirmed_s is None and shown.state is not ReplicaState.READY
    assert model_views.unheard_nodes(sim.fleet.facts) == {}
