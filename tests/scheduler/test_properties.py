"""Property tests: placement invariants over generated fleets.

Fleets are small (up to a dozen nodes, two classes, three fabrics) so that
collisions -- shared fabrics, contended cards, several holders -- are common.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.scheduler import NodeCapacity, Placement, Unplaceable, place, place_many
from llmgw.wire import ModelSpec

from ._fleet import A100, H100

CLASSES = (A100, H100)
FABRICS = ("ib-a", "ib-b", "ib-c")
MODELS = ("m1", "m2", "m3")

SETTINGS = settings(max_examples=200, deadline=None)


@dataclass(frozen=True)
class Fleet:
    nodes: list[NodeCapacity]
    unusable: frozenset[str]  # cards that are busy or unhealthy: never in `free`


def _subset(items: tuple[str, ...], mask: int) -> tuple[str, ...]:
    return tuple(x for i, x in enumerate(items) if mask >> i & 1)


# One node as plain integers: cheap to generate and to shrink.
# (A100 cards, A100 taken, H100 cards, H100 taken, fabric mask, ready, holds mask, runs mask)
_taken = st.sampled_from([0, 0, 0, 1, 2, 4, 8])  # mostly free, so that replicas land
_node_shape = st.tuples(
    st.integers(0, 8),
    _taken,
    st.integers(0, 8),
    _taken,
    st.sampled_from([0, 1, 1, 2, 2, 3, 4, 5, 6]),  # at most two fabrics, sometimes none
    st.sampled_from([True, True, True, False]),
    st.integers(0, 7),
    st.sampled_from([0, 0, 1, 2, 3, 4, 7]),  # models with a replica on the node already
)


@st.composite
def fleets(draw: st.DrawFn, max_nodes: int = 12) -> Fleet:
    nodes: list[NodeCapacity] = []
    unusable: set[str] = set()
    for i, shape in enumerate(draw(st.lists(_node_shape, max_size=max_nodes))):
        name = f"n{i:02d}"
        free: dict[str, tuple[str, ...]] = {}
        for cls, cards, taken in ((A100, shape[0], shape[1]), (H100, shape[2], shape[3])):
            if cards:
                taken = min(taken, cards)  # busy or unhealthy
                uuids = [f"{name}/{cls}/{j}" for j in range(cards)]
                unusable.update(uuids[:taken])
                free[cls] = tuple(uuids[taken:])
        nodes.append(
            NodeCapacity(
                name=name,
                free=free,
                total_cards=shape[0] + shape[2],
                fabrics=_subset(FABRICS, shape[4]),
                schedulable=shape[5],
                holds=frozenset(_subset(MODELS, shape[6])),
                runs=frozenset(_subset(MODELS, shape[7])),
            )
        )
    return Fleet(nodes, frozenset(unusable))


specs = st.builds(
    ModelSpec,
    name=st.sampled_from(MODELS),
    source=st.just("org/model"),
    gpus_per_shard=st.one_of(st.sampled_from([1, 2, 4, 8]), st.integers(1, 8)),
    shards=st.sampled_from([1, 1, 2, 3]),
    gpu_class=st.sampled_from([None, None, A100, H100, H100, "B200-192GB"]),
)


def placements(results: Sequence[Placement | Unplaceable]) -> list[Placement]:
    return [r for r in results if isinstance(r, Placement)]


# -- invariants -------------------------------------------------------------------------


@SETTINGS
@given(fleets(), st.lists(specs, min_size=1, max_size=8))
def test_never_spans_fabrics(fleet: Fleet, requests: list[ModelSpec]) -> None:
    by_name = {n.name: n for n in fleet.nodes}
    for spec, result in zip(requests, place_many(requests, fleet.nodes), strict=True):
        if not isinstance(result, Placement):
            continue
        assert len(result.shards) == spec.shards
        assert len(set(result.nodes)) == spec.shards, "a replica takes distinct nodes"
        if spec.shards == 1:
            assert result.fabric is None
        else:
            assert result.fabric is not None
            assert all(result.fabric in by_name[n].fabrics for n in result.nodes)


@SETTINGS
@given(fleets(), st.lists(specs, min_size=1, max_size=8))
def test_never_over_allocates(fleet: Fleet, requests: list[ModelSpec]) -> None:
    by_name = {n.name: n for n in fleet.nodes}
    handed_out: list[str] = []
    for spec, result in zip(requests, place_many(requests, fleet.nodes), strict=True):
        if not isinstance(result, Placement):
            continue
        if spec.gpu_class is not None:
            assert result.gpu_class == spec.gpu_class
        for shard in result.shards:
            assert len(shard.gpus) == spec.gpus_per_shard
            # every card is a free card of the one class the replica uses
            assert set(shard.gpus) <= set(by_name[shard.node].free[result.gpu_class])
            handed_out += shard.gpus
    assert len(handed_out) == len(set(handed_out)), "a card was handed out twice"


@SETTINGS
@given(fleets(), st.lists(specs, min_size=1, max_size=8))
def test_never_uses_unusable_cards_or_nodes_that_are_not_ready(
    fleet: Fleet, requests: list[ModelSpec]
) -> None:
    ready = {n.name for n in fleet.nodes if n.schedulable}
    for result in placements(place_many(requests, fleet.nodes)):
        for shard in result.shards:
            assert shard.node in ready
            assert not set(shard.gpus) & fleet.unusable


@SETTINGS
@given(fleets(max_nodes=8), specs, st.data())
def test_prefers_weights_when_all_else_is_equal(
    fleet: Fleet, spec: ModelSpec, data: st.DataObject
) -> None:
    # Two twins, identical but for the name and whether they hold the weights.
    # Which twin holds is drawn, so the name tie-break cannot be what decides.
    free = data.draw(
        st.dictionaries(st.sampled_from(CLASSES), st.integers(1, 8), min_size=1), label="free"
    )
    fabrics = tuple(data.draw(st.lists(st.sampled_from(FABRICS), unique=True, max_size=2)))
    total = sum(free.values()) + data.draw(st.integers(0, 2), label="busy")
    holder_first = data.draw(st.booleans(), label="holder_first")

    def twin(name: str, holds: bool) -> NodeCapacity:
        return NodeCapacity(
            name=name,
            free={c: tuple(f"{name}/{c}/{i}" for i in range(n)) for c, n in free.items()},
            total_cards=total,
            fabrics=fabrics,
            holds=frozenset({spec.name}) if holds else frozenset(),
        )

    holder, other = twin("tw-1", holder_first), twin("tw-2", not holder_first)
    if not holder_first:
        holder, other = other, holder
    nodes = [n for n in fleet.nodes if n.name not in {holder.name, other.name}]
    result = place(spec, [*nodes, holder, other])
    if isinstance(result, Placement) and other.name in result.nodes:
        assert holder.name in result.nodes, "a non-holder was chosen over its holding twin"


@SETTINGS
@given(fleets(), specs)
def test_a_single_shard_lands_on_a_holder_whenever_one_fits(fleet: Fleet, spec: ModelSpec) -> None:
    # Among the nodes spread allows: those running no replica of the model when one fits.
    spec = spec.model_copy(update={"shards": 1})
    fit = [n for n in fleet.nodes if _fits(n, spec)]
    allowed = [n for n in fit if spec.name not in n.runs] or fit
    result = place(spec, fleet.nodes)
    if any(spec.name in n.holds for n in allowed):
        assert isinstance(result, Placement)
        by_name = {n.name: n for n in fleet.nodes}
        assert spec.name in by_name[result.nodes[0]].holds


def _fits(node: NodeCapacity, spec: ModelSpec, cls: str | None = None) -> bool:
    """Whether a ready node could take one shard of ``spec`` (of class ``cls``, if given)."""
    classes = [cls] if cls else [spec.gpu_class] if spec.gpu_class else CLASSES
    return node.schedulable and any(
        len(node.free.get(c, ())) >= spec.gpus_per_shard for c in classes
    )


# -- spread: a node running a replica of the model ranks after every node that does not ------


def _spread_fits(nodes: Sequence[NodeCapacity], spec: ModelSpec) -> bool:
    """Whether a replica fits on nodes that run none of the model."""
    fresh = [n for n in nodes if spec.name not in n.runs]
    if spec.shards == 1:
        return any(_fits(n, spec) for n in fresh)
    classes = [spec.gpu_class] if spec.gpu_class else CLASSES
    return any(
        sum(fabric in n.fabrics and _fits(n, spec, c) for n in fresh) >= spec.shards
        for fabric in FABRICS
        for c in classes
    )


@SETTINGS
@given(fleets(), specs)
def test_spread_holds_whenever_a_node_running_none_can_take_it(
    fleet: Fleet, spec: ModelSpec
) -> None:
    result = place(spec, fleet.nodes)
    if _spread_fits(fleet.nodes, spec):
        assert isinstance(result, Placement)
        by_name = {n.name: n for n in fleet.nodes}
        doubled = [n for n in result.nodes if spec.name in by_name[n].runs]
        assert not doubled, f"placed on {doubled}, which already run {spec.name}"


@SETTINGS
@given(fleets(), st.lists(specs, min_size=1, max_size=8))
def test_spread_counts_the_placements_of_the_same_call(
    fleet: Fleet, requests: list[ModelSpec]
) -> None:
    # Replica after replica, each as if the earlier ones were in the snapshot: the
    # answer of one call equals that of calls one at a time on the updated fleet.
    nodes = list(fleet.nodes)
    expected = []
    for spec in requests:
        result = place(spec, nodes)
        expected.append(result)
        if isinstance(result, Placement):
            taken = {s.node: set(s.gpus) for s in result.shards}
            nodes = [
                replace(
                    n,
                    free={
                        c: tuple(u for u in cards if u not in taken.get(n.name, ()))
                        for c, cards in n.free.items()
                    },
                    runs=n.runs | {spec.name} if n.name in taken else n.runs,
                )
                for n in nodes
            ]
    assert place_many(requests, fleet.nodes) == expected


@SETTINGS
@given(fleets(), specs)
def test_spread_is_never_a_filter(fleet: Fleet, spec: ModelSpec) -> None:
    # What runs where changes which nodes are chosen, never whether a replica fits
    # nor why not.
    blind = [replace(n, runs=frozenset()) for n in fleet.nodes]
    with_runs, without = place(spec, fleet.nodes), place(spec, blind)
    assert type(with_runs) is type(without)
    if isinstance(without, Unplaceable):
        assert with_runs == without


@SETTINGS
@given(fleets(), st.lists(specs, min_size=1, max_size=6), st.integers(0, 2**32))
def test_deterministic_whatever_the_input_order(
    fleet: Fleet, requests: list[ModelSpec], seed: int
) -> None:
    rnd = random.Random(seed)
    expected = place_many(requests, fleet.nodes)
    shuffled = []
    for n in fleet.nodes:
        free = {c: tuple(rnd.sample(cards, len(cards))) for c, cards in n.free.items()}
        shuffled.append(replace(n, free=dict(rnd.sample(list(free.items()), len(free)))))
    rnd.shuffle(shuffled)
    assert place_many(requests, shuffled) == expected


@SETTINGS
@given(fleets(), specs)
def test_unplaceable_only_when_nothing_fits(fleet: Fleet, spec: ModelSpec) -> None:
    result = place(spec, fleet.nodes)
    if isinstance(result, Placement):
        return
    assert result.reason.startswith(f"needs {spec.shards} node")
    classes = [spec.gpu_class] if spec.gpu_class else CLASSES
    ready = [n for n in fleet.nodes if n.schedulable]
    for cls in classes:
        fits = [n for n in ready if len(n.free.get(cls, ())) >= spec.gpus_per_shard]
        if spec.shards == 1:
            assert not fits
        for fabric in FABRICS:
            assert sum(fabric in n.fabrics for n in fits) < spec.shards


# -- the indexed implementation agrees with a plain reading of the rules ---------------------


def reference(
    requests: Sequence[ModelSpec], nodes: Sequence[NodeCapacity]
) -> list[tuple[str | None, str, tuple[tuple[str, tuple[str, ...]], ...]] | None]:
    """The documented rules, by brute force: rank every candidate for every request."""
    info = {n.name: n for n in nodes if n.schedulable}
    free = {name: {c: sorted(cards) for c, cards in n.free.items()} for name, n in info.items()}

    def entirely_free(name: str) -> bool:
        total = info[name].total_cards
        return total > 0 and sum(map(len, free[name].values())) >= total

    runs = {name: set(n.runs) for name, n in info.items()}

    def rank(spec: ModelSpec, name: str, cls: str) -> tuple[bool, bool, bool, int, int, str]:
        g = spec.gpus_per_shard
        on_node = sum(map(len, free[name].values()))
        return (
            spec.name in runs[name],
            spec.name not in info[name].holds,
            entirely_free(name),
            on_node - g,
            len(free[name][cls]) - g,
            name,
        )

    out: list[tuple[str | None, str, tuple[tuple[str, tuple[str, ...]], ...]] | None] = []
    for spec in requests:
        g, k = spec.gpus_per_shard, spec.shards
        classes = [spec.gpu_class] if spec.gpu_class else sorted(CLASSES)
        chosen: tuple[str | None, str, list[str]] | None = None
        if k == 1:
            options = [
                (rank(spec, name, c), c)
                for name in info
                for c in classes
                if len(free[name].get(c, ())) >= g
            ]
            if options:
                (r, c) = min(options)
                chosen = (None, c, [r[5]])
        else:
            best = None
            for fabric in sorted({f for n in info.values() for f in n.fabrics}):
                members = [name for name in info if fabric in info[name].fabrics]
                block = sum(entirely_free(name) for name in members)
                for c in classes:
                    ranked = sorted(
                        rank(spec, name, c) for name in members if len(free[name].get(c, ())) >= g
                    )
                    if len(ranked) < k:
                        continue
                    picked = ranked[:k]
                    used = sum(r[2] for r in picked)
                    score = (
                        sum(r[0] for r in picked),
                        sum(r[1] for r in picked),
                        used,
                        block - used,
                        sum(r[3] for r in picked),
                        fabric,
                        c,
                    )
                    if best is None or score < best[0]:
                        best = (score, [r[5] for r in picked])
            if best is not None:
                chosen = (best[0][5], best[0][6], best[1])
        if chosen is None:
            out.append(None)
            continue
        where, cls, names = chosen
        shards = []
        for name in names:
            taken, free[name][cls] = free[name][cls][:g], free[name][cls][g:]
            runs[name].add(spec.name)
            shards.append((name, tuple(taken)))
        out.append((where, cls, tuple(shards)))
    return out


@SETTINGS
@given(fleets(), st.lists(specs, min_size=1, max_size=10))
def test_agrees_with_the_reference(fleet: Fleet, requests: list[ModelSpec]) -> None:
    got = [
        (r.fabric, r.gpu_class, tuple((s.node, s.gpus) for s in r.shards))
        if isinstance(r, Placement)
        else None
        for r in place_many(requests, fleet.nodes)
    ]
    assert got == reference(requests, fleet.nodes)
