"""Replica placement and the drain pre-check, as pure functions over a snapshot.

Nothing here does I/O, reads a clock or keeps state between calls. The controller
builds a snapshot of the fleet (one `NodeCapacity` per node), asks, and records
the answer. The same snapshot gives the same answer whatever the order of nodes
and of the card UUIDs in it.

Public API
----------
``place(spec, nodes, wanted=()) -> Placement | Unplaceable``
    Place one replica of ``spec``. ``wanted`` (every function takes it): the GPU
    classes that declared specs ask for by name (see Classes below).
``place_many(requests, nodes) -> list[Placement | Unplaceable]``
    Place one replica per request, in request order. Cards taken by one placement
    are not free for the next; an `Unplaceable` takes nothing. Results come back
    in request order. Ask for two replicas of a model by listing its spec twice.
``placer(nodes) -> (spec, count) -> Fill``
    A function that places up to ``count`` replicas of ``spec`` per call, each
    call seeing the cards the earlier calls took. It stops at the first replica
    that does not fit: capacity only shrinks, so the rest would not fit either,
    and a reason costs a scan of the fleet. For a caller that spreads placement
    over time (the reconcile loop yields to its event loop between calls); that
    caller keeps the snapshot fresh. ``placer_in_steps(nodes, step)`` builds the
    same a step of nodes at a time, yielding in between.
``plan_drain(specs, replicas, nodes, draining) -> DrainPlan``
    What draining ``draining`` would do to every model with replicas on those
    nodes: how many replicas must move, how many replacements fit elsewhere now,
    and a verdict, worst first. Models bound to a class are placed before those
    that fit on any, and a reason says what the fleet has, not what the plan left.

All of them raise `ValueError` when two snapshot entries share a node name.

Rules
-----
Candidates
    Ready (``schedulable``) nodes with at least ``gpus_per_shard`` free cards of
    the class asked for. ``free`` lists only healthy, unused cards, so broken or
    busy cards are never handed out. A shard never mixes classes, and a
    multi-shard replica uses one class on all its nodes. With no class asked for,
    every class is tried and the best-ranked choice wins (ties by class name).
Fabrics
    A replica with ``shards > 1`` takes that many distinct nodes in one fabric.
    Nodes in no fabric can host single-shard replicas only. A node in several
    fabrics is a candidate in each. Single-shard placements report ``fabric=None``.
Spread (a preference, never a filter)
    A node that already runs a replica of the model (``runs``, and every
    placement made in the same call) ranks after every node that does not, so
    that one node's failure, reboot or drain never takes a whole model. Several
    shards: the fabric where the fewest chosen nodes run one wins, and inside it
    nodes that run none are taken first. When only such nodes fit, they are used.
Weights (a preference, never a filter), after spread
    One shard: a node that holds the model's weights beats any node that does
    not. Several shards: the fabric where the most of the chosen nodes hold the
    weights wins (holders beyond ``shards`` add nothing, so the count is capped
    at ``shards``), and inside it holders are taken first.
Classes (a preference), after spread and weights, before packing
    A spec with no class, given a choice, takes a class that no spec in ``wanted``
    asks for: a model that fits anywhere does not spend the cards a model bound
    to one class needs, when another class would do. Ties keep the packing rank.
Packing, after weights (and classes)
    Nodes rank by: not entirely free before entirely free (an entirely free node
    is a free block a multi-node replica may need), then least leftover free
    cards on the node, then least leftover in the class, then name.
    Fabrics rank by (after spread and weights): fewest entirely free nodes consumed, then *best fit* on
    blocks -- the fabric whose largest free block is smallest after placement,
    so the largest blocks elsewhere stay intact -- then least leftover on the
    chosen nodes, then fabric name, then class.
Ranks
    Rank 0 is the best-ranked node (one running no replica of the model and
    holding its weights, when there is one).
Reasons
    An `Unplaceable` says what is missing, in words with numbers, e.g.
    "needs 2 nodes x 8 H100-80GB in one fabric; largest free block: ib-a 1, ib-b 0".

How it stays fast
-----------------
Ready nodes are bucketed per (scope, class) by (entirely free, free cards on the
node, free cards of the class); a scope is the whole fleet or one fabric. Bucket
keys sort in rank order and each bucket keeps its names sorted, so the best
candidates are read off the front instead of ranking every node per placement;
taking cards moves one node between a few buckets.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import (
    Callable,
    Collection,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Literal, NamedTuple

from llmgw.wire import DrainImpact, DrainPlan, ModelSpec

__all__ = [
    "Fill",
    "NodeCapacity",
    "Placement",
    "RunningReplica",
    "ShardPlacement",
    "Unplaceable",
    "place",
    "place_many",
    "placer",
    "placer_in_steps",
    "plan_drain",
]


def _empty_first(cards: Iterable[str], shared: frozenset[str]) -> list[str]:
    return sorted(cards, key=lambda uuid: (uuid in shared, uuid))


# -- inputs and results ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """What placement needs to know about one node.

    ``free`` maps a GPU class to the UUIDs of its healthy, unused cards. List a
    class the node has even when none of its cards is free (an empty tuple), so
    that reasons can tell "all busy" from "no such cards here".
    """

    name: str
    free: Mapping[str, tuple[str, ...]]
    total_cards: int  # every card, busy or broken: tells whether the node is entirely free
    fabrics: tuple[str, ...] = ()
    schedulable: bool = True  # ready: not cordoned, draining or unreachable
    holds: frozenset[str] = frozenset()  # models whose complete weights the node can read
    runs: frozenset[str] = frozenset()  # models with a replica (any shard) on the node
    # Of `free`, cards free only beside sleeping replicas (the warm tier): taken after
    # the empty ones on a node, so that a sleeping replica's wake stays possible.
    shared: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ShardPlacement:
    node: str
    rank: int
    gpus: tuple[str, ...]  # UUIDs, sorted


@dataclass(frozen=True, slots=True)
class Placement:
    model: str
    fabric: str | None  # None for a single-shard replica
    shards: tuple[ShardPlacement, ...]  # in rank order
    gpu_class: str
    weights_local: bool = False  # every node chosen holds the model's weights (a warm start)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.shards)


@dataclass(frozen=True, slots=True)
class Unplaceable:
    model: str
    reason: str


class Fill(NamedTuple):
    """What one call of a `placer` did: the replicas placed, in order, and why
    the next one did not fit (None: every replica asked for was placed)."""

    placed: tuple[Placement, ...]
    unplaceable: Unplaceable | None


@dataclass(frozen=True, slots=True)
class RunningReplica:
    """A replica as the drain pre-check needs it."""

    id: str
    model: str
    nodes: tuple[str, ...]
    ready: bool


Verdict = Literal["ok", "below_minimum", "unplaceable"]

# -- public functions --------------------------------------------------------------


def place(
    spec: ModelSpec, nodes: Iterable[NodeCapacity], wanted: Collection[str] = ()
) -> Placement | Unplaceable:
    """Place one replica of ``spec`` on ``nodes``."""
    return _Allocation(nodes, wanted).place(spec)


def place_many(
    requests: Sequence[ModelSpec], nodes: Iterable[NodeCapacity], wanted: Collection[str] = ()
) -> list[Placement | Unplaceable]:
    """Place one replica per request, in order, each seeing the cards the earlier took."""
    allocation = _Allocation(nodes, wanted)
    return [allocation.place(spec) for spec in requests]


def placer(
    nodes: Iterable[NodeCapacity], wanted: Collection[str] = ()
) -> Callable[[ModelSpec, int], Fill]:
    """Place up to ``count`` replicas of ``spec`` per call, on one snapshot."""
    return _Allocation(nodes, wanted).place_up_to


def placer_in_steps(
    nodes: Iterable[NodeCapacity], step: int = 500, wanted: Collection[str] = ()
) -> Generator[None, None, Callable[[ModelSpec, int], Fill]]:
    """`placer`, its index built ``step`` nodes at a time with a yield after each,
    for a caller that must not hold its event loop for the whole build: the
    function comes back as the generator's value (``yield from``)."""
    ordered = sorted(nodes, key=_name)
    allocation = _Allocation(wanted=wanted)
    for start in range(0, len(ordered), step):
        allocation._add(ordered[start : start + step])
        yield
    return allocation.place_up_to


