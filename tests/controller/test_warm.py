"""The warm tier's step (`warm.sleep_and_wake`) and what it rests on, on snapshots
built by hand: idle replicas sleep instead of stopping, sleeping ones wake for held
requests (the same replica), one that cannot sleep stops (issue 32 items 1-2)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fleet_factories import FakeClock, make_fleet
from fleet_factories import report as fleet_report
from pydantic import ValidationError
from test_steps import CHAT, replica, snapshot

from llmgw.controller.core.nodes import NodeEntry, ShardDigest
from llmgw.controller.core.reclaim import Candidate, order
from llmgw.controller.core.records import LeaveReason, ReplicaRecord
from llmgw.controller.core.revisions import same_engine
from llmgw.controller.loop.demand import scale
from llmgw.controller.loop.drains import drain
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.loop_memory import LoopMemory
from llmgw.controller.loop.outcomes import record_transitions
from llmgw.controller.loop.placing import record_from
from llmgw.controller.loop.plans import MakingRoom, MarkDrained, Plan, Scaling, Started
from llmgw.controller.loop.rolling import roll
from llmgw.controller.loop.warm import OUTRANKING_IDLE_S, sleep_and_wake
from llmgw.controller.state.replicas import answering, replica_status
from llmgw.controller.views.endpoints import GateView, LiveGateway
from llmgw.controller.views.replies import sleep_level
from llmgw.present import Meaning, model_words
from llmgw.scheduler import Placement, place_many
from llmgw.wire import (
    AdapterSpec,
    AdminFlag,
    AdminInfo,
    EventReason,
    GpuHealth,
    GpuReport,
    ModelSpec,
    NodeReport,
    ReplicaReport,
    ReplicaState,
    ShardState,
    SleepFailure,
    StartKind,
    fit_together,
)

SLEEPY = CHAT.model_copy(update={"min_replicas": 0, "max_replicas": 2, "sleep_after_s": 30.0})
NOW = 100.0  # the snapshot's clock
AT_ZERO = SLEEPY.model_copy(update={"max_replicas": None})  # a fixed count of 0: scale down


def shard(
    rec: ReplicaRecord,
    state: ShardState,
    idle_for: float | None = None,
    sleep_error: str | None = None,
    sleep_failure: SleepFailure | None = None,
) -> ShardDigest:
    idle_since = None if idle_for is None else NOW - idle_for
    return ShardDigest(
        rec.id, 0, state, idle_since, None, 8000, None, sleep_error, sleep_failure=sleep_failure
    )


def reported(
    records: Iterable[ReplicaRecord],
    shards: dict[str, ShardDigest],
    models: Iterable[ModelSpec] = (SLEEPY,),
    gate: GateView | None = None,
) -> FleetSnapshot:
    """A snapshot whose replicas' states come from their engines' reports, as the facts'."""
    records = list(records)
    snap = snapshot(records, models, gate=gate)
    statuses = {r.id: replica_status(r, {(r.id, 0): shards[r.id]}) for r in records}
    return replace(snap, statuses=statuses)


def held(model: str, n: int) -> GateView:
    return GateView(now=NOW, grace_s=math.inf, live=(LiveGateway(None, {}),), held={model: n})


def test_a_replica_idle_for_sleep_after_sleeps_instead_of_stopping() -> None:
    idle, busy = replica("a"), replica("b", created_at=2.0)
    shards = {"a": shard(idle, ShardState.READY, 31.0), "b": shard(busy, ShardState.READY, 5.0)}

    plan = sleep_and_wake(reported([idle, busy], shards))

    # No gateway to let go of it: told to sleep at once.
    assert [(r.id, r.state, r.asleep_since) for r in plan.put] == [
        ("a", ReplicaState.SLEEPING, 1_000.0)
    ]
    assert plan.removed == []
    [event] = plan.events
    assert (event.obj, event.reason) == ("replica/a", EventReason.SLEPT)
    assert "idle for 31s" in event.message


def test_a_replica_is_told_to_sleep_only_once_the_gateways_let_go_of_it() -> None:
    idle = replica("a")
    holding = GateView(now=NOW, grace_s=math.inf, live=(LiveGateway(None, {}),))

    decided = sleep_and_wake(
        reported([idle], {"a": shard(idle, ShardState.READY, 60.0)}, gate=holding)
    )

    [going] = decided.put
    assert (going.state, going.asleep_since) == (ReplicaState.SLEEPING, None), "not told yet"
    assert decided.stopping == ["a"], "out of routing as before a stop"
    let_go = GateView(
        now=NOW, grace_s=math.inf, live=(LiveGateway(50, {}),), stopping={"a": (40, 90.0)}
    )
    still = sleep_and_wake(reported([going], {"a": shard(going, ShardState.READY)}, gate=holding))
    told = sleep_and_wake(reported([going], {"a": shard(going, ShardState.READY)}, gate=let_go))
    assert still.put == []
    assert [(r.id, r.state, r.asleep_since) for r in told.put] == [
        ("a", ReplicaState.SLEEPING, 1_000.0)
    ]


def test_nothing_sleeps_for_a_spec_that_does_not_ask() -> None:
    idle = replica("a")
    plain = SLEEPY.model_copy(update={"sleep_after_s": None})

    plan = sleep_and_wake(reported([idle], {"a": shard(idle, ShardState.READY, 3600.0)}, [plain]))

    assert not plan


