"""The reconcile loop's steps, each called on a snapshot built by hand: no store, no
facts, no term. Each test asserts on the plan a step returns."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleet_factories import FakeClock, gpu, make_fleet, report

from llmgw.controller.core.records import Backoff, LeaveReason, ReplicaRecord, ShardRecord
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.loop.apply import apply, take_snapshot
from llmgw.controller.loop.demand import reclaim, scale
from llmgw.controller.loop.drains import cancel_called_off, drain
from llmgw.controller.loop.faults import FaultCordons
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot, replica_sets
from llmgw.controller.loop.loop_memory import LoopMemory
from llmgw.controller.loop.outcomes import record_transitions, replace_lost, retire_deleted
from llmgw.controller.loop.plans import (
    BackOff,
    ClearBackoff,
    Cordon,
    DrainBlocked,
    ForgetScaling,
    Scaling,
    Stopping,
    Unplaceable,
)
from llmgw.controller.loop.rolling import roll
from llmgw.controller.loop.shortfalls import shortfalls
from llmgw.controller.state.liveness import Liveness
from llmgw.controller.state.replicas import ReplicaStatus
from llmgw.controller.term import Term
from llmgw.controller.views.endpoints import GateView, LiveGateway
from llmgw.controller.views.model_views import leave_words
from llmgw.wire import AdminFlag, EventReason, ModelSpec, ReplicaState

SETTINGS = ControllerSettings(state_dir=Path("/nonexistent"))
CHAT = ModelSpec(name="chat", source="org/chat", min_replicas=1, gpus_per_shard=1)


def replica(
    rid: str,
    state: ReplicaState = ReplicaState.READY,
    *,
    model: str = "chat",
    node: str = "n1",
    created_at: float = 1.0,
    **fields: Any,
) -> ReplicaRecord:
    shard = ShardRecord(node, 0, (f"GPU-{rid}",))
    return ReplicaRecord(rid, model, state, (shard,), created_at, **fields)


def status(rec: ReplicaRecord, state: ReplicaState | None = None) -> ReplicaStatus:
    """The replica as its agents report it (`state`: what they say, else its record's)."""
    return ReplicaStatus(rec, state or rec.state, (None,) * len(rec.shards), None)


def snapshot(
    replicas: Iterable[ReplicaRecord],
    models: Iterable[ModelSpec] = (CHAT,),
    *,
    reported: Mapping[str, ReplicaState] | None = None,
    outdated: Iterable[str] = (),
    backoffs: Mapping[str, Backoff] | None = None,
    unplaceable: Mapping[str, str] | None = None,
    gate: GateView | None = None,
) -> FleetSnapshot:
    records = {r.id: r for r in replicas}
    specs = {m.name: m for m in models}
    reported = reported or {}
    return FleetSnapshot(
        now=100.0,
        wall=1_000.0,
        settings=SETTINGS,
        models=specs,
        revisions={name: 1 for name in specs},
        desired={name: spec.min_replicas for name, spec in specs.items()},
        backoffs=backoffs or {},
        records=records,
        statuses={rid: status(r, reported.get(rid)) for rid, r in records.items()},
        outdated=frozenset(outdated),
        nodes={},
        admin={},
        pending={},
        liveness=Liveness(SETTINGS, started_at=0.0),
        faults={},
        rollout_notes={},
        unplaceable=unplaceable or {},
        placement_reasons=unplaceable or {},
        capacity_version=7,
        revision=9,
        gate=gate,
    )


def test_which_replicas_count_for_a_model_is_said_once() -> None:
    original = replica("a", ReplicaState.DRAINING)
    stand_in = replica("b", ReplicaState.STARTING, replaces="a")
    plain = replica("c")
    leaving = replica("d", ReplicaState.DRAINING).leaves(LeaveReason.SCALE_DOWN, "scale down")
    failed = replica("e")
    statuses = [status(original), status(stand_in), status(plain), status(leaving)]
    statuses.append(status(failed, ReplicaState.FAILED))

    sets = replica_sets(statuses)["chat"]

    def ids(group: Iterable[ReplicaStatus]) -> list[str]:
        return [s.record.id for s in group]

    assert ids(sets.standing) == ["b", "c"], "a stand-in counts in its original's place"
    assert ids(sets.standing_in) == ["b"]
    assert ids(sets.moving) == ["a"]
    assert ids(sets.leaving) == ["d"]
    assert ids(sets.failed) == ["e"]
    assert ids(sets.live) == ["a", "b", "c", "d"]


def test_a_replica_whose_shards_are_ready_becomes_ready() -> None:
    starting = replica("a", ReplicaState.STARTING)
    snap = snapshot(
        [starting],
        reported={"a": ReplicaState.READY},
        backoffs={"chat": Backoff("chat", 1, 2_000.0, "crashed")},
    )

    plan = record_transitions(snap)

    assert [(r.id, r.state) for r in plan.put] == [("a", ReplicaState.READY)]
    assert plan.of(ClearBackoff) == [], "not at its first ready: it may die just after"
    assert plan.removed == []


def test_a_backoff_ends_once_a_replica_has_been_ready_a_while() -> None:
    """An engine that dies just after it turned ready (at its first request; a crash
    loop whose health check answered for a moment) keeps backing off: before, its first
    ready cleared the backoff, and each crash started it over at its base (seen as a
    placement 1 s after the one before, not 4 s, in test_a_crash_looping_engine_backs_off
    on a loaded machine)."""
    ready = replica("a", ReplicaState.READY)
    backoffs = {"chat": Backoff("chat", 3, 2_000.0, "crashed")}
    reset_s = SETTINGS.backoff_reset_s
    for since, cleared in ((100.0 - reset_s + 1, []), (100.0 - reset_s, [ClearBackoff("chat")])):
        snap = replace(snapshot([ready], backoffs=backoffs), ready_since={"a": since})
        assert record_transitions(snap).of(ClearBackoff) == cleared


def test_a_failed_replica_is_removed_and_its_model_backs_off() -> None:
    snap = snapshot([replica("a")], reported={"a": ReplicaState.FAILED})

    plan = record_transitions(snap)

    assert plan.removed == ["a"]
    assert plan.of(BackOff) == [BackOff("chat", "engine failed", 1_000.0)]
    assert plan.put == []


def test_replicas_of_a_deleted_model_wait_for_the_gateways_then_stop() -> None:
    gone = replica("a", model="old")
    holding = GateView(now=100.0, grace_s=math.inf, live=(LiveGateway(None, {}),))

    waits = retire_deleted(snapshot([gone], gate=holding))
    stops = retire_deleted(snapshot([gone]))

    assert waits.stopping == ["a"] and waits.removed == [], "out of routing, not stopped yet"
    assert stops.removed == ["a"]
    assert [e.reason for e in stops.events] == [EventReason.STOPPED]


def test_a_gate_lets_go_of_what_every_live_gateway_applied() -> None:
    gate = GateView(
        now=100.0,
        grace_s=60.0,
        live=(LiveGateway(12, {}), LiveGateway(12, {"busy": 1})),
        stopping={"a": (10, 90.0), "busy": (10, 90.0), "late": (20, 90.0), "old": (99, 30.0)},
    )

    assert gate.lets_go(["a", "busy", "late", "old", "new"]) == ["a", "old"]
    assert gate.lets_go(["busy"], force=True) == ["busy"], "forced: in flight does not wait"
    assert GateView(now=1.0, grace_s=60.0).lets_go(["new"]) == ["new"], "no gateway at all"


def test_a_stop_waits_for_no_other_models_change() -> None:
    """A gateway still applying a slow change of model B (its cursor held back, up to
    about 35 s) has let go of model A's replica once its SMG dropped A's worker: the
    stop of A waits for that, not for B (issue 36)."""
    stopping = {"a": (10, 90.0), "busy": (10, 90.0)}
    slow = LiveGateway(9, {"busy": 1}, released=frozenset({"a", "busy"}))
    gate = GateView(now=100.0, grace_s=60.0, live=(LiveGateway(12, {}), slow), stopping=stopping)
    assert gate.lets_go(["a", "busy"]) == ["a"], "released, but a request still runs on busy"
    assert gate.lets_go(["busy"], force=True) == ["busy"]
    # Neither applied nor released: it may still route there.
    held = LiveGateway(9, {}, released=frozenset({"busy"}))
    assert GateView(now=100.0, grace_s=60.0, live=(held,), stopping=stopping).lets_go(["a"]) == []
    # Released but never marked stopping: nothing lets it go before its mark.
    unmarked = GateView(now=100.0, grace_s=60.0, live=(slow,))
    assert unmarked.lets_go(["a"]) == []


def test_one_replica_above_the_desired_count_leaves_as_a_scale_down() -> None:
    old, new = replica("a", created_at=1.0), replica("b", created_at=2.0)

    plan = scale(snapshot([old, new]), LoopMemory())

    [leaving] = plan.put
    assert leaving.id == "b", "the newest: its cache is the coldest"
    assert leaving.leave_reason is LeaveReason.SCALE_DOWN and leaving.reclaimed_for is None
    assert leaving.state is ReplicaState.DRAINING
    assert plan.removed == ["b"], "no gateway to wait for"
    assert plan.of(ForgetScaling) == [ForgetScaling(frozenset({"chat"}))]
    assert [a.model for a in plan.of(Scaling)] == ["chat"]


def test_demand_back_takes_a_scale_down_back_but_never_a_reclaimed_replica() -> None:
    spec = CHAT.model_copy(update={"min_replicas": 2})
    scaled = replica("a", ReplicaState.DRAINING).leaves(LeaveReason.SCALE_DOWN, "scale down")
    reclaimed = replica("b", ReplicaState.DRAINING).leaves(
        LeaveReason.RECLAIM, "reclaimed for big (priority 9)", "big"
    )
    holding = GateView(now=100.0, grace_s=math.inf, live=(LiveGateway(None, {}),))

    plan = scale(snapshot([scaled, reclaimed], [spec], gate=holding), LoopMemory())

    assert [(r.id, r.state, r.leave_reason) for r in plan.put] == [("a", ReplicaState.READY, None)]
    assert plan.stopping == ["b"] and plan.removed == []


def test_no_second_reclaim_while_one_for_the_same_model_is_on_its_way() -> None:
    big = ModelSpec(name="big", source="org/big", min_replicas=1, gpus_per_shard=8, priority=9)
    low = CHAT.model_copy(update={"min_replicas": 0})
    on_its_way = replica("a", ReplicaState.DRAINING).leaves(
        LeaveReason.RECLAIM, "reclaimed for big (priority 9)", "big"
    )
    snap = snapshot([on_its_way, replica("b")], [big, low], unplaceable={"big": "no room"})

    memory = LoopMemory()
    assert not reclaim(snap, memory)
    assert not memory.reclaim_hopeless(big, 7), "not even weighed: its room is on its way"


def test_a_rollout_takes_an_old_replica_out_once_a_new_one_serves() -> None:
    old, new = replica("old", revision=1), replica("new", revision=2)

    plan = roll(snapshot([old, new], outdated={"old"}))

    assert [(r.id, r.state) for r in plan.put] == [("old", ReplicaState.DRAINING)]
    assert [e.reason for e in plan.events] == [EventReason.ROLLOUT]
    assert plan.removed == []


def test_a_called_off_drain_keeps_its_replica_and_withdraws_the_stand_in() -> None:
    original = replica("a", ReplicaState.DRAINING, error="drain")
    stand_in = replica("b", ReplicaState.STARTING, node="n2", replaces="a")

    plan = cancel_called_off(snapshot([original, stand_in]))

    assert plan.removed == ["b"]
    assert [(r.id, r.state, r.error) for r in plan.put] == [("a", ReplicaState.READY, None)]


def test_a_short_model_is_wanted_and_a_satisfied_one_loses_its_reason() -> None:
    short = CHAT.model_copy(update={"name": "short", "min_replicas": 2})
    snap = snapshot(
        [replica("a"), replica("b", model="short")], [CHAT, short], unplaceable={"chat": "was full"}
    )

    wants, plan = shortfalls(snap, LoopMemory(), set())

    assert [(w.spec.name, w.missing) for w in wants] == [("short", 1)]
    assert plan.actions == (Unplaceable("chat", None),)


def test_a_plan_with_a_gate_marks_before_it_removes() -> None:
    """A scale-down with gateways that let go at once: out of routing, then removed."""
    gate = GateView(now=100.0, grace_s=0.0, live=(LiveGateway(None, {}),))
    plan = scale(snapshot([replica("a"), replica("b", created_at=2.0)], gate=gate), LoopMemory())

    kinds = [type(a).__name__ for a in plan.actions if not isinstance(a, (Scaling, ForgetScaling))]
    assert kinds == ["Put", "Event", "Stopping", "Remove", "Event"]
    assert plan.of(Stopping) == [Stopping(("b",))]


def test_a_model_view_says_why_replicas_leave_from_the_reason_not_its_text() -> None:
    big = ModelSpec(name="big", source="org/big", min_replicas=1, gpus_per_shard=8, priority=9)

    assert leave_words(LeaveReason.SCALE_DOWN, None, 2, {}) == "scale down to 2"
    assert leave_words(LeaveReason.RECLAIM, "big", 2, {"big": big}) == (
        "reclaimed for big (priority 9)"
    )
    assert leave_words(LeaveReason.RECLAIM, "big", 2, {}) == "reclaimed for big"


# -- steps on a snapshot of a term's facts (fleet_factories): they write nothing ----------


def term_with_nodes(tmp_path: Path, nodes: dict[str, list[dict[str, Any]] | None]) -> Term:
    """A term whose agents reported once: node -> its cards (None: 8 healthy ones)."""
    term = make_fleet(tmp_path, FakeClock())
    for node, cards in nodes.items():
        term.ingest(report(node, gpus=cards))
    term.facts.put_models([CHAT])
    return term


def on(node: str, rid: str, state: ReplicaState = ReplicaState.READY) -> ReplicaRecord:
    shard = ShardRecord(node, 0, (f"GPU-{node}-0",))
    return ReplicaRecord(rid, "chat", state, (shard,), 1.0, revision=1)


def test_a_drain_plans_a_stand_in_elsewhere_and_writes_nothing(tmp_path: Path) -> None:
    term = term_with_nodes(tmp_path, {"gpu1": None, "gpu2": None})
    term.facts.put_replicas([on("gpu1", "a")])
    term.facts.set_flag("gpu1", AdminFlag.DRAINING, "BIOS update", "ops")
    snap = take_snapshot(term, None)
    revision, events = term.facts.revision, term.facts.events().cursor

    plan = drain(snap)

    assert (term.facts.revision, term.facts.events().cursor) == (revision, events)
    [original, stand_in] = plan.put
    assert (original.id, original.state) == ("a", ReplicaState.DRAINING)
    assert (stand_in.replaces, stand_in.nodes) == ("a", ("gpu2",))
    assert plan.of(DrainBlocked) == [DrainBlocked("gpu1", None)]
    apply(term.facts, plan)
    assert term.facts.records[stand_in.id].replaces == "a"


def test_a_failed_card_plans_a_cordon_once_it_is_applied(tmp_path: Path) -> None:
    cards = [gpu("gpu1", i, health="unhealthy" if i == 3 else "healthy") for i in range(8)]
    term = term_with_nodes(tmp_path, {"gpu1": cards})
    cordons = FaultCordons()
    snap = take_snapshot(term, None)

    plan = cordons.plan(snap)

    [cordon] = plan.of(Cordon)
    assert cordon.node == "gpu1" and "GPU 3" in cordon.reason
    assert [e.reason for e in plan.events] == [EventReason.GPU_FAULT]
    assert term.facts.admin_info("gpu1").flag is AdminFlag.NONE, "decided, not written"
    assert cordons.plan(snap) == plan, "not acted on until applied"
    apply(term.facts, plan)
    cordons.acted(snap.faults)
    assert term.facts.admin_info("gpu1").flag is AdminFlag.CORDONED
    assert not cordons.plan(take_snapshot(term, None)), "one cordon per fault"


def test_replicas_on_a_node_gone_too_long_are_planned_away(tmp_path: Path) -> None:
    clock = FakeClock()
    term = make_fleet(tmp_path, clock, replace_after_s=60.0)
    term.ingest(report("gpu1"))
    term.facts.put_models([CHAT])
    term.facts.put_replicas([on("gpu1", "a")])
    assert not replace_lost(take_snapshot(term, None))

    clock.advance(1_000.0)
    plan = replace_lost(take_snapshot(term, None))

    assert plan.removed == ["a"]
    assert [e.reason for e in plan.events] == [EventReason.NODE_LOST]
    assert "a" in term.facts.records
