"""The change log of `Term`: one revision per change, a bounded history,
and long polls that wake on a change."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fleet_factories import FakeClock, make_fleet, report

from llmgw.controller.core.changes import Change, ChangeKind, ChangeLog, HistoryLost
from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.term import Term
from llmgw.wire import AdminFlag, ModelSpec, ReplicaState


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fleet(tmp_path: Path, clock: FakeClock) -> Term:
    f = make_fleet(tmp_path, clock)
    for name in ("a", "b"):
        f.ingest(report(name, n_gpus=4))
    return f


def kinds(changes: list[Change]) -> list[tuple[ChangeKind, str]]:
    return [(c.kind, c.key) for c in changes]


def test_each_change_gets_the_next_revision_with_its_kind_and_key(fleet: Term) -> None:
    start = fleet.facts.revision
    fleet.facts.set_flag("a", AdminFlag.CORDONED, "fan", "ops")
    fleet.facts.put_models([ModelSpec(name="m", source="org/m", min_replicas=0)])
    changes = fleet.facts.changes_since(start)
    assert [c.revision for c in changes] == list(range(start + 1, fleet.facts.revision + 1))
    # The cordon changes the node's row too, but the row is a view (node_rows.py):
    # the log says what the writer changed, the flag, and the view follows it.
    assert kinds(changes) == [(ChangeKind.ADMIN, "a"), (ChangeKind.MODEL, "m")]
    assert fleet.facts.changes_since(fleet.facts.revision) == []


def test_a_report_that_changes_nothing_appends_nothing(fleet: Term, clock: FakeClock) -> None:
    start = fleet.facts.revision
    clock.advance(1)
    fleet.ingest(report("a", n_gpus=4))
    assert fleet.facts.changes_since(start) == []
    fleet.ingest(report("a", n_gpus=3))
    assert kinds(fleet.facts.changes_since(start)) == [(ChangeKind.NODE, "a")]


def test_replicas_backoffs_and_reasons_are_logged(fleet: Term) -> None:
    fleet.facts.put_models([ModelSpec(name="m", source="org/m", min_replicas=0)])
    start = fleet.facts.revision
    rec = ReplicaRecord("r1", "m", ReplicaState.STARTING, (ShardRecord("a", 0, ("GPU-a-0",)),), 0.0)
    fleet.facts.put_replicas([rec])
    # The node's report did not change, so neither did its facts (its digest is the
    # report's): the cards the replica holds are its assignments, which the views
    # that count cards in use join (`NodeDigest.counted`).
    assert kinds(fleet.facts.changes_since(start)) == [
        (ChangeKind.REPLICA, "r1"),
        (ChangeKind.ASSIGNMENTS, "a"),
    ]
    assert fleet.rows.row("a").gpus_used == 1
    assert [(g.used, g.free) for g in fleet.summary().gpus] == [(1, 7)]
    start = fleet.facts.revision
    fleet.facts.back_off("m", "CUDA out of memory", 0.0)
    fleet.facts.decisions.set_unplaceable("m", "no room")
    fleet.facts.decisions.set_unplaceable("m", "no room")  # the same reason again is no change
    fleet.facts.clear_backoff("m")
    fleet.facts.decisions.set_unplaceable("m", None)
    assert kinds(fleet.facts.changes_since(start)) == [
        (ChangeKind.BACKOFF, "m"),
        (ChangeKind.UNPLACEABLE, "m"),
        (ChangeKind.BACKOFF, "m"),
        (ChangeKind.UNPLACEABLE, "m"),
    ]


def test_an_old_or_future_revision_is_detectable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llmgw.controller.core.changes.HISTORY_KEPT", 3)
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


@pytest.mark.parametrize("back", [0, 1, 64, 65, 200])
def test_since_gives_every_change_after_a_revision_near_or_far(back: int) -> None:
    log = ChangeLog()
    for i in range(200):
        log.append(list(ChangeKind)[i % len(ChangeKind)], f"k{i + 1}")
    after = log.revision - back
    assert [(c.revision, c.kind, c.key) for c in log.since(after)] == [
        (r, list(ChangeKind)[(r - 1) % len(ChangeKind)], f"k{r}") for r in range(after + 1, 201)
    ]


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
    tmp_path: Path, fleet: Term, clock: FakeClock
) -> None:
    fleet.facts.put_models([ModelSpec(name="m", source="org/m", min_replicas=0)])
    fleet.facts.set_flag("b", AdminFlag.CORDONED, "dead PSU", "ops")
    shards = (ShardRecord("a", 0, ("GPU-a-0",)), ShardRecord("b", 1, ("GPU-b-0",)))
    fleet.facts.put_replicas([ReplicaRecord("r1", "m", ReplicaState.READY, shards, 0.0)])
    assert fleet.summary().nodes.total == 2
    start = fleet.facts.revision
    fleet.facts.forget_node("b", "ops")
    assert (
        "b" not in fleet.facts.nodes
        and "b" not in fleet.facts.admin
        and "r1" not in fleet.facts.records
    )
    changes = kinds(fleet.facts.changes_since(start))
    assert (ChangeKind.NODE, "b") in changes and (ChangeKind.REPLICA, "r1") in changes
    assert (ChangeKind.ASSIGNMENTS, "a") in changes  # a's shard of r1 is gone too
    summary = fleet.summary()
    assert (summary.nodes.total, summary.nodes.cordoned, summary.replicas.ready) == (1, 0, 0)
    assert fleet.rows.row("a").replicas == 0
    fleet.facts.close()
    restarted = make_fleet(tmp_path, clock)
    assert (
        set(restarted.facts.nodes) == {"a"}
        and not restarted.facts.admin
        and not restarted.facts.records
    )
