"""Replicas that move: off a draining node, or off a failed card.

Each moves the same way: a stand-in is placed elsewhere first; when it is ready
(and the gateways route to it and have let go of the original) the original
stops, and the stand-in is an ordinary replica from then on. A node with
nothing left ends up cordoned and marked drained. A forced drain stops the
replicas at once. A replica on a failed card that serves nothing yet just stops:
the shortfall step places it again.

Who calls: `Reconciler.steps`, once a pass, in this order: `cancel_called_off`,
`drain`, (the fault cordons), `replace_faulted`; and the admin API's drain
pre-check (`drain_plan`). Each is a function of a `FleetSnapshot`; the steps
return a `Plan` (replicas, drains' state, events); `replace_faulted` keeps why
a stand-in waits in the loop's memory (`LoopMemory.note_fault_blocked`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from llmgw.controller.loop.faults import fault_under
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.loop_memory import LoopMemory
from llmgw.controller.loop.placing import place_stand_ins, report_moved, stoppable
from llmgw.controller.loop.plans import DrainBlocked, ForceDrain, MarkDrained, Plan, Planner
from llmgw.scheduler import RunningReplica, plan_drain
from llmgw.wire import AdminFlag, AdminInfo, DrainPlan, ReplicaState

__all__ = ["cancel_called_off", "drain", "drain_plan", "replace_faulted"]

log = logging.getLogger("llmgw.reconcile")


def drain_plan(snap: FleetSnapshot, nodes: list[str]) -> DrainPlan:
    """The drain pre-check: what draining these nodes would do to each model."""
    # A drain in progress: an original and its stand-in are left out (the
    # stand-in's cards are taken already). A stand-in whose original is gone is
    # an ordinary replica and must move like one.
    counted = {s.record.id for m in snap.by_model.values() for s in (*m.standing, *m.leaving)}
    running = [
        RunningReplica(s.record.id, s.record.model, s.record.nodes, s.state is ReplicaState.READY)
        for s in snap.statuses.values()
        if s.record.id in counted
        and (s.record.replaces is None or s.record.replaces not in snap.records)
    ]
    return plan_drain(snap.models.values(), running, snap.capacity(), set(nodes))


_WARM = (ReplicaState.SLEEPING, ReplicaState.WAKING)  # the warm tier: serving nothing


def cancel_called_off(snap: FleetSnapshot) -> Plan:
    """An operator uncordoned (or re-cordoned) a draining node, or a failed
    card reads healthy again: its replicas stay, and stand-ins that are not
    serving yet are withdrawn."""
    plan = Planner(snap.records)
    draining = set(snap.draining)
    called_off = [
        r
        for r in snap.records.values()
        if r.state is ReplicaState.DRAINING
        and not draining.intersection(r.nodes)
        and fault_under(r, snap.faults) is None
        and snap.up_to_date(r)  # an old one leaves for a rollout (`rolling`)
        and r.leave_reason is None  # one leaves by the loop's decision (`demand`)
    ]
    if not called_off:
        return plan.plan()
    ids = {r.id for r in called_off}
    stand_ins = [r for r in snap.records.values() if r.replaces in ids]
    plan.remove(r.id for r in stand_ins if r.state is not ReplicaState.READY)
    plan.put(replace(r, replaces=None) for r in stand_ins if r.state is ReplicaState.READY)
    # A draining replica's own error only ever says why it moves (a card fault).
    plan.put(replace(r, state=ReplicaState.READY, error=None) for r in called_off)
    return plan.plan()


def drain(snap: FleetSnapshot) -> Plan:
    """Each replica on a draining node gets a stand-in elsewhere, then stops;
    drains past their deadline are forced."""
    plan = Planner(snap.records)
    forced_now = due_drains(snap.admin, snap.wall)
    for node in forced_now:
        log.warning("drain of %s not done by its deadline: forcing it", node)
        plan.add(ForceDrain(node, "deadline"))
    draining = list(snap.draining)
    if not draining:
        return plan.plan()
    by_replaced = {r.replaces: r for r in snap.records.values() if r.replaces}
    for node in draining:
        on_node = [r for r in plan.records.values() if node in r.nodes]
        if node in forced_now or snap.admin_info(node).force:
            forced = [r.id for r in on_node]
            plan.remove(stoppable(snap, plan, forced, force=True))
            if any(rid in plan.records for rid in forced):
                continue  # gateways are still letting go of them
            # Their stand-ins, placed already, are ordinary replicas from now on.
            stand_ins = [
                plan.records.get(by_replaced[rid].id) for rid in forced if rid in by_replaced
            ]
            plan.put(replace(r, replaces=None) for r in stand_ins if r is not None)
            on_node = []
        # One asleep or waking serves nothing: it stops without a stand-in (its
        # model's minimum no longer counts it, so the shortfall step places again).
        warm = [r.id for r in on_node if r.state in _WARM]
        if warm:
            gone = set(stoppable(snap, plan, warm))
            plan.remove(gone)
            on_node = [r for r in on_node if r.id not in gone]
        # Replacements that are ready let their originals go, once the
        # gateways route to the stand-ins and have let go of the originals.
        done = stoppable(
            snap,
            plan,
            [
                r.id
                for r in on_node
                if (rep := by_replaced.get(r.id)) and rep.state is ReplicaState.READY
            ],
        )
        plan.remove(done)
        report_moved(plan, done, by_replaced, f"drain of {node}")
        # Their stand-ins are ordinary replicas from now on.
        stand_ins = [plan.records.get(by_replaced[rid].id) for rid in done]
        plan.put(replace(r, replaces=None) for r in stand_ins if r is not None)
        on_node = [r for r in on_node if r.id not in done]
        if not on_node:
            plan.add(MarkDrained(node))
            log.info("node %s drained", node)
            continue
        plan.put(
            r.with_state(ReplicaState.DRAINING)
            for r in on_node
            if r.state is not ReplicaState.DRAINING and r.state not in _WARM
        )
        needing = [
            r
            for r in on_node
            if r.state not in _WARM
            and r.id not in by_replaced
            and r.leave_reason is None  # leaving by the loop's decision: no stand-in
            and r.model in snap.models
            and not snap.backing_off(r.model)
        ]
        why = place_stand_ins(snap, plan, needing, draining, f"drain of {node}")
        plan.add(DrainBlocked(node, why))
    return plan.plan()


def replace_faulted(snap: FleetSnapshot, memory: LoopMemory) -> Plan:
    """Replicas on a failed card move as a drain moves them: a stand-in placed
    elsewhere (off the failed card's node), serving when ready, then the
    original stopped once the gateways have let go of it. One not serving
    yet just stops; the minimums place it again. Replicas on a draining node
    are the drain's."""
    plan = Planner(snap.records)
    faults = snap.faults
    if not faults:
        memory.note_fault_blocked({})
        return plan.plan()
    draining = list(snap.draining)
    by_replaced = {r.replaces: r for r in snap.records.values() if r.replaces}
    hit = [
        (r, f)
        for r in snap.records.values()
        if not set(draining).intersection(r.nodes)
        and (f := fault_under(r, faults))
        # One leaving for a rollout needs no stand-in: the rollout replaces it;
        # nor one leaving by the loop's decision.
        and not (r.state is ReplicaState.DRAINING and not snap.up_to_date(r))
        and r.leave_reason is None
    ]
    if not hit:
        memory.note_fault_blocked({})
        return plan.plan()
    # Nothing to hand over from a replica that serves nothing: stopped at once.
    starting = [r.id for r, _ in hit if r.state is ReplicaState.STARTING or r.state in _WARM]
    if starting:
        log.warning("stopping %d starting replica(s) on failed cards", len(starting))
        plan.remove(starting)
    moving = [(r, f) for r, f in hit if r.state in (ReplicaState.READY, ReplicaState.DRAINING)]
    plan.put(
        r.with_state(ReplicaState.DRAINING, f"card fault: {f.describe()}")
        for r, f in moving
        if r.state is ReplicaState.READY
    )
    done = stoppable(
        snap,
        plan,
        [
            r.id
            for r, _ in moving
            if (rep := by_replaced.get(r.id)) and rep.state is ReplicaState.READY
        ],
    )
    plan.remove(done)
    report_moved(plan, done, by_replaced, "a failed card")
    plan.put(
        replace(rep, replaces=None)
        for rid in done
        if (rep := plan.records.get(by_replaced[rid].id)) is not None
    )
    needing = [
        plan.records[r.id]
        for r, _ in moving
        if r.id not in by_replaced
        and r.id in plan.records
        and r.model in snap.models
        and not snap.backing_off(r.model)
    ]
    excluded = [*draining, *faults]
    cause = {r.id: f"{f.describe()} on {r.shards[0].node}" for r, f in moving}
    why = ""
    for rec in needing:
        why = place_stand_ins(snap, plan, [rec], excluded, f"card fault: {cause[rec.id]}") or why
    blocked = {r.id: why for r in needing if why}
    for rid, reason in memory.note_fault_blocked(blocked).items():
        log.warning("no stand-in for %s (on a failed card): %s", rid, reason)
    return plan.plan()


def due_drains(admin: Mapping[str, AdminInfo], wall: float) -> list[str]:
    """Draining nodes whose deadline has passed and that are not forced yet."""
    return sorted(
        name
        for name, info in admin.items()
        if info.flag is AdminFlag.DRAINING
        and not info.force
        and info.force_at is not None
        and wall >= info.force_at
    )