def test_an_idle_replica_with_requests_held_or_unknown_idleness_stays_awake() -> None:
    idle = replica("a")
    unknown = sleep_and_wake(reported([idle], {"a": shard(idle, ShardState.READY)}))
    holding = sleep_and_wake(
        reported([idle], {"a": shard(idle, ShardState.READY, 60.0)}, gate=held("chat", 1))
    )
    assert not unknown.put and not holding.put


def test_held_requests_wake_the_sleeping_replica_itself() -> None:
    asleep = replica("a", ReplicaState.SLEEPING, asleep_since=900.0)

    plan = sleep_and_wake(
        reported([asleep], {"a": shard(asleep, ShardState.SLEEPING)}, gate=held("chat", 2))
    )

    assert [(r.id, r.state, r.asleep_since) for r in plan.put] == [("a", ReplicaState.WAKING, None)]
    assert [(e.obj, e.reason) for e in plan.events] == [("replica/a", EventReason.WOKE)]
    assert plan.removed == []


def test_held_requests_take_back_one_not_told_to_sleep_yet() -> None:
    going = replica("a", ReplicaState.SLEEPING)

    plan = sleep_and_wake(
        reported([going], {"a": shard(going, ShardState.READY)}, gate=held("chat", 1))
    )

    assert [(r.id, r.state) for r in plan.put] == [("a", ReplicaState.READY)]


def test_one_not_asleep_yet_is_not_woken_and_none_wakes_without_requests() -> None:
    # Told to sleep, its engine has not answered yet.
    falling = replica("a", ReplicaState.SLEEPING, asleep_since=990.0)
    on_its_way = sleep_and_wake(
        reported([falling], {"a": shard(falling, ShardState.READY)}, gate=held("chat", 1))
    )
    quiet = sleep_and_wake(reported([falling], {"a": shard(falling, ShardState.SLEEPING)}))
    assert not on_its_way.put and not quiet.put


def test_a_replica_that_could_not_sleep_stays_awake_and_stops_as_without_sleep() -> None:
    tried = replica("a", ReplicaState.SLEEPING, asleep_since=990.0)
    why = "engine 'fake' cannot sleep: POST /sleep answered 404"
    engine = {"a": shard(tried, ShardState.READY, 60.0, sleep_error=why)}

    plan = sleep_and_wake(reported([tried], engine))

    [back] = plan.put
    assert (back.state, back.asleep_since, back.leave_reason) == (ReplicaState.READY, None, None)
    assert plan.removed == []
    [event] = plan.events
    assert event.reason is EventReason.SLEEP_FAILED and why in event.message
    # Never asked again, and a scale-down stops it as it would without sleep.
    again = reported([back], {"a": shard(back, ShardState.READY, 3600.0, sleep_error=why)})
    assert not sleep_and_wake(again)
    at_zero = reported(
        [back], {"a": shard(back, ShardState.READY, 3600.0, sleep_error=why)}, [AT_ZERO]
    )
    scaled = scale(at_zero, LoopMemory())
    assert [(r.id, r.leave_reason) for r in scaled.put] == [("a", LeaveReason.SCALE_DOWN)]


def test_a_sleep_that_kept_its_memory_is_said_apart_with_its_figures() -> None:
    tried = replica("a", ReplicaState.SLEEPING, asleep_since=990.0)
    why = "its sleep answered 200 but its processes still hold 16384 MiB of 16384 MiB"
    engine = {
        "a": shard(
            tried, ShardState.WAKING, sleep_error=why, sleep_failure=SleepFailure.MEMORY_KEPT
        )
    }

    plan = sleep_and_wake(reported([tried], engine))

    [back] = plan.put
    assert back.state is ReplicaState.READY  # awake: its cards are full, as before
    [event] = plan.events
    assert event.reason is EventReason.SLEEP_FAILED
    assert "without freeing its memory" in event.message and "16384 MiB" in event.message
    # An older agent says only why: read as refused, never as kept memory.
    older = reported([tried], {"a": shard(tried, ShardState.READY, sleep_error=why)})
    assert older.statuses["a"].sleep_failure is SleepFailure.REFUSED


def test_a_sleeping_replica_is_not_scaled_down_as_demand_falls_to_zero() -> None:
    asleep = replica("a", ReplicaState.SLEEPING, asleep_since=900.0)
    awake = replica("b")
    plain = AT_ZERO.model_copy(update={"sleep_after_s": None})

    kept = scale(
        reported([asleep], {"a": shard(asleep, ShardState.SLEEPING)}, [AT_ZERO]), LoopMemory()
    )
    stopped = scale(reported([awake], {"b": shard(awake, ShardState.READY)}, [plain]), LoopMemory())

    assert kept.put == [] and kept.removed == [] and kept.stopping == []
    assert [r.id for r in stopped.put] == ["b"], "without sleep, the same count stops it"


def test_replica_state_follows_the_decision_then_the_engines() -> None:
    asleep = replica("a", ReplicaState.SLEEPING)
    waking = replica("a", ReplicaState.WAKING)

    def state(rec: ReplicaRecord, engine: ShardState) -> ReplicaState:
        return replica_status(rec, {("a", 0): shard(rec, engine)}).state

    assert state(asleep, ShardState.READY) is ReplicaState.SLEEPING, "decided: out of routing"
    assert state(waking, ShardState.SLEEPING) is ReplicaState.WAKING
    assert state(waking, ShardState.WAKING) is ReplicaState.WAKING
    assert state(waking, ShardState.READY) is ReplicaState.READY
    snap = reported([waking], {"a": shard(waking, ShardState.READY)})
    assert [(r.id, r.state) for r in record_transitions(snap).put] == [("a", ReplicaState.READY)]


