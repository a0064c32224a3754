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
   replicas at once. A replica on a card that failed is replaced the same way,
   and the card's node is cordoned (`llmgw.controller.faults`).
4. Rollouts (`llmgw.controller.rollout`), then demand
   (`llmgw.controller.autoscale`): each model's desired count follows its
   requests in flight; one replica above it at a time leaves through the stop
   handshake.
5. Every model keeps ready + starting >= its desired count; what cannot be
   placed says why.

The work of a pass is bounded whatever the specs say (a spec may ask for
10,000 replicas): a model that did not fit is tried again only once the
fleet's capacity has moved (`Term.capacity_version`) or its spec has
changed, and then once, not once per missing replica; a pass makes at most
`attempts_per_pass` placement attempts (the rest wait for the next pass, which
starts with the models this one did not reach); and `run` yields to the event
loop between slices of at most `attempts_per_slice` attempts or `slice_s`
seconds, for as long as the slice took, so reports and requests are served in
between. The snapshot and the scheduler's index are built in steps of
`NODES_PER_STEP` nodes, and only nodes whose capacity changed since the last
pass are read again. One picture of the fleet serves a pass: once something
else moved capacity during a yield, each placement is checked against the
fleet as it is before it is committed.

Placement itself is `llmgw.scheduler`, pure functions over a snapshot.
Everything a tick decides is written to the store before the next report's
reply carries it, so a controller killed at any moment resumes without
duplicating or losing a replica.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import re
import secrets
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import NamedTuple

from llmgw.controller.autoscale import Autoscaler
from llmgw.controller.endpoints import StopGate
from llmgw.controller.faults import FaultCordons, Faults, card_faults, fault_under
from llmgw.controller.reclaim import RECLAIMED, Candidate, choose
from llmgw.controller.replicas import ReplicaStatus
from llmgw.controller.rollout import plan_rollout
from llmgw.controller.store import ReplicaRecord, ShardRecord, StoreUnavailable
from llmgw.controller.term import Term
from llmgw.scheduler import (
    Fill,
    NodeCapacity,
    Placement,
    RunningReplica,
    place_many,
    placer_in_steps,
    plan_drain,
)
from llmgw.wire import (
    IDLE_AFTER_S,
    AdminFlag,
    DrainPlan,
    EventReason,
    ModelSpec,
    NodeState,
    ReplicaState,
    RolloutState,
)

log = logging.getLogger("llmgw.reconcile")

# Placement attempts (one replica each) a pass may make, and per slice between
# two yields to the event loop. An attempt costs microseconds when it places and
# up to a scan of the fleet when it does not (the reason).
ATTEMPTS_PER_PASS = 256
ATTEMPTS_PER_SLICE = 32
SLICE_S = 0.002
# Characters of a failed new replica's error a stalled rollout keeps (its first
# line says why: the engine's exit and cause; then the excerpt of its log).
STALL_MESSAGE_MAX = 4096
# Nodes per step of building the snapshot and the scheduler's index (~2 ms each).
NODES_PER_STEP = 200
# Wall time a pass (in `run`) spends placing before it leaves the rest to the
# next: a first look at many models, or a big change, is spread over seconds.
PASS_S = 0.05


def snapshot(
    fleet: Term,
    now: float,
    excluded: Iterable[str] = (),
    names: Iterable[str] | None = None,
) -> list[NodeCapacity]:
    """What placement may use: healthy idle cards not held by any replica (of
    the nodes named, when `names` is given; those gone meanwhile are left out)."""
    excluded = set(excluded)
    # A node holds a model when it has weights under the model's name or source:
    # looked up per weight held, not per declared model (200 models x 2,000 nodes).
    by_weights: dict[str, set[str]] = defaultdict(set)
    for spec in fleet.facts.models.values():
        by_weights[spec.name].add(spec.name)
        by_weights[spec.source].add(spec.name)
    out = []
    entries = fleet.facts.nodes
    for name in entries if names is None else names:
        entry = entries.get(name)
        if entry is None:
            continue
        assigned = fleet.facts.assigned_gpus(name)
        free: dict[str, list[str]] = defaultdict(list)
        for uuid, cls, usable in entry.cards:
            free.setdefault(cls, [])
            if usable and uuid not in assigned:
                free[cls].append(uuid)
        holds = {model for held in entry.digest.models for model in by_weights.get(held, ())}
        out.append(
            NodeCapacity(
                name=name,
                free={cls: tuple(sorted(uuids)) for cls, uuids in free.items()},
                total_cards=len(entry.cards),
                fabrics=entry.digest.fabrics,
                schedulable=name not in excluded
                and fleet.facts.state_of(name, now) is NodeState.READY,
                holds=frozenset(holds),
                runs=frozenset(rec.model for rec in fleet.facts.replicas_on(name)),  # spread
            )
        )
    return out


