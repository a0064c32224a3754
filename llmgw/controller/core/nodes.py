"""The node registry: each node's latest report, when it came, and its digest.

A *digest* is what the controller reads of a report (per-class card counts,
weights held, cards, faults, address), reduced once when the report arrives, so
that the summary never walks 80,000 GPU records. It is the report's alone: the
cards the controller assigned to replicas are the facts' (`Facts.assigned_gpus`),
joined by the views that count them (`NodeDigest.counted`), so a replica placed
or removed re-reads no report. Digests are named tuples: thousands are built
every second, and a tuple is the cheapest immutable record Python has.
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
    SleepFailure,
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
    adapters: frozenset[str] = frozenset()  # LoRA adapters the engine holds (rank 0)
    adapter_failures: tuple[tuple[str, int | None, str], ...] = ()  # (name, status, why)
    sleep_failure: SleepFailure | None = None  # its kind
    last_wake: tuple[int, float] | None = (
        None  # (level, seconds) of its last wake, timed by the agent
    )


class NodeDigest(NamedTuple):
    """What the controller reads of one report, reduced once when it arrives: a
    function of the report alone. Two digests equal: nothing a node's row, the
    summary or placement reads of the report changed (only its age)."""

    # Per class, each card in one bucket as the agent sees it (broken beats busy
    # beats unknown beats free); `counted` adds the cards replicas were assigned.
    classes: tuple[tuple[str, CardCounts], ...]
    entirely_free: bool  # >= 1 card, every card healthy and idle
    models: frozenset[str]
    # (model, scope, where): where is the mount source for shared storage
    copies: frozenset[tuple[str, StorageScope, str]]
    fabrics: tuple[str, ...] = ()
    engines: frozenset[str] = frozenset()  # what the agent says it can run
    # (uuid, class, healthy and idle per the agent): what placement hands out
    cards: tuple[tuple[str, str, bool], ...] = ()
    idle_unknown: frozenset[str] = frozenset()  # idle cards of unknown health
    faults: tuple[CardFault, ...] = ()  # cards the agent reports unhealthy
    address: str | None = None
    gpu_error: str | None = None
    adapters: frozenset[str] = frozenset()  # complete LoRA adapters in its storage
    # Healthy cards in use that still have room for an awake engine (`has_room`): the
    # warm tier shares a card whose replicas all sleep (`fleet_snapshot.node_capacity`).
    roomy: frozenset[str] = frozenset()

    @property
    def gpus_total(self) -> int:
        return sum(c.total for _, c in self.classes)

    def counted(self, assigned: Collection[str]) -> tuple[tuple[tuple[str, CardCounts], ...], bool]:
        """(`classes`, `entirely_free`) with each idle card in `assigned` (the
        controller's: replica shards on this node, `Facts.assigned_gpus`) counted
        as used: a replica holds its cards before its engine shows on them."""
        if not assigned:
            return self.classes, self.entirely_free
        taken: dict[str, list[int]] = {}  # class -> [cards taken, of them unknown]
        unknown = self.idle_unknown
        for uuid, cls, free in self.cards:
            if uuid in assigned and (free or uuid in unknown):
                counts = taken.setdefault(cls, [0, 0])
                counts[0] += 1
                counts[1] += not free
        if not taken:
            return self.classes, self.entirely_free
        classes = tuple(
            (cls, c._replace(used=c.used + t[0], unknown=c.unknown - t[1]))
            if (t := taken.get(cls))
            else (cls, c)
            for cls, c in self.classes
        )
        return classes, False


EMPTY_DIGEST = NodeDigest((), False, frozenset(), frozenset())

# Enum members looked up once: attribute access on an Enum class is slow in a hot loop.
_HEALTHY, _UNHEALTHY, _UNKNOWN = GpuHealth.HEALTHY, GpuHealth.UNHEALTHY, GpuHealth.UNKNOWN
_SHARED = StorageScope.SHARED
_FAILED = ShardState.FAILED


# What an awake engine claims of a card: vLLM's --gpu-memory-utilization default, which
# its start checks is free. A card whose processes hold no more than the rest (a
# sleeping engine's CUDA context and leftovers) has room for one awake engine.
AWAKE_SHARE = 0.9


def has_room(used_mib: int | None, total_mib: int) -> bool:
    """Room for one awake engine beside what the card holds (unknown: none)."""
    claim = round(total_mib * AWAKE_SHARE)
    return used_mib is not None and total_mib > 0 and used_mib <= total_mib - claim


def digest_report(report: NodeReport) -> NodeDigest:
    """Reduce a report to what the controller reads of it (one pass over the cards).
    Runs on every report: empty parts are skipped rather than walked (a frozenset or
    tuple built from a generator costs about a microsecond even when it is empty)."""
    per_class: dict[str, list[int]] = {}  # class -> [total, used, unhealthy, unknown]
    cards, faults, idle_unknown, roomy = [], [], [], []
    entirely_free = True
    for gpu in report.gpus:
        cls, health, in_use = gpu.gpu_class, gpu.health, gpu.in_use
        counts = per_class.get(cls)
        if counts is None:
            counts = per_class[cls] = [0, 0, 0, 0]
        counts[0] += 1
        free = health is _HEALTHY and not in_use
        cards.append((gpu.uuid, cls, free))
        if free:
            continue
        entirely_free = False
        if health is _UNHEALTHY:
            counts[2] += 1
            faults.append(CardFault(gpu.uuid, gpu.index, gpu.health_reason or "unhealthy"))
        elif in_use:
            counts[1] += 1
            if health is _HEALTHY and has_room(gpu.memory_used_mib, gpu.memory_total_mib):
                roomy.append(gpu.uuid)
        elif health is _UNKNOWN:
            counts[3] += 1
            idle_unknown.append(gpu.uuid)
    copies: set[tuple[str, StorageScope, str]] = set()
    models: set[str] = set()
    adapters: list[str] = []
    for loc in report.storage:
        scope = loc.scope
        where = (loc.mount_source or loc.path) if scope is _SHARED else ""
        names = [m.name for m in loc.models]
        models.update(names)
        copies.update([(name, scope, where) for name in names])
        if loc.adapters:
            adapters += [a.name for a in loc.adapters]
    return NodeDigest(
        tuple(sorted([(k, CardCounts(*v)) for k, v in per_class.items()])),
        bool(cards) and entirely_free,
        frozenset(models),
        frozenset(copies),
        _fabrics(report.fabrics),
        frozenset(report.engines) if report.engines else _NONE,
        tuple(cards),
        frozenset(idle_unknown) if idle_unknown else _NONE,
        tuple(faults),
        report.address,
        report.gpu_error,
        frozenset(adapters) if adapters else _NONE,
        frozenset(roomy) if roomy else _NONE,
    )


_NONE: frozenset[str] = frozenset()


def _fabrics(fabrics: list[str]) -> tuple[str, ...]:
    if len(fabrics) < 2:
        return tuple(fabrics)
    return tuple(sorted(set(fabrics)))


def digest_shards(report: NodeReport, received_at: float) -> tuple[ShardDigest, ...]:
    """The engines a node runs, with idleness turned into a moment on our clock."""
    return tuple(
        [
            ShardDigest(
                r.id,
                r.rank,
                r.state,
                None if r.idle_seconds is None else received_at - r.idle_seconds,
                r.error,
                r.port,
                r.traffic,
                r.sleep_error,
                frozenset(r.adapters) if r.adapters else _NONE,
                tuple([(f.name, f.status, f.message) for f in r.adapter_failures])
                if r.adapter_failures
                else (),
                r.sleep_failure,
                None
                if r.last_wake_s is None or r.last_wake_level is None
                else (r.last_wake_level, r.last_wake_s),
            )
            for r in report.replicas
        ]
    )


class Changed(NamedTuple):
    facts: bool  # what the node's row or placement reads (its digest)
    listening: bool  # where its engines listen (the endpoint feed's URLs)
    engines: bool  # an engine came, went, or changed state (news for the loop)


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
    # The digest's, set with it, by the names placement and the views read (an
    # attribute each: a reconcile pass reads them for every node).
    cards: tuple[tuple[str, str, bool], ...] = ()
    faults: tuple[CardFault, ...] = ()
    address: str | None = None
    gpu_error: str | None = None
    shards: tuple[ShardDigest, ...] = ()
    # (replica id, port, failed, adapters loaded) of each rank 0 here: with the address,
    # where the endpoint feed's URLs point and what each serves.
    ports: tuple[tuple[str, int | None, bool, frozenset[str]], ...] = ()
    interval_s: float = 5.0

    def update(self, report: NodeReport, raw: bytes, received_at: float) -> Changed:
        """Take a report: whether a fact the node's row or placement reads changed
        (its digest), not just its age; and whether where its engines listen did
        (its address, a rank 0's port or failure)."""
        digest = digest_report(report)
        old = self.digest
        moved = digest.address != old.address
        facts = digest != old
        if facts:  # else the old one is kept: the new one dies young instead of
            self.digest = digest  # joining the long-lived objects every GC pass walks
            self.cards, self.faults = digest.cards, digest.faults
            self.address, self.gpu_error = digest.address, digest.gpu_error
        self.raw, self.received_at = raw, received_at
        before, shards = self.shards, digest_shards(report, received_at)
        self.shards = shards
        engines = len(shards) != len(before) or any(
            a.state is not b.state or a.replica_id != b.replica_id or a.rank != b.rank
            for a, b in zip(shards, before, strict=True)
        )
        # Adapters too: a loaded one joins the endpoint feed (routing) at once.
        ports = tuple(
            [(s.replica_id, s.port, s.state is _FAILED, s.adapters) for s in shards if s.rank == 0]
        )
        if ports != self.ports:
            self.ports = ports
            moved = True
        self.interval_s = report.interval_s
        return Changed(facts, moved, engines)

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
