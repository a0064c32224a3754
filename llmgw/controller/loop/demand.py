"""Demand: each model's desired count, replicas above it leaving, and room
reclaimed for a model short of its minimum.

Who calls: `Reconciler.steps`, once a pass, after rollouts and before the
shortfall step: `scale`, then `reclaim`. The decisions are the pure
`llmgw.controller.core.autoscale` (its memory is the loop's, `LoopMemory.autoscaler`)
and `llmgw.controller.core.reclaim.choose`. Each is a function of a `FleetSnapshot`
returning a `Plan` (scaling answers, replicas, events); the autoscaler keeps its
memory (`LoopMemory.autoscaler`), and `reclaim` notes a short model no choice
made fit (`LoopMemory.note_reclaim_hopeless`).
"""

from __future__ import annotations

from llmgw.controller.core.autoscale import Decision, desired_count
from llmgw.controller.core.reclaim import Candidate, choose, reclaimed_words
from llmgw.controller.core.records import LeaveReason
from llmgw.controller.loop.faults import fault_under
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot, ModelReplicas
from llmgw.controller.loop.loop_memory import LoopMemory
from llmgw.controller.loop.placing import stoppable
from llmgw.controller.loop.plans import ForgetScaling, Plan, Planner, Scaling
from llmgw.controller.state.replicas import model_in_flight
from llmgw.wire import EventReason, ModelSpec, ReplicaState

__all__ = ["reclaim", "scale"]


def scale(snap: FleetSnapshot, memory: LoopMemory) -> Plan:
    """Each model's desired count from its requests in flight (`autoscale`);
    above it, one replica at a time leaves through the stop handshake: one
    starting first (it serves nothing), else the least busy, newest first
    (its KV cache is the coldest). Not while the model rolls out (the
    rollout owns its counts) or while a stand-in of its is pending. A
    leaving replica is taken back when the count rises before it stopped."""
    plan = Planner(snap.records)
    gateways = snap.gateway_in_flight
    memory.autoscaler.forget(set(snap.models))
    plan.add(ForgetScaling(frozenset(snap.models)))
    for name, spec in sorted(snap.models.items()):
        mine = snap.replicas_of(name)
        ready = [s for s in mine.standing if s.state is ReplicaState.READY]
        held = snap.held_for(name)  # an adapter's held requests wake its base too
        decision = memory.autoscaler.decide(
            spec,
            model_in_flight(ready, gateways, held),
            len(mine.standing),
            snap.now,
            held=held,
            serving=len(ready),
        )
        before = snap.desired[name]
        plan.add(Scaling(name, decision))
        if decision.changed:
            reason = EventReason.SCALED_UP if decision.changed > 0 else EventReason.SCALED_DOWN
            plan.event(f"model/{name}", reason, f"{before} -> {decision.desired}: {decision.why}")
        _scale_down(snap, plan, spec, mine, decision)
    return plan.plan()


def _scale_down(
    snap: FleetSnapshot, plan: Planner, spec: ModelSpec, mine: ModelReplicas, decision: Decision
) -> None:
    name = spec.name
    desired = desired_count(spec, decision)
    leaving = [s.record for s in mine.leaving]
    staying = mine.standing
    if spec.sleeps:
        # The warm tier: a sleeping replica stays (it costs no serving card time); an
        # idle one sleeps instead of stopping (`warm`). What may still go is a starting
        # one, or one whose engine could not sleep (it falls back to stopping).
        staying = tuple(
            s for s in staying if s.state is ReplicaState.STARTING or s.sleep_error is not None
        )
        desired = max(0, desired - (len(mine.standing) - len(staying)))
    # Demand came back before they stopped (a reclaimed one stays reclaimed).
    undone = [r for r in leaving if r.leave_reason is not LeaveReason.RECLAIM]
    if undone and len(staying) < desired:
        back = undone[: desired - len(staying)]
        plan.put(r.stays() for r in back)
        plan.event(
            f"model/{name}",
            EventReason.SCALED_UP,
            f"{', '.join(r.id for r in back)} back in routing: wanted again",
        )
        leaving = [r for r in leaving if r not in back]
    stopped = stoppable(snap, plan, [r.id for r in leaving])
    if stopped:
        plan.remove(stopped)
        plan.event(f"model/{name}", EventReason.SCALED_DOWN, f"{', '.join(stopped)} stopped")
    excess = len(staying) - desired
    if (
        excess <= 0
        or leaving  # one at a time
        or mine.standing_in  # a stand-in is pending
        or not all(snap.up_to_date(s.record) for s in mine.live)  # a rollout owns the counts
        or any(fault_under(s.record, snap.faults) is not None for s in staying)
    ):
        return
    gateways = snap.gateway_in_flight
    pick = min(
        staying,
        key=lambda s: (
            s.state is not ReplicaState.STARTING,
            s.in_flight(gateways) or 0,
            -s.record.created_at,
            s.record.id,
        ),
    ).record
    scaled = "fixed count" if not decision.reason else decision.reason
    why = f"scale down to {desired}: {scaled}"
    if pick.state is ReplicaState.STARTING:
        plan.remove([pick.id])
        plan.event(f"model/{name}", EventReason.SCALED_DOWN, f"{pick.id} stopped ({why})")
        return
    plan.put([pick.leaves(LeaveReason.SCALE_DOWN, why)])
    plan.event(
        f"model/{name}",
        EventReason.SCALED_DOWN,
        f"{pick.id} out of routing, to stop once the gateways let go ({why})",
    )
    if stoppable(snap, plan, [pick.id]):  # no gateway to wait for
        plan.remove([pick.id])
        plan.event(f"model/{name}", EventReason.SCALED_DOWN, f"{pick.id} stopped")


