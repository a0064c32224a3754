"""The change log of `FleetState`: one revision per change, a bounded history,
and long polls that wake on a change."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fleet_factories import FakeClock, make_fleet, report

from llmgw.controller.changes import Change, ChangeKind, ChangeLog, HistoryLost
from llmgw.controller.fleet import FleetState
from llmgw.controller.store import ReplicaRecord, ShardRecord
from llmgw.wire import AdminFlag, ModelSpec, ReplicaState


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fleet(tmp_path: Path, clock: FakeClock) -> FleetState:
    f = make_fleet(tmp_path, clock)
    for name in ("a", "b"):
        f.ingest(report(name, n_gpus=4))
    return f


def kinds(changes: list[Change]) -> list[tuple[ChangeKind, str]]:
    return [(c.kind, c.key) for c in changes]


def test_each_change_gets_the_next_revision_with_its_kind_and_key(fleet: FleetState) -> None:
    start = fleet.revision
    fleet.set_flag("a", AdminFlag.CORDONED, "fan", "ops")
    fleet.put_models([ModelSpec(name="m", source="org/m", min_replicas=0)])
    changes = fleet.changes_since(start)
    assert [c.revision for c in changes] == list(range(start + 1, fleet.revision + 1))
    assert kinds(changes) == [
        (ChangeKind.ADMIN, "a"),
        (ChangeKind.NODE, "a"),
        (ChangeKind.MODEL, "m"),
    ]
    assert fleet.changes_since(fleet.revision) == []


def test_a_report_that_changes_nothing_appends_nothing(fleet: FleetState, clock: FakeClock) -> None:
    start = fleet.revision
    clock.advance(1)
    fleet.ingest(report("a", n_gpus=4))
    assert fleet.changes_since(start) == []
    fleet.ingest(report("a", n_gpus=3))
    assert kinds(fleet.changes_since(start)) == [(ChangeKind.NODE, "a")]


def test_replicas_backoffs_and_reasons_are_logged(fleet: FleetState) -> None:
    fleet.put_models([ModelSpec(name="m", source="org/m", min_replicas=0)])
    start = fleet.revision
    rec = ReplicaRecord("r1", "m", ReplicaState.STARTING, (ShardRecord("a", 0, ("GPU-a-0",)),), 0.0)
    fleet.put_replicas([rec])
    assert kinds(fleet.changes_since(start)) == [
        (ChangeKind.REPLICA, "r1"),
        (ChangeKind.ASSIGNMENTS, "a"),
        (ChangeKind.NODE, "a"),
    ]
    start = fleet.revision
    fleet.back_off("m", "CUDA out of memory", 0.0)
    fleet.set_unplaceable("m", "no room")
    fleet.set_unplaceable("m", "no room")  # the same reason again is no change
    fleet.clear_backoff("m")
    fleet.set_unplaceable("m", None)
    assert kinds(fleet.changes_since(start)) == [
        (ChangeKind.BACKOFF, "m"),
        (ChangeKind.UNPLACEABLE, "m"),
        (ChangeKind.BACKOFF, "m"),
        (ChangeKind.UNPLACEABLE, "m"),
    ]


def test_an_old_or_future_revision_is_detectable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llmgw.controller.changes.HISTORY_KEPT", 3)
    log = ChangeLog()
    for i in range(5):
        log.append(ChangeKind.NODE, f"n{i}")
    assert log.oldest == 2
    assert kinds(log.since(2)) == [
        (ChangeKind.NODE, "n2"),
        (ChangeKind.NODE, "n3"),
        (ChangeKind.NODE, "n4"),
    ]
    with pytest.raises(HistoryLost):
        log.since(1)
    with pytest.raises(HistoryLost):
        log.since(6)


async def test_wait_changed_wakes_on_a_change_and_times_out_without_one() -> None:
    log = ChangeLog()
    waiter = asyncio.create_task(log.wait_changed(log.revision, 5.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    log.append(ChangeKind.MODEL, "m")
    assert await asyncio.wait_for(waiter, 1.0) == 1
    assert await log.wait_changed(0, 5.0) == 1  # already past: at once
    loop = asyncio.get_running_loop()
    t = loop.time()
    assert await log.wait_changed(1, 0.05) == 1
    assert loop.time() - t >= 0.04


def test_forget_node_removes_row_flag_and_replicas_durably(
    tmp_path: Path, fleet: FleetState, clock: FakeClock
) -> None:
    fleet.put_models([ModelSpec(name="m", source="org/m", min_replicas=0)])
    fleet.set_flag("b", AdminFlag.CORDONED, "dead PSU", "ops")
    shards = (ShardRecord("a", 0, ("GPU-a-0",)), ShardRecord("b", 1, ("GPU-b-0",)))
    fleet.put_replicas([ReplicaRecord("r1", "m", ReplicaState.READY, shards, 0.0)])
    assert fleet.summary().nodes.total == 2
    start = fleet.revision
    fleet.forget_node("b", "ops")
    assert "b" not in fleet.nodes and "b" not in fleet.admin and "r1" not in fleet.records
    changes = kinds(fleet.changes_since(start))
    assert (ChangeKind.NODE, "b") in changes and (ChangeKind.REPLICA, "r1") in changes
    assert (ChangeKind.ASSIGNMENTS, "a") in changes  # a's shard of r1 is gone too
    summary = fleet.summary()
    assert (summary.nodes.total, summary.nodes.cordoned, summary.replicas.ready) == (1, 0, 0)
    assert fleet.row("a").replicas == 0
    fleet.close()
    restarted = make_fleet(tmp_path, clock)
    assert set(restarted.nodes) == {"a"} and not restarted.admin and not restarted.records
