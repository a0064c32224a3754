"""One follower protocol for every view of the change log (follow.py): what a view
is told, and that a view fallen behind the history kept is told to resync and then
shows what it would have shown had it followed every change."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from fleet_factories import FakeClock, make_fleet, report

from llmgw.controller.core.changes import SUBJECTS, Change, ChangeKind
from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.term import Term
from llmgw.controller.views.follow import replay
from llmgw.wire import AdminFlag, GatewayStatus, ModelSpec, ReplicaState

MODEL = ModelSpec(name="m", source="org/m", min_replicas=0, gpus_per_shard=1)


class Recorder:
    """A handler that writes down what it is told."""

    follows: ClassVar[frozenset[ChangeKind]] = frozenset(
        {ChangeKind.NODE, ChangeKind.ADMIN, ChangeKind.REPLICA}
    )

    def __init__(self) -> None:
        self.told: list[tuple[str, ChangeKind | None, str, int]] = []

    def changed(self, change: Change, now: float) -> None:
        self.told.append(("changed", change.kind, change.key, change.revision))

    def removed(self, change: Change, now: float) -> None:
        self.told.append(("removed", change.kind, change.key, change.revision))

    def resync(self, revision: int, now: float) -> None:
        self.told.append(("resync", None, "", revision))


@pytest.fixture
def fleet(tmp_path: Path) -> Term:
    term = make_fleet(tmp_path, FakeClock())
    for name in ("a", "b"):
        term.ingest(report(name, n_gpus=4))
    return term


def told(fleet: Term, after: int) -> list[tuple[str, ChangeKind | None, str, int]]:
    recorder = Recorder()
    assert replay(fleet.facts, after, recorder, fleet.facts.clock()) == fleet.facts.revision
    return recorder.told


def test_every_kind_of_change_names_what_its_key_is() -> None:
    assert set(SUBJECTS) == set(ChangeKind)


def test_a_view_is_told_once_of_each_key_with_its_newest_change(fleet: Term) -> None:
    start = fleet.facts.revision
    fleet.facts.set_flag("a", AdminFlag.CORDONED, "fan", "ops")
    fleet.ingest(report("a", n_gpus=3))
    fleet.facts.put_models([MODEL])  # a kind the view does not follow
    assert told(fleet, start) == [("changed", ChangeKind.NODE, "a", fleet.facts.revision - 1)]
    assert told(fleet, fleet.facts.revision) == []


def test_a_key_gone_is_removed_and_one_back_since_is_changed(fleet: Term) -> None:
    fleet.facts.put_models([MODEL])
    rec = ReplicaRecord("r1", "m", ReplicaState.READY, (ShardRecord("b", 0, ("GPU-b-0",)),), 0.0)
    fleet.facts.put_replicas([rec])
    start = fleet.facts.revision
    fleet.facts.forget_node("b", "ops")  # its replica goes with it
    assert [t[:3] for t in told(fleet, start)] == [
        ("removed", ChangeKind.NODE, "b"),
        ("removed", ChangeKind.REPLICA, "r1"),
    ]
    fleet.ingest(report("b", n_gpus=4))  # back, as a new node
    assert [t[:3] for t in told(fleet, start)] == [
        ("changed", ChangeKind.NODE, "b"),
        ("removed", ChangeKind.REPLICA, "r1"),
    ]


def test_a_revision_the_log_does_not_hold_is_a_resync(
    fleet: Term, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert told(fleet, -1) == [("resync", None, "", fleet.facts.revision)]  # the first look
    assert told(fleet, fleet.facts.revision + 1) == [("resync", None, "", fleet.facts.revision)]
    monkeypatch.setattr("llmgw.controller.core.changes.HISTORY_KEPT", 2)
    start = fleet.facts.revision
    for n in (3, 2, 1):
        fleet.ingest(report("a", n_gpus=n))
    assert told(fleet, start) == [("resync", None, "", fleet.facts.revision)]


def test_views_behind_the_history_kept_show_what_they_would_have_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two terms over the same store, one read after every change, one only at the end
    past a history of three changes: every view of the late one shows what the other
    does (after a resync: a full answer for an older cursor)."""
    late, eager = (
        make_fleet(tmp_path / "late", FakeClock()),
        make_fleet(tmp_path / "e", FakeClock()),
    )
    gateway = GatewayStatus(name="gw", cursor="", in_flight={"r1": 1}, requests={"r1": 3})

    def read(term: Term) -> tuple[object, ...]:
        return (
            term.summary().model_dump(exclude={"generated_at"}),
            term.rows.rows(),
            [term.replies.reply_json(n, term.facts.clock()) for n in sorted(term.facts.nodes)],
            [(g.in_flight, g.requests) for g in term.gateways.live(term.facts.clock())],
        )

    steps = [
        lambda t: [t.ingest(report(n, n_gpus=4)) for n in ("a", "b", "c")],
        lambda t: t.facts.put_models([MODEL]),
        lambda t: t.facts.put_replicas(
            [ReplicaRecord("r1", "m", ReplicaState.READY, (ShardRecord("a", 0, ("GPU-a-0",)),), 0)]
        ),
        lambda t: t.gateways.report(gateway),  # a status naming r1 while it exists
        lambda t: t.facts.set_flag("b", AdminFlag.CORDONED, "fan", "ops"),
        lambda t: t.facts.remove_replicas(["r1"]),
        lambda t: t.facts.forget_node("c", "ops"),
        lambda t: t.ingest(report("d", n_gpus=2)),
    ]
    for term in (late, eager):
        cursor = ""
        for i, step in enumerate(steps):
            step(term)
            if term is eager or i == 3:
                read(term)
                cursor = cursor or term.rows.nodes_since("").cursor
            if i == 3:
                monkeypatch.setattr("llmgw.controller.core.changes.HISTORY_KEPT", 3)
        monkeypatch.undo()
        delta = term.rows.nodes_since(cursor)
        assert delta.full is (term is late)
    assert read(late) == read(eager)
    assert late.gateways.seen["gw"].requests == {}  # r1's went with it, in a resync
    assert [name for name, f in late.followers.items() if f.holds("c")] == []  # forgotten
