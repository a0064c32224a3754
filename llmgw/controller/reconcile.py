"""The reconcile loop: make the replicas that exist match what the specs ask for.

Every tick, from the fleet's current facts:

1. Record what the agents report: a replica whose shards are all ready becomes
   ready; one whose engine failed is removed, and its model backs off
   exponentially, so a crash-looping engine cannot cause a placement storm.
2. Replicas on a node unreachable for longer than `replace_after_s` are removed
   (and so replaced); when the node comes back, its agent stops the orphans.
3. Drains: each replica on a draining node gets a replacement placed elsewhere
   first; when the replacement is ready the old one is stopped. A node with
   nothing left ends up cordoned and marked drained. A forced drain stops the
   replicas at once.
4. Every model keeps ready + starting >= its minimum; what cannot be placed
   says why.

Placement itself is `llmgw.scheduler`, pure functions over a snapshot.
Everything a tick decides is written to the store before the next report's
reply carries it, so a controller killed at any moment resumes without
duplicating or losing a replica.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace

from llmgw.controller.endpoints import StopGate
from llmgw.controller.fleet import FleetState
from llmgw.controller.replicas import ReplicaStatus
from llmgw.controller.store import ReplicaRecord, ShardRecord, StoreUnavailable
from llmgw.scheduler import NodeCapacity, Placement, RunningReplica, place_many, plan_drain
from llmgw.wire import AdminFlag, DrainPlan, ModelSpec, NodeState, ReplicaState

log = logging.getLogger("llmgw.reconcile")


def snapshot(fleet: FleetState, now: float, excluded: Iterable[str] = ()) -> list[NodeCapacity]:
    """What placement may use: healthy idle cards not held by any replica."""
    excluded = set(excluded)
    out = []
    for name, entry in fleet.nodes.items():
        assigned = fleet.assigned_gpus(name)
        free: dict[str, list[str]] = defaultdict(list)
        for uuid, cls, usable in entry.cards:
            free.setdefault(cls, [])
            if usable and uuid not in assigned:
                free[cls].append(uuid)
        holds = {
            spec.name
            for spec in fleet.models.values()
            if spec.name in entry.digest.models or spec.source in entry.digest.models
        }
        out.append(
            NodeCapacity(
                name=name,
                free={cls: tuple(sorted(uuids)) for cls, uuids in free.items()},
                total_cards=len(entry.cards),
                fabrics=entry.digest.fabrics,
                schedulable=name not in excluded and fleet.state_of(name, now) is NodeState.READY,
                holds=frozenset(holds),
            )
        )
    return out


def new_replica_id(model: str) -> str:
    stem = re.sub(r"[^a-z0-9]+", "-", model.rsplit("/", 1)[-1].lower()).strip("-")[:40] or "replica"
    return f"{stem}-{secrets.token_hex(3)}"


def record_from(
    placement: Placement, created_at: float, replaces: str | None = None
) -> ReplicaRecord:
    return ReplicaRecord(
        id=new_replica_id(placement.model),
        model=placement.model,
        state=ReplicaState.STARTING,
        shards=tuple(ShardRecord(s.node, s.rank, s.gpus) for s in placement.shards),
        created_at=created_at,
        replaces=replaces,
    )


def drain_plan(fleet: FleetState, nodes: list[str]) -> DrainPlan:
    """The drain pre-check: what draining these nodes would do to each model."""
    now = fleet.clock()
    statuses = fleet.replica_statuses()
    replaced = {r.replaces for r in fleet.records.values() if r.replaces}
    # A drain in progress: an original and its stand-in are left out (the
    # stand-in's cards are taken already). A stand-in whose original is gone is
    # an ordinary replica and must move like one.
    running = [
        RunningReplica(s.record.id, s.record.model, s.record.nodes, s.state is ReplicaState.READY)
        for s in statuses.values()
        if s.state is not ReplicaState.FAILED
        and s.record.id not in replaced
        and (s.record.replaces is None or s.record.replaces not in fleet.records)
    ]
    return plan_drain(fleet.models.values(), running, snapshot(fleet, now), set(nodes))


class Reconciler:
    def __init__(
        self,
        fleet: FleetState,
        gate: StopGate | None = None,
        on_pass: Callable[[float, bool], None] | None = None,
    ) -> None:
        self.fleet = fleet
        self.gate = gate
        self.on_pass = on_pass  # told each pass's duration and whether it failed (metrics)

    def _stoppable(self, ids: list[str], *, force: bool = False) -> list[str]:
        """Of replicas that must stop, those the gateways have let go of (all, without a gate)."""
        return ids if self.gate is None else self.gate.ready_to_stop(ids, force=force)

    async def run(self, interval_s: float) -> None:
        while True:
            t0, failed = time.perf_counter(), False
            try:
                self.tick()
            except StoreUnavailable:
                pass  # the store logs once per outage; the next tick tries again
            except Exception:  # one bad tick must not stop reconciling
                failed = True
                log.exception("reconcile tick failed")
            if self.on_pass is not None:
                self.on_pass(time.perf_counter() - t0, failed)
            await asyncio.sleep(interval_s)

    def tick(self) -> None:
        fleet = self.fleet
        now, wall = fleet.clock(), fleet.wall()
        fleet.advance_time(now)
        statuses = fleet.replica_statuses()
        self._record_transitions(statuses, wall)
        self._replace_lost(now)
        self._retire_deleted()
        self._cancel_stopped_drains()
        self._drain(now, wall)
        self._fill_shortfalls(now, wall)

    # -- 1. what the agents report ---------------------------------------------------

    def _record_transitions(self, statuses: dict[str, ReplicaStatus], wall: float) -> None:
        fleet = self.fleet
        became_ready = [
            s.record.with_state(ReplicaState.READY)
            for s in statuses.values()
            if s.state is ReplicaState.READY and s.record.state is ReplicaState.STARTING
        ]
        fleet.put_replicas(became_ready)
        for rec in became_ready:
            fleet.clear_backoff(rec.model)
        failed = [s for s in statuses.values() if s.state is ReplicaState.FAILED]
        for s in failed:
            fleet.back_off(s.record.model, s.error or "engine failed", wall)
            log.warning("replica %s of %s failed: %s", s.record.id, s.record.model, s.error)
        fleet.remove_replicas(s.record.id for s in failed)

    # -- 2. nodes gone for good ------------------------------------------------------------

    def _replace_lost(self, now: float) -> None:
        fleet = self.fleet
        limit = fleet.settings.replace_after_s
        lost = {
            name for name, entry in fleet.nodes.items() if now > fleet.unreachable_at(entry) + limit
        }
        doomed = [r.id for r in fleet.records.values() if lost.intersection(r.nodes)]
        if doomed:
            log.warning(
                "replacing %d replica(s) on unreachable nodes %s", len(doomed), sorted(lost)
            )
            fleet.remove_replicas(doomed)

    def _retire_deleted(self) -> None:
        """Replicas of deleted models stop once the gateways have let go of them."""
        fleet = self.fleet
        fleet.remove_replicas(self._stoppable(fleet.retired_replicas()))

    # -- 3. drains ---------------------------------------------------------------------------

    def _cancel_stopped_drains(self) -> None:
        """An operator uncordoned (or re-cordoned) a draining node: its replicas
        stay, and stand-ins that are not serving yet are withdrawn."""
        fleet = self.fleet
        draining = {n for n, info in fleet.admin.items() if info.flag is AdminFlag.DRAINING}
        stale = [
            r
            for r in fleet.records.values()
            if r.state is ReplicaState.DRAINING and not draining.intersection(r.nodes)
        ]
        if not stale:
            return
        ids = {r.id for r in stale}
        stand_ins = [r for r in fleet.records.values() if r.replaces in ids]
        fleet.remove_replicas(r.id for r in stand_ins if r.state is not ReplicaState.READY)
        fleet.put_replicas(
            replace(r, replaces=None) for r in stand_ins if r.state is ReplicaState.READY
        )
        fleet.put_replicas(r.with_state(ReplicaState.READY) for r in stale)

    def _drain(self, now: float, wall: float) -> None:
        fleet = self.fleet
        for node in fleet.due_drains(wall):
            log.warning("drain of %s not done by its deadline: forcing it", node)
            fleet.force_drain(node, "deadline")
        draining = sorted(n for n, info in fleet.admin.items() if info.flag is AdminFlag.DRAINING)
        if not draining:
            return
        by_replaced = {r.replaces: r for r in fleet.records.values() if r.replaces}
        for node in draining:
            on_node = [r for r in fleet.records.values() if node in r.nodes]
            if fleet.admin_info(node).force:
                forced = [r.id for r in on_node]
                fleet.remove_replicas(self._stoppable(forced, force=True))
                if any(rid in fleet.records for rid in forced):
                    continue  # gateways are still letting go of them
                on_node = []
            # Replacements that are ready let their originals go, once the
            # gateways route to the stand-ins and have let go of the originals.
            done = self._stoppable(
                [
                    r.id
                    for r in on_node
                    if (rep := by_replaced.get(r.id)) and rep.state is ReplicaState.READY
                ]
            )
            fleet.remove_replicas(done)
            # Their stand-ins are ordinary replicas from now on.
            stand_ins = [fleet.records.get(by_replaced[rid].id) for rid in done]
            fleet.put_replicas(replace(r, replaces=None) for r in stand_ins if r is not None)
            on_node = [r for r in on_node if r.id not in done]
            if not on_node:
                fleet.mark_drained(node)
                log.info("node %s drained", node)
                continue
            fleet.put_replicas(
                r.with_state(ReplicaState.DRAINING)
                for r in on_node
                if r.state is not ReplicaState.DRAINING
            )
            needing = [
                r
                for r in on_node
                if r.id not in by_replaced
                and r.model in fleet.models
                and not fleet.backing_off(r.model, wall)
            ]
            fleet.set_drain_blocked(node, self._place_replacements(needing, draining, now, wall))

    def _place_replacements(
        self, originals: list[ReplicaRecord], draining: list[str], now: float, wall: float
    ) -> str | None:
        """Place a stand-in for each original; say why when one cannot be placed."""
        if not originals:
            return None
        fleet = self.fleet
        results = place_many(
            [fleet.models[r.model] for r in originals], snapshot(fleet, now, draining)
        )
        placed, reasons = [], []
        for original, result in zip(originals, results, strict=True):
            if isinstance(result, Placement):
                placed.append(record_from(result, wall, replaces=original.id))
            else:
                reasons.append(f"{original.model}: {result.reason}")
        fleet.put_replicas(placed)
        return "; ".join(reasons) or None

    # -- 4. minimums ------------------------------------------------------------------------------

    def _fill_shortfalls(self, now: float, wall: float) -> None:
        fleet = self.fleet
        replaced = {r.replaces for r in fleet.records.values() if r.replaces}
        active: dict[str, int] = defaultdict(int)
        for r in fleet.records.values():
            # A draining replica and its stand-in are one replica between them.
            if r.state is not ReplicaState.FAILED and r.id not in replaced:
                active[r.model] += 1
        requests: list[ModelSpec] = []
        for name, spec in sorted(fleet.models.items()):
            missing = spec.min_replicas - active[name]
            if missing <= 0:
                fleet.set_unplaceable(name, None)
            elif not fleet.backing_off(name, wall):
                requests.extend([spec] * missing)
        if not requests:
            return
        results = place_many(requests, snapshot(fleet, now))
        placed = []
        unplaced: dict[str, str] = {}
        for spec, result in zip(requests, results, strict=True):
            if isinstance(result, Placement):
                placed.append(record_from(result, wall))
            else:
                unplaced.setdefault(spec.name, result.reason)
        fleet.put_replicas(placed)
        for spec in requests:
            fleet.set_unplaceable(spec.name, unplaced.get(spec.name))
        if placed:
            log.info("placed %d replica(s): %s", len(placed), ", ".join(r.id for r in placed))