def plan_drain(
    specs: Iterable[ModelSpec],
    replicas: Iterable[RunningReplica],
    nodes: Iterable[NodeCapacity],
    draining: Collection[str],
) -> DrainPlan:
    """Say what draining ``draining`` would do to each model with replicas on them.

    ``nodes`` is the fleet as it is now; the nodes to drain are treated as not
    ready. Every replica with a shard on them must move. Replacements are placed
    one after another, models in name order, so two models competing for the
    same free cards are not both promised them.

    Verdicts, per model:

    - ``ok``: every replacement fits elsewhere now.
    - ``below_minimum``: some do not, and ready replicas (those kept plus the
      replacements that fit) would fall below ``min_replicas``.
    - ``unplaceable``: some do not, but the model keeps its minimum; the drain
      would still wait for them (or lose them with ``--force``).

    Replicas of models without a spec are ignored: they are stopped, not moved.
    Leave out replicas that already have a replacement (a drain in progress):
    the replacement's cards are already taken in ``nodes``.
    Models bound to a GPU class are placed first (then by name): a model that fits
    on any class must not take the cards of the one class another needs.
    Where a replacement does not fit, the reason is the fleet's (as placing it
    alone would say), or names the replacements of this plan that take its room.
    Impacts come worst first: verdict, then most replacements missing, then name.
    """
    drain = frozenset(draining)
    by_name = {spec.name: spec for spec in specs}
    wanted = frozenset(s.gpu_class for s in by_name.values() if s.gpu_class)
    ready_now: dict[str, int] = defaultdict(int)
    moving: dict[str, int] = defaultdict(int)
    ready_moving: dict[str, int] = defaultdict(int)
    for replica in replicas:
        if replica.model not in by_name:
            continue
        ready_now[replica.model] += replica.ready
        if drain.intersection(replica.nodes):
            moving[replica.model] += 1
            ready_moving[replica.model] += replica.ready

    fleet = [replace(n, schedulable=False) if n.name in drain else n for n in nodes]
    allocation = _Allocation(fleet, wanted)
    planned: list[Placement] = []  # this plan's replacements so far
    impacts: list[DrainImpact] = []
    for model in sorted(moving, key=lambda m: (by_name[m].gpu_class is None, m)):
        spec, need = by_name[model], moving[model]
        fill = allocation.place_up_to(spec, need)
        planned += fill.placed
        placed = len(fill.placed)
        why = _fleet_reason(spec, need, placed, fleet, wanted, planned) if placed < need else ""
        ready_after = ready_now[model] - ready_moving[model] + placed
        verdict: Verdict
        reason: str | None = None
        if placed == need:
            verdict = "ok"
        else:
            fit = f"replacements that fit elsewhere: {placed} of {need}"
            if ready_after < spec.min_replicas:
                verdict = "below_minimum"
                reason = (
                    f"{fit}; ready replicas would fall to {ready_after}"
                    f" of minimum {spec.min_replicas}: {why}"
                )
            else:
                verdict = "unplaceable"
                reason = f"{fit}; the drain would wait for the rest: {why}"
        impacts.append(
            DrainImpact(
                model=model,
                min_replicas=spec.min_replicas,
                ready_now=ready_now[model],
                replicas_on_nodes=need,
                replaceable=placed,
                verdict=verdict,
                reason=reason,
            )
        )
    severity = {"below_minimum": 0, "unplaceable": 1, "ok": 2}
    impacts.sort(key=lambda i: (severity[i.verdict], i.replaceable - i.replicas_on_nodes, i.model))
    return DrainPlan(
        nodes=sorted(drain),
        replicas_to_move=sum(moving.values()),
        impacts=impacts,
    )