def test_turning_sleep_on_is_an_engine_change_its_idle_time_is_not() -> None:
    later = SLEEPY.model_copy(update={"sleep_after_s": 600.0})
    off = SLEEPY.model_copy(update={"sleep_after_s": None})
    assert same_engine(SLEEPY, later)
    assert not same_engine(SLEEPY, off), "the engine starts with --enable-sleep-mode or not"
    assert sleep_level(SLEEPY) == 2, "auto: level 2 until host memory is reported"
    assert sleep_level(SLEEPY.model_copy(update={"sleep_level": 1})) == 1


def test_a_share_of_the_cards_is_an_engine_change() -> None:
    shared = SLEEPY.model_copy(update={"gpu_memory_share": 0.45})
    assert not same_engine(SLEEPY, shared), "the engine is told its share when it starts"


def test_shares_fit_together_only_when_each_is_said_and_they_add_up_to_one() -> None:
    assert fit_together([None]) and fit_together([0.45])  # one alone, whatever it says
    assert fit_together([0.45, 0.55]) and fit_together([0.3, 0.3, 0.4])
    assert not fit_together([0.5, 0.6])
    assert not fit_together([0.45, None])


def test_spec_fields_are_strict() -> None:
    for bad in (
        {"sleep_level": 3},
        {"sleep_after_s": -1.0},
        {"stop_asleep_after_s": "5"},
        {"gpu_memory_share": 0},
        {"gpu_memory_share": 1.5},
        {"gpu_memory_share": "0.5"},
    ):
        with pytest.raises(ValidationError):
            ModelSpec.model_validate({"name": "m", "source": "s", **bad})
    assert ModelSpec(name="m", source="s").sleeps is False


def test_a_model_whose_replicas_sleep_is_satisfied_and_says_so() -> None:
    asleep = Counter({ReplicaState.SLEEPING: 1})
    assert answering(asleep) == 1 and answering(Counter({ReplicaState.STARTING: 1})) == 0
    view = SimpleNamespace(
        rollout=None, satisfied=True, ready=0, nodes=0, sleeping=1, waking=0, starting=0
    )
    assert model_words(view) == (
        "asleep: 1 replica(s) sleeping, woken by a request",
        Meaning.MUTED,
    )
    view.waking, view.sleeping = 1, 0
    words, meaning = model_words(view)
    assert words.startswith("waking") and meaning is Meaning.ATTENTION


def test_a_drain_stops_a_sleeping_replica_without_a_stand_in() -> None:
    asleep = replica("a", ReplicaState.SLEEPING, asleep_since=900.0)
    snap = reported([asleep], {"a": shard(asleep, ShardState.SLEEPING)})
    draining = {"n1": AdminInfo(flag=AdminFlag.DRAINING, reason="maintenance")}

    plan = drain(replace(snap, admin=draining))

    assert plan.removed == ["a"] and plan.put == []
    assert plan.of(MarkDrained) == [MarkDrained("n1")]


def test_out_of_sleep_a_record_is_never_left_told_to_sleep() -> None:
    asleep = replica("a", ReplicaState.SLEEPING, asleep_since=900.0)
    assert asleep.with_state(ReplicaState.DRAINING).asleep_since is None
    assert asleep.leaves(LeaveReason.SCALE_DOWN, "scale down").asleep_since is None
    assert asleep.stays().asleep_since is None
    assert asleep.with_state(ReplicaState.SLEEPING).asleep_since == 900.0


def test_a_rollout_stops_an_old_sleeping_replica_at_once() -> None:
    old = replica("old", ReplicaState.SLEEPING, revision=1, asleep_since=900.0)
    new = replica("new", revision=2, created_at=2.0)
    shards = {"old": shard(old, ShardState.SLEEPING), "new": shard(new, ShardState.READY)}
    snap = replace(reported([old, new], shards, [CHAT]), outdated=frozenset({"old"}))

    plan = roll(snap)

    assert plan.removed == ["old"] and plan.put == []


def test_asleep_for_stop_asleep_after_a_replica_stops_but_never_below_the_minimum() -> None:
    spec = SLEEPY.model_copy(update={"stop_asleep_after_s": 60.0, "min_replicas": 1})
    long_ago = replica("a", ReplicaState.SLEEPING, asleep_since=900.0)  # 100 s at wall 1000
    lately = replica("b", ReplicaState.SLEEPING, asleep_since=990.0, created_at=2.0)
    shards = {"a": shard(long_ago, ShardState.SLEEPING), "b": shard(lately, ShardState.SLEEPING)}

    plan = sleep_and_wake(reported([long_ago, lately], shards, [spec]))
    alone = sleep_and_wake(reported([long_ago], {"a": shards["a"]}, [spec]))

    assert plan.removed == ["a"]
    assert [e.reason for e in plan.events] == [EventReason.SCALED_DOWN]
    assert "after 100s asleep" in plan.events[0].message
    assert alone.removed == [], "the model's minimum keeps it, asleep"


def test_reclaim_takes_sleeping_replicas_before_idle_ones() -> None:
    idle = Candidate(replica("idle", created_at=1.0), CHAT, True, 0)
    busy = Candidate(replica("busy", created_at=3.0), CHAT, False, 4)
    asleep = Candidate(
        replica("asleep", ReplicaState.SLEEPING, created_at=2.0, asleep_since=900.0),
        CHAT,
        False,
        0,
    )

    assert [c.record.id for c in order([busy, idle, asleep])] == ["asleep", "idle", "busy"]


