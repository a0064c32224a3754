"""Events (issue 21 item 7): every decision the controller takes by itself is an
event with time, object, reason and message, kept durably and bounded, read with
`since=` and `for=`. Issue 36 item 4: repeats are counted as one event, and each
reason keeps its own newest, so that no flood of one kind pushes another out."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from fleet_factories import FakeClock
from loading_sim import BROKEN, LoadingSim
from test_reconcile import MODEL

from llmgw import render
from llmgw.controller.state import events
from llmgw.wire import AdminFlag, EventReason, EventView


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
    monkeypatch.setattr(events, "KEEP_PER_REASON", 5)
    sim = LoadingSim(tmp_path, clock, ["gpu1"])
    for i in range(12):  # each of its own node: repeats of one would be counted as one
        sim.fleet.facts.event(f"node/gpu{i}", EventReason.NODE_LOST, f"event {i}")
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


def test_repeats_of_one_object_and_reason_are_one_event_with_a_count(
    tmp_path: Path, clock: FakeClock
) -> None:
    sim = LoadingSim(tmp_path, clock, ["gpu1"])
    facts = sim.fleet.facts
    first_at = facts.wall()
    for _ in range(5):  # a card that flaps every 9 minutes
        facts.event("node/gpu1", EventReason.GPU_FAULT, "card fault: GPU 3: cordoned already")
        clock.advance(540)
    [flaps] = facts.events().events
    assert (flaps.count, flaps.first_at, flaps.at) == (5, first_at, first_at + 4 * 540)
    assert flaps.id == 5, "each repeat moves it to a new id"
    facts.event("node/gpu1", EventReason.NODE_LOST, "lost")  # another reason: its own
    facts.event("node/gpu1", EventReason.GPU_FAULT, "card fault: GPU 3: cordoned already")
    after = facts.events(flaps.id).events
    assert [(e.reason, e.count) for e in after] == [
        (EventReason.NODE_LOST, 1),
        (EventReason.GPU_FAULT, 6),
    ], "a watcher past its id sees it again, counted"
    facts.flush()
    sim.restart_controller()
    assert sim.fleet.facts.events().events == after, "counted in the store alike"
    clock.advance(events.WINDOW_S + 1)  # quiet for longer than the window: a new run
    sim.fleet.facts.event("node/gpu1", EventReason.GPU_FAULT, "card fault: GPU 3: cordoned")
    assert [e.count for e in sim.fleet.facts.events(0, "node/gpu1").events] == [1, 6, 1]


def test_a_run_keeps_ten_messages_then_counts_the_rest(tmp_path: Path, clock: FakeClock) -> None:
    sim = LoadingSim(tmp_path, clock, ["gpu1"])
    facts = sim.fleet.facts
    for i in range(25):  # a drain moving 25 replicas of one model
        facts.event("model/llama", EventReason.STAND_IN, f"r{i} to stand in for o{i}")
        clock.advance(1)
    kept = facts.events().events
    assert [e.message for e in kept[:-1]] == [f"r{i} to stand in for o{i}" for i in range(9)]
    assert (kept[-1].message, kept[-1].count) == ("r24 to stand in for o24", 16)
    assert kept[-1].first_at == kept[0].at + 9


def test_a_flood_of_one_kind_leaves_every_other_kind_in_place(
    tmp_path: Path, clock: FakeClock
) -> None:
    """At the bound: 100,000 enrollments of as many names, flushed as they come."""
    sim = LoadingSim(tmp_path, clock, ["gpu1"])
    facts = sim.fleet.facts
    decisions = [
        ("model/llama", EventReason.PLACED, "placed 2 replica(s)"),
        ("node/gpu1", EventReason.DRAINED, "every replica moved: cordoned, drained"),
        ("model/chat", EventReason.SCALED_UP, "desired 1 -> 2"),
    ]
    for obj, reason, message in decisions:
        facts.event(obj, reason, message)
    for i in range(100_000):
        facts.event(f"node/n{i}", EventReason.ENROLLED, "credential issued (enroll)")
        if i % 10_000 == 0:
            facts.flush()
    facts.flush()

    def kept(sim: LoadingSim) -> tuple[list[tuple[str, EventReason, str]], list[str]]:
        found = sim.fleet.facts.events().events
        others = [
            (e.object, e.reason, e.message) for e in found if e.reason is not EventReason.ENROLLED
        ]
        return others, [e.object for e in found if e.reason is EventReason.ENROLLED]

    others, enrolled = kept(sim)
    assert others == decisions
    assert enrolled == [f"node/n{i}" for i in range(99_000, 100_000)]
    assert len(enrolled) == events.KEEP_PER_REASON
    sim.restart_controller()
    assert kept(sim) == (others, enrolled), "the store keeps the same"


def test_ctl_shows_a_counted_event_as_kubectl_does() -> None:
    now = time.time()
    once = EventView(id=1, at=now - 30, object="node/a", reason=EventReason.DRAINED, message="d")
    flaps = EventView(
        id=2,
        at=now - 250,
        object="node/b",
        reason=EventReason.GPU_FAULT,
        message="card fault: GPU 3",
        count=12,
        first_at=now - 250 - 7980,
    )
    lines = render.events_table([once, flaps]).format().splitlines()
    assert re.match(r" *3\ds +Drained +node/a +d$", lines[1]), lines[1]
    assert re.match(r" *4m1\ds \(x12 over 2h13m\) +GpuFault +node/b +card fault", lines[2]), lines[
        2
    ]


class FlakyStore:
    """Takes add_events as a store does, or fails while `fail` is set."""

    def __init__(self) -> None:
        self.rows: dict[int, EventView] = {}
        self.fail = False

    def add_events(self, written: list[EventView], *, gone: set[int], keep_after: float) -> None:
        if self.fail:
            self.fail = False
            raise OSError("disk full")
        for i in gone:
            self.rows.pop(i, None)
        self.rows.update({e.id: e for e in written})


def test_a_failed_save_writes_and_deletes_all_of_it_next_time() -> None:
    kept, store = events.Events([]), FlakyStore()
    kept.add(1000.0, "node/a", EventReason.GPU_FAULT, "fault")
    kept.save(store, 1000.0)
    assert list(store.rows) == [1]
    store.fail = True
    kept.add(1001.0, "node/a", EventReason.GPU_FAULT, "fault")  # counted: 1 goes, 2 comes
    with pytest.raises(OSError):
        kept.save(store, 1001.0)
    assert list(store.rows) == [1]
    kept.save(store, 1001.0)
    assert [(e.id, e.count) for e in store.rows.values()] == [(2, 2)]
