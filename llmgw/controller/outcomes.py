"""What became of replicas since the last pass: ready, failed, lost with their
node, or left without a model.

Who calls: `Reconciler.steps`, first in every pass, in this order:
`record_transitions`, `replace_lost`, `retire_deleted`. What they may touch:
replicas, backoffs, rollout notes and events, through `Term.facts`; nothing
is remembered between passes.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from llmgw.controller.endpoints import StopGate
from llmgw.controller.faults import Faults, fault_under
from llmgw.controller.placing import stoppable
from llmgw.controller.replicas import ReplicaStatus
from llmgw.controller.term import Term
from llmgw.wire import EventReason, ReplicaState, RolloutState

__all__ = ["STALL_MESSAGE_MAX", "record_transitions", "replace_lost", "retire_deleted"]

log = logging.getLogger("llmgw.reconcile")

# Characters of a failed new replica's error a stalled rollout keeps (its first
# line says why: the engine's exit and cause; then the excerpt of its log).
STALL_MESSAGE_MAX = 4096


def record_transitions(
    fleet: Term, statuses: dict[str, ReplicaStatus], wall: float, faults: Faults
) -> None:
    """A replica whose shards are all ready becomes ready; one whose engine
    failed is removed, and its model backs off exponentially (so a crash-looping
    engine cannot cause a placement storm), unless its card failed under it. A
    failed replica of a rollout's new revision stalls the rollout."""
    became_ready = [
        s.record.with_state(ReplicaState.READY)
        for s in statuses.values()
        if s.state is ReplicaState.READY and s.record.state is ReplicaState.STARTING
    ]
    fleet.facts.put_replicas(became_ready)
    for rec in became_ready:
        fleet.facts.clear_backoff(rec.model)
        note = fleet.facts.decisions.rollout_note(rec.model)
        if note is not None and note[0] is RolloutState.STALLED and fleet.facts.up_to_date(rec):
            fleet.facts.decisions.set_rollout_note(
                rec.model, None
            )  # the new revision serves after all
    failed = [s for s in statuses.values() if s.state is ReplicaState.FAILED]
    rolling = {r.model for r in fleet.facts.records.values() if not fleet.facts.up_to_date(r)}
    for s in failed:
        log.warning("replica %s of %s failed: %s", s.record.id, s.record.model, s.error)
        if s.record.model in rolling and fleet.facts.up_to_date(s.record):
            why = (s.error or "engine failed")[:STALL_MESSAGE_MAX]
            note = fleet.facts.decisions.rollout_note(s.record.model)
            if note is None or note[0] is not RolloutState.STALLED:
                cause = why.strip().split("\n", 1)[0]
                fleet.facts.event(
                    f"model/{s.record.model}",
                    EventReason.ROLLOUT_STALLED,
                    f"revision {s.record.revision}: {s.record.id} failed, no more old "
                    f"replicas stop: {cause}",
                )
            fleet.facts.decisions.set_rollout_note(s.record.model, (RolloutState.STALLED, why))
        # An engine that died with its card is not the spec's fault: it is
        # replaced at once, without backing the model off.
        if fault_under(s.record, faults) is None:
            fleet.facts.back_off(s.record.model, s.error or "engine failed", wall)
    fleet.facts.remove_replicas(s.record.id for s in failed)


def replace_lost(fleet: Term, now: float) -> None:
    """Replicas on a node unreachable for longer than `replace_after_s` are
    removed (and so placed again by the shortfall step); when the node comes
    back, its agent stops the orphans."""
    limit = fleet.facts.settings.replace_after_s
    lost = {
        name
        for name, entry in fleet.facts.nodes.items()
        if now > fleet.facts.liveness.unreachable_at(entry) + limit
    }
    doomed = [r.id for r in fleet.facts.records.values() if lost.intersection(r.nodes)]
    gone_from = {
        node: {r.id for r in fleet.facts.records.values() if node in r.nodes} for node in lost
    }
    if doomed:
        log.warning("replacing %d replica(s) on unreachable nodes %s", len(doomed), sorted(lost))
        fleet.facts.remove_replicas(doomed)
        for node in sorted(lost):
            on_node = [rid for rid in doomed if rid in gone_from.get(node, ())]
            if on_node:
                fleet.facts.event(
                    f"node/{node}",
                    EventReason.NODE_LOST,
                    f"unreachable for more than {limit:g}s: replicas {', '.join(on_node)} "
                    "replaced elsewhere",
                )


def retire_deleted(fleet: Term, gate: StopGate | None) -> None:
    """Replicas of deleted models stop once the gateways have let go of them."""
    models = fleet.facts.models  # replicas of models no longer declared: to stop
    retired = {r.id: r.model for r in fleet.facts.records.values() if r.model not in models}
    stopped = stoppable(gate, list(retired))
    fleet.facts.remove_replicas(stopped)
    by_model: dict[str, list[str]] = defaultdict(list)
    for rid in stopped:
        by_model[retired[rid]].append(rid)
    for model, ids in sorted(by_model.items()):
        fleet.facts.event(
            f"model/{model}", EventReason.STOPPED, f"model deleted: {', '.join(ids)} stopped"
        )