# -- a card shared by a sleeping replica and an awake one (issue 32 item 4) ---------------

OTHER = SLEEPY.model_copy(update={"name": "other", "source": "org/other"})
PLAIN_OTHER = OTHER.model_copy(update={"sleep_after_s": None, "min_replicas": 0})


def on_card(rec: ReplicaRecord, card: str = "GPU-shared") -> ReplicaRecord:
    return replace(rec, shards=(replace(rec.shards[0], gpus=(card,)),))


def switch_fleet(
    b_state: ShardState,
    b_in_flight: int = 0,
    other: ModelSpec = OTHER,
    b_record: ReplicaState = ReplicaState.READY,
) -> FleetSnapshot:
    """chat's replica `a` asleep on a card where other's `b` was placed since."""
    a = on_card(replica("a", ReplicaState.SLEEPING, asleep_since=900.0))
    b = on_card(
        replica(
            "b",
            b_record,
            model="other",
            asleep_since=950.0 if b_record is ReplicaState.SLEEPING else None,
        )
    )
    gate = GateView(
        now=NOW, grace_s=math.inf, live=(), held={"chat": 1}, in_flight={"b": b_in_flight}
    )
    shards = {"a": shard(a, ShardState.SLEEPING), "b": shard(b, b_state, 60.0)}
    return reported([a, b], shards, [SLEEPY, other], gate=gate)


def test_a_wake_onto_a_card_held_by_an_idle_replica_switches_it_out_first() -> None:
    snap = switch_fleet(ShardState.READY)

    plan = sleep_and_wake(snap)

    [asleep] = plan.put
    assert (asleep.id, asleep.state) == ("b", ReplicaState.SLEEPING)  # a waits for it
    [event] = plan.events
    assert (
        event.reason is EventReason.SLEPT and "chat" in event.message and "other" in event.message
    )
    assert plan.removed == []


def test_once_the_other_sleeps_the_wake_goes_ahead_on_the_same_card() -> None:
    snap = switch_fleet(ShardState.SLEEPING, b_record=ReplicaState.SLEEPING)

    plan = sleep_and_wake(snap)

    assert [(r.id, r.state) for r in plan.put] == [("a", ReplicaState.WAKING)]


def test_still_falling_asleep_the_wake_waits() -> None:
    snap = switch_fleet(ShardState.READY, b_record=ReplicaState.SLEEPING)

    plan = sleep_and_wake(snap)

    assert plan.put == [] and plan.removed == []  # b's engine has not said it sleeps


def shared_card(shares: dict[str, float | None], idle: dict[str, float]) -> FleetSnapshot:
    """chat's `a` asleep with a request held, on a card where each replica named in
    `idle` (model of its name) is awake and idle that long; `shares`: each model's
    `gpu_memory_share`."""
    specs = [
        SLEEPY.model_copy(update={"gpu_memory_share": shares.get("chat")}),
        *(
            OTHER.model_copy(
                update={"name": n, "source": f"org/{n}", "gpu_memory_share": shares.get(n)}
            )
            for n in idle
        ),
    ]
    a = on_card(replica("a", ReplicaState.SLEEPING, asleep_since=900.0))
    awake = [on_card(replica(n, model=n, created_at=2.0)) for n in idle]
    shards = {"a": shard(a, ShardState.SLEEPING)}
    shards |= {r.id: shard(r, ShardState.READY, idle[r.id]) for r in awake}
    gate = GateView(now=NOW, grace_s=math.inf, live=(), held={"chat": 1})
    return reported([a, *awake], shards, specs, gate=gate)


def test_a_wake_beside_an_awake_replica_whose_share_leaves_room_switches_nothing() -> None:
    snap = shared_card({"chat": 0.45, "b": 0.45}, {"b": 20.0})

    plan = sleep_and_wake(snap)

    assert [(r.id, r.state) for r in plan.put] == [("a", ReplicaState.WAKING)]
    assert [e.reason for e in plan.events] == [EventReason.WOKE]


def test_of_two_waiting_for_one_place_beside_an_awake_one_the_longest_held_wakes() -> None:
    # c is awake (idle) on the card; chat's a and zzz's z sleep there, both asked for,
    # zzz's request held longer. Room for one beside c: zzz's, then c makes way for chat.
    chat = SLEEPY.model_copy(update={"gpu_memory_share": 0.45})
    zzz, other = (
        OTHER.model_copy(update={"name": n, "source": f"org/{n}", "gpu_memory_share": 0.45})
        for n in ("zzz", "other")
    )
    a = on_card(replica("a", ReplicaState.SLEEPING, asleep_since=900.0))
    z = on_card(replica("z", ReplicaState.SLEEPING, model="zzz", asleep_since=900.0))
    c = on_card(replica("c", model="other", created_at=2.0))
    shards = {
        "a": shard(a, ShardState.SLEEPING),
        "z": shard(z, ShardState.SLEEPING),
        "c": shard(c, ShardState.READY, 20.0),
    }
    gate = GateView(
        now=NOW,
        grace_s=math.inf,
        live=(),
        held={"chat": 1, "zzz": 1},
        held_age={"chat": 0.5, "zzz": 1.5},
    )
    snap = reported([a, z, c], shards, [chat, zzz, other], gate=gate)

    plan = sleep_and_wake(snap)

    assert sorted((r.id, r.state) for r in plan.put) == [
        ("c", ReplicaState.SLEEPING),
        ("z", ReplicaState.WAKING),
    ]


