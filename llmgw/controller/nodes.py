"""The node registry: each node's latest report, when it came, and its digest.

A *digest* is the part of a report that the fleet summary depends on, reduced
once when the report arrives, so that the summary never walks 80,000 GPU
records. Digests are named tuples: thousands are built every second, and a
tuple is the cheapest immutable record Python has.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from llmgw.wire import (
    AdminFlag,
    AdminInfo,
    EngineTraffic,
    GpuHealth,
    NodeReport,
    NodeState,
    ShardState,
    StorageScope,
)


class CardCounts(NamedTuple):
    """Cards of one class; each card is in exactly one bucket."""

    total: int = 0
    used: int = 0
    unhealthy: int = 0
    unknown: int = 0

    @property
    def healthy_unused(self) -> int:
        return self.total - self.used - self.unhealthy - self.unknown


class CardFault(NamedTuple):
    """A card the agent reports unhealthy: fatal until the agent sees it reset."""

    uuid: str
    gpu_index: int  # as nvidia-smi numbers it
    reason: str

    def describe(self) -> str:
        """`GPU 3 (GPU-3f2a…): fatal Xid 79 (...)`: the index an operator sees in
        nvidia-smi, enough of the UUID to tell the card apart, and why."""
        return f"GPU {self.gpu_index} ({self.uuid[:8]}…): {self.reason}"


Faults = Mapping[str, Mapping[str, CardFault]]  # node -> card uuid -> fault


class ShardDigest(NamedTuple):
    replica_id: str
    rank: int
    state: ShardState
    idle_since: float | None  # controller monotonic time of last activity; None unknown
    error: str | None
    port: int | None = None  # where the engine listens on the node's address
    traffic: EngineTraffic | None = None  # what the engine served lately (rank 0)
    sleep_error: str | None = None  # asked to sleep, it could not: why


class NodeDigest(NamedTuple):
    classes: tuple[tuple[str, CardCounts], ...]
    entirely_free: bool  # >= 1 card, every card healthy and unused
    models: frozenset[str]
    # (model, scope, where): where is the mount source for shared storage
    copies: frozenset[tuple[str, StorageScope, str]]
    fabrics: tuple[str, ...] = ()
    engines: frozenset[str] = frozenset()  # what the agent says it can run

    @property
    def gpus_total(self) -> int:
        return sum(c.total for _, c in self.classes)


EMPTY_DIGEST = NodeDigest((), False, frozenset(), frozenset())

# Enum members looked up once: attribute access on an Enum class is slow in a hot loop.
_HEALTHY, _UNHEALTHY, _UNKNOWN = GpuHealth.HEALTHY, GpuHealth.UNHEALTHY, GpuHealth.UNKNOWN
_SHARED = StorageScope.SHARED
_FAILED = ShardState.FAILED


def digest_report(
    report: NodeReport,
    received_at: float,
    assigned_gpus: Collection[str],
) -> NodeDigest:
    """Reduce a report to what the aggregates need.

    Each card lands in one bucket: broken beats busy beats unknown beats free.
    A card is used when the agent sees compute processes on it or the controller
    has assigned it to a replica shard on this node.
    """
    per_class: dict[str, list[int]] = {}  # class -> [total, used, unhealthy, unknown]
    entirely_free = bool(report.gpus)
    for gpu in report.gpus:
        counts = per_class.get(gpu.gpu_class)
        if counts is None:
            counts = per_class[gpu.gpu_class] = [0, 0, 0, 0]
        counts[0] += 1
        if gpu.health is _UNHEALTHY:
            counts[2] += 1
        elif gpu.in_use or gpu.uuid in assigned_gpus:
            counts[1] += 1
        elif gpu.health is _UNKNOWN:
            counts[3] += 1
        else:
            continue
        entirely_free = False

    copies = frozenset(
        (m.name, loc.scope, (loc.mount_source or loc.path) if loc.scope is _SHARED else "")
        for loc in report.storage
        for m in loc.models
    )
    return NodeDigest(
        tuple(sorted((k, CardCounts(*v)) for k, v in per_class.items())),
        entirely_free,
        frozenset([c[0] for c in copies]),
        copies,
        tuple(sorted(set(report.fabrics))),
        frozenset(report.engines or ()),
    )


def digest_shards(report: NodeReport, received_at: float) -> tuple[ShardDigest, ...]:
    """The engines a node runs, with idleness turned into a moment on our clock."""
    return tuple(
        ShardDigest(
            r.id,
            r.rank,
            r.state,
            None if r.idle_seconds is None else received_at - r.idle_seconds,
            r.error,
            r.port,
            r.traffic,
            r.sleep_error,
        )
        for r in report.replicas
    )


class Changed(NamedTuple):
    facts: bool  # what the node's row or placement reads
    listening: bool  # where its engines listen (the endpoint feed's URLs)


@dataclass
class NodeEntry:
    """One node as the controller knows it.

    The latest report is kept as the bytes that came in, not as a parsed model:
    10,000 parsed reports are millions of long-lived objects for the garbage
    collector to walk. Only the node detail view parses it again.
    """

    name: str
    first_seen: float  # unix time
    raw: bytes | None = None
    received_at: float | None = None  # controller monotonic clock
    digest: NodeDigest = field(default=EMPTY_DIGEST)
    shards: tuple[ShardDigest, ...] = ()
    # (uuid, class, healthy and idle per the agent): what placement hands out
    cards: tuple[tuple[str, str, bool], ...] = ()
    # Cards the agent reports unhealthy (a fatal fault): (uuid, index, reason).
    faults: tuple[CardFault, ...] = ()
    # (replica id, port, failed) of each rank 0 here: with the address, where the
    # endpoint feed's URLs point.
    ports: tuple[tuple[str, int | None, bool], ...] = ()
    interval_s: float = 5.0
    address: str | None = None
    gpu_error: str | None = None

    def update(
        self, report: NodeReport, raw: bytes, received_at: float, digest: NodeDigest
    ) -> Changed:
        """Take a report: whether a fact the node's row or placement reads changed (its
        digest, cards, faults, address or GPU error), not just its age; and whether
        where its engines listen did (its address, a rank 0's port or failure)."""
        facts = self.set_digest(digest)
        self.raw, self.received_at = raw, received_at
        self.shards = digest_shards(report, received_at)
        cards, faults = [], []
        for g in report.gpus:
            health = g.health
            cards.append((g.uuid, g.gpu_class, health is _HEALTHY and not g.in_use))
            if health is _UNHEALTHY:
                faults.append(CardFault(g.uuid, g.index, g.health_reason or "unhealthy"))
        if cards != list(self.cards):
            self.cards = tuple(cards)
            facts = True
        if faults != list(self.faults):
            self.faults = tuple(faults)
            facts = True
        moved = report.address != self.address
        if moved or report.gpu_error != self.gpu_error:
            self.address, self.gpu_error = report.address, report.gpu_error
            facts = True
        ports = tuple((r.id, r.port, r.state is _FAILED) for r in report.replicas if r.rank == 0)
        if ports != self.ports:
            self.ports = ports
            moved = True
        self.interval_s = report.interval_s
        return Changed(facts, moved)

    def set_digest(self, digest: NodeDigest) -> bool:
        """The one writer of `digest` (a report, or the cards assigned on the node
        changed); False when equal. The old object is kept then: the new one dies
        young instead of joining the long-lived objects every GC pass walks."""
        if digest == self.digest:
            return False
        self.digest = digest
        return True

    @property
    def report(self) -> NodeReport | None:
        return None if self.raw is None else NodeReport.model_validate_json(self.raw)

    def grace_s(self, intervals: float, extra_s: float) -> float:
        return intervals * self.interval_s + extra_s

    def last_heard(self, started_at: float) -> float:
        """A node not heard from since the controller started gets one grace from the start."""
        return self.received_at if self.received_at is not None else started_at


def node_state(
    entry: NodeEntry,
    admin: AdminInfo | None,
    now: float,
    grace_s: float,
    started_at: float,
) -> NodeState:
    """Liveness wins over admin flags; the flag is still kept and shown beside it.

    A node that has not reported since the controller started is given one grace
    period from the start before it counts as unreachable.
    """
    if now - entry.last_heard(started_at) > grace_s:
        return NodeState.UNREACHABLE
    flag = admin.flag if admin else AdminFlag.NONE
    if flag is AdminFlag.DRAINING:
        return NodeState.DRAINING
    if flag is AdminFlag.CORDONED:
        return NodeState.CORDONED
    return NodeState.READY
