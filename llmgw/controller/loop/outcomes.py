"""What became of replicas since the last pass: ready, failed, lost with their
node, or left without a model.

Who calls: `Reconciler.steps`, first in every pass, in this order:
`record_transitions`, `replace_lost`, `retire_deleted`. Each is a function of a
`FleetSnapshot` returning a `Plan` (replicas, backoffs, rollout notes, events);
nothing is remembered between passes.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from llmgw.controller.loop.faults import fault_under
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.placing import stoppable
from llmgw.controller.loop.plans import (
    BackOff,
    ClearBackoff,
    Plan,
    Planner,
    RolloutNote,
    Started,
)
from llmgw.controller.state.replicas import ReplicaStatus
from llmgw.wire import EventReason, ReplicaState, RolloutState, StartKind

__all__ = ["STALL_MESSAGE_MAX", "record_transitions", "replace_lost", "retire_deleted"]

log = logging.getLogger("llmgw.reconcile")

# Characters of a failed new replica's error a stalled rollout keeps (its first
# line says why: the engine's exit and cause; then the excerpt of its log).
STALL_MESSAGE_MAX = 4096


def _steady(snap: FleetSnapshot) -> list[str]:
    """Models backing off with a replica ready for `backoff_reset_s`: their backoff ends.
    Not at a replica's first ready: one that dies just after (at its first request, or
    a crash loop whose engine answers its health check for a moment) would otherwise
    start the backoff over at its base each time."""
    reset_s = snap.settings.backoff_reset_s
    return [
        model
        for model in snap.backoffs
        if any(
            s.state is ReplicaState.READY
            and snap.now - snap.ready_since.get(s.record.id, snap.now) >= reset_s
            for s in snap.replicas_of(model).standing
        )
    ]


def record_transitions(snap: FleetSnapshot) -> Plan:
    """A replica whose shards are all ready (started, or woken) becomes ready; one whose engine
    failed is removed, and its model backs off exponentially (so a crash-looping
    engine cannot cause a placement storm), unless its card failed under it, until one
    of its replicas has been ready a while (`_steady`). A failed replica of a rollout's
    new revision stalls the rollout."""
    plan = Planner(snap.records)
    notes = dict(snap.rollout_notes)  # as this plan leaves them
    arrived = [
        s
        for s in snap.statuses.values()
        if s.state is ReplicaState.READY
        and s.record.state in (ReplicaState.STARTING, ReplicaState.WAKING)
    ]
    became_ready = [s.record.with_state(ReplicaState.READY) for s in arrived]
    plan.put(became_ready)
    for s in arrived:
        _count_start(snap, plan, s)
    for model in _steady(snap):
        plan.add(ClearBackoff(model))
    for rec in became_ready:
        note = notes.get(rec.model)
        if note is not None and note[0] is RolloutState.STALLED and snap.up_to_date(rec):
            notes.pop(rec.model)  # the new revision serves after all
            plan.add(RolloutNote(rec.model, None))
    failed = [s for s in snap.statuses.values() if s.state is ReplicaState.FAILED]
    rolling = {r.model for r in plan.records.values() if not snap.up_to_date(r)}
    for s in failed:
        log.warning("replica %s of %s failed: %s", s.record.id, s.record.model, s.error)
        if s.record.model in rolling and snap.up_to_date(s.record):
            why = (s.error or "engine failed")[:STALL_MESSAGE_MAX]
            note = notes.get(s.record.model)
            if note is None or note[0] is not RolloutState.STALLED:
                cause = why.strip().split("\n", 1)[0]
                plan.event(
                    f"model/{s.record.model}",
                    EventReason.ROLLOUT_STALLED,
                    f"revision {s.record.revision}: {s.record.id} failed, no more old "
                    f"replicas stop: {cause}",
                )
            stalled = (RolloutState.STALLED, why)
            if notes.get(s.record.model) != stalled:
                notes[s.record.model] = stalled
                plan.add(RolloutNote(s.record.model, stalled))
        # An engine that died with its card is not the spec's fault: it is
        # replaced at once, without backing the model off.
        if fault_under(s.record, snap.faults) is None:
            plan.add(BackOff(s.record.model, s.error or "engine failed", snap.wall))
    plan.remove(s.record.id for s in failed)
    return plan.plan()


def _count_start(snap: FleetSnapshot, plan: Planner, s: ReplicaStatus) -> None:
    """A start that reached ready, counted (`Started`): a wake by the level and time
    its agents say; an engine start by its kind and the time since its placement."""
    rec = s.record
    if rec.state is ReplicaState.WAKING:
        wake = s.last_wake
        level, seconds = wake if wake is not None else (0, None)
        plan.add(Started(rec.model, StartKind.HOT, level, seconds))
    else:
        kind = rec.start or StartKind.COLD
        plan.add(Started(rec.model, kind, 0, round(max(0.0, snap.wall - rec.created_at), 2)))


def replace_lost(snap: FleetSnapshot) -> Plan:
    """Replicas on a node unreachable for longer than `replace_after_s` are
    removed (and so placed again by the shortfall step); when the node comes
    back, its agent stops the orphans."""
    plan = Planner(snap.records)
    limit = snap.settings.replace_after_s
    lost = {
        name
        for name, entry in snap.nodes.items()
        if snap.now > snap.liveness.unreachable_at(entry) + limit
    }
    doomed = [r.id for r in snap.records.values() if lost.intersection(r.nodes)]
    gone_from = {node: {r.id for r in snap.records.values() if node in r.nodes} for node in lost}
    if doomed:
        log.warning("replacing %d replica(s) on unreachable nodes %s", len(doomed), sorted(lost))
        plan.remove(doomed)
        for node in sorted(lost):
            on_node = [rid for rid in doomed if rid in gone_from.get(node, ())]
            if on_node:
                plan.event(
                    f"node/{node}",
                    EventReason.NODE_LOST,
                    f"unreachable for more than {limit:g}s: replicas {', '.join(on_node)} "
                    "replaced elsewhere",
                )
    return plan.plan()


def retire_deleted(snap: FleetSnapshot) -> Plan:
    """Replicas of deleted models stop once the gateways have let go of them."""
    plan = Planner(snap.records)
    # Replicas of models no longer declared: to stop.
    retired = {r.id: r.model for r in snap.records.values() if r.model not in snap.models}
    stopped = stoppable(snap, plan, list(retired))
    plan.remove(stopped)
    by_model: dict[str, list[str]] = defaultdict(list)
    for rid in stopped:
        by_model[retired[rid]].append(rid)
    for model, ids in sorted(by_model.items()):
        plan.event(
            f"model/{model}", EventReason.STOPPED, f"model deleted: {', '.join(ids)} stopped"
        )
    return plan.plan()