def test_shares_that_do_not_add_up_switch_out_the_longest_idle_and_no_more() -> None:
    snap = shared_card({"chat": 0.45, "b": 0.45, "c": 0.45}, {"b": 20.0, "c": 10.0})

    plan = sleep_and_wake(snap)

    # b (idle longest) makes way; c stays awake beside a once b sleeps.
    assert [(r.id, r.state) for r in plan.put] == [("b", ReplicaState.SLEEPING)]
    [event] = plan.events
    assert event.reason is EventReason.SLEPT and "wanted by chat" in event.message


@pytest.mark.parametrize(
    "shares",
    [{"chat": 0.45}, {"b": 0.45}, {"chat": 0.6, "b": 0.45}],
    ids=["the other says none", "the waking one says none", "more than the card"],
)
def test_without_shares_that_fit_the_awake_one_switches_out_as_before(
    shares: dict[str, float | None],
) -> None:
    snap = shared_card(shares, {"b": 20.0})

    plan = sleep_and_wake(snap)

    assert [(r.id, r.state) for r in plan.put] == [("b", ReplicaState.SLEEPING)]


def test_a_replica_running_an_older_share_counts_as_taking_its_whole_card() -> None:
    snap = shared_card({"chat": 0.45, "b": 0.45}, {"b": 20.0})
    snap = replace(snap, outdated=frozenset({"b"}))  # started before its share was set

    plan = sleep_and_wake(snap)

    # Out of the card (an outdated replica stops rather than sleeps); a waits for it.
    assert [(r.id, r.state) for r in plan.put] == [("b", ReplicaState.DRAINING)]


def free_node(name: str = "n2") -> NodeEntry:
    report = NodeReport(
        node=name,
        agent_version="t",
        boot_id="b",
        interval_s=5,
        gpus=[
            GpuReport(
                uuid=f"GPU-{name}",
                index=0,
                gpu_class="H100-SXM-80GB",
                memory_total_mib=81920,
                health=GpuHealth.HEALTHY,
            )
        ],
    )
    entry = NodeEntry(name, first_seen=0.0)
    entry.update(report, b"", NOW)
    return entry


def test_a_wake_onto_a_card_held_by_a_busy_replica_starts_afresh_where_one_fits() -> None:
    snap = switch_fleet(ShardState.READY, b_in_flight=2)
    snap = replace(snap, nodes={"n2": free_node()})

    plan = sleep_and_wake(snap)

    # Placed in the same plan: a wake decided later in the pass cannot take n2 first.
    assert plan.removed == ["a"]
    [fresh] = plan.put
    assert (fresh.model, fresh.nodes, fresh.state) == ("chat", ("n2",), ReplicaState.STARTING)
    stopped, placed = plan.events
    assert stopped.reason is EventReason.NO_ROOM_TO_WAKE
    assert "other awake and busy" in stopped.message and fresh.id in stopped.message
    assert placed.reason is EventReason.PLACED and placed.obj == "model/chat"


def test_with_no_room_elsewhere_the_wake_waits_for_the_busy_one() -> None:
    snap = switch_fleet(ShardState.READY, b_in_flight=2)  # no other node

    plan = sleep_and_wake(snap)

    assert plan.removed == [] and plan.put == [] and plan.events == []


def test_a_busy_replica_of_a_lower_priority_switches_out_for_a_higher_one() -> None:
    """Issue 32 item 4: a switch is the normal path when the awake model has nothing in
    flight or a lower priority; its requests in flight finish first (the stop handshake)."""
    urgent = SLEEPY.model_copy(update={"priority": 10})
    snap = replace(switch_fleet(ShardState.READY, b_in_flight=2), nodes={"n2": free_node()})
    gate = replace(snap.gate, live=(LiveGateway(None, {}),))
    snap = replace(snap, models={"chat": urgent, "other": OTHER}, gate=gate)

    plan = sleep_and_wake(snap)

    [going] = plan.put  # not placed afresh elsewhere: the card is its in seconds
    assert (going.id, going.state, going.asleep_since) == ("b", ReplicaState.SLEEPING, None)
    assert plan.removed == []
    [event] = plan.events
    assert event.reason is EventReason.SLEPT
    assert "priority 10 over 0" in event.message and "2 request(s) in flight" in event.message


def test_one_switched_out_for_a_higher_priority_is_not_taken_back_by_its_own_requests() -> None:
    urgent = SLEEPY.model_copy(update={"priority": 10})
    a = on_card(replica("a", ReplicaState.SLEEPING, asleep_since=900.0))
    b = on_card(replica("b", ReplicaState.SLEEPING, model="other"))  # falling asleep
    gate = GateView(
        now=NOW,
        grace_s=math.inf,
        live=(LiveGateway(None, {}),),
        held={"chat": 1, "other": 3},
        in_flight={"b": 1},
    )
    shards = {"a": shard(a, ShardState.SLEEPING), "b": shard(b, ShardState.READY, 0.0)}
    snap = reported([a, b], shards, [urgent, OTHER], gate=gate)

    plan = sleep_and_wake(snap)

    assert plan.put == [] and plan.removed == []  # b keeps falling asleep; a waits for it

    # At equal priority a held request takes it back, as a scale-down taken back.
    snap = replace(snap, models={"chat": SLEEPY, "other": OTHER})
    plan = sleep_and_wake(snap)
    assert [(r.id, r.state) for r in plan.put] == [("b", ReplicaState.READY)]