def reclaim(snap: FleetSnapshot, memory: LoopMemory) -> Plan:
    """Room for the highest-priority model short of its minimum that cannot
    be placed, from lower-priority models above theirs (`reclaim`): the
    chosen replicas leave as a scale-down's do; it is placed when they stop."""
    plan = Planner(snap.records)
    if not snap.unplaceable:
        return plan.plan()  # the common case: everything that must run, runs
    staying = {name: len(m.standing) for name, m in snap.by_model.items()}
    pending = {
        s.record.reclaimed_for
        for m in snap.by_model.values()
        for s in m.leaving
        if s.record.leave_reason is LeaveReason.RECLAIM
    }
    short = sorted(
        (
            spec
            for name, spec in snap.models.items()
            if staying.get(name, 0) < spec.min_replicas
            and name in snap.unplaceable
            and not snap.backing_off(name)
        ),
        key=lambda spec: (-spec.priority, spec.name),
    )
    if not short or short[0].name in pending:
        return plan.plan()  # nothing to do, or its room is on its way
    spec = short[0]
    if memory.reclaim_hopeless(spec, snap.capacity_version):
        return plan.plan()  # nothing it could take has moved since no choice made it fit
    # Replicas that count for their model and stand in for none.
    takeable = {
        s.record.id for m in snap.by_model.values() for s in m.standing if s.record.replaces is None
    }
    gateways = snap.gateway_in_flight
    candidates = [
        Candidate(
            s.record,
            snap.models[s.record.model],
            s.state is ReplicaState.READY
            and s.idle_since is not None
            and snap.now - s.idle_since >= snap.settings.idle_after_s,
            s.in_flight(gateways) or 0,
        )
        for s in snap.statuses.values()
        if s.record.model in snap.models
        and snap.models[s.record.model].priority < spec.priority
        and s.record.id in takeable
        and (
            s.state in (ReplicaState.READY, ReplicaState.STARTING)
            or (s.state is ReplicaState.SLEEPING and s.record.asleep_since is not None)
        )
    ]
    if not candidates:
        memory.note_reclaim_hopeless(spec, snap.capacity_version)
        return plan.plan()
    cards = {uuid: cls for entry in snap.nodes.values() for uuid, cls, _ in entry.cards}
    nodes = snap.capacity([*snap.draining, *snap.faults])
    picked = choose(spec, candidates, staying, nodes, cards)
    if not picked:
        memory.note_reclaim_hopeless(spec, snap.capacity_version)
        return plan.plan()
    why = reclaimed_words(spec.name, spec.priority)
    # Asleep: out of routing already, its engines told to sleep. Stopped now (waking
    # it to stop it would take the time the short model waits for).
    asleep = [r for r in picked if r.state is ReplicaState.SLEEPING]
    for rec in asleep:
        plan.event(f"model/{rec.model}", EventReason.RECLAIMED, f"{rec.id} stopped, asleep: {why}")
    plan.remove(r.id for r in asleep)
    awake = [r for r in picked if r.state is not ReplicaState.SLEEPING]
    for rec in awake:
        plan.event(
            f"model/{rec.model}",
            EventReason.RECLAIMED,
            f"{rec.id} out of routing, to stop: {why}, short of its minimum",
        )
    plan.put(r.leaves(LeaveReason.RECLAIM, why, spec.name) for r in awake)
    plan.event(
        f"model/{spec.name}",
        EventReason.RECLAIMED,
        f"room for a replica: {', '.join(f'{r.id} ({r.model})' for r in picked)} to stop",
    )
    plan.remove(stoppable(snap, plan, [r.id for r in awake]))
    return plan.plan()
