"""The fleet summary: one answer for the whole fleet.

Built from the same derived state as every table (node states from
`nodes.node_state`, replica states from `replicas.replica_status`), so it can
never disagree with them.

Node-level figures are kept as running sums (`FleetTotals`): each node adds its
contribution, and takes it back out before a changed one goes in. `Totals`
keeps them by following the change log (a node's facts, its admin flag, the
cards assigned on it; follow.py), so a summary of 10,000 nodes costs as much as
one of ten; only replicas are walked.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from llmgw.controller.core.changes import Change, ChangeKind
from llmgw.controller.core.nodes import CardCounts
from llmgw.controller.state.facts import Facts
from llmgw.controller.state.replicas import ReplicaStatus, answering, count_by_model
from llmgw.controller.views.follow import Follower
from llmgw.wire import (
    IDLE_AFTER_S,
    AdminFlag,
    AdminInfo,
    EngineTraffic,
    FabricModelCopies,
    FabricSummary,
    FleetSummary,
    GpuClassCounts,
    IdleReplica,
    ModelCounts,
    ModelSpec,
    ModelTraffic,
    NodeCounts,
    NodeState,
    ReasonGroup,
    ReplicaCounts,
    ReplicaState,
    SleepingReplica,
    StorageScope,
    WakingModel,
)


class NodeFacts(NamedTuple):
    """What one node contributes to the summary."""

    state: NodeState
    fabrics: tuple[str, ...]
    classes: tuple[tuple[str, CardCounts], ...]
    entirely_free: bool
    models: frozenset[str]
    copies: frozenset[tuple[str, StorageScope, str]]
    engines: frozenset[str] = frozenset()


@dataclass
class _FabricTotals:
    nodes: int = 0
    free_block: int = 0
    with_weights: int = 0
    readers: Counter[str] = field(default_factory=Counter)  # model -> nodes that can read it
    local: Counter[str] = field(default_factory=Counter)  # model -> nodes holding it locally
    shared: Counter[tuple[str, str]] = field(default_factory=Counter)  # (model, filer) -> nodes


class FleetTotals:
    """Running sums of every node's `NodeFacts`."""

    def __init__(self) -> None:
        self.states: Counter[NodeState] = Counter()
        self.classes: dict[str, Counter[str]] = defaultdict(Counter)
        self.fabrics: dict[str, _FabricTotals] = defaultdict(_FabricTotals)
        self.engines: Counter[str] = Counter()  # reachable nodes per engine

    def add(self, facts: NodeFacts, sign: int = 1) -> None:
        self.states[facts.state] += sign
        ready = facts.state is NodeState.READY
        for cls, c in facts.classes:
            agg = self.classes[cls]
            agg["total"] += sign * c.total
            agg["used"] += sign * c.used
            agg["unhealthy"] += sign * c.unhealthy
            agg["unknown"] += sign * c.unknown
            agg["free" if ready else "unschedulable"] += sign * c.healthy_unused
        # An unreachable node's disk cannot serve anything now.
        reachable = facts.state is not NodeState.UNREACHABLE
        if reachable:
            for engine in facts.engines:
                self.engines[engine] += sign
        for fabric in facts.fabrics:
            f = self.fabrics[fabric]
            f.nodes += sign
            f.free_block += sign * (ready and facts.entirely_free)
            if reachable and facts.models:
                f.with_weights += sign
                for model in facts.models:
                    f.readers[model] += sign
                for model, scope, where in facts.copies:
                    if scope is StorageScope.SHARED:
                        f.shared[(model, where)] += sign
                    else:
                        f.local[model] += sign

    def remove(self, facts: NodeFacts) -> None:
        self.add(facts, -1)

    def node_counts(self) -> NodeCounts:
        s = self.states
        return NodeCounts(
            total=sum(s.values()),
            ready=s[NodeState.READY],
            cordoned=s[NodeState.CORDONED],
            draining=s[NodeState.DRAINING],
            unreachable=s[NodeState.UNREACHABLE],
        )

    def gpu_classes(self) -> list[GpuClassCounts]:
        return [
            GpuClassCounts(
                gpu_class=cls,
                total=c["total"],
                used=c["used"],
                unhealthy=c["unhealthy"],
                unknown=c["unknown"],
                unschedulable=c["unschedulable"],
                free=c["free"],
            )
            for cls, c in sorted(self.classes.items())
            if c["total"]
        ]

    def fabric_summaries(self) -> list[FabricSummary]:
        out = []
        for name, f in sorted(self.fabrics.items()):
            if f.nodes <= 0:
                continue
            filers: Counter[str] = Counter(model for (model, _), n in f.shared.items() if n > 0)
            models = sorted(m for m, n in f.readers.items() if n > 0)
            out.append(
                FabricSummary(
                    fabric=name,
                    nodes=f.nodes,
                    nodes_with_weights=f.with_weights,
                    models_present=len(models),
                    largest_free_block=f.free_block,
                    copies=[
                        FabricModelCopies(
                            model=m,
                            local_copies=f.local[m],
                            shared_copies=filers[m],
                            nodes=f.readers[m],
                        )
                        for m in models
                    ],
                )
            )
        return out