def test_of_two_asleep_on_one_card_with_requests_held_the_higher_priority_wakes() -> None:
    """Whichever pass order: the lower one woken first would be switched out for the
    higher one as soon as it served, pass after pass (seen in bench_density with
    `--priority-top`: two replicas flipping 300 times, neither serving)."""
    low = SLEEPY.model_copy(update={"name": "a-low", "source": "org/low"})
    high = SLEEPY.model_copy(update={"name": "z-high", "source": "org/high", "priority": 1})
    lo = on_card(replica("lo", ReplicaState.SLEEPING, model="a-low", asleep_since=900.0))
    hi = on_card(replica("hi", ReplicaState.SLEEPING, model="z-high", asleep_since=900.0))
    gate = GateView(
        now=NOW,
        grace_s=math.inf,
        live=(LiveGateway(None, {}),),
        held={"a-low": 1, "z-high": 1},
    )
    shards = {"lo": shard(lo, ShardState.SLEEPING), "hi": shard(hi, ShardState.SLEEPING)}
    snap = reported([lo, hi], shards, [low, high], gate=gate)

    plan = sleep_and_wake(snap)

    assert [(r.id, r.state) for r in plan.put] == [("hi", ReplicaState.WAKING)]


def _engines_follow(records: dict[str, ReplicaRecord], engines: dict[str, ShardState]) -> None:
    """One agent round: each engine does what its record asks, and a woken replica's
    record reads ready once its engine does (`outcomes.record_transitions`)."""
    for rid, rec in records.items():
        if rec.state is ReplicaState.WAKING and engines[rid] is ShardState.READY:
            records[rid] = replace(rec, state=ReplicaState.READY)
        elif rec.state is ReplicaState.WAKING:
            engines[rid] = ShardState.READY
        elif rec.state is ReplicaState.SLEEPING and rec.asleep_since is not None:
            engines[rid] = ShardState.SLEEPING


def test_two_models_on_one_card_with_requests_held_settle_by_priority_over_passes() -> None:
    """Pass after pass, engines following: the higher-priority model wakes and stays
    awake while its requests come; the lower one waits, never flipping in between."""
    low = SLEEPY.model_copy(update={"name": "a-low", "source": "org/low"})
    high = SLEEPY.model_copy(update={"name": "z-high", "source": "org/high", "priority": 1})
    records = {
        "lo": on_card(replica("lo", ReplicaState.SLEEPING, model="a-low", asleep_since=900.0)),
        "hi": on_card(replica("hi", ReplicaState.SLEEPING, model="z-high", asleep_since=900.0)),
    }
    engines = {"lo": ShardState.SLEEPING, "hi": ShardState.SLEEPING}
    woke: Counter[str] = Counter()
    for _ in range(8):
        gate = GateView(
            now=NOW,
            grace_s=math.inf,
            held={"a-low": 1}
            | ({} if records["hi"].state is ReplicaState.READY else {"z-high": 1}),
            in_flight={"hi": 1} if records["hi"].state is ReplicaState.READY else {},
        )
        shards = {rid: shard(rec, engines[rid], 0.0) for rid, rec in records.items()}
        plan = sleep_and_wake(reported(records.values(), shards, [low, high], gate=gate))
        woke.update(e.obj for e in plan.events if e.reason is EventReason.WOKE)
        records.update({r.id: r for r in plan.put})
        _engines_follow(records, engines)
    assert records["hi"].state is ReplicaState.READY and engines["hi"] is ShardState.READY
    assert records["lo"].state is ReplicaState.SLEEPING and engines["lo"] is ShardState.SLEEPING
    assert woke == {"replica/hi": 1}, woke


def test_an_idle_higher_priority_replica_makes_way_once_idle_or_waited_for_a_while() -> None:
    """Not between two of its requests (to be switched back at the next one): once
    idle `OUTRANKING_IDLE_S` (or its own sleep_after_s, if shorter), or once the lower
    one's requests have waited that long, which bounds their wait."""
    low = SLEEPY.model_copy(update={"priority": -1})
    a = on_card(replica("a", ReplicaState.SLEEPING, asleep_since=900.0))
    b = on_card(replica("b", model="other"))

    def plan_for(idle: float, waited: float = 0.0, other: ModelSpec = OTHER) -> Plan:
        gate = GateView(
            now=NOW, grace_s=math.inf, live=(), held={"chat": 1}, held_age={"chat": waited}
        )
        shards = {"a": shard(a, ShardState.SLEEPING), "b": shard(b, ShardState.READY, idle)}
        return sleep_and_wake(reported([a, b], shards, [low, other], gate=gate))

    assert plan_for(idle=1.0).put == []  # a waits
    assert [r.id for r in plan_for(idle=OUTRANKING_IDLE_S).put] == ["b"]
    assert [r.id for r in plan_for(idle=1.0, waited=OUTRANKING_IDLE_S).put] == ["b"]
    quick = OTHER.model_copy(update={"sleep_after_s": 2.0})
    assert [r.id for r in plan_for(idle=2.0, other=quick).put] == ["b"]
    # With a card nobody holds: seconds of wait, not an engine start there.
    gate = GateView(now=NOW, grace_s=math.inf, live=(), held={"chat": 1})
    shards = {"a": shard(a, ShardState.SLEEPING), "b": shard(b, ShardState.READY, 1.0)}
    snap = replace(reported([a, b], shards, [low, OTHER], gate=gate), nodes={"n2": free_node()})
    waits = sleep_and_wake(snap)
    assert waits.put == [] and waits.removed == []


