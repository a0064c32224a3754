"""Rolling out: placing and stopping what `llmgw.controller.core.rollout` plans.

Who calls: `Reconciler.steps`, once a pass, after drains and faults and before
demand (`roll`): a function of a `FleetSnapshot` returning a `Plan` (replicas,
rollout notes and events). It remembers nothing between passes (a controller
killed mid-rollout starts again from the replicas in the store, each with its
revision).
"""

from __future__ import annotations

import logging

from llmgw.controller.core.decisions import Note
from llmgw.controller.core.rollout import plan_rollout
from llmgw.controller.loop.faults import fault_under
from llmgw.controller.loop.fleet_snapshot import FleetSnapshot
from llmgw.controller.loop.placing import placed_words, record_from, stoppable
from llmgw.controller.loop.plans import Plan, Planner, RolloutNote
from llmgw.scheduler import Placement, place_many
from llmgw.wire import EventReason, ReplicaState, RolloutState

__all__ = ["roll"]

log = logging.getLogger("llmgw.reconcile")


_SERVING_NOTHING = (ReplicaState.STARTING, ReplicaState.SLEEPING, ReplicaState.WAKING)


def roll(snap: FleetSnapshot) -> Plan:
    """Models with replicas of an older revision: place new ones and let old
    ones go, as `llmgw.controller.core.rollout` says, and say why one waits."""
    plan = Planner(snap.records)
    notes: dict[str, Note | None] = dict(snap.rollout_notes)  # as this plan leaves them

    def set_note(model: str, note: Note | None) -> None:
        if notes.get(model) != note:
            notes[model] = note
            plan.add(RolloutNote(model, note))

    draining = set(snap.draining)
    for name in sorted(snap.models):
        # A replica with a stand-in (a drain, a fault) counts as its stand-in.
        mine = [s.record for s in snap.replicas_of(name).standing]
        if not mine:
            continue
        if all(snap.up_to_date(r) for r in mine):
            if (note := notes.get(name)) and note[0] is RolloutState.WAITING:
                set_note(name, None)
            continue
        spec, revision = snap.models[name], snap.revisions[name]
        new, old, leaving = [], [], []
        for r in mine:
            if snap.up_to_date(r):
                new.append(r)
            elif (
                r.state is ReplicaState.DRAINING
                and not draining.intersection(r.nodes)
                and fault_under(r, snap.faults) is None
            ):
                leaving.append(r.id)
            else:
                old.append(r)
        stopped = stoppable(snap, plan, leaving)
        plan.remove(stopped)
        note = notes.get(name)
        stalled = note is not None and note[0] is RolloutState.STALLED
        rollout = plan_rollout(
            spec, snap.desired[name], new, old, len(leaving) - len(stopped), stalled=stalled
        )
        going = set(rollout.leave)
        why = f"rollout: replaced by revision {revision}"
        # One that serves nothing (starting, asleep, waking) just stops.
        plan.remove(r.id for r in old if r.id in going and r.state in _SERVING_NOTHING)
        plan.put(
            r.with_state(ReplicaState.DRAINING, why)
            for r in old
            if r.id in going and r.state is ReplicaState.READY
        )
        if rollout.leave:
            log.info("rollout of %s to revision %d: %s leave", name, revision, rollout.leave)
            plan.event(
                f"model/{name}",
                EventReason.ROLLOUT,
                f"revision {revision}: {', '.join(rollout.leave)} of an older revision "
                "out of routing, to stop",
            )
        if stopped:
            plan.event(
                f"model/{name}",
                EventReason.ROLLOUT,
                f"revision {revision}: {', '.join(stopped)} stopped",
            )
        if not rollout.place or snap.backing_off(name):
            continue
        results = place_many(
            [spec] * rollout.place,
            snap.capacity([*draining, *snap.faults], plan.records),
            snap.wanted_classes,
        )
        placed = [record_from(p, snap.wall, revision) for p in results if isinstance(p, Placement)]
        plan.put(placed)
        if placed:
            log.info(
                "rollout of %s to revision %d: placed %s",
                name,
                revision,
                ", ".join(r.id for r in placed),
            )
            plan.event(
                f"model/{name}",
                EventReason.ROLLOUT,
                f"revision {revision}: {placed_words(placed)}",
            )
        unplaceable = [p for p in results if not isinstance(p, Placement)]
        if stalled:
            continue
        if unplaceable:
            waiting = (RolloutState.WAITING, unplaceable[0].reason)
            if note != waiting and (note is None or note[0] is not RolloutState.WAITING):
                plan.event(
                    f"model/{name}",
                    EventReason.ROLLOUT,
                    f"revision {revision}: waiting: {unplaceable[0].reason}",
                )
            set_note(name, waiting)
        elif note is not None:
            set_note(name, None)
    return plan.plan()