def _placed_words(records: list[ReplicaRecord]) -> str:
    """`placed 2 replica(s): a-1f on gpu1, a-2e on gpu2,gpu3`, at most ten named."""
    named = ", ".join(f"{r.id} on {','.join(r.nodes)}" for r in records[:10])
    more = f" and {len(records) - 10} more" if len(records) > 10 else ""
    return f"placed {len(records)} replica(s): {named}{more}"


def new_replica_id(model: str) -> str:
    stem = re.sub(r"[^a-z0-9]+", "-", model.rsplit("/", 1)[-1].lower()).strip("-")[:40] or "replica"
    return f"{stem}-{secrets.token_hex(3)}"


def record_from(
    placement: Placement, created_at: float, revision: int, replaces: str | None = None
) -> ReplicaRecord:
    return ReplicaRecord(
        id=new_replica_id(placement.model),
        model=placement.model,
        state=ReplicaState.STARTING,
        shards=tuple(ShardRecord(s.node, s.rank, s.gpus) for s in placement.shards),
        created_at=created_at,
        replaces=replaces,
        revision=revision,
    )


def wanted_classes(fleet: Term) -> frozenset[str]:
    """The GPU classes declared specs ask for by name: a model that fits on any
    class leaves them to those that need them (llmgw.scheduler, Classes)."""
    return frozenset(s.gpu_class for s in fleet.facts.models.values() if s.gpu_class)


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


class _Want(NamedTuple):
    spec: ModelSpec
    missing: int


class _Tried(NamedTuple):
    """A model that did not fit: the spec tried, and the fleet's capacity version then."""

    spec: ModelSpec
    version: int


class _Kept(NamedTuple):
    """A node's entry in the last snapshot, and the capacity version it was built at."""

    changed_at: int
    capacity: NodeCapacity