def test_a_higher_priority_busy_replica_is_not_switched_out_for_a_lower_one() -> None:
    low = SLEEPY.model_copy(update={"priority": -1})
    snap = switch_fleet(ShardState.READY, b_in_flight=2)
    snap = replace(snap, models={"chat": low, "other": OTHER})

    plan = sleep_and_wake(snap)

    assert plan.removed == [] and plan.put == [] and plan.events == []  # a waits


def test_a_model_that_does_not_sleep_makes_way_only_above_what_it_should_have() -> None:
    at_min = PLAIN_OTHER.model_copy(update={"min_replicas": 1})
    snap = replace(switch_fleet(ShardState.READY, other=at_min), nodes={"n2": free_node()})
    plan = sleep_and_wake(snap)
    assert plan.removed == ["a"], "its minimum keeps it: the wake goes elsewhere"

    snap = switch_fleet(ShardState.READY, other=PLAIN_OTHER)
    plan = sleep_and_wake(snap)
    [leaving] = plan.put
    assert leaving.id == "b" and leaving.leave_reason is LeaveReason.SCALE_DOWN


def test_requests_held_for_an_adapter_wake_its_sleeping_base() -> None:
    """An adapter is served by a replica of its base: a request held for it wakes a
    sleeping base as the base's own would (else it waits out its timeout: 503)."""
    asleep = replica("a", ReplicaState.SLEEPING, asleep_since=900.0)
    snap = reported([asleep], {"a": shard(asleep, ShardState.SLEEPING)}, gate=held("sql-lora", 1))
    snap = replace(
        snap,
        adapters={"sql-lora": AdapterSpec(name="sql-lora", base="chat", source="acme/sql-lora")},
    )

    plan = sleep_and_wake(snap)

    assert [(r.id, r.state) for r in plan.put] == [("a", ReplicaState.WAKING)]
    # Held for another model's adapter: nothing wakes.
    other = replace(
        snap, adapters={"sql-lora": AdapterSpec(name="sql-lora", base="other", source="x")}
    )
    assert sleep_and_wake(other).put == []


# -- room made by sleep for a model with no replica (the density benchmark's finding) -----


def room_fleet(b_in_flight: int = 0, **snap_fields: Any) -> FleetSnapshot:
    """chat at zero with a request held; other's `b` awake on the only card."""
    b = replica("b", model="other")
    gate = GateView(
        now=NOW, grace_s=math.inf, live=(), held={"chat": 1}, in_flight={"b": b_in_flight}
    )
    snap = reported([b], {"b": shard(b, ShardState.READY, 5.0)}, [SLEEPY, OTHER], gate=gate)
    return replace(snap, **snap_fields)


def making_room(plan: Plan) -> list[tuple[str, str | None]]:
    return [(a.model, a.how) for a in plan.of(MakingRoom)]


def test_requests_held_for_an_adapter_wake_its_base_from_zero() -> None:
    """Demand counts an adapter's held requests for its base, as the warm step does: a
    base at zero is woken by its adapter's first request (issue 33 item 2: held as a
    wake is, not left to the gateway's timeout)."""
    sql = AdapterSpec(name="sql-lora", base="chat", source="acme/sql-lora")
    base = SLEEPY.model_copy(update={"max_replicas": 1})
    snap = replace(snapshot([], [base], gate=held("sql-lora", 2)), adapters={"sql-lora": sql})

    [decided] = scale(snap, LoopMemory()).of(Scaling)

    assert decided.decision.desired == 1 and decided.decision.changed == 1
    mute = replace(snapshot([], [base], gate=held("other-lora", 2)), adapters={"sql-lora": sql})
    [stays] = scale(mute, LoopMemory()).of(Scaling)
    assert stays.decision.desired == 0


def test_requests_held_for_a_model_with_no_room_put_an_idle_replica_to_sleep_at_once() -> None:
    plan = sleep_and_wake(room_fleet())

    # Idle 5 s only, far from its sleep_after_s: the held request does not wait for it.
    [asleep] = plan.put
    assert (asleep.id, asleep.state) == ("b", ReplicaState.SLEEPING)
    [event] = plan.events
    assert event.reason is EventReason.SLEPT and "wanted by chat" in event.message
    assert making_room(plan) == [("chat", "waits for room: other (b) goes to sleep")]


def test_no_room_is_made_from_a_busy_replica_or_a_higher_priority_one() -> None:
    busy = sleep_and_wake(room_fleet(b_in_flight=1))
    above = OTHER.model_copy(update={"priority": 5})
    higher = sleep_and_wake(room_fleet(models={"chat": SLEEPY, "other": above}))

    for plan in (busy, higher):
        assert plan.put == [] and plan.events == [] and making_room(plan) == []


def test_while_the_replica_falls_asleep_the_model_waits_and_nothing_more_sleeps() -> None:
    going = replica("b", ReplicaState.SLEEPING, model="other", asleep_since=990.0)
    gate = GateView(now=NOW, grace_s=math.inf, live=(), held={"chat": 1})
    snap = reported([going], {"b": shard(going, ShardState.READY)}, [SLEEPY, OTHER], gate=gate)

    plan = sleep_and_wake(snap)

    assert plan.put == [] and plan.events == []
    assert making_room(plan) == [("chat", "waits for room: other (b) goes to sleep")]
    said = replace(snap, making_room={"chat": "waits for room: other (b) goes to sleep"})
    assert making_room(sleep_and_wake(said)) == [], "said once"