class Totals(Follower):
    """The running sums, following the facts: each node's contribution is built
    again when the log says its facts, admin flag or assignments changed."""

    follows = frozenset({ChangeKind.NODE, ChangeKind.ADMIN, ChangeKind.ASSIGNMENTS})

    def __init__(self, facts: Facts) -> None:
        super().__init__(facts)
        self._sums = FleetTotals()
        self._of: dict[str, NodeFacts] = {}  # what each node last put into the sums

    def current(self, now: float) -> FleetTotals:
        self.catch_up(now)
        return self._sums

    def changed(self, change: Change, now: float) -> None:
        name = change.key
        facts = self._facts
        d = facts.nodes[name].digest
        classes, entirely_free = d.counted(facts.assigned_gpus(name))
        new = NodeFacts(
            facts.state_of(name, now),
            d.fabrics,
            classes,
            entirely_free,
            d.models,
            d.copies,
            d.engines,
        )
        old = self._of.get(name)
        if new != old:
            if old is not None:
                self._sums.remove(old)
            self._sums.add(new)
            self._of[name] = new

    def removed(self, change: Change, now: float) -> None:
        old = self._of.pop(change.key, None)
        if old is not None:
            self._sums.remove(old)

    def resync(self, revision: int, now: float) -> None:
        self.resync_keys(ChangeKind.NODE, self._of, self._facts.nodes, revision, now)

    def holds(self, key: str) -> bool:
        return key in self._of


