"""Replicas that move: off a draining node, or off a failed card.

Each moves the same way: a stand-in is placed elsewhere first; when it is ready
(and the gateways route to it and have let go of the original) the original
stops, and the stand-in is an ordinary replica from then on. A node with
nothing left ends up cordoned and marked drained. A forced drain stops the
replicas at once. A replica on a failed card that serves nothing yet just stops:
the shortfall step places it again.

Who calls: `Reconciler.steps`, once a pass, in this order: `cancel_called_off`,
`drain`, (the fault cordons), `replace_faulted`; and the admin API's drain
pre-check (`drain_plan`, which only reads). What they may touch: replicas,
drains' state and events, through `Term.facts`; `replace_faulted` keeps why a
stand-in waits in the loop's memory (`LoopMemory.note_fault_blocked`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from llmgw.controller.endpoints import StopGate
from llmgw.controller.faults import Faults, fault_under
from llmgw.controller.loop_memory import LoopMemory
from llmgw.controller.picture import snapshot
from llmgw.controller.placing import place_stand_ins, report_moved, stoppable
from llmgw.controller.term import Term
from llmgw.scheduler import RunningReplica, plan_drain
from llmgw.wire import AdminFlag, AdminInfo, DrainPlan, ReplicaState

__all__ = ["cancel_called_off", "drain", "drain_plan", "replace_faulted"]

log = logging.getLogger("llmgw.reconcile")


def drain_plan(fleet: Term, nodes: list[str]) -> DrainPlan:
    """The drain pre-check: what draining these nodes would do to each model."""
    now = fleet.facts.clock()
    statuses = fleet.replica_statuses()
    replaced = {r.replaces for r in fleet.facts.records.values() if r.replaces}
    # A drain in progress: an original and its stand-in are left out (the
    # stand-in's cards are taken already). A stand-in whose original is gone is
    # an ordinary replica and must move like one.
    running = [
        RunningReplica(s.record.id, s.record.model, s.record.nodes, s.state is ReplicaState.READY)
        for s in statuses.values()
        if s.state is not ReplicaState.FAILED
        and s.record.id not in replaced
        and (s.record.replaces is None or s.record.replaces not in fleet.facts.records)
    ]
    return plan_drain(fleet.facts.models.values(), running, snapshot(fleet, now), set(nodes))


def cancel_called_off(fleet: Term, faults: Faults) -> None:
    """An operator uncordoned (or re-cordoned) a draining node, or a failed
    card reads healthy again: its replicas stay, and stand-ins that are not
    serving yet are withdrawn."""
    draining = {n for n, info in fleet.facts.admin.items() if info.flag is AdminFlag.DRAINING}
    called_off = [
        r
        for r in fleet.facts.records.values()
        if r.state is ReplicaState.DRAINING
        and not draining.intersection(r.nodes)
        and fault_under(r, faults) is None
        and fleet.facts.up_to_date(r)  # an old one leaves for a rollout (`rolling`)
        and r.leaving is None  # one leaves for a scale-down (`demand`)
    ]
    if not called_off:
        return
    ids = {r.id for r in called_off}
    stand_ins = [r for r in fleet.facts.records.values() if r.replaces in ids]
    fleet.facts.remove_replicas(r.id for r in stand_ins if r.state is not ReplicaState.READY)
    fleet.facts.put_replicas(
        replace(r, replaces=None) for r in stand_ins if r.state is ReplicaState.READY
    )
    # A draining replica's own error only ever says why it moves (a card fault).
    fleet.facts.put_replicas(replace(r, state=ReplicaState.READY, error=None) for r in called_off)


def drain(fleet: Term, gate: StopGate | None, now: float, wall: float) -> None:
    """Each replica on a draining node gets a stand-in elsewhere, then stops;
    drains past their deadline are forced."""
    for node in due_drains(fleet.facts.admin, wall):
        log.warning("drain of %s not done by its deadline: forcing it", node)
        fleet.facts.force_drain(node, "deadline")
    draining = sorted(n for n, info in fleet.facts.admin.items() if info.flag is AdminFlag.DRAINING)
    if not draining:
        return
    by_replaced = {r.replaces: r for r in fleet.facts.records.values() if r.replaces}
    for node in draining:
        on_node = [r for r in fleet.facts.records.values() if node in r.nodes]
        if fleet.facts.admin_info(node).force:
            forced = [r.id for r in on_node]
            fleet.facts.remove_replicas(stoppable(gate, forced, force=True))
            if any(rid in fleet.facts.records for rid in forced):
                continue  # gateways are still letting go of them
            # Their stand-ins, placed already, are ordinary replicas from now on.
            stand_ins = [
                fleet.facts.records.get(by_replaced[rid].id) for rid in forced if rid in by_replaced
            ]
            fleet.facts.put_replicas(replace(r, replaces=None) for r in stand_ins if r is not None)
            on_node = []
        # Replacements that are ready let their originals go, once the
        # gateways route to the stand-ins and have let go of the originals.
        done = stoppable(
            gate,
            [
                r.id
                for r in on_node
                if (rep := by_replaced.get(r.id)) and rep.state is ReplicaState.READY
            ],
        )
        fleet.facts.remove_replicas(done)
        report_moved(fleet, done, by_replaced, f"drain of {node}")
        # Their stand-ins are ordinary replicas from now on.
        stand_ins = [fleet.facts.records.get(by_replaced[rid].id) for rid in done]
        fleet.facts.put_replicas(replace(r, replaces=None) for r in stand_ins if r is not None)
        on_node = [r for r in on_node if r.id not in done]
        if not on_node:
            fleet.facts.mark_drained(node)
            log.info("node %s drained", node)
            continue
        fleet.facts.put_replicas(
            r.with_state(ReplicaState.DRAINING)
            for r in on_node
            if r.state is not ReplicaState.DRAINING
        )
        needing = [
            r
            for r in on_node
            if r.id not in by_replaced
            and r.leaving is None  # leaving for a scale-down: no stand-in
            and r.model in fleet.facts.models
            and not fleet.facts.backing_off(r.model, wall)
        ]
        fleet.facts.decisions.set_drain_blocked(
            node, place_stand_ins(fleet, needing, draining, now, wall, f"drain of {node}")
        )


def replace_faulted(
    fleet: Term,
    memory: LoopMemory,
    gate: StopGate | None,
    faults: Faults,
    now: float,
    wall: float,
) -> None:
    """Replicas on a failed card move as a drain moves them: a stand-in placed
    elsewhere (off the failed card's node), serving when ready, then the
    original stopped once the gateways have let go of it. One not serving
    yet just stops; the minimums place it again. Replicas on a draining node
    are the drain's."""
    if not faults:
        memory.note_fault_blocked({})
        return
    draining = sorted(n for n, info in fleet.facts.admin.items() if info.flag is AdminFlag.DRAINING)
    by_replaced = {r.replaces: r for r in fleet.facts.records.values() if r.replaces}
    hit = [
        (r, f)
        for r in list(fleet.facts.records.values())
        if not set(draining).intersection(r.nodes)
        and (f := fault_under(r, faults))
        # One leaving for a rollout needs no stand-in: the rollout replaces it;
        # nor one leaving for a scale-down.
        and not (r.state is ReplicaState.DRAINING and not fleet.facts.up_to_date(r))
        and r.leaving is None
    ]
    if not hit:
        memory.note_fault_blocked({})
        return
    starting = [r.id for r, _ in hit if r.state is ReplicaState.STARTING]
    if starting:
        log.warning("stopping %d starting replica(s) on failed cards", len(starting))
        fleet.facts.remove_replicas(starting)
    moving = [(r, f) for r, f in hit if r.state in (ReplicaState.READY, ReplicaState.DRAINING)]
    fleet.facts.put_replicas(
        r.with_state(ReplicaState.DRAINING, f"card fault: {f.describe()}")
        for r, f in moving
        if r.state is ReplicaState.READY
    )
    done = stoppable(
        gate,
        [
            r.id
            for r, _ in moving
            if (rep := by_replaced.get(r.id)) and rep.state is ReplicaState.READY
        ],
    )
    fleet.facts.remove_replicas(done)
    report_moved(fleet, done, by_replaced, "a failed card")
    fleet.facts.put_replicas(
        replace(rep, replaces=None)
        for rid in done
        if (rep := fleet.facts.records.get(by_replaced[rid].id)) is not None
    )
    needing = [
        fleet.facts.records[r.id]
        for r, _ in moving
        if r.id not in by_replaced
        and r.id in fleet.facts.records
        and r.model in fleet.facts.models
        and not fleet.facts.backing_off(r.model, wall)
    ]
    excluded = [*draining, *faults]
    cause = {r.id: f"{f.describe()} on {r.shards[0].node}" for r, f in moving}
    why = ""
    for rec in needing:
        why = (
            place_stand_ins(fleet, [rec], excluded, now, wall, f"card fault: {cause[rec.id]}")
            or why
        )
    blocked = {r.id: why for r in needing if why}
    for rid, reason in memory.note_fault_blocked(blocked).items():
        log.warning("no stand-in for %s (on a failed card): %s", rid, reason)


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
