"""The spread step (`loop.spread`, issue 32): a sleeping replica on a card where models
keep switching each other out moves, make-before-break, to a quiet card where nothing
is awake; the move never holds a request up. On snapshots built by hand: one node of
three cards, `x` asleep and `y` awake on the busy card 0, `z` asleep on card 1 (room
beside it), `w` awake on card 2."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from test_steps import replica, snapshot

from llmgw.controller.core.contention import WINDOW_S, Contention, Switch
from llmgw.controller.core.nodes import NodeEntry
from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.plans import MoveSettled, Switched
from llmgw.controller.loop.spread import CONTENDED, spread
from llmgw.controller.loop.warm import sleep_and_wake
from llmgw.controller.state.replicas import replica_status
from llmgw.controller.views.endpoints import GateView, LiveGateway
from llmgw.wire import (
    EventReason,
    GpuHealth,
    GpuReport,
    ModelSpec,
    NodeReport,
    ReplicaReport,
    ReplicaState,
    ShardState,
)

TOTAL = 81920
NOW = 100.0
SPECS = [
    ModelSpec(name=n, source=f"org/{n}", min_replicas=0, max_replicas=1, sleep_after_s=10.0)
    for n in ("w", "x", "y", "z")
]
HOT = ("n1", "GPU-0")


def on(rid: str, model: str, card: int, state: ReplicaState, **fields: object) -> ReplicaRecord:
    rec = replica(rid, state, model=model, **fields)  # type: ignore[arg-type]
    return replace(rec, shards=(ShardRecord("n1", 0, (f"GPU-{card}",)),))


def fleet(
    records: Iterable[ReplicaRecord],
    engines: Mapping[str, ShardState],
    *,
    switches: int = CONTENDED,
    held: Mapping[str, int] | None = None,
    moved_lately: frozenset[str] = frozenset(),
) -> FleetSnapshot:
    """The node as its agent reports it: a card's memory nearly all used under an awake
    engine, 512 MiB under a sleeping one, none on a card nobody holds."""
    records = list(records)
    awake_on = {
        r.shards[0].gpus[0] for r in records if engines.get(r.id) not in (ShardState.SLEEPING, None)
    }
    held_on = {r.shards[0].gpus[0] for r in records if r.id in engines}
    cards = [
        GpuReport(
            uuid=f"GPU-{i}",
            index=i,
            gpu_class="H100-SXM-80GB",
            memory_total_mib=TOTAL,
            memory_used_mib=TOTAL - 2048
            if f"GPU-{i}" in awake_on
            else (512 if f"GPU-{i}" in held_on else 0),
            in_use=f"GPU-{i}" in held_on,
            health=GpuHealth.HEALTHY,
        )
        for i in range(3)
    ]
    report = NodeReport(
        node="n1",
        agent_version="t",
        boot_id="b",
        interval_s=5,
        gpus=cards,
        replicas=[
            ReplicaReport(id=r.id, model=r.model, state=engines[r.id], gpus=list(r.shards[0].gpus))
            for r in records
            if r.id in engines
        ],
    )
    entry = NodeEntry("n1", first_seen=0.0)
    entry.update(report, b"", NOW)
    # One live gateway, which let go of the sleeping replicas when they went to sleep.
    gate = GateView(
        now=NOW,
        grace_s=math.inf,
        live=(LiveGateway(50, {}),),
        stopping={r.id: (40, 90.0) for r in records if r.state is ReplicaState.SLEEPING},
        held=dict(held or {}),
    )
    snap = snapshot(records, SPECS, gate=gate)
    shards = {s.replica_id: s for s in entry.shards}
    statuses = {
        r.id: replica_status(r, {(r.id, 0): shards[r.id]} if r.id in shards else {})
        for r in records
    }
    seen = tuple(
        Switch(NOW - i, "x" if i % 2 else "y", "y" if i % 2 else "x") for i in range(switches)
    )
    return replace(
        snap,
        nodes={"n1": entry},
        statuses=statuses,
        switches={HOT: seen} if seen else {},
        moved_lately=moved_lately,
    )


X = on("x", "x", 0, ReplicaState.SLEEPING, asleep_since=900.0)
Y = on("y", "y", 0, ReplicaState.READY)
Z = on("z", "z", 1, ReplicaState.SLEEPING, asleep_since=900.0)
W = on("w", "w", 2, ReplicaState.READY)
ENGINES = {
    "x": ShardState.SLEEPING,
    "y": ShardState.READY,
    "z": ShardState.SLEEPING,
    "w": ShardState.READY,
}


def test_a_sleeping_replica_moves_off_a_card_that_keeps_switching_to_a_quiet_one() -> None:
    plan = spread(fleet([X, Y, Z, W], ENGINES))

    [stand_in] = plan.put
    assert stand_in.model == "x" and stand_in.replaces == "x"
    assert stand_in.state is ReplicaState.STARTING
    assert stand_in.shards[0].gpus == ("GPU-1",), "beside z asleep: not the busy card, not w's"
    assert plan.removed == [], "make-before-break: x stays until its stand-in serves"
    [event] = plan.events
    assert event.reason is EventReason.STAND_IN and event.obj == "model/x"
    assert f"where x and y switched {CONTENDED} times" in event.message


def test_no_move_for_a_card_that_switched_less_for_a_model_moved_lately_or_asked_for() -> None:
    assert not spread(fleet([X, Y, Z, W], ENGINES, switches=CONTENDED - 1))
    assert not spread(fleet([X, Y, Z, W], ENGINES, moved_lately=frozenset({"x"})))
    assert not spread(fleet([X, Y, Z, W], ENGINES, held={"x": 1})), "x wakes where it is"
    assert not spread(fleet([X, Y, Z, W], ENGINES, held={"z": 1})), "z wakes on card 1"
    # Nowhere quiet: card 1 awake too.
    awake_z = on("z", "z", 1, ReplicaState.READY)
    assert not spread(fleet([X, Y, awake_z, W], {**ENGINES, "z": ShardState.READY}))


def _moving(stand_in_state: ReplicaState) -> list[ReplicaRecord]:
    stand_in = on("s", "x", 1, stand_in_state, replaces="x", created_at=2.0)
    return [X, Y, Z, W, stand_in]


def test_a_move_is_called_off_when_requests_come_that_its_start_would_hold_up() -> None:
    starting = {**ENGINES, "s": ShardState.STARTING}
    assert not spread(fleet(_moving(ReplicaState.STARTING), starting)), "nothing asked"
    for asked in ("x", "z"):  # its own model's; the model asleep on the stand-in's card
        plan = spread(fleet(_moving(ReplicaState.STARTING), starting, held={asked: 1}))
        assert plan.removed == ["s"] and plan.put == []
        assert plan.of(MoveSettled) == [MoveSettled("x")]
        [event] = plan.events
        assert event.reason is EventReason.MOVE_CALLED_OFF and event.obj == "replica/x"
        assert f"requests held for {asked}" in event.message


def test_called_off_for_its_models_requests_the_original_wakes_in_the_same_pass() -> None:
    starting = {**ENGINES, "s": ShardState.STARTING}
    snap = fleet(_moving(ReplicaState.STARTING), starting, held={"x": 1})
    called_off = spread(snap)
    left = [r for r in snap.records.values() if r.id not in called_off.removed]
    after = fleet(left, ENGINES, held={"x": 1})

    plan = sleep_and_wake(after)

    # x is its model's replica again (no stand-in pending): its wake begins, y (awake and
    # idle on its card) is switched out first, and x wakes once y sleeps.
    assert plan.of(Switched) == [Switched(HOT, "y", "x")]
    assert [(r.id, r.state) for r in plan.put] == [("y", ReplicaState.SLEEPING)]


def test_the_original_stops_once_its_stand_in_is_ready() -> None:
    ready = {**ENGINES, "s": ShardState.READY}
    plan = spread(fleet(_moving(ReplicaState.READY), ready))

    assert plan.removed == ["x"]
    [ordinary] = plan.put
    assert ordinary.id == "s" and ordinary.replaces is None
    assert plan.of(MoveSettled) == [MoveSettled("x")]
    assert [e.reason for e in plan.events] == [EventReason.MOVED]


def test_a_stand_in_whose_original_is_gone_is_an_ordinary_replica() -> None:
    orphan = on("s", "x", 1, ReplicaState.READY, replaces="gone")
    plan = spread(fleet([orphan, Y, W], {"s": ShardState.READY, **{k: ENGINES[k] for k in "yw"}}))
    assert [(r.id, r.replaces) for r in plan.put] == [("s", None)]


def test_a_switch_is_noted_for_each_card_of_the_replica_put_to_sleep() -> None:
    """The warm step's switches are what the spread step counts."""
    asleep_x = X
    idle_y = Y
    snap = fleet([asleep_x, idle_y, Z, W], ENGINES, switches=0, held={"x": 1})
    plan = sleep_and_wake(snap)
    assert plan.of(Switched) == [Switched(HOT, "y", "x")]


def test_contention_keeps_the_window_only() -> None:
    c = Contention()
    c.switched(HOT, "x", "y", at=0.0)
    c.switched(HOT, "y", "x", at=WINDOW_S / 2)
    c.moved("x", at=WINDOW_S / 2)
    assert [s.at for s in c.recent(WINDOW_S + 1)[HOT]] == [WINDOW_S / 2]
    assert c.moved_lately(WINDOW_S) == {"x"}
    assert c.recent(2 * WINDOW_S) == {} and c.moved_lately(2 * WINDOW_S) == frozenset()
