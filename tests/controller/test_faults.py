"""A card that fails under a replica (issue 21 item 5): the replica is replaced as
a drain replaces it, the node is cordoned by llmgw with the card and the reason,
and unknown health never acts."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_factories import FakeClock
from loading_sim import LoadingSim as FaultSim
from test_reconcile import MODEL

from llmgw.controller.core.admin_flags import BY_LLMGW
from llmgw.wire import AdminFlag, ReplicaState

XID = "fatal Xid 79 (GPU has fallen off the bus): reset the GPU or reboot the node"


def serving_sim(tmp_path: Path, clock: FakeClock, **settings: object) -> FaultSim:
    """Four 8-card nodes; MODEL's two 4-card replicas serving on gpu1 and gpu2."""
    sim = FaultSim(tmp_path, clock, [f"gpu{i}" for i in range(1, 5)], **settings)
    for node in sim.nodes:
        sim.report(node)
    sim.fleet.facts.put_models([MODEL])
    for _ in range(3):  # placed, loading, ready
        sim.step()
    assert sorted(n for _, s, n in sim.replicas() if s is ReplicaState.READY) == [
        ("gpu1",),
        ("gpu2",),
    ]
    return sim


def card_of(sim: FaultSim, node: str) -> int:
    """The index of a card the replica on `node` runs on."""
    [rec] = [r for r in sim.fleet.facts.records.values() if node in r.nodes]
    return int(rec.shards[0].gpus[0].rsplit("-", 1)[1])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_a_replica_on_a_failed_card_is_replaced_before_it_stops(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = serving_sim(tmp_path, clock)
    [(original, _)] = sim.on("gpu1")
    sim.health["gpu1"] = {card_of(sim, "gpu1"): ("unhealthy", XID)}
    sim.step()  # the stand-in placed
    sim.step()  # its engine is loading
    # The original keeps serving, marked draining with the card as the reason.
    rec = sim.fleet.facts.records[original]
    assert rec.state is ReplicaState.DRAINING
    assert rec.error is not None and "card fault: GPU" in rec.error and "Xid 79" in rec.error
    stand_ins = [r for r in sim.fleet.facts.records.values() if r.replaces == original]
    assert [r.nodes for r in stand_ins] == [("gpu3",)]  # off gpu1, and spread off gpu2
    assert sim.serving() == 2
    # The node is cordoned, by llmgw, naming the card.
    admin = sim.fleet.facts.admin_info("gpu1")
    assert admin.flag is AdminFlag.CORDONED and admin.by == BY_LLMGW
    assert admin.reason is not None and admin.reason.startswith("card fault: GPU ")
    assert "GPU-gpu1" in admin.reason and "Xid 79" in admin.reason
    history = sim.fleet.rows.detail("gpu1").history
    assert [(e.action, e.by) for e in history][-1] == ("cordon", BY_LLMGW)
    # The stand-in ready: the original stops, the stand-in is an ordinary replica.
    sim.step()
    sim.step()
    assert original not in sim.fleet.facts.records
    assert sorted(n for _, s, n in sim.replicas() if s is ReplicaState.READY) == [
        ("gpu2",),
        ("gpu3",),
    ]
    assert all(r.replaces is None for r in sim.fleet.facts.records.values())
    assert sim.serving() == 2


def test_unknown_health_never_acts(tmp_path: Path, clock: FakeClock) -> None:
    sim = serving_sim(tmp_path, clock)
    sim.health["gpu1"] = {card_of(sim, "gpu1"): ("unknown", "NVML cannot read this GPU")}
    for _ in range(3):
        sim.step()
    assert [s for _, s in sim.on("gpu1")] == [ReplicaState.READY]
    assert sim.fleet.facts.admin_info("gpu1").flag is AdminFlag.NONE
    assert len(sim.fleet.facts.records) == 2


def test_a_fault_on_an_idle_card_cordons_without_moving_anything(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = serving_sim(tmp_path, clock)
    idle = next(i for i in range(8) if i != card_of(sim, "gpu1") and i >= 4)
    sim.health["gpu1"] = {idle: ("unhealthy", "uncorrectable ECC errors: 2")}
    sim.step()
    assert [s for _, s in sim.on("gpu1")] == [ReplicaState.READY]
    assert sim.fleet.facts.admin_info("gpu1").flag is AdminFlag.CORDONED
    assert len(sim.fleet.facts.records) == 2


def test_without_the_cordon_the_replica_still_moves(tmp_path: Path, clock: FakeClock) -> None:
    sim = serving_sim(tmp_path, clock, cordon_on_gpu_fault=False)
    [(original, _)] = sim.on("gpu1")
    sim.health["gpu1"] = {card_of(sim, "gpu1"): ("unhealthy", XID)}
    sim.step()
    assert sim.fleet.facts.admin_info("gpu1").flag is AdminFlag.NONE
    [stand_in] = [r for r in sim.fleet.facts.records.values() if r.replaces == original]
    assert "gpu1" not in stand_in.nodes  # elsewhere, though gpu1 has four good cards free
    sim.step()
    sim.step()
    assert original not in sim.fleet.facts.records and sim.serving() == 2


def test_the_cordon_outlives_the_fault_and_an_uncordon_is_not_overruled(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = serving_sim(tmp_path, clock)
    card = card_of(sim, "gpu1")
    sim.health["gpu1"] = {card: ("unhealthy", XID)}
    sim.step()
    sim.step()
    assert sim.fleet.facts.admin_info("gpu1").flag is AdminFlag.CORDONED
    # The card is reset and reads healthy: the node stays cordoned.
    sim.health["gpu1"] = {}
    sim.step()
    assert sim.fleet.facts.admin_info("gpu1").flag is AdminFlag.CORDONED
    # It fails again; the operator uncordons, knowing: that sticks for this fault.
    sim.health["gpu1"] = {card: ("unhealthy", XID)}
    sim.step()
    sim.fleet.facts.set_flag("gpu1", AdminFlag.NONE, None, "alice")
    sim.step()
    sim.step()
    assert sim.fleet.facts.admin_info("gpu1").flag is AdminFlag.NONE
    # Another card fails: a new fault, a new cordon.
    sim.health["gpu1"] = {card: ("unhealthy", XID), 7: ("unhealthy", "row remapping failed")}
    sim.step()
    admin = sim.fleet.facts.admin_info("gpu1")
    assert admin.flag is AdminFlag.CORDONED and admin.reason is not None
    assert admin.reason.startswith("card fault: GPU 7 ")


def test_an_operators_cordon_keeps_its_reason(tmp_path: Path, clock: FakeClock) -> None:
    sim = serving_sim(tmp_path, clock)
    sim.fleet.facts.set_flag("gpu1", AdminFlag.CORDONED, "PSU swap", "carol")
    sim.health["gpu1"] = {card_of(sim, "gpu1"): ("unhealthy", XID)}
    sim.step()
    admin = sim.fleet.facts.admin_info("gpu1")
    assert (admin.reason, admin.by) == ("PSU swap", "carol")
    assert [s for _, s in sim.on("gpu1")] == [ReplicaState.DRAINING]  # moves all the same


def test_a_card_that_recovers_before_the_stand_in_is_ready_keeps_its_replica(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = serving_sim(tmp_path, clock)
    [(original, _)] = sim.on("gpu1")
    sim.health["gpu1"] = {card_of(sim, "gpu1"): ("unhealthy", XID)}
    sim.step()
    assert sim.fleet.facts.records[original].state is ReplicaState.DRAINING
    sim.health["gpu1"] = {}
    sim.step()
    rec = sim.fleet.facts.records[original]
    assert (rec.state, rec.error) == (ReplicaState.READY, None)
    assert len(sim.fleet.facts.records) == 2  # the stand-in that was not serving yet is withdrawn


def test_an_engine_that_died_with_its_card_is_replaced_at_once(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = serving_sim(tmp_path, clock)
    [(original, _)] = sim.on("gpu1")
    sim.health["gpu1"] = {card_of(sim, "gpu1"): ("unhealthy", XID)}
    sim.failing.add("gpu1")
    sim.step()
    sim.step()
    assert original not in sim.fleet.facts.records
    assert sim.fleet.facts.backoffs == {}  # the card's fault, not the spec's: no backoff
    assert len(sim.fleet.facts.records) == 2
    assert not any("gpu1" in r.nodes for r in sim.fleet.facts.records.values())


def test_a_starting_replica_on_a_failed_card_stops_and_is_placed_again(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = FaultSim(tmp_path, clock, [f"gpu{i}" for i in range(1, 5)])
    for node in sim.nodes:
        sim.report(node)
    sim.fleet.facts.put_models([MODEL])
    sim.step()
    [(starting, state)] = sim.on("gpu1")
    assert state is ReplicaState.STARTING
    sim.health["gpu1"] = {card_of(sim, "gpu1"): ("unhealthy", XID)}
    sim.step()
    sim.step()
    assert starting not in sim.fleet.facts.records
    assert len(sim.fleet.facts.records) == 2
    assert not any("gpu1" in r.nodes for r in sim.fleet.facts.records.values())


def test_a_replacement_interrupted_by_a_restart_finishes_without_doubling(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = serving_sim(tmp_path, clock)
    [(original, _)] = sim.on("gpu1")
    sim.health["gpu1"] = {card_of(sim, "gpu1"): ("unhealthy", XID)}
    sim.step()
    ids = set(sim.fleet.facts.records)
    assert len(ids) == 3
    sim.restart_controller()
    sim.step()
    assert set(sim.fleet.facts.records) == ids, "nothing placed twice"
    sim.step()
    sim.step()
    assert original not in sim.fleet.facts.records and len(sim.fleet.facts.records) == 2
    assert sim.serving() == 2
