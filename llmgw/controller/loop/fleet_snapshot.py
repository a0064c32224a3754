"""`FleetSnapshot`: the facts as one reconcile step decides on them, taken whole.

Each step of a pass (`llmgw.controller.loop.reconcile`) is a function of a snapshot
(plus the loop's memory) returning a plan (`llmgw.controller.loop.plans`); one place
applies the plan through `Facts` (`llmgw.controller.loop.apply`) and, when that
changed the facts, the next step decides on a fresh snapshot, as Kueue's
scheduler nominates on a snapshot and admits with writes.

"Which replicas count for a model" is said here and nowhere else
(`ModelReplicas`): every step reads the sets it needs by name.

A snapshot holds plain values and read-only mappings copied from the facts, and
the stop gate as a value (`GateView`): nothing in it writes, and a test builds
one by hand or from a term (`take`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from llmgw.controller.core.admin_flags import NO_ADMIN
from llmgw.controller.core.decisions import Note
from llmgw.controller.core.nodes import Faults, NodeEntry, node_state
from llmgw.controller.core.records import AdapterHold, Backoff, ReplicaRecord, gpus_on
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.state.liveness import Liveness
from llmgw.controller.state.replicas import ReplicaStatus
from llmgw.controller.views.endpoints import GateView
from llmgw.scheduler import NodeCapacity, Placement
from llmgw.wire import (
    AdapterSpec,
    AdminFlag,
    AdminInfo,
    ModelSpec,
    NodeState,
    ReplicaState,
    ShardState,
)

__all__ = ["FleetSnapshot", "ModelReplicas", "node_capacity", "replica_sets"]


@dataclass(frozen=True)
class ModelReplicas:
    """One model's replicas, in the sets the loop reasons with. Failed ones are
    only in `failed`; every other replica is in exactly one of `standing`,
    `moving` and `leaving`."""

    # Count for the model: live, not leaving, not moving. A stand-in (a drain's,
    # a failed card's) counts here in its original's place.
    standing: tuple[ReplicaStatus, ...] = ()
    # The stand-ins among `standing` (their record names what they replace).
    standing_in: tuple[ReplicaStatus, ...] = ()
    # Originals that have a stand-in: it counts for them until they stop.
    moving: tuple[ReplicaStatus, ...] = ()
    # Out of routing by the loop's own decision (`ReplicaRecord.leave_reason`).
    leaving: tuple[ReplicaStatus, ...] = ()
    failed: tuple[ReplicaStatus, ...] = ()
    live: tuple[ReplicaStatus, ...] = ()  # every one not failed: standing, moving, leaving


def replica_sets(statuses: Iterable[ReplicaStatus]) -> dict[str, ModelReplicas]:
    """Every model's sets (models with no replica have none), each in the order of
    `statuses` (the facts' order of replicas)."""
    statuses = list(statuses)
    replaced = {s.record.replaces for s in statuses if s.record.replaces}
    by_model: dict[str, _Sets] = defaultdict(_Sets)
    for s in statuses:
        mine = by_model[s.record.model]
        if s.state is ReplicaState.FAILED:
            mine.failed.append(s)
            continue
        mine.live.append(s)
        if s.record.leave_reason is not None:
            mine.leaving.append(s)
        elif s.record.id in replaced:
            mine.moving.append(s)
        else:
            mine.standing.append(s)
            if s.record.replaces is not None:
                mine.standing_in.append(s)
    return {model: sets.frozen() for model, sets in by_model.items()}


@dataclass
class _Sets:
    """`ModelReplicas` while it is being sorted out."""

    standing: list[ReplicaStatus] = field(default_factory=list)
    standing_in: list[ReplicaStatus] = field(default_factory=list)
    moving: list[ReplicaStatus] = field(default_factory=list)
    leaving: list[ReplicaStatus] = field(default_factory=list)
    failed: list[ReplicaStatus] = field(default_factory=list)
    live: list[ReplicaStatus] = field(default_factory=list)

    def frozen(self) -> ModelReplicas:
        return ModelReplicas(
            standing=tuple(self.standing),
            standing_in=tuple(self.standing_in),
            moving=tuple(self.moving),
            leaving=tuple(self.leaving),
            failed=tuple(self.failed),
            live=tuple(self.live),
        )


@dataclass(frozen=True)
class FleetSnapshot:
    """The facts one step decides on (see the module docstring)."""

    now: float  # monotonic
    wall: float
    settings: ControllerSettings
    models: Mapping[str, ModelSpec]
    revisions: Mapping[str, int]  # each declared model's current revision
    desired: Mapping[str, int]  # `Facts.desired_replicas`, per declared model
    backoffs: Mapping[str, Backoff]
    records: Mapping[str, ReplicaRecord]
    statuses: Mapping[str, ReplicaStatus]
    outdated: frozenset[str]  # replicas not running what their model's spec asks now
    nodes: Mapping[str, NodeEntry]
    admin: Mapping[str, AdminInfo]  # flags set by operators or llmgw
    pending: Mapping[str, AdminInfo]  # awaiting approval: a cordon by llmgw
    liveness: Liveness
    faults: Faults
    rollout_notes: Mapping[str, Note]
    unplaceable: Mapping[str, str]  # `model_views.unplaceable_reasons`: failures too
    placement_reasons: Mapping[str, str]  # the scheduler's reasons only (`Decisions.unplaceable`)
    capacity_version: int
    revision: int  # the facts' change log's, when taken
    gate: GateView | None = None  # None: replicas stop at once
    adapters: Mapping[str, AdapterSpec] = field(default_factory=dict)
    # Replica id -> adapter -> the controller's wish (`Facts.adapter_holds`)
    adapter_holds: Mapping[str, Mapping[str, AdapterHold]] = field(default_factory=dict)
    making_room: Mapping[str, str] = field(default_factory=dict)  # `Decisions.making_room`
    # `Decisions.handing_over`: replica -> (since, last asked)
    handing_over: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    ready_since: Mapping[str, float] = field(default_factory=dict)  # `Facts.ready_since`

    # -- replicas -----------------------------------------------------------------------

    @cached_property
    def by_model(self) -> Mapping[str, ModelReplicas]:
        return replica_sets(self.statuses.values())

    def replicas_of(self, model: str) -> ModelReplicas:
        return self.by_model.get(model) or ModelReplicas()

    def up_to_date(self, rec: ReplicaRecord) -> bool:
        """`Facts.up_to_date`: a replica placed since the snapshot is."""
        return rec.id not in self.outdated

    def held_for(self, model: str) -> int:
        """Requests the gateways hold for `model`, those for its LoRA adapters included:
        an adapter's request needs an awake replica of its base as much as the base's own."""
        return self._held_by_base.get(model, 0)

    def held_age(self, name: str) -> float:
        """How long requests for model or adapter `name` have been held at a gateway, in
        seconds (0: none are); a model's counts its adapters' too."""
        return self._held_ages.get(name, 0.0)

    @cached_property
    def _held_ages(self) -> Mapping[str, float]:
        """`held_age` of every name held, once a snapshot (steps ask per replica)."""
        out = dict(self.gate.held_age) if self.gate is not None else {}
        for name, age in list(out.items()):
            adapter = self.adapters.get(name)
            if adapter is not None:
                out[adapter.base] = max(out.get(adapter.base, 0.0), age)
        return out

    @cached_property
    def _held_by_base(self) -> Mapping[str, int]:
        """Held requests per model, an adapter's counted for its base (once a snapshot:
        every step asks for every model)."""
        out: dict[str, int] = {}
        for name, n in (self.gate.held if self.gate is not None else {}).items():
            adapter = self.adapters.get(name)
            base = adapter.base if adapter is not None else name
            out[base] = out.get(base, 0) + n
        return out

    def adapters_only_on(self, rid: str, leaving: Iterable[str] = ()) -> list[str]:
        """The adapters `rid` serves (loaded, routed) that no other replica of its base
        serves, when another could load them: ready, in routing, not `leaving`, not
        itself handing adapters over. Empty when none could: nothing to wait for."""
        held = self.adapter_holds.get(rid)
        status = self.statuses.get(rid)
        shard = status.shards[0] if status is not None and status.shards else None
        if not held or status is None or shard is None:
            return []
        loaded = shard.adapters
        mine = [
            n
            for n, hold in held.items()
            if hold.leaving is None and n in loaded and n in self.adapters
        ]
        if not mine:
            return []
        away = {rid, *leaving, *self.handing_over}
        stopping = self.gate.stopping if self.gate is not None else {}
        others = [
            s
            for s in self.replicas_of(status.record.model).standing
            if s.record.id not in away
            and s.record.id not in stopping
            and s.state is ReplicaState.READY
        ]
        if not others:
            return []

        def served_by(other: ReplicaStatus, name: str) -> bool:
            hold = self.adapter_holds.get(other.record.id, {}).get(name)
            first = other.shards[0] if other.shards else None
            return (
                hold is not None
                and hold.leaving is None
                and first is not None
                and name in first.adapters
            )

        return sorted(n for n in mine if not any(served_by(o, n) for o in others))

    def backing_off(self, model: str) -> bool:
        backoff = self.backoffs.get(model)
        return backoff is not None and self.wall < backoff.retry_at

    def stop_now(self, ids: Iterable[str], *, force: bool = False) -> list[str]:
        """Of `ids`, those the gateways have let go of (all, without a gate)."""
        return list(ids) if self.gate is None else self.gate.lets_go(ids, force=force)

    @property
    def gateway_in_flight(self) -> Mapping[str, int]:
        return {} if self.gate is None else self.gate.in_flight

    # -- nodes ---------------------------------------------------------------------------

    def admin_info(self, node: str) -> AdminInfo:
        """`Facts.admin_info`: the node's flag, else awaiting approval a cordon."""
        return self.admin.get(node) or self.pending.get(node) or NO_ADMIN

    @cached_property
    def draining(self) -> tuple[str, ...]:
        """Draining nodes, sorted."""
        return tuple(sorted(n for n, info in self.admin.items() if info.flag is AdminFlag.DRAINING))

    def state_of(self, node: str) -> NodeState:
        entry = self.nodes[node]
        live = self.liveness
        return node_state(
            entry, self.admin_info(node), self.now, live.grace_s(entry), live.started_at
        )

    @cached_property
    def _on_node(self) -> Mapping[str, list[ReplicaRecord]]:
        by_node: dict[str, list[ReplicaRecord]] = defaultdict(list)
        for rec in self.records.values():
            for shard in rec.shards:
                by_node[shard.node].append(rec)
        return by_node

    def assigned_gpus(self, node: str) -> frozenset[str]:
        return gpus_on(node, self._on_node.get(node, ()))

    def still_free(self, placement: Placement) -> bool:
        return still_free(self, placement)

    # -- placement -----------------------------------------------------------------------

    @cached_property
    def wanted_classes(self) -> frozenset[str]:
        """The GPU classes declared specs ask for by name (`picture.wanted_classes`)."""
        return frozenset(s.gpu_class for s in self.models.values() if s.gpu_class)

    def capacity(
        self,
        excluded: Iterable[str] = (),
        records: Mapping[str, ReplicaRecord] | None = None,
    ) -> list[NodeCapacity]:
        """What placement may use (`picture.snapshot`), with the replicas as in
        `records` (default: the snapshot's): a step that places several times
        hands in the replicas as its plan leaves them so far."""
        excluded = set(excluded)
        by_weights = weights_index(self.models.values())
        if records is None:
            on_node = self._on_node
        else:
            by_node: dict[str, list[ReplicaRecord]] = defaultdict(list)
            for rec in records.values():
                for shard in rec.shards:
                    by_node[shard.node].append(rec)
            on_node = by_node
        return [
            node_capacity(
                name,
                entry,
                on_node.get(name, ()),
                by_weights,
                name not in excluded and self.state_of(name) is NodeState.READY,
            )
            for name, entry in self.nodes.items()
        ]


def still_free(snap: FleetSnapshot, placement: Placement) -> bool:
    """Whether a placement made on an older picture still fits the fleet as in `snap`."""
    for shard in placement.shards:
        entry = snap.nodes.get(shard.node)
        if entry is None or snap.state_of(shard.node) is not NodeState.READY:
            return False
        free, _ = free_cards(shard.node, entry, snap._on_node.get(shard.node, ()))
        if not {uuid for uuids in free.values() for uuid in uuids}.issuperset(shard.gpus):
            return False
    return True


def asleep_on(node: str, rec: ReplicaRecord, entry: NodeEntry) -> bool:
    """Whether `rec` sleeps on `node` as the warm tier shares a card with: decided
    (sleeping, told to) and every engine of it there says it sleeps. An engine says so
    only once its sleep freed the memory (llmgw.agent.sleep_check)."""
    if rec.state is not ReplicaState.SLEEPING or rec.asleep_since is None:
        return False
    mine = [d for d in entry.shards if d.replica_id == rec.id]
    return bool(mine) and all(d.state is ShardState.SLEEPING for d in mine)


def free_cards(
    name: str, entry: NodeEntry, on_node: Iterable[ReplicaRecord]
) -> tuple[dict[str, list[str]], frozenset[str]]:
    """Per class, the cards placement may hand out on one node, and of them the
    shared ones. A card is free when healthy, idle and no replica holds it; or (the
    warm tier) when every replica holding it sleeps there and the card has room for an
    awake engine beside what they keep (`nodes.has_room`, measured by the agent): one
    awake engine, since a card a replica is placed on is then held awake."""
    awake: set[str] = set()
    sleeping: set[str] = set()
    for rec in on_node:
        held = awake if not asleep_on(name, rec, entry) else sleeping
        held.update(gpu for shard in rec.shards if shard.node == name for gpu in shard.gpus)
    free: dict[str, list[str]] = defaultdict(list)
    shared: set[str] = set()
    roomy = entry.digest.roomy
    for uuid, cls, usable in entry.cards:
        free.setdefault(cls, [])
        if uuid in awake:
            continue
        if uuid in sleeping:
            if uuid in roomy:
                free[cls].append(uuid)
                shared.add(uuid)
        elif usable:
            free[cls].append(uuid)
    return free, frozenset(shared)


def weights_index(specs: Iterable[ModelSpec]) -> dict[str, set[str]]:
    """Models by the names their weights are held under (name or source)."""
    by_weights: dict[str, set[str]] = defaultdict(set)
    for spec in specs:
        by_weights[spec.name].add(spec.name)
        by_weights[spec.source].add(spec.name)
    return by_weights


def node_capacity(
    name: str,
    entry: NodeEntry,
    on_node: Iterable[ReplicaRecord],
    by_weights: Mapping[str, set[str]],
    schedulable: bool,
) -> NodeCapacity:
    """One node as placement sees it: healthy cards no replica holds, what it
    holds and runs (`on_node`: the replicas with a shard on it)."""
    on_node = list(on_node)
    free, shared = free_cards(name, entry, on_node)
    holds = {model for held in entry.digest.models for model in by_weights.get(held, ())}
    return NodeCapacity(
        name=name,
        free={cls: tuple(sorted(uuids)) for cls, uuids in free.items()},
        total_cards=len(entry.cards),
        fabrics=entry.digest.fabrics,
        schedulable=schedulable,
        holds=frozenset(holds),
        runs=frozenset(rec.model for rec in on_node),  # spread
        shared=shared,
    )
