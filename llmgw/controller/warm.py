"""The warm tier (issue 32): an idle replica of a model whose spec asks for it sleeps
instead of stopping, and wakes, the same replica, when its model's requests come.

Who calls: `Reconciler.steps`, once a pass, after `demand.scale` and before reclaim and
the shortfall step, which then place only what waking cannot serve (a sleeping replica
counts for its model, toward `max_replicas`, and serves nothing). A function of a
`FleetSnapshot` returning a `Plan`; nothing is remembered between passes.

A replica's state says what the controller decided (`sleeping`, `waking`). Going to
sleep is a stop's handshake: the replica leaves routing at once (a `stopping` endpoint),
and only once every live gateway has let go of it (`FleetSnapshot.stop_now`: applied,
nothing in flight) is it `asleep_since` now, and its assignment carries the sleep level
to its agent, the only caller of the engine's sleep endpoints: no request is sent to an
engine on its way to sleep. It is out of routing until it is ready again. The engines' reports say what became of it: asleep (`ReplicaStatus.asleep`),
awake again (`outcomes.record_transitions` makes it ready), or unable to sleep
(`sleep_error`: awake and in routing again, it stops as without sleep when demand falls).
"""

from __future__ import annotations

import math
from dataclasses import replace

from llmgw.controller.faults import fault_under
from llmgw.controller.fleet_snapshot import FleetSnapshot, ModelReplicas
from llmgw.controller.placing import stoppable
from llmgw.controller.plans import Plan, Planner
from llmgw.controller.replicas import ReplicaStatus
from llmgw.wire import EventReason, ModelSpec, ReplicaState, SleepFailure

__all__ = ["sleep_and_wake"]

_AWAKE = (ReplicaState.READY, ReplicaState.STARTING, ReplicaState.WAKING)


def sleep_and_wake(snap: FleetSnapshot) -> Plan:
    """Per model: replicas that could not sleep stop; sleeping ones wake for the
    requests held or in flight that the awake ones cannot take; idle ones sleep."""
    plan = Planner(snap.records)
    for name, spec in sorted(snap.models.items()):
        mine = snap.replicas_of(name)
        _could_not_sleep(snap, plan, mine)
        if not _wake(snap, plan, spec, mine):
            _let_go(snap, plan, mine)
            _stop_long_asleep(snap, plan, spec, mine)
            if spec.sleeps:
                _sleep(snap, plan, spec, mine)
    return plan.plan()


def _stop_long_asleep(
    snap: FleetSnapshot, plan: Planner, spec: ModelSpec, mine: ModelReplicas
) -> None:
    """Asleep for `stop_asleep_after_s`: stopped, the longest asleep first, but never
    below what the model should have (its minimum, its desired count), which would
    only place a cold replica in its stead."""
    limit = spec.stop_asleep_after_s
    if limit is None:
        return
    room = len(mine.standing) - max(spec.min_replicas, snap.desired.get(spec.name, 0))
    long_asleep = sorted(
        (
            s.record
            for s in mine.standing
            if s.record.state is ReplicaState.SLEEPING
            and s.record.asleep_since is not None
            and snap.wall - s.record.asleep_since >= limit
        ),
        key=lambda r: (r.asleep_since, r.id),
    )[: max(room, 0)]
    if not long_asleep:
        return
    plan.remove(r.id for r in long_asleep)  # out of routing since it was let go
    for rec in long_asleep:
        asleep_s = snap.wall - (rec.asleep_since or snap.wall)
        plan.event(
            f"model/{spec.name}",
            EventReason.SCALED_DOWN,
            f"{rec.id} stopped after {asleep_s:.0f}s asleep (stop_asleep_after_s {limit:g})",
        )


def _let_go(snap: FleetSnapshot, plan: Planner, mine: ModelReplicas) -> None:
    """Replicas going to sleep that every gateway has let go of: told to sleep now."""
    going = [s.record for s in mine.standing if _falling_asleep(s)]
    if not going:
        return
    # Marked again (a no-op but after a restart, whose facts forgot the mark).
    done = set(stoppable(snap, plan, [r.id for r in going]))
    plan.put(replace(r, asleep_since=snap.wall) for r in going if r.id in done)


def _falling_asleep(s: ReplicaStatus) -> bool:
    return s.record.state is ReplicaState.SLEEPING and s.record.asleep_since is None