# -- the index -------------------------------------------------------------------------


class _BucketKey(NamedTuple):
    """Where a node sits in a (scope, class) index. For a fixed request these
    sort exactly as the packing rank does."""

    entirely_free: bool
    node_free: int  # free cards on the node, every class
    class_free: int  # free cards of the class


class _Rank(NamedTuple):
    """A candidate node for one shard: smaller is better, field by field."""

    runs_model: bool  # already runs a replica of the model: spread first
    not_holder: bool
    entirely_free: bool
    node_leftover: int  # free cards left on the node after the shard
    class_leftover: int  # free cards of the class left on the node
    name: str


class _FabricScore(NamedTuple):
    """A fabric's bid for a multi-shard replica: smaller is better, field by field."""

    doubled: int  # chosen nodes that already run a replica of the model
    non_holders: int
    wanted_class: bool  # a class some spec asks for, taken by a spec that asks for none
    free_nodes_consumed: int
    free_blocks_left: int  # best fit: the fabric left with the smallest largest block wins
    leftover: int  # free cards left on the chosen nodes
    fabric: str
    gpu_class: str


class _SingleChoice(NamedTuple):
    """The best node for a single-shard replica so far, and its class (ties by class name)."""

    rank: _Rank
    gpu_class: str


class _MostFree(NamedTuple):
    """For a reason: the ready node with the most free cards of one class (smallest wins)."""

    minus_free: int
    node: str
    gpu_class: str