class Reconciler:
    def __init__(
        self,
        fleet: Term,
        gate: StopGate | None = None,
        on_pass: Callable[[float, bool], None] | None = None,
        *,
        attempts_per_pass: int = ATTEMPTS_PER_PASS,
        attempts_per_slice: int = ATTEMPTS_PER_SLICE,
        slice_s: float = SLICE_S,
        pass_s: float = PASS_S,
    ) -> None:
        if attempts_per_pass < 1 or attempts_per_slice < 1:
            raise ValueError("a pass and a slice must each allow at least one placement attempt")
        self.fleet = fleet
        self.gate = gate
        # Told each pass's time on the event loop and whether it failed (metrics).
        self.on_pass = on_pass
        self.attempts_per_pass = attempts_per_pass
        self.attempts_per_slice = attempts_per_slice
        self.slice_s = slice_s
        self.pass_s = pass_s
        # Models that did not fit. While spec and capacity are the same, trying
        # again would give the same answer.
        self._did_not_fit: dict[str, _Tried] = {}
        # Where the next pass starts when one ran out of attempts: (model, just after it).
        self._resume: tuple[str, bool] | None = None
        # The last snapshot, node by node, and the (name, source) of the models then.
        self._kept: dict[str, _Kept] = {}
        self._kept_weights: tuple[tuple[str, str], ...] = ()
        # The last pass's placer, and the capacity version it matched when it ended:
        # while nothing has moved since, the next pass goes on with it.
        self._placer: tuple[Callable[[ModelSpec, int], Fill], int] | None = None
        # Capacity moved by this loop's own placements only takes cards away, so it
        # cannot make a model fit that did not: such a model is only looked at again
        # (for its reason's numbers) after every model that may now fit. `_expected`
        # is the version after this loop's last commit; `_moved_at`, the last one
        # at which something else was seen to move capacity.
        self._expected = -1
        self._moved_at = 0
        self._cordons = FaultCordons()
        self._autoscaler = Autoscaler()
        # The last short model no reclaim could make fit, and the capacity then.
        self._reclaim_tried: tuple[ModelSpec, int] | None = None
        # Why a stand-in for a replica on a failed card cannot be placed, as last logged.
        self._fault_blocked: dict[str, str] = {}

    def _stoppable(self, ids: list[str], *, force: bool = False) -> list[str]:
        """Of replicas that must stop, those the gateways have let go of (all, without a gate)."""
        return ids if self.gate is None else self.gate.ready_to_stop(ids, force=force)

    async def run(self, interval_s: float) -> None:
        while True:
            await self.run_pass()
            await asyncio.sleep(interval_s)

    async def run_pass(self) -> None:
        """One pass, letting the event loop run between its slices."""
        held, failed = 0.0, False
        t0 = time.perf_counter()
        try:
            for _ in self.steps(time.perf_counter() + self.pass_s):
                took = time.perf_counter() - t0
                held += took
                # As long again for everything else: a pass with much to do takes
                # at most half the loop. (A request needs several turns of the
                # loop; one `sleep(0)` per slice would give it one.)
                await asyncio.sleep(took)
                t0 = time.perf_counter()
        except StoreUnavailable:
            pass  # the store logs once per outage; the next pass tries again
        except Exception:  # one bad pass must not stop reconciling
            failed = True
            log.exception("reconcile tick failed")
        held += time.perf_counter() - t0
        if self.on_pass is not None:
            self.on_pass(held, failed)

    def tick(self) -> None:
        """One whole pass without yielding and without a time limit (tests and benches)."""
        for _ in self.steps():
            pass

    def steps(self, place_until: float = float("inf")) -> Iterator[None]:
        """One pass, in slices: it yields where other work may run in between.
        Past `place_until` (`time.perf_counter()`), placing stops at the next slice."""
        fleet = self.fleet
        now, wall = fleet.facts.clock(), fleet.facts.wall()
        fleet.facts.advance_time(now)
        statuses = fleet.replica_statuses()
        read_at = fleet.capacity_version  # every replica moved moves it
        faults = card_faults(fleet.facts)
        self._record_transitions(statuses, wall, faults)
        self._replace_lost(now)
        self._retire_deleted()
        self._cancel_stopped_drains(faults)
        self._drain(now, wall)
        self._cordons.cordon(fleet.facts, faults)
        self._replace_faulted(faults, now, wall)
        self._roll(faults, now, wall)
        if fleet.capacity_version != read_at:  # the steps before moved replicas
            statuses = fleet.replica_statuses()
        self._scale(statuses, faults, now)
        self._reclaim(faults, now)
        yield
        yield from self._fill_shortfalls(place_until)

    # -- 1. what the agents report ---------------------------------------------------

    def _record_transitions(
        self, statuses: dict[str, ReplicaStatus], wall: float, faults: Faults
    ) -> None:
        fleet = self.fleet
        became_ready = [
            s.record.with_state(ReplicaState.READY)
            for s in statuses.values()
            if s.state is ReplicaState.READY and s.record.state is ReplicaState.STARTING
        ]
        fleet.facts.put_replicas(became_ready)
        for rec in became_ready:
            fleet.facts.clear_backoff(rec.model)
            note = fleet.facts.rollout_note(rec.model)
            if note is not None and note[0] is RolloutState.STALLED and fleet.facts.up_to_date(rec):
                fleet.facts.set_rollout_note(rec.model, None)  # the new revision serves after all
        failed = [s for s in statuses.values() if s.state is ReplicaState.FAILED]
        rolling = {r.model for r in fleet.facts.records.values() if not fleet.facts.up_to_date(r)}
        for s in failed:
            log.warning("replica %s of %s failed: %s", s.record.id, s.record.model, s.error)
            if s.record.model in rolling and fleet.facts.up_to_date(s.record):
                why = (s.error or "engine failed")[:STALL_MESSAGE_MAX]
                note = fleet.facts.rollout_note(s.record.model)
                if note is None or note[0] is not RolloutState.STALLED:
                    cause = why.strip().split("\n", 1)[0]
                    fleet.facts.event(
                        f"model/{s.record.model}",
                        EventReason.ROLLOUT_STALLED,
                        f"revision {s.record.revision}: {s.record.id} failed, no more old "
                        f"replicas stop: {cause}",
                    )
                fleet.facts.set_rollout_note(s.record.model, (RolloutState.STALLED, why))
            # An engine that died with its card is not the spec's fault: it is
            # replaced at once, without backing the model off.
            if fault_under(s.record, faults) is None:
                fleet.facts.back_off(s.record.model, s.error or "engine failed", wall)
        fleet.facts.remove_replicas(s.record.id for s in failed)

    # -- 2. nodes gone for good ------------------------------------------------------------

    def _replace_lost(self, now: float) -> None:
        fleet = self.fleet
        limit = fleet.facts.settings.replace_after_s
        lost = {
            name
            for name, entry in fleet.facts.nodes.items()
            if now > fleet.facts.unreachable_at(entry) + limit
        }
        doomed = [r.id for r in fleet.facts.records.values() if lost.intersection(r.nodes)]
        gone_from = {
            node: {r.id for r in fleet.facts.records.values() if node in r.nodes} for node in lost
        }
        if doomed:
            log.warning(
                "replacing %d replica(s) on unreachable nodes %s", len(doomed), sorted(lost)
            )
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

    def _retire_deleted(self) -> None:
        """Replicas of deleted models stop once the gateways have let go of them."""
        fleet = self.fleet
        retired = {rid: fleet.facts.records[rid].model for rid in fleet.facts.retired_replicas()}
        stopped = self._stoppable(list(retired))
        fleet.facts.remove_replicas(stopped)
        by_model: dict[str, list[str]] = defaultdict(list)
        for rid in stopped:
            by_model[retired[rid]].append(rid)
        for model, ids in sorted(by_model.items()):
            fleet.facts.event(
                f"model/{model}", EventReason.STOPPED, f"model deleted: {', '.join(ids)} stopped"
            )

    # -- 3. drains ---------------------------------------------------------------------------

    def _cancel_stopped_drains(self, faults: Faults) -> None:
        """An operator uncordoned (or re-cordoned) a draining node, or a failed
        card reads healthy again: its replicas stay, and stand-ins that are not
        serving yet are withdrawn."""
        fleet = self.fleet
        draining = {n for n, info in fleet.facts.admin.items() if info.flag is AdminFlag.DRAINING}
        stale = [
            r
            for r in fleet.facts.records.values()
            if r.state is ReplicaState.DRAINING
            and not draining.intersection(r.nodes)
            and fault_under(r, faults) is None
            and fleet.facts.up_to_date(r)  # an old one leaves for a rollout (`_roll`)
            and r.leaving is None  # one leaves for a scale-down (`_scale`)
        ]
        if not stale:
            return
        ids = {r.id for r in stale}
        stand_ins = [r for r in fleet.facts.records.values() if r.replaces in ids]
        fleet.facts.remove_replicas(r.id for r in stand_ins if r.state is not ReplicaState.READY)
        fleet.facts.put_replicas(
            replace(r, replaces=None) for r in stand_ins if r.state is ReplicaState.READY
        )
        # A draining replica's own error only ever says why it moves (a card fault).
        fleet.facts.put_replicas(replace(r, state=ReplicaState.READY, error=None) for r in stale)

    def _drain(self, now: float, wall: float) -> None:
        fleet = self.fleet
        for node in fleet.facts.due_drains(wall):
            log.warning("drain of %s not done by its deadline: forcing it", node)
            fleet.facts.force_drain(node, "deadline")
        draining = sorted(
            n for n, info in fleet.facts.admin.items() if info.flag is AdminFlag.DRAINING
        )
        if not draining:
            return
        by_replaced = {r.replaces: r for r in fleet.facts.records.values() if r.replaces}
        for node in draining:
            on_node = [r for r in fleet.facts.records.values() if node in r.nodes]
            if fleet.facts.admin_info(node).force:
                forced = [r.id for r in on_node]
                fleet.facts.remove_replicas(self._stoppable(forced, force=True))
                if any(rid in fleet.facts.records for rid in forced):
                    continue  # gateways are still letting go of them
                # Their stand-ins, placed already, are ordinary replicas from now on.
                stand_ins = [
                    fleet.facts.records.get(by_replaced[rid].id)
                    for rid in forced
                    if rid in by_replaced
                ]
                fleet.facts.put_replicas(
                    replace(r, replaces=None) for r in stand_ins if r is not None
                )
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
            fleet.facts.remove_replicas(done)
            self._moved(done, by_replaced, f"drain of {node}")
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
            fleet.facts.set_drain_blocked(
                node, self._place_replacements(needing, draining, now, wall, f"drain of {node}")
            )

    def _replace_faulted(self, faults: Faults, now: float, wall: float) -> None:
        """Replicas on a failed card move as a drain moves them: a stand-in placed
        elsewhere (off the failed card's node), serving when ready, then the
        original stopped once the gateways have let go of it. One not serving
        yet just stops; the minimums place it again. Replicas on a draining node
        are the drain's."""
        fleet = self.fleet
        if not faults:
            self._fault_blocked.clear()
            return
        draining = sorted(
            n for n, info in fleet.facts.admin.items() if info.flag is AdminFlag.DRAINING
        )
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
            self._fault_blocked.clear()
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
        done = self._stoppable(
            [
                r.id
                for r, _ in moving
                if (rep := by_replaced.get(r.id)) and rep.state is ReplicaState.READY
            ]
        )
        fleet.facts.remove_replicas(done)
        self._moved(done, by_replaced, "a failed card")
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
                self._place_replacements([rec], excluded, now, wall, f"card fault: {cause[rec.id]}")
                or why
            )
        blocked = {r.id: why for r in needing if why}
        for rid, reason in blocked.items():
            if self._fault_blocked.get(rid) != reason:
                log.warning("no stand-in for %s (on a failed card): %s", rid, reason)
        self._fault_blocked = blocked

    # -- 4. rollouts -----------------------------------------------------------------------

    def _roll(self, faults: Faults, now: float, wall: float) -> None:
        """Models with replicas of an older revision: place new ones and let old
        ones go, as `llmgw.controller.rollout` says, and say why one waits."""
        fleet = self.fleet
        draining = {n for n, info in fleet.facts.admin.items() if info.flag is AdminFlag.DRAINING}
        replaced = {r.replaces for r in fleet.facts.records.values() if r.replaces}
        by_model: dict[str, list[ReplicaRecord]] = defaultdict(list)
        for r in fleet.facts.records.values():
            # A replica with a stand-in (a drain, a fault) counts as its stand-in.
            if (
                r.model in fleet.facts.models
                and r.state is not ReplicaState.FAILED
                and r.id not in replaced
                and r.leaving is None  # a scale-down's (`_scale`)
            ):
                by_model[r.model].append(r)
        for name in sorted(by_model):
            if all(fleet.facts.up_to_date(r) for r in by_model[name]):
                if (note := fleet.facts.rollout_note(name)) and note[0] is RolloutState.WAITING:
                    fleet.facts.set_rollout_note(name, None)
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
            stopped = self._stoppable(leaving)
            fleet.facts.remove_replicas(stopped)
            note = fleet.facts.rollout_note(name)
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
                    f"revision {revision}: {_placed_words(placed)}",
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
                fleet.facts.set_rollout_note(name, waiting)
            elif note is not None:
                fleet.facts.set_rollout_note(name, None)

    # -- 5. demand ---------------------------------------------------------------------------

    def _scale(self, statuses: dict[str, ReplicaStatus], faults: Faults, now: float) -> None:
        """Each model's desired count from its requests in flight (`autoscale`);
        above it, one replica at a time leaves through the stop handshake: one
        starting first (it serves nothing), else the least busy, newest first
        (its KV cache is the coldest). Not while the model rolls out (the
        rollout owns its counts) or while a stand-in of its is pending. A
        leaving replica is taken back when the count rises before it stopped."""
        fleet = self.fleet
        gateways = self.gate.gateways.in_flight(now) if self.gate is not None else {}
        held = self.gate.gateways.held(now) if self.gate is not None else {}
        replaced = {r.replaces for r in fleet.facts.records.values() if r.replaces}
        live: dict[str, list[ReplicaStatus]] = defaultdict(list)
        for s in statuses.values():
            if s.state is not ReplicaState.FAILED:
                live[s.record.model].append(s)
        self._autoscaler.forget(set(fleet.facts.models))
        fleet.facts.forget_scaling(fleet.facts.models)
        for name, spec in sorted(fleet.facts.models.items()):
            mine = live.get(name, [])
            staying = [s for s in mine if s.record.leaving is None and s.record.id not in replaced]
            ready = [s for s in staying if s.state is ReplicaState.READY]
            in_flight = sum(s.in_flight(gateways) or 0 for s in ready)
            decision = self._autoscaler.decide(
                spec, in_flight, len(staying), now, held=held.get(name, 0), serving=len(ready)
            )
            before = fleet.facts.desired_replicas(name)
            fleet.facts.set_scaling(name, decision)
            if decision.changed:
                reason = EventReason.SCALED_UP if decision.changed > 0 else EventReason.SCALED_DOWN
                fleet.facts.event(
                    f"model/{name}", reason, f"{before} -> {decision.desired}: {decision.why}"
                )
            self._scale_down(name, mine, replaced, faults, gateways)

    def _scale_down(
        self,
        name: str,
        mine: list[ReplicaStatus],
        replaced: set[str],
        faults: Faults,
        gateways: Mapping[str, int],
    ) -> None:
        fleet = self.fleet
        desired = fleet.facts.desired_replicas(name)
        leaving = [s.record for s in mine if s.record.leaving is not None]
        staying = [s for s in mine if s.record.leaving is None and s.record.id not in replaced]
        # Demand came back before they stopped (a reclaimed one stays reclaimed).
        undone = [r for r in leaving if not r.leaving or not r.leaving.startswith(RECLAIMED)]
        if undone and len(staying) < desired:
            back = undone[: desired - len(staying)]
            fleet.facts.put_replicas(
                replace(r, state=ReplicaState.READY, leaving=None, error=None) for r in back
            )
            fleet.facts.event(
                f"model/{name}",
                EventReason.SCALED_UP,
                f"{', '.join(r.id for r in back)} back in routing: wanted again",
            )
            leaving = [r for r in leaving if r not in back]
        stopped = self._stoppable([r.id for r in leaving])
        if stopped:
            fleet.facts.remove_replicas(stopped)
            fleet.facts.event(
                f"model/{name}", EventReason.SCALED_DOWN, f"{', '.join(stopped)} stopped"
            )
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
        why = f"scale down to {desired}: {self._why_scaled(name)}"
        if pick.state is ReplicaState.STARTING:
            fleet.facts.remove_replicas([pick.id])
            fleet.facts.event(
                f"model/{name}", EventReason.SCALED_DOWN, f"{pick.id} stopped ({why})"
            )
            return
        fleet.facts.put_replicas(
            [replace(pick, state=ReplicaState.DRAINING, leaving=why, error=why)]
        )
        fleet.facts.event(
            f"model/{name}",
            EventReason.SCALED_DOWN,
            f"{pick.id} out of routing, to stop once the gateways let go ({why})",
        )
        if self._stoppable([pick.id]):  # no gateway to wait for
            fleet.facts.remove_replicas([pick.id])
            fleet.facts.event(f"model/{name}", EventReason.SCALED_DOWN, f"{pick.id} stopped")

    def _reclaim(self, faults: Faults, now: float) -> None:
        """Room for the highest-priority model short of its minimum that cannot
        be placed, from lower-priority models above theirs (`reclaim`): the
        chosen replicas leave as a scale-down's do; it is placed when they stop."""
        fleet = self.fleet
        if not fleet.unplaceable_reasons:
            return  # the common case: everything that must run, runs
        wall = fleet.facts.wall()
        records = [r for r in fleet.facts.records.values() if r.state is not ReplicaState.FAILED]
        replaced = {r.replaces for r in records if r.replaces}
        staying = Counter(r.model for r in records if r.leaving is None and r.id not in replaced)
        pending = {r.leaving for r in records if (r.leaving or "").startswith(RECLAIMED)}
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
        if not short or any(f"{RECLAIMED} {short[0].name} " in p for p in pending if p):
            return  # nothing to do, or its room is on its way
        spec = short[0]
        if self._reclaim_tried == (spec, fleet.capacity_version):
            return  # nothing it could take has moved since no choice made it fit
        statuses = [
            s for s in fleet.replica_statuses().values() if s.state is not ReplicaState.FAILED
        ]
        gateways = self.gate.gateways.in_flight(now) if self.gate is not None else {}
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
            self._reclaim_tried = (spec, fleet.capacity_version)
            return
        draining = [n for n, info in fleet.facts.admin.items() if info.flag is AdminFlag.DRAINING]
        cards = {uuid: cls for entry in fleet.facts.nodes.values() for uuid, cls, _ in entry.cards}
        nodes = snapshot(fleet, now, [*draining, *faults])
        picked = choose(spec, candidates, staying, nodes, cards)
        if not picked:
            self._reclaim_tried = (spec, fleet.capacity_version)
            return
        why = f"{RECLAIMED} {spec.name} (priority {spec.priority})"
        for rec in picked:
            fleet.facts.event(
                f"model/{rec.model}",
                EventReason.RECLAIMED,
                f"{rec.id} out of routing, to stop: {why}, short of its minimum",
            )
        fleet.facts.put_replicas(
            replace(r, state=ReplicaState.DRAINING, leaving=why, error=why) for r in picked
        )
        fleet.facts.event(
            f"model/{spec.name}",
            EventReason.RECLAIMED,
            f"room for a replica: {', '.join(f'{r.id} ({r.model})' for r in picked)} to stop",
        )
        stopped = self._stoppable([r.id for r in picked])
        fleet.facts.remove_replicas(stopped)

    def _why_scaled(self, name: str) -> str:
        scaling = self.fleet.facts.scaling(name)
        return "fixed count" if scaling is None or not scaling.reason else scaling.reason

    def _moved(self, done: list[str], by_replaced: Mapping[str, ReplicaRecord], why: str) -> None:
        """Events: originals stopped once their stand-ins served."""
        for rid in done:
            stand_in = by_replaced[rid]
            self.fleet.facts.event(
                f"model/{stand_in.model}",
                EventReason.MOVED,
                f"{rid} stopped ({why}): {stand_in.id} serves in its place",
            )

    def _place_replacements(
        self,
        originals: list[ReplicaRecord],
        excluded: list[str],
        now: float,
        wall: float,
        cause: str,
    ) -> str | None:
        """Place a stand-in for each original, off the `excluded` nodes; say why
        when one cannot be placed."""
        if not originals:
            return None
        fleet = self.fleet
        results = place_many(
            [fleet.facts.models[r.model] for r in originals],
            snapshot(fleet, now, excluded),
            wanted_classes(fleet),
        )
        placed, reasons = [], []
        for original, result in zip(originals, results, strict=True):
            if isinstance(result, Placement):
                revision = fleet.facts.model_revision(original.model)
                stand_in = record_from(result, wall, revision, replaces=original.id)
                placed.append(stand_in)
                fleet.facts.event(
                    f"model/{original.model}",
                    EventReason.STAND_IN,
                    f"{stand_in.id} placed on {', '.join(stand_in.nodes)} to stand in for "
                    f"{original.id} ({cause})",
                )
            else:
                reasons.append(f"{original.model}: {result.reason}")
        fleet.facts.put_replicas(placed)
        return "; ".join(reasons) or None

    # -- 4. minimums ------------------------------------------------------------------------------

    def _fill_shortfalls(self, place_until: float) -> Iterator[None]:
        """Place what models miss, a slice at a time, each slice committing what it
        placed before yielding.

        One picture of the fleet (snapshot and index, built in steps) serves the
        whole pass: rebuilding it whenever some report moved capacity during a
        yield would cost a fleet-wide scan per slice. Once something else has
        moved capacity, each placement is checked against the fleet as it is
        before it is committed (a cordoned node, a card taken meanwhile), and a
        model that did not fit is looked at again next pass.

        Past `place_until` the pass stops at the next slice (having done at
        least one); the next pass goes on from there, with the same picture
        when nothing has moved meanwhile."""
        fleet = self.fleet
        attempts_left = self.attempts_per_pass
        done: set[str] = set()  # models dealt with in this pass
        started: set[str] = set()  # models that got a replica in this pass
        place_up_to: Callable[[ModelSpec, int], Fill] | None = None
        basis = 0  # the capacity version the placer's picture of the fleet is from
        stale = False  # capacity moved under the placer, by something other than it
        seen_version = fleet.capacity_version
        if seen_version != self._expected:  # reports, admin, the steps before this one
            self._moved_at = seen_version
        if self._placer is not None and self._placer[1] == seen_version:
            place_up_to, basis = self._placer
        self._placer = None
        sliced = False
        wants = self._shortfalls(fleet.facts.wall(), done)
        while wants and attempts_left and not (sliced and time.perf_counter() > place_until):
            if place_up_to is None:
                basis, stale = seen_version, False
                nodes = yield from self._snapshot_in_steps(place_until)
                if nodes is None:
                    break  # out of time: what was read is kept for the next pass
                building = time.perf_counter()
                place_up_to = yield from placer_in_steps(
                    nodes, NODES_PER_STEP, wanted_classes(fleet)
                )
                # A picture built is used for at least as long as its index took:
                # on a busy fleet, where each pass needs a new one, passes still
                # get on (the rest of their time is never less than the build's).
                built = time.perf_counter()
                place_until = max(place_until, built + (built - building))
            else:
                sliced = True
                now, wall = fleet.facts.clock(), fleet.facts.wall()
                placed: list[ReplicaRecord] = []
                settled: list[tuple[str, str | None]] = []  # (model, why it does not fit)
                slice_left = self.attempts_per_slice
                slice_end = time.perf_counter() + self.slice_s
                while wants and slice_left and attempts_left and time.perf_counter() < slice_end:
                    spec, missing = wants[0]
                    fill = place_up_to(spec, min(missing, slice_left, attempts_left))
                    used = len(fill.placed) + (fill.unplaceable is not None)
                    slice_left, attempts_left = slice_left - used, attempts_left - used
                    good = [p for p in fill.placed if not stale or self._still_free(p, now)]
                    revision = fleet.facts.model_revision(spec.name)
                    placed.extend(record_from(p, wall, revision) for p in good)
                    if good:
                        started.add(spec.name)
                    if len(good) < len(fill.placed):
                        # The picture is out of date where it matters: a fresh one.
                        wants[0] = _Want(spec, missing - len(good))
                        place_up_to = None
                        break
                    if fill.unplaceable is not None:
                        wants.popleft()
                        done.add(spec.name)
                        settled.append((spec.name, fill.unplaceable.reason))
                        # Tried on the fleet as of `basis`: any placement committed
                        # since moves the version, so it is looked at once more then.
                        self._did_not_fit[spec.name] = _Tried(spec, basis)
                    elif len(fill.placed) == missing:
                        wants.popleft()
                        done.add(spec.name)
                        settled.append((spec.name, None))
                        self._did_not_fit.pop(spec.name, None)
                    else:  # out of attempts for the slice or pass: it fits, the rest later
                        wants[0] = _Want(spec, missing - len(fill.placed))
                        settled.append((spec.name, None))
                fleet.facts.put_replicas(placed)
                by_model: dict[str, list[ReplicaRecord]] = defaultdict(list)
                for rec in placed:
                    by_model[rec.model].append(rec)
                for name, recs in by_model.items():
                    fleet.facts.event(f"model/{name}", EventReason.PLACED, _placed_words(recs))
                for name, why in settled:
                    fleet.facts.set_unplaceable(name, why)
                if placed:
                    log.info(
                        "placed %d replica(s): %s", len(placed), ", ".join(r.id for r in placed)
                    )
                if not stale:  # the placer took what was just committed: it matches
                    basis = fleet.capacity_version
                seen_version = self._expected = fleet.capacity_version
                yield
            fleet.facts.advance_time()
            if fleet.capacity_version != seen_version:  # moved by something else meanwhile
                stale, seen_version = True, fleet.capacity_version
                self._moved_at = seen_version
                wants = self._shortfalls(fleet.facts.wall(), done)
        if wants:  # out of attempts or time: the next pass begins with the models not reached
            head = wants[0].spec.name
            self._resume = (head, head in started)
        else:
            self._resume = None
        if place_up_to is not None and not stale and basis == fleet.capacity_version:
            self._placer = (place_up_to, basis)

    def _snapshot_in_steps(
        self, until: float = float("inf")
    ) -> Generator[None, None, list[NodeCapacity] | None]:
        """`snapshot(fleet, now)`, a step of nodes at a time. A node's entry is
        kept from the last snapshot while nothing placement reads of it has
        changed (`Term.capacity_changed_at`) and the models are the same,
        so a busy fleet costs a rebuild of the nodes that changed, not of all.
        None when time ran out first (past `until`, after a step at least)."""
        fleet = self.fleet
        weights = tuple(sorted((spec.name, spec.source) for spec in fleet.facts.models.values()))
        if weights != self._kept_weights:  # which node holds which model may differ
            self._kept.clear()
            self._kept_weights = weights
        for gone in self._kept.keys() - fleet.facts.nodes.keys():
            del self._kept[gone]
        stale = [
            name
            for name in fleet.facts.nodes
            if (kept := self._kept.get(name)) is None
            or kept.changed_at != fleet.capacity_changed_at(name)
        ]
        for start in range(0, len(stale), NODES_PER_STEP):
            chunk = stale[start : start + NODES_PER_STEP]
            for cap in snapshot(fleet, fleet.facts.clock(), names=chunk):
                self._kept[cap.name] = _Kept(fleet.capacity_changed_at(cap.name), cap)
            yield
            if start + NODES_PER_STEP < len(stale) and time.perf_counter() > until:
                return None
        return [self._kept[name].capacity for name in fleet.facts.nodes if name in self._kept]

    def _still_free(self, placement: Placement, now: float) -> bool:
        """Whether a placement made on an older picture still fits the fleet as it is."""
        fleet = self.fleet
        for shard in placement.shards:
            entry = fleet.facts.nodes.get(shard.node)
            if entry is None or fleet.facts.state_of(shard.node, now) is not NodeState.READY:
                return False
            usable = {uuid for uuid, _, ok in entry.cards if ok}
            if not usable.issuperset(shard.gpus) or fleet.facts.assigned_gpus(shard.node) & set(
                shard.gpus
            ):
                return False
        return True

    def _shortfalls(self, wall: float, done: set[str]) -> deque[_Want]:
        """The models to try now, in name order from where the last pass stopped;
        last, those that did not fit and that only this loop's placements have
        touched since (they still do not fit; their reasons' numbers may change).

        Satisfied models lose their reason; models backing off, and those that
        did not fit with the same spec at the same capacity, are not tried."""
        fleet = self.fleet
        replaced = {r.replaces for r in fleet.facts.records.values() if r.replaces}
        active: dict[str, int] = defaultdict(int)
        for r in fleet.facts.records.values():
            # A draining replica and its stand-in are one replica between them; one
            # leaving for a scale-down is gone already (`_scale` takes it back first).
            if r.state is not ReplicaState.FAILED and r.id not in replaced and r.leaving is None:
                active[r.model] += 1
        for gone in self._did_not_fit.keys() - fleet.facts.models.keys():
            del self._did_not_fit[gone]
        names = sorted(fleet.facts.models)
        first = 0
        if self._resume is not None:
            name, after = self._resume
            first = (bisect.bisect_right if after else bisect.bisect_left)(names, name)
        # While a model is short and cannot be placed, lower-priority models do
        # not grow above their minimum: the room reclaimed for it goes to it.
        starving = max(
            (
                spec.priority
                for name, spec in fleet.facts.models.items()
                if active[name] < spec.min_replicas and name in fleet.unplaceable_reasons
            ),
            default=None,
        )
        version = fleet.capacity_version
        wants: deque[_Want] = deque()
        refresh: list[_Want] = []  # did not fit, and only this loop has moved capacity since
        for name in names[first:] + names[:first]:
            if name in done:
                continue
            spec = fleet.facts.models[name]
            missing = fleet.facts.desired_replicas(name) - active[name]
            if starving is not None and spec.priority < starving:
                missing = min(missing, spec.min_replicas - active[name])
            if missing <= 0:
                fleet.facts.set_unplaceable(name, None)
                self._did_not_fit.pop(name, None)
            elif fleet.facts.backing_off(name, wall):
                continue
            elif (tried := self._did_not_fit.get(name)) and tried.spec == spec:
                if tried.version == version:
                    continue  # nothing it needs has changed since it did not fit
                if tried.version >= self._moved_at:
                    refresh.append(_Want(spec, missing))  # still does not fit
                else:
                    wants.append(_Want(spec, missing))
            else:
                wants.append(_Want(spec, missing))
        wants.extend(refresh)
        return wants
