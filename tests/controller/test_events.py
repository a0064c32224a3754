"""Events (issue 21 item 7): every decision the controller takes by itself is an
event with time, object, reason and message, kept durably and bounded, read with
`since=` and `for=`."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_factories import FakeClock
from loading_sim import BROKEN, LoadingSim
from test_reconcile import MODEL

import llmgw.controller.events
import llmgw.controller.facts
from llmgw.wire import AdminFlag, EventReason


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def serving(tmp_path: Path, clock: FakeClock) -> LoadingSim:
    sim = LoadingSim(tmp_path, clock, [f"gpu{i}" for i in range(1, 5)])
    for node in sim.nodes:
        sim.report(node)
    sim.fleet.facts.put_models([MODEL], "alice")
    for _ in range(3):
        sim.step()
    return sim


def said(sim: LoadingSim, obj: str | None = None) -> list[tuple[str, EventReason, str]]:
    return [(e.object, e.reason, e.message) for e in sim.fleet.facts.events(0, obj).events]


def test_placements_drains_and_their_stand_ins_are_events(tmp_path: Path, clock: FakeClock) -> None:
    sim = serving(tmp_path, clock)
    [(obj, reason, message)] = said(sim)
    assert (obj, reason) == ("model/llama", EventReason.PLACED)
    assert message.startswith("placed 2 replica(s): ") and "on gpu1" in message
    [original] = [r.id for r in sim.fleet.facts.records.values() if "gpu1" in r.nodes]
    sim.fleet.facts.set_flag("gpu1", AdminFlag.DRAINING, "BIOS", "ops")
    for _ in range(4):
        sim.step()
    reasons = [(o, r) for o, r, _ in said(sim)][1:]
    assert reasons == [
        ("model/llama", EventReason.STAND_IN),
        ("model/llama", EventReason.MOVED),
        ("node/gpu1", EventReason.DRAINED),
    ]
    stand_in = said(sim)[1][2]
    assert f"to stand in for {original} (drain of gpu1)" in stand_in
    assert said(sim)[2][2].startswith(f"{original} stopped (drain of gpu1): ")
    # An operator's own cordon or drain is the node's history, not an event.
    assert not [e for e in said(sim) if "ops" in e[2]]


def test_a_failed_card_a_rollout_a_stall_and_a_backoff_are_events(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = serving(tmp_path, clock)
    card = next(r for r in sim.fleet.facts.records.values() if "gpu1" in r.nodes).shards[0].gpus[0]
    index = int(card.rsplit("-", 1)[1])
    sim.health["gpu1"] = {index: ("unhealthy", "uncorrectable ECC errors: 3")}
    sim.step()
    [fault] = said(sim, "node/gpu1")
    assert fault[1] is EventReason.GPU_FAULT
    assert "card fault: GPU" in fault[2] and fault[2].endswith(": cordoned")
    assert any(
        r is EventReason.STAND_IN and "(card fault: GPU" in m
        for _, r, m in said(sim, "model/llama")
    )
    sim.health["gpu1"] = {}
    for _ in range(3):
        sim.step()
    before = len(said(sim))
    sim.fleet.facts.put_models([MODEL.model_copy(update={"engine_args": [BROKEN]})], "carol")
    for _ in range(4):
        sim.step()
    new = said(sim, "model/llama")[before - 1 :]
    reasons = [r for _, r, _ in new]
    assert EventReason.ROLLOUT in reasons
    assert EventReason.ROLLOUT_STALLED in reasons and EventReason.BACK_OFF in reasons
    [stalled] = [m for _, r, m in new if r is EventReason.ROLLOUT_STALLED]
    assert "no more old replicas stop: engine exited with code 2" in stalled
    counts = sim.fleet.facts.event_counts
    assert counts[EventReason.GPU_FAULT] == 1 and counts[EventReason.ROLLOUT_STALLED] == 1


def test_events_survive_a_restart_and_ids_go_on(tmp_path: Path, clock: FakeClock) -> None:
    sim = serving(tmp_path, clock)
    sim.fleet.facts.set_flag("gpu1", AdminFlag.DRAINING, "BIOS", "ops")
    for _ in range(4):
        sim.step()
    kept = sim.fleet.facts.events().events
    assert len(kept) == 4
    sim.restart_controller()  # flushes, as a shutdown does; a SIGKILL loses up to a second
    assert sim.fleet.facts.events().events == kept
    cursor = kept[-1].id
    sim.fleet.facts.set_flag("gpu2", AdminFlag.DRAINING, "BIOS", "ops")
    for _ in range(4):
        sim.step()
    after = sim.fleet.facts.events(cursor)
    assert [e.id for e in after.events] == list(range(cursor + 1, cursor + 4))
    assert after.cursor == cursor + 3
    assert sim.fleet.facts.events(after.cursor).events == []
    assert sim.fleet.facts.events(after.cursor).cursor == after.cursor
    assert [e.reason for e in sim.fleet.facts.events(0, "node/gpu2").events] == [
        EventReason.DRAINED
    ]


def test_events_are_bounded_in_memory_and_in_the_store(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llmgw.controller.facts, "EVENTS_KEPT", 5)
    monkeypatch.setattr(llmgw.controller.events, "KEEP", 5)
    sim = LoadingSim(tmp_path, clock, ["gpu1"])
    for i in range(12):
        sim.fleet.facts.event("node/gpu1", EventReason.NODE_LOST, f"event {i}")
    sim.fleet.facts.flush()
    assert [e.message for e in sim.fleet.facts.events().events] == [
        f"event {i}" for i in range(7, 12)
    ]
    sim.restart_controller()
    assert [e.message for e in sim.fleet.facts.events().events] == [
        f"event {i}" for i in range(7, 12)
    ]
    # Nothing older than a week is kept.
    clock.advance(8 * 86400)
    sim.fleet.facts.event("node/gpu1", EventReason.NODE_LOST, "today")
    sim.fleet.facts.flush()
    sim.restart_controller()
    assert [e.message for e in sim.fleet.facts.events().events] == ["today"]
