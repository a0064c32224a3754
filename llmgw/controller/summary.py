"""The fleet summary: one answer for the whole fleet.

Built from the same derived state as every table (node states from
`nodes.node_state`, replica states from `replicas.replica_state`), so it can
never disagree with them. `build_summary` is pure; the fleet caches its result
until something it depends on changes (see `SummaryBasis`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.controller.nodes import NodeDigest
from llmgw.controller.replicas import ReplicaStatus
from llmgw.wire import (
    IDLE_AFTER_S,
    AdminFlag,
    AdminInfo,
    FabricModelCopies,
    FabricSummary,
    FleetSummary,
    GpuClassCounts,
    IdleReplica,
    ModelCounts,
    ModelSpec,
    NodeCounts,
    NodeState,
    ReasonGroup,
    ReplicaCounts,
    ReplicaState,
    StorageScope,
)


@dataclass(frozen=True)
class NodeFacts:
    """What the summary needs to know of one node."""

    state: NodeState
    fabrics: tuple[str, ...]
    digest: NodeDigest


@dataclass(frozen=True)
class IdleCandidate:
    id: str
    model: str
    idle_since: float  # controller monotonic clock
    gpus: int


@dataclass(frozen=True)
class SummaryBasis:
    """A summary with its idle list still in monotonic time, ready to render."""

    summary: FleetSummary
    idle: tuple[IdleCandidate, ...]  # ready replicas whose idleness is known

    def render(self, now: float, wall: float) -> FleetSummary:
        idle = [
            IdleReplica(
                id=c.id, model=c.model, idle_seconds=round(now - c.idle_since, 1), gpus=c.gpus
            )
            for c in self.idle
            if now - c.idle_since >= IDLE_AFTER_S
        ]
        idle.sort(key=lambda r: (-r.idle_seconds, r.id))
        return self.summary.model_copy(update={"idle_replicas": idle, "generated_at": wall})

    def next_idle_change(self, now: float) -> float:
        """When the next not-yet-idle replica crosses the idle threshold."""
        pending = [
            c.idle_since + IDLE_AFTER_S for c in self.idle if now - c.idle_since < IDLE_AFTER_S
        ]
        return min(pending, default=float("inf"))


def build_summary(
    nodes: Mapping[str, NodeFacts],
    admin: Mapping[str, AdminInfo],
    replicas: Mapping[str, ReplicaStatus],
    models: Mapping[str, ModelSpec],
    unplaceable_reasons: Mapping[str, str],
) -> SummaryBasis:
    node_counts = dict.fromkeys(NodeState, 0)
    classes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    fab_nodes: dict[str, int] = defaultdict(int)
    fab_free: dict[str, int] = defaultdict(int)
    fab_with_weights: dict[str, int] = defaultdict(int)
    fab_local: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    fab_shared: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    fab_readers: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    for facts in nodes.values():
        node_counts[facts.state] += 1
        ready = facts.state is NodeState.READY
        d = facts.digest
        for cls, c in d.classes:
            agg = classes[cls]
            agg["total"] += c.total
            agg["used"] += c.used
            agg["unhealthy"] += c.unhealthy
            agg["unknown"] += c.unknown
            agg["free" if ready else "unschedulable"] += c.healthy_unused
        # An unreachable node's disk cannot serve anything now.
        reachable = facts.state is not NodeState.UNREACHABLE
        for fabric in facts.fabrics:
            fab_nodes[fabric] += 1
            if ready and d.entirely_free:
                fab_free[fabric] += 1
            if reachable and d.models:
                fab_with_weights[fabric] += 1
                for model in d.models:
                    fab_readers[fabric][model] += 1
                for model, scope, where in d.copies:
                    if scope is StorageScope.SHARED:
                        fab_shared[fabric][model].add(where)
                    else:
                        fab_local[fabric][model] += 1

    fabrics = []
    for fabric in sorted(fab_nodes):
        readers = fab_readers.get(fabric, {})
        copies = [
            FabricModelCopies(
                model=m,
                local_copies=fab_local[fabric].get(m, 0),
                shared_copies=len(fab_shared[fabric].get(m, ())),
                nodes=readers[m],
            )
            for m in sorted(readers)
        ]
        fabrics.append(
            FabricSummary(
                fabric=fabric,
                nodes=fab_nodes[fabric],
                nodes_with_weights=fab_with_weights.get(fabric, 0),
                models_present=len(readers),
                largest_free_block=fab_free.get(fabric, 0),
                copies=copies,
            )
        )

    replica_counts = dict.fromkeys(ReplicaState, 0)
    serving: dict[str, int] = defaultdict(int)
    starting: dict[str, int] = defaultdict(int)
    idle: list[IdleCandidate] = []
    for r in replicas.values():
        replica_counts[r.state] += 1
        if r.state in (ReplicaState.READY, ReplicaState.DRAINING):
            serving[r.record.model] += 1  # a draining replica still answers until replaced
        elif r.state is ReplicaState.STARTING:
            starting[r.record.model] += 1
        if r.state is ReplicaState.READY and r.idle_since is not None:
            idle.append(
                IdleCandidate(r.record.id, r.record.model, r.idle_since, r.record.gpu_count)
            )

    short = sorted(name for name, spec in models.items() if serving[name] < spec.min_replicas)
    unplaceable = [name for name in short if starting[name] == 0]

    summary = FleetSummary(
        nodes=NodeCounts(
            total=sum(node_counts.values()),
            ready=node_counts[NodeState.READY],
            cordoned=node_counts[NodeState.CORDONED],
            draining=node_counts[NodeState.DRAINING],
            unreachable=node_counts[NodeState.UNREACHABLE],
        ),
        gpus=[
            GpuClassCounts(
                gpu_class=cls,
                total=c["total"],
                used=c["used"],
                unhealthy=c["unhealthy"],
                unknown=c["unknown"],
                unschedulable=c["unschedulable"],
                free=c["free"],
            )
            for cls, c in sorted(classes.items())
        ],
        fabrics=fabrics,
        replicas=ReplicaCounts(**{s.value: n for s, n in replica_counts.items()}),
        models=ModelCounts(total=len(models), satisfied=len(models) - len(short), short=len(short)),
        unplaceable=unplaceable,
        idle_replicas=[],
        unplaceable_reasons={
            m: unplaceable_reasons[m] for m in unplaceable if m in unplaceable_reasons
        },
        reasons=reason_groups(admin, {name: f.state for name, f in nodes.items()}),
    )
    return SummaryBasis(summary, tuple(idle))


def reason_groups(
    admin: Mapping[str, AdminInfo], states: Mapping[str, NodeState]
) -> list[ReasonGroup]:
    """Nodes grouped by (reason, who, flag), as `sinfo -R` lists them."""
    groups: dict[tuple[str, AdminFlag, str | None], list[str]] = defaultdict(list)
    first_at: dict[tuple[str, AdminFlag, str | None], float | None] = {}
    for name in sorted(admin):
        info = admin[name]
        if info.flag is AdminFlag.NONE or name not in states:
            continue
        key = (info.reason or "", info.flag, info.by)
        groups[key].append(name)
        at = first_at.get(key)
        first_at[key] = info.at if at is None or (info.at is not None and info.at < at) else at
    return [
        ReasonGroup(reason=reason, flag=flag, by=by, at=first_at[(reason, flag, by)], nodes=names)
        for (reason, flag, by), names in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1].value, kv[0][2] or "")
        )
    ]