def test_once_room_is_made_the_model_waits_to_be_placed_then_the_wait_is_over() -> None:
    was = {"chat": "waits for room: other (b) goes to sleep"}
    fits = room_fleet(b_in_flight=1, nodes={"n2": free_node()}, making_room=was)
    placed = reported(
        [replica("c"), replica("b", model="other")],
        {"c": shard(replica("c"), ShardState.STARTING), "b": shard(replica("b"), ShardState.READY)},
        [SLEEPY, OTHER],
        gate=GateView(now=NOW, grace_s=math.inf, live=(), held={"chat": 1}),
    )

    assert making_room(sleep_and_wake(fits)) == [("chat", "room made: a replica is being placed")]
    assert making_room(sleep_and_wake(replace(placed, making_room=was))) == [("chat", None)]
    assert making_room(sleep_and_wake(room_fleet(b_in_flight=1, nodes={"n2": free_node()}))) == []


def test_a_blocked_wake_waits_rather_than_start_beside_sleeping_replicas() -> None:
    """Room elsewhere only on a card where another model sleeps: an engine start there
    would cost more than the wait here, and take the room that one wakes into."""
    snap = switch_fleet(ShardState.READY, b_in_flight=2)
    z = replica("z", ReplicaState.SLEEPING, model="other", node="n2", asleep_since=900.0)
    z = replace(z, shards=(replace(z.shards[0], gpus=("GPU-n2",)),))
    report = NodeReport(
        node="n2",
        agent_version="t",
        boot_id="b",
        interval_s=5,
        gpus=[
            GpuReport(
                uuid="GPU-n2",
                index=0,
                gpu_class="H100-SXM-80GB",
                memory_total_mib=81920,
                memory_used_mib=512,  # what a sleeping engine keeps: room for one awake
                in_use=True,
                health=GpuHealth.HEALTHY,
            )
        ],
        replicas=[ReplicaReport(id="z", model="other", state=ShardState.SLEEPING, gpus=["GPU-n2"])],
    )
    n2 = NodeEntry("n2", first_seen=0.0)
    n2.update(report, b"", NOW)
    records = {**snap.records, "z": z}
    statuses = {**snap.statuses, "z": replica_status(z, {("z", 0): shard(z, ShardState.SLEEPING)})}
    snap = replace(snap, nodes={"n2": n2}, records=records, statuses=statuses)
    assert snap.capacity()[0].free == {"H100-SXM-80GB": ("GPU-n2",)}, "room there"

    plan = sleep_and_wake(snap)

    assert plan.removed == [] and plan.put == [] and plan.events == []


# -- starts counted by kind (issue 32 item 5) ---------------------------------------------


def test_a_wake_and_an_engine_start_reaching_ready_are_counted_by_kind() -> None:
    waking = replica("a", ReplicaState.WAKING)
    starting = replace(replica("b", ReplicaState.STARTING, created_at=970.0), start=StartKind.WARM)
    woke = shard(waking, ShardState.READY)._replace(last_wake=(2, 1.25))
    snap = reported([waking, starting], {"a": woke, "b": shard(starting, ShardState.READY)})

    started = record_transitions(snap).of(Started)

    assert sorted(started, key=lambda s: s.kind) == [
        Started("chat", StartKind.HOT, 2, 1.25),  # as its agent timed the wake
        Started("chat", StartKind.WARM, 0, 30.0),  # placement (wall 970) to ready (1,000)
    ]
    still = reported([waking], {"a": shard(waking, ShardState.WAKING)})
    assert record_transitions(still).of(Started) == [], "counted once it is ready"


def test_a_placement_where_the_weights_are_is_a_warm_start() -> None:
    holder = free_node("n2")
    holder.digest = holder.digest._replace(models=frozenset({"org/chat"}))
    bare = free_node("n3")
    snap = replace(snapshot([], [CHAT]), nodes={"n3": bare, "n2": holder})

    [warm] = place_many([CHAT], snap.capacity(), frozenset())
    [cold] = place_many([CHAT], replace(snap, nodes={"n3": bare}).capacity(), frozenset())

    assert isinstance(warm, Placement) and warm.nodes == ("n2",) and warm.weights_local
    assert isinstance(cold, Placement) and not cold.weights_local
    assert record_from(warm, 1.0, 1).start is StartKind.WARM
    assert record_from(cold, 1.0, 1).start is StartKind.COLD


def test_a_woken_replica_is_not_idle_since_a_request_it_served_before_its_sleep(
    tmp_path: Path,
) -> None:
    # The gateways' last request for it came before its sleep; read as its idleness once
    # it woke, it put the replica back to sleep as the held requests were sent on to it
    # (bench_density: "asleep, idle for 53s" a moment after the wake).
    clock = FakeClock()
    term = make_fleet(tmp_path, clock)
    term.ingest_json(fleet_report("gpu1", n_gpus=1))
    facts = term.facts
    facts.put_models([SLEEPY])
    rec = on_card(replica("a"), "GPU-gpu1-0")
    facts.put_replicas([rec])
    facts.note_requests(["a"], clock())
    clock.t += 53
    facts.put_replicas([replace(rec, state=ReplicaState.SLEEPING, asleep_since=clock.t)])
    facts.put_replicas([replace(rec, state=ReplicaState.WAKING)])
    facts.put_replicas([rec])  # ready: its engine's count of idleness starts afresh
    assert term.replica_statuses()["a"].idle_since is None
    facts.note_requests(["a"], clock())  # what a gateway sends it from now on counts
    assert term.replica_statuses()["a"].idle_since == clock.t
