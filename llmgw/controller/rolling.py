"""Rolling out: placing and stopping what `llmgw.controller.rollout` plans.

Who calls: `Reconciler.steps`, once a pass, after drains and faults and before
demand (`roll`). What it may touch: replicas, rollout notes and events, through
`Term.facts`; it remembers nothing between passes (a controller killed
mid-rollout starts again from the replicas in the store, each with its revision).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from llmgw.controller.endpoints import StopGate
from llmgw.controller.faults import Faults, fault_under
from llmgw.controller.picture import snapshot, wanted_classes
from llmgw.controller.placing import placed_words, record_from, stoppable
from llmgw.controller.rollout import plan_rollout
from llmgw.controller.store import ReplicaRecord
from llmgw.controller.term import Term
from llmgw.scheduler import Placement, place_many
from llmgw.wire import AdminFlag, EventReason, ReplicaState, RolloutState

__all__ = ["roll"]

log = logging.getLogger("llmgw.reconcile")


def roll(fleet: Term, gate: StopGate | None, faults: Faults, now: float, wall: float) -> None:
    """Models with replicas of an older revision: place new ones and let old
    ones go, as `llmgw.controller.rollout` says, and say why one waits."""
    draining = {n for n, info in fleet.facts.admin.items() if info.flag is AdminFlag.DRAINING}
    replaced = {r.replaces for r in fleet.facts.records.values() if r.replaces}
    by_model: dict[str, list[ReplicaRecord]] = defaultdict(list)
    for r in fleet.facts.records.values():
        # A replica with a stand-in (a drain, a fault) counts as its stand-in.
        if (
            r.model in fleet.facts.models
            and r.state is not ReplicaState.FAILED
            and r.id not in replaced
            and r.leaving is None  # a scale-down's (`demand`)
        ):
            by_model[r.model].append(r)
    for name in sorted(by_model):
        if all(fleet.facts.up_to_date(r) for r in by_model[name]):
            if (note := fleet.facts.decisions.rollout_note(name)) and note[
                0
            ] is RolloutState.WAITING:
                fleet.facts.decisions.set_rollout_note(name, None)
            continue
        spec, revision = fleet.facts.models[name], fleet.facts.model_revision(name)
        new, old, leaving = [], [], []
        for r in by_model[name]:
            if fleet.facts.up_to_date(r):
                new.append(r)
            elif (
                r.state is ReplicaState.DRAINING
                and not draining.intersection(r.nodes)
                and fault_under(r, faults) is None
            ):
                leaving.append(r.id)
            else:
                old.append(r)
        stopped = stoppable(gate, leaving)
        fleet.facts.remove_replicas(stopped)
        note = fleet.facts.decisions.rollout_note(name)
        stalled = note is not None and note[0] is RolloutState.STALLED
        plan = plan_rollout(
            spec,
            fleet.facts.desired_replicas(name),
            new,
            old,
            len(leaving) - len(stopped),
            stalled=stalled,
        )
        going = set(plan.leave)
        why = f"rollout: replaced by revision {revision}"
        fleet.facts.remove_replicas(
            r.id for r in old if r.id in going and r.state is ReplicaState.STARTING
        )
        fleet.facts.put_replicas(
            r.with_state(ReplicaState.DRAINING, why)
            for r in old
            if r.id in going and r.state is ReplicaState.READY
        )
        if plan.leave:
            log.info("rollout of %s to revision %d: %s leave", name, revision, plan.leave)
            fleet.facts.event(
                f"model/{name}",
                EventReason.ROLLOUT,
                f"revision {revision}: {', '.join(plan.leave)} of an older revision "
                "out of routing, to stop",
            )
        if stopped:
            fleet.facts.event(
                f"model/{name}",
                EventReason.ROLLOUT,
                f"revision {revision}: {', '.join(stopped)} stopped",
            )
        if not plan.place or fleet.facts.backing_off(name, wall):
            continue
        results = place_many(
            [spec] * plan.place,
            snapshot(fleet, now, [*draining, *faults]),
            wanted_classes(fleet),
        )
        placed = [record_from(p, wall, revision) for p in results if isinstance(p, Placement)]
        fleet.facts.put_replicas(placed)
        if placed:
            log.info(
                "rollout of %s to revision %d: placed %s",
                name,
                revision,
                ", ".join(r.id for r in placed),
            )
            fleet.facts.event(
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
                fleet.facts.event(
                    f"model/{name}",
                    EventReason.ROLLOUT,
                    f"revision {revision}: waiting: {unplaceable[0].reason}",
                )
            fleet.facts.decisions.set_rollout_note(name, waiting)
        elif note is not None:
            fleet.facts.decisions.set_rollout_note(name, None)