def build_summary(
    totals: FleetTotals,
    admin: Mapping[str, AdminInfo],
    known_nodes: Mapping[str, object],
    replicas: Mapping[str, ReplicaStatus],
    models: Mapping[str, ModelSpec],
    unplaceable_reasons: Mapping[str, str],
    now: float,
    wall: float,
    gateway_in_flight: Mapping[str, int] | None = None,
    waking: list[WakingModel] | None = None,
    idle_after_s: float = IDLE_AFTER_S,
) -> FleetSummary:
    replica_counts = dict.fromkeys(ReplicaState, 0)
    by_model = count_by_model(replicas.values())
    idle = []
    for r in replicas.values():
        replica_counts[r.state] += 1
        if r.state is ReplicaState.READY and r.idle_since is not None:
            idle_s = now - r.idle_since
            if idle_s >= idle_after_s:
                idle.append(
                    IdleReplica(
                        id=r.record.id,
                        model=r.record.model,
                        idle_seconds=round(idle_s, 1),
                        gpus=r.record.gpu_count,
                    )
                )
    idle.sort(key=lambda i: (-i.idle_seconds, i.id))
    asleep = sorted(
        (
            SleepingReplica(
                id=r.record.id,
                model=r.record.model,
                asleep_seconds=round(max(0.0, wall - r.record.asleep_since), 1),
                gpus=r.record.gpu_count,
            )
            for r in replicas.values()
            if r.state is ReplicaState.SLEEPING and r.record.asleep_since is not None
        ),
        key=lambda s: (-s.asleep_seconds, s.id),
    )

    none: Counter[ReplicaState] = Counter()
    short = sorted(
        name
        for name, spec in models.items()
        if answering(by_model.get(name, none)) < spec.min_replicas
    )
    unplaceable = [n for n in short if by_model.get(n, none)[ReplicaState.STARTING] == 0]

    return FleetSummary(
        nodes=totals.node_counts(),
        gpus=totals.gpu_classes(),
        fabrics=totals.fabric_summaries(),
        replicas=ReplicaCounts(**{s.value: n for s, n in replica_counts.items()}),
        models=ModelCounts(total=len(models), satisfied=len(models) - len(short), short=len(short)),
        unplaceable=unplaceable,
        idle_replicas=idle,
        unplaceable_reasons={
            m: unplaceable_reasons[m] for m in unplaceable if m in unplaceable_reasons
        },
        reasons=reason_groups(admin, known_nodes),
        generated_at=wall,
        traffic=model_traffic(replicas, gateway_in_flight or {}),
        engines={e: n for e, n in sorted(totals.engines.items()) if n > 0},
        waking=waking or [],
        idle_after_s=idle_after_s,
        sleeping_replicas=asleep,
    )


def model_traffic(
    replicas: Mapping[str, ReplicaStatus], gateway_in_flight: Mapping[str, int]
) -> list[ModelTraffic]:
    """Per model, what its serving replicas' engines (rank 0) say they served."""
    by_model: dict[str, list[tuple[EngineTraffic, int]]] = defaultdict(list)
    for r in replicas.values():
        lead = r.shards[0] if r.shards else None
        if r.state not in (ReplicaState.READY, ReplicaState.DRAINING):
            continue
        if lead is None or lead.traffic is None:
            continue
        by_model[r.record.model].append((lead.traffic, r.in_flight(gateway_in_flight) or 0))
    out = []
    for model, rows in sorted(by_model.items()):
        figures = [t for t, _ in rows]
        metrics = {t.p50_metric or "e2e" for t in figures if t.p50_latency_s is not None}
        bounds = [t.p50_upper_bound for t in figures if t.p50_latency_s is not None]
        out.append(
            ModelTraffic(
                model=model,
                replicas=len(rows),
                requests_per_s=round(sum(t.requests_per_s for t in figures), 3),
                in_flight=sum(n for _, n in rows),
                p50_latency_s=_weighted(figures, lambda t: t.p50_latency_s),
                prefix_hit_rate=_weighted(figures, lambda t: t.prefix_hit_rate),
                p50_metric=metrics.pop() if len(metrics) == 1 else None,
                p50_upper_bound=bool(bounds) and all(bounds),
            )
        )
    return out


def _weighted(
    figures: list[EngineTraffic], value: Callable[[EngineTraffic], float | None]
) -> float | None:
    """Mean of the known values weighted by requests (equal weights when none served)."""
    known = [(t.requests_per_s, v) for t in figures if (v := value(t)) is not None]
    if not known:
        return None
    total = sum(w for w, _ in known)
    if total <= 0:
        return round(sum(v for _, v in known) / len(known), 4)
    return round(sum(w * v for w, v in known) / total, 4)


def reason_groups(
    admin: Mapping[str, AdminInfo], known_nodes: Mapping[str, object]
) -> list[ReasonGroup]:
    """Nodes grouped by (reason, flag, who), as `sinfo -R` lists them."""
    groups: dict[tuple[str, AdminFlag, str | None], list[str]] = defaultdict(list)
    first_at: dict[tuple[str, AdminFlag, str | None], float | None] = {}
    for name in sorted(admin):
        info = admin[name]
        if info.flag is AdminFlag.NONE or name not in known_nodes:
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