_Scope = str | None  # None: the whole fleet; otherwise a fabric

_MAX_LISTED = 6  # fabrics or classes named in one reason


@dataclass(slots=True)
class _Node:
    name: str
    fabrics: tuple[str, ...]
    total_cards: int
    holds: frozenset[str]
    free: dict[str, list[str]]
    total_free: int = field(init=False)
    # Where the node sits in each class's index: set on entering, read on leaving.
    keys: dict[str, _BucketKey] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.total_free = sum(len(cards) for cards in self.free.values())

    @property
    def entirely_free(self) -> bool:
        return self.total_cards > 0 and self.total_free >= self.total_cards

    def key(self, cls: str) -> _BucketKey:
        return _BucketKey(self.entirely_free, self.total_free, len(self.free.get(cls, ())))


class _Allocation:
    """Mutable allocation state for one call: the snapshot, indexed."""

    def __init__(self, nodes: Iterable[NodeCapacity] = (), wanted: Collection[str] = ()) -> None:
        self._wanted = frozenset(wanted)  # classes declared specs ask for by name
        self._ready: dict[str, _Node] = {}
        self._not_ready: list[NodeCapacity] = []
        self._buckets: dict[tuple[_Scope, str], dict[_BucketKey, list[str]]] = defaultdict(dict)
        self._free_block: dict[str, int] = defaultdict(int)  # fabric -> entirely free nodes
        self._holders_by_model: dict[str, set[str]] = defaultdict(set)
        self._holders: dict[tuple[str, _Scope], frozenset[str]] = {}
        # Ready nodes running a replica of a model: the snapshot's, then this call's.
        self._runners_by_model: dict[str, set[str]] = defaultdict(set)
        self._runners: dict[tuple[str, _Scope], frozenset[str]] = {}
        # (model, scope, class, GPUs) with no candidate left that runs none of the model.
        self._spread_spent: set[tuple[str, _Scope, str, int]] = set()
        # Shapes (shards, GPUs per shard, class) that did not fit, with the reason,
        # until cards are taken. Neither depends on the model's name or weights, so
        # 200 models of one shape that cannot fit cost one scan of the fleet, not 200.
        self._refused: dict[tuple[int, int, str | None], str] = {}
        # For reasons, until cards are taken: the node with most free per class asked
        # for (None: any), and what a missing class's reason says.
        self._most_free: dict[str | None, _MostFree] = {}
        self._class_missing: dict[str, str | None] = {}
        self._by_fabric: dict[str | None, list[_Node]] = defaultdict(list)  # None: in none
        self._seen: set[str] = set()
        self._fabrics: list[str] = []
        self._add(sorted(nodes, key=_name))

    def _add(self, nodes: Iterable[NodeCapacity]) -> None:
        """Index nodes given in name order, each after every node indexed before."""
        self._forget_reasons()
        self._spread_spent.clear()
        fabrics = set(self._fabrics)
        for cap in nodes:
            if cap.name in self._seen:
                raise ValueError(f"node {cap.name!r} appears twice in the snapshot")
            self._seen.add(cap.name)
            if not cap.schedulable:
                self._not_ready.append(cap)
                continue
            node = _Node(
                name=cap.name,
                fabrics=tuple(sorted(set(cap.fabrics))),
                total_cards=cap.total_cards,
                holds=cap.holds,
                free={cls: _empty_first(cards, cap.shared) for cls, cards in cap.free.items()},
            )
            self._ready[node.name] = node
            for model in node.holds:
                self._holders_by_model[model].add(node.name)
            for model in cap.runs:
                self._runners_by_model[model].add(node.name)
            self._enter(node, presorted=True)  # names arrive sorted: append keeps buckets sorted
            fabrics.update(node.fabrics)
            for fabric in node.fabrics or (None,):
                self._by_fabric[fabric].append(node)
        self._fabrics = sorted(fabrics)

    # -- bookkeeping

    def _enter(self, node: _Node, *, presorted: bool = False) -> None:
        node.keys = {cls: node.key(cls) for cls, cards in node.free.items() if cards}
        for scope in (None, *node.fabrics):
            for cls, key in node.keys.items():
                bucket = self._buckets[scope, cls].setdefault(key, [])
                if presorted:
                    bucket.append(node.name)
                else:
                    bisect.insort(bucket, node.name)
        if node.entirely_free:
            for fabric in node.fabrics:
                self._free_block[fabric] += 1

    def _leave(self, node: _Node) -> None:
        for scope in (None, *node.fabrics):
            for cls, key in node.keys.items():
                table = self._buckets[scope, cls]
                bucket = table[key]
                del bucket[bisect.bisect_left(bucket, node.name)]
                if not bucket:
                    del table[key]
        if node.entirely_free:
            for fabric in node.fabrics:
                self._free_block[fabric] -= 1

    def _take(self, name: str, cls: str, count: int) -> tuple[str, ...]:
        node = self._ready[name]
        self._forget_reasons()  # only an untouched fleet refuses the same way
        self._leave(node)
        cards = node.free[cls]
        taken, node.free[cls] = tuple(sorted(cards[:count])), cards[count:]
        node.total_free -= count
        self._enter(node)
        return taken

    def _forget_reasons(self) -> None:
        self._refused.clear()
        self._most_free.clear()
        self._class_missing.clear()

    def _holders_in(self, model: str, scope: _Scope) -> frozenset[str]:
        cached = self._holders.get((model, scope))
        if cached is None:
            everywhere = self._holders_by_model.get(model, set())
            if scope is None:
                cached = frozenset(everywhere)
            else:
                cached = frozenset(n for n in everywhere if scope in self._ready[n].fabrics)
            self._holders[model, scope] = cached
        return cached

    def _runners_in(self, model: str, scope: _Scope) -> frozenset[str]:
        cached = self._runners.get((model, scope))
        if cached is None:
            everywhere = self._runners_by_model.get(model, set())
            if scope is None:
                cached = frozenset(everywhere)
            else:
                cached = frozenset(n for n in everywhere if scope in self._ready[n].fabrics)
            self._runners[model, scope] = cached
        return cached

    def _now_runs(self, model: str, names: Iterable[str]) -> None:
        """A placement made in this call: its nodes run the model from now on."""
        runners = self._runners_by_model[model]
        for name in names:
            runners.add(name)
            for scope in (None, *self._ready[name].fabrics):
                self._runners.pop((model, scope), None)

    # -- choosing

    def _pick(self, scope: _Scope, cls: str, gpus: int, count: int, model: str) -> list[_Rank]:
        """The ``count`` best-ranked candidates in ``scope``, or [] when too few fit."""
        table = self._buckets.get((scope, cls))
        if not table:
            return []
        keys = sorted(k for k in table if k.class_free >= gpus)
        eligible = sum(len(table[k]) for k in keys)
        if eligible < count:
            return []

        holders = self._holders_in(model, scope)
        runners = self._runners_in(model, scope)

        def rank(name: str, key: _BucketKey) -> _Rank:
            return _Rank(
                name in runners,
                name not in holders,
                key.entirely_free,
                key.node_free - gpus,
                key.class_free - gpus,
                name,
            )

        def best(
            want: int, keep: Callable[[str], bool], among: Collection[str] | None
        ) -> list[_Rank]:
            """The ``want`` best-ranked candidates that ``keep`` accepts. ``among``: a
            set that holds all of them, when one is known; few are ranked directly
            rather than walking every bucket, many are met early by the walk."""
            if among is not None and len(among) * 4 < eligible:
                ranks = []
                for name in among:
                    key = self._ready[name].keys.get(cls)
                    if key is not None and key.class_free >= gpus and keep(name):
                        ranks.append(rank(name, key))
                return sorted(ranks)[:want]
            walk = (rank(n, k) for k in keys for n in table[k] if keep(n))
            return list(islice(walk, want))

        smaller = holders if len(holders) < len(runners) else runners
        # Tiers in rank order, disjoint: spread, then weights; packing orders each
        # tier. Nodes running the model come last, only when too few others fit.
        tiers: list[tuple[Callable[[str], bool], Collection[str] | None]] = [
            (lambda n: n in holders and n not in runners, holders),
            (lambda n: n not in runners and n not in holders, None),
            (lambda n: n in runners and n in holders, smaller),
            (lambda n: n in runners and n not in holders, runners),
        ]
        # Once no candidate runs none, none will in this call: capacity only shrinks
        # and runners only grow. Remembered, so that the replicas of a model on every
        # node do not each walk every bucket for a node it is not on.
        spent = (model, scope, cls, gpus)
        chosen: list[_Rank] = []
        for i, (keep, among) in enumerate(tiers):
            if len(chosen) == count:
                break
            if i == 2 and not chosen:
                self._spread_spent.add(spent)
            if (among is not None and not among) or (i < 2 and spent in self._spread_spent):
                continue
            chosen += best(count - len(chosen), keep, among)
        return chosen

    def _classes(self, scope: _Scope) -> list[str]:
        return sorted(cls for (s, cls), table in self._buckets.items() if s == scope and table)

    def place(self, spec: ModelSpec) -> Placement | Unplaceable:
        shape = (spec.shards, spec.gpus_per_shard, spec.gpu_class)
        refused = self._refused.get(shape)
        if refused is not None:
            return Unplaceable(spec.name, refused)
        result = self._place(spec)
        if isinstance(result, Unplaceable):
            self._refused[shape] = result.reason
        return result

    def _place(self, spec: ModelSpec) -> Placement | Unplaceable:
        gpus, shards = spec.gpus_per_shard, spec.shards
        # Only a spec with no class chooses one: one that others want ranks after.
        wanted = self._wanted if spec.gpu_class is None else frozenset()
        if shards == 1:
            single: tuple[tuple[bool, bool, bool], _SingleChoice] | None = None
            for cls in [spec.gpu_class] if spec.gpu_class else self._classes(None):
                picked = self._pick(None, cls, gpus, 1, spec.name)
                if not picked:
                    continue
                r = picked[0]
                choice = ((r.runs_model, r.not_holder, cls in wanted), _SingleChoice(r, cls))
                if single is None or choice < single:
                    single = choice
            if single is None:
                return Unplaceable(spec.name, self._why_single(spec))
            return self._commit(spec, None, single[1].gpu_class, [single[1].rank])

        best: tuple[_FabricScore, list[_Rank]] | None = None
        for fabric in self._fabrics:
            for cls in [spec.gpu_class] if spec.gpu_class else self._classes(fabric):
                picked = self._pick(fabric, cls, gpus, shards, spec.name)
                if not picked:
                    continue
                consumed = sum(r.entirely_free for r in picked)
                score = _FabricScore(
                    doubled=sum(r.runs_model for r in picked),
                    non_holders=sum(r.not_holder for r in picked),
                    wanted_class=cls in wanted,
                    free_nodes_consumed=consumed,
                    free_blocks_left=self._free_block[fabric] - consumed,
                    leftover=sum(r.node_leftover for r in picked),
                    fabric=fabric,
                    gpu_class=cls,
                )
                if best is None or score < best[0]:
                    best = (score, picked)
        if best is None:
            return Unplaceable(spec.name, self._why_multi(spec))
        score, picked = best
        return self._commit(spec, score.fabric, score.gpu_class, picked)

    def place_up_to(self, spec: ModelSpec, count: int) -> Fill:
        placed: list[Placement] = []
        for _ in range(count):
            result = self.place(spec)
            if isinstance(result, Unplaceable):
                return Fill(tuple(placed), result)
            placed.append(result)
        return Fill(tuple(placed), None)

    def _commit(
        self, spec: ModelSpec, fabric: str | None, cls: str, picked: list[_Rank]
    ) -> Placement:
        shards = tuple(
            ShardPlacement(node=r.name, rank=i, gpus=self._take(r.name, cls, spec.gpus_per_shard))
            for i, r in enumerate(picked)
        )
        self._now_runs(spec.name, (r.name for r in picked))
        warm = not any(r.not_holder for r in picked)
        return Placement(
            model=spec.name, fabric=fabric, shards=shards, gpu_class=cls, weights_local=warm
        )

    # -- reasons (only on failure, so plain scans are fine)

    def _no_ready_node(self) -> str:
        if self._not_ready:
            return f"no node is ready ({len(self._not_ready)} cordoned, draining or unreachable)"
        return "the fleet has no nodes"

    def _missing_class(self, cls: str) -> str | None:
        if cls not in self._class_missing:
            self._class_missing[cls] = self._why_class_missing(cls)
        return self._class_missing[cls]

    def _why_class_missing(self, cls: str) -> str | None:
        if any(cls in node.free for node in self._ready.values()):
            return None
        reason = f"no ready node has GPUs of class {cls}"
        elsewhere = sum(cls in cap.free for cap in self._not_ready)
        if elsewhere:
            reason += (
                f" ({_nodes(elsewhere)} that {_is(elsewhere, 'is', 'are')} not ready"
                f" {_is(elsewhere, 'has', 'have')} them)"
            )
        present = sorted({c for node in self._ready.values() for c in node.free})
        if present:
            reason += "; ready nodes have " + _listing(present)
        return reason

    def _why_single(self, spec: ModelSpec) -> str:
        cls = spec.gpu_class
        want = _needs(spec)
        if not self._ready:
            return f"{want}; {self._no_ready_node()}"
        if cls is not None and (missing := self._missing_class(cls)):
            return f"{want}; {missing}"
        most = self._most_free.get(cls)
        if most is None:
            # Most free, then first by name: (-count, name, class) is smallest.
            most = self._most_free[cls] = _MostFree(
                *min(
                    (
                        (-len(cards), node.name, c)
                        for node in self._ready.values()
                        for c, cards in node.free.items()
                        if cls is None or c == cls
                    ),
                    default=(0, "", ""),
                )
            )
        if most.minus_free == 0:
            return f"{want}; no ready node has a free one"
        where = most.node if cls else f"{most.gpu_class} on {most.node}"
        kind = "" if cls else " of one class"
        return f"{want}; most free{kind} on a ready node: {-most.minus_free} ({where})"

    def _why_multi(self, spec: ModelSpec) -> str:
        gpus, cls = spec.gpus_per_shard, spec.gpu_class
        want = _needs(spec)
        if not self._ready:
            return f"{want}; {self._no_ready_node()}"
        if cls is not None and (missing := self._missing_class(cls)):
            return f"{want}; {missing}"

        def fitting(nodes: Iterable[_Node]) -> int:
            # A replica uses one class throughout, so count per class and keep the best.
            per_class: dict[str, int] = defaultdict(int)
            for node in nodes:
                for c, cards in node.free.items():
                    if (cls is None or c == cls) and len(cards) >= gpus:
                        per_class[c] += 1
            return max(per_class.values(), default=0)

        loose = fitting(self._by_fabric.get(None, ()))
        if not self._fabrics:
            reason = f"{want}; no ready node is in a fabric"
            return reason + (f" ({loose} would fit)" if loose else "")
        fits = {f: fitting(self._by_fabric[f]) for f in self._fabrics}
        if all(fits[f] == self._free_block[f] for f in self._fabrics):
            label = "largest free block"  # the same numbers, in the fleet's own words
        else:
            label = f"ready nodes with {gpus} free" + ("" if cls else " of one class")
        ordered = sorted(self._fabrics, key=lambda f: (-fits[f], f))
        reason = f"{want}; {label}: " + _listing([f"{f} {fits[f]}" for f in ordered])
        if loose:
            reason += f"; {_nodes(loose)} outside any fabric would fit"
        return reason