def _could_not_sleep(snap: FleetSnapshot, plan: Planner, mine: ModelReplicas) -> None:
    """Found out at the first try (its engines say so from then on): it is awake, so
    back in routing, never asked again, and stopped as a replica of a model that does
    not sleep is (`demand` scales it down)."""
    for s in mine.standing:
        error = s.sleep_error
        if s.record.state is not ReplicaState.SLEEPING or error is None:
            continue
        rec = s.record
        plan.put([replace(rec, state=ReplicaState.READY, asleep_since=None)])
        what = (
            "slept without freeing its memory, so it was woken again"
            if s.sleep_failure is SleepFailure.MEMORY_KEPT
            else "could not sleep"
        )
        plan.event(
            f"replica/{rec.id}",
            EventReason.SLEEP_FAILED,
            f"{rec.model}: {what} ({error.splitlines()[0]}); it stays awake and "
            "stops when demand falls, as without sleep",
        )


def _wanted_awake(snap: FleetSnapshot, spec: ModelSpec, awake: list[ReplicaStatus]) -> int:
    """Awake replicas the model's requests ask for now: its requests in flight and
    held at the gateways over its target, and one for any held request."""
    held = snap.gate.held.get(spec.name, 0) if snap.gate is not None else 0
    in_flight = sum(s.in_flight(snap.gateway_in_flight) or 0 for s in awake) + held
    wanted = math.ceil(in_flight / spec.target_in_flight)
    return max(wanted, 1) if held else wanted


def _wake(snap: FleetSnapshot, plan: Planner, spec: ModelSpec, mine: ModelReplicas) -> bool:
    """Wake what the requests ask for; True when any replica wakes (or will)."""
    awake = [s for s in mine.standing if s.state in _AWAKE]
    # Not told to sleep yet: back in routing at once, as a scale-down taken back.
    # Told: woken once its engines say they sleep (one still on its way to sleep would
    # read ready from its last report, and be routed to while it falls asleep).
    going = [s for s in mine.standing if _falling_asleep(s)]
    asleep = [
        s
        for s in mine.standing
        if s.record.state is ReplicaState.SLEEPING
        and s.record.asleep_since is not None
        and s.asleep
    ]
    candidates = [*going, *sorted(asleep, key=lambda s: (s.record.created_at, s.record.id))]
    count = min(len(candidates), _wanted_awake(snap, spec, awake) - len(awake))
    if count <= 0:
        return any(s.state is ReplicaState.WAKING for s in awake)
    picked = candidates[:count]
    plan.put(
        replace(
            s.record,
            state=ReplicaState.READY if _falling_asleep(s) else ReplicaState.WAKING,
            asleep_since=None,
        )
        for s in picked
    )
    for s in picked:
        plan.event(
            f"replica/{s.record.id}",
            EventReason.WOKE,
            f"{spec.name}: waking for its requests ({len(awake)} replica(s) awake)",
        )
    return True


def _sleep(snap: FleetSnapshot, plan: Planner, spec: ModelSpec, mine: ModelReplicas) -> None:
    """A ready replica nobody asked anything of for `sleep_after_s` sleeps."""
    after = spec.sleep_after_s
    assert after is not None
    held = snap.gate.held.get(spec.name, 0) if snap.gate is not None else 0
    if held:
        return
    for s in mine.standing:
        rec = s.record
        if (
            rec.state is ReplicaState.READY
            and s.state is ReplicaState.READY
            and rec.replaces is None  # a stand-in serves in another's place
            and snap.up_to_date(rec)  # started able to sleep (`sleeps` is an engine field)
            and s.idle_since is not None
            and snap.now - s.idle_since >= after
            and not s.in_flight(snap.gateway_in_flight)
            and fault_under(rec, snap.faults) is None
            and s.sleep_error is None  # it cannot: found out once
        ):
            let_go = stoppable(snap, plan, [rec.id])  # out of routing, as before a stop
            asleep_since = snap.wall if let_go else None
            plan.put([replace(rec, state=ReplicaState.SLEEPING, asleep_since=asleep_since)])
            idle = snap.now - s.idle_since
            plan.event(
                f"replica/{rec.id}",
                EventReason.SLEPT,
                f"{spec.name}: asleep, idle for {idle:.0f}s (sleep_after_s {after:g})",
            )
