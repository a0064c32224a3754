"""Demand: each model's desired count, replicas above it leaving, and room
reclaimed for a model short of its minimum.

Who calls: `Reconciler.steps`, once a pass, after rollouts and before the
shortfall step: `scale`, then `reclaim`. The decisions are the pure
`llmgw.controller.autoscale` (its memory is the loop's, `LoopMemory.autoscaler`)
and `llmgw.controller.reclaim.choose`. What they may touch: desired counts,
replicas and events, through `Term.facts`; `reclaim` notes in the loop's memory
a short model no choice made fit (`LoopMemory.note_reclaim_hopeless`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping

from llmgw.controller.endpoints import StopGate
from llmgw.controller.faults import Faults, fault_under
from llmgw.controller.loop_memory import LoopMemory
from llmgw.controller.picture import snapshot
from llmgw.controller.placing import stoppable
from llmgw.controller.reclaim import Candidate, choose, reclaimed_words
from llmgw.controller.records import LeaveReason
from llmgw.controller.replicas import ReplicaStatus
from llmgw.controller.term import Term
from llmgw.wire import IDLE_AFTER_S, AdminFlag, EventReason, ReplicaState

__all__ = ["reclaim", "scale"]


def scale(
    fleet: Term,
    memory: LoopMemory,
    gate: StopGate | None,
    statuses: dict[str, ReplicaStatus],
    faults: Faults,
    now: float,
) -> None:
    """Each model's desired count from its requests in flight (`autoscale`);
    above it, one replica at a time leaves through the stop handshake: one
    starting first (it serves nothing), else the least busy, newest first
    (its KV cache is the coldest). Not while the model rolls out (the
    rollout owns its counts) or while a stand-in of its is pending. A
    leaving replica is taken back when the count rises before it stopped."""
    gateways = gate.gateways.in_flight(now) if gate is not None else {}
    held = gate.gateways.held(now) if gate is not None else {}
    replaced = {r.replaces for r in fleet.facts.records.values() if r.replaces}
    live: dict[str, list[ReplicaStatus]] = defaultdict(list)
    for s in statuses.values():
        if s.state is not ReplicaState.FAILED:
            live[s.record.model].append(s)
    memory.autoscaler.forget(set(fleet.facts.models))
    fleet.facts.decisions.forget_scaling(fleet.facts.models)
    for name, spec in sorted(fleet.facts.models.items()):
        mine = live.get(name, [])
        staying = [s for s in mine if s.record.leaving is None and s.record.id not in replaced]
        ready = [s for s in staying if s.state is ReplicaState.READY]
        in_flight = sum(s.in_flight(gateways) or 0 for s in ready)
        decision = memory.autoscaler.decide(
            spec, in_flight, len(staying), now, held=held.get(name, 0), serving=len(ready)
        )
        before = fleet.facts.desired_replicas(name)
        fleet.facts.decisions.set_scaling(name, decision)
        if decision.changed:
            reason = EventReason.SCALED_UP if decision.changed > 0 else EventReason.SCALED_DOWN
            fleet.facts.event(
                f"model/{name}", reason, f"{before} -> {decision.desired}: {decision.why}"
            )
        _scale_down(fleet, gate, name, mine, replaced, faults, gateways)


def _scale_down(
    fleet: Term,
    gate: StopGate | None,
    name: str,
    mine: list[ReplicaStatus],
    replaced: set[str],
    faults: Faults,
    gateways: Mapping[str, int],
) -> None:
    desired = fleet.facts.desired_replicas(name)
    leaving = [s.record for s in mine if s.record.leaving is not None]
    staying = [s for s in mine if s.record.leaving is None and s.record.id not in replaced]
    # Demand came back before they stopped (a reclaimed one stays reclaimed).
    undone = [r for r in leaving if r.leave_reason is not LeaveReason.RECLAIM]
    if undone and len(staying) < desired:
        back = undone[: desired - len(staying)]
        fleet.facts.put_replicas(r.stays() for r in back)
        fleet.facts.event(
            f"model/{name}",
            EventReason.SCALED_UP,
            f"{', '.join(r.id for r in back)} back in routing: wanted again",
        )
        leaving = [r for r in leaving if r not in back]
    stopped = stoppable(gate, [r.id for r in leaving])
    if stopped:
        fleet.facts.remove_replicas(stopped)
        fleet.facts.event(f"model/{name}", EventReason.SCALED_DOWN, f"{', '.join(stopped)} stopped")
    excess = len(staying) - desired
    if (
        excess <= 0
        or leaving  # one at a time
        or any(s.record.replaces is not None for s in staying)  # a stand-in is pending
        or not all(fleet.facts.up_to_date(s.record) for s in mine)  # a rollout owns the counts
        or any(fault_under(s.record, faults) is not None for s in staying)
    ):
        return
    pick = min(
        staying,
        key=lambda s: (
            s.state is not ReplicaState.STARTING,
            s.in_flight(gateways) or 0,
            -s.record.created_at,
            s.record.id,
        ),
    ).record
    why = f"scale down to {desired}: {_why_scaled(fleet, name)}"
    if pick.state is ReplicaState.STARTING:
        fleet.facts.remove_replicas([pick.id])
        fleet.facts.event(f"model/{name}", EventReason.SCALED_DOWN, f"{pick.id} stopped ({why})")
        return
    fleet.facts.put_replicas([pick.leaves(LeaveReason.SCALE_DOWN, why)])
    fleet.facts.event(
        f"model/{name}",
        EventReason.SCALED_DOWN,
        f"{pick.id} out of routing, to stop once the gateways let go ({why})",
    )
    if stoppable(gate, [pick.id]):  # no gateway to wait for
        fleet.facts.remove_replicas([pick.id])
        fleet.facts.event(f"model/{name}", EventReason.SCALED_DOWN, f"{pick.id} stopped")


def _why_scaled(fleet: Term, name: str) -> str:
    scaling = fleet.facts.decisions.scaling(name)
    return "fixed count" if scaling is None or not scaling.reason else scaling.reason


def reclaim(
    fleet: Term, memory: LoopMemory, gate: StopGate | None, faults: Faults, now: float
) -> None:
    """Room for the highest-priority model short of its minimum that cannot
    be placed, from lower-priority models above theirs (`reclaim`): the
    chosen replicas leave as a scale-down's do; it is placed when they stop."""
    if not fleet.unplaceable_reasons:
        return  # the common case: everything that must run, runs
    wall = fleet.facts.wall()
    records = [r for r in fleet.facts.records.values() if r.state is not ReplicaState.FAILED]
    replaced = {r.replaces for r in records if r.replaces}
    staying = Counter(r.model for r in records if r.leaving is None and r.id not in replaced)
    pending = {r.reclaimed_for for r in records if r.leave_reason is LeaveReason.RECLAIM}
    short = sorted(
        (
            spec
            for name, spec in fleet.facts.models.items()
            if staying[name] < spec.min_replicas
            and name in fleet.unplaceable_reasons
            and not fleet.facts.backing_off(name, wall)
        ),
        key=lambda spec: (-spec.priority, spec.name),
    )
    if not short or short[0].name in pending:
        return  # nothing to do, or its room is on its way
    spec = short[0]
    if memory.reclaim_hopeless(spec, fleet.capacity_version):
        return  # nothing it could take has moved since no choice made it fit
    statuses = [s for s in fleet.replica_statuses().values() if s.state is not ReplicaState.FAILED]
    gateways = gate.gateways.in_flight(now) if gate is not None else {}
    candidates = [
        Candidate(
            s.record,
            fleet.facts.models[s.record.model],
            s.state is ReplicaState.READY
            and s.idle_since is not None
            and now - s.idle_since >= IDLE_AFTER_S,
            s.in_flight(gateways) or 0,
        )
        for s in statuses
        if s.record.model in fleet.facts.models
        and fleet.facts.models[s.record.model].priority < spec.priority
        and s.record.leaving is None
        and s.record.replaces is None
        and s.record.id not in replaced
        and s.state in (ReplicaState.READY, ReplicaState.STARTING)
    ]
    if not candidates:
        memory.note_reclaim_hopeless(spec, fleet.capacity_version)
        return
    draining = [n for n, info in fleet.facts.admin.items() if info.flag is AdminFlag.DRAINING]
    cards = {uuid: cls for entry in fleet.facts.nodes.values() for uuid, cls, _ in entry.cards}
    nodes = snapshot(fleet, now, [*draining, *faults])
    picked = choose(spec, candidates, staying, nodes, cards)
    if not picked:
        memory.note_reclaim_hopeless(spec, fleet.capacity_version)
        return
    why = reclaimed_words(spec.name, spec.priority)
    for rec in picked:
        fleet.facts.event(
            f"model/{rec.model}",
            EventReason.RECLAIMED,
            f"{rec.id} out of routing, to stop: {why}, short of its minimum",
        )
    fleet.facts.put_replicas(r.leaves(LeaveReason.RECLAIM, why, spec.name) for r in picked)
    fleet.facts.event(
        f"model/{spec.name}",
        EventReason.RECLAIMED,
        f"room for a replica: {', '.join(f'{r.id} ({r.model})' for r in picked)} to stop",
    )
    stopped = stoppable(gate, [r.id for r in picked])
    fleet.facts.remove_replicas(stopped)