def _name(node: NodeCapacity) -> str:
    return node.name


def _needs(spec: ModelSpec) -> str:
    """What one replica needs, as every reason begins."""
    gpus, cls = spec.gpus_per_shard, spec.gpu_class or "GPUs of one class"
    if spec.shards == 1:
        return f"needs 1 node with {gpus} free {cls}"
    return f"needs {spec.shards} nodes x {gpus} {cls} in one fabric"


def _fleet_reason(
    spec: ModelSpec,
    need: int,
    placed: int,
    fleet: Sequence[NodeCapacity],
    wanted: Collection[str],
    planned: Sequence[Placement],
) -> str:
    """Why the plan could not place all of ``spec``'s replacements, in terms of the
    fleet as it is: what placing them alone would say, or, when the fleet has room
    the plan's other replacements took, where it is and who takes it."""
    alone = _Allocation(fleet, wanted).place_up_to(spec, need)
    if len(alone.placed) <= placed:
        assert alone.unplaceable is not None
        return alone.unplaceable.reason
    room = sorted({n for p in alone.placed[placed:] for n in p.nodes})
    takers = sorted({p.model for p in planned if p.model != spec.name and _overlaps(p, room)})
    has = _is(len(room), "has", "have")
    return (
        f"{_needs(spec)}; {_listing(room)} {has} room for it, but this drain's replacements"
        f" of {_listing(takers)} take it first"
    )


def _overlaps(placement: Placement, room: Collection[str]) -> bool:
    return any(n in room for n in placement.nodes)


def _listing(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    more = len(items) - _MAX_LISTED
    return f"{shown} and {more} more" if more > 0 else shown


def _is(count: int, one: str, many: str) -> str:
    return one if count == 1 else many


def _nodes(count: int) -> str:
    return f"{count} {_is(count, 'node', 'nodes')}"
