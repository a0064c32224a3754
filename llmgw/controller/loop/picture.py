"""The fleet as placement sees it: snapshots, and the picture a pass places on.

Who calls: the shortfall step (`llmgw.controller.loop.shortfalls`) for the picture
it keeps across slices and passes (`picture_in_steps`). The other steps place
on `FleetSnapshot.capacity`, built by the same `node_capacity`. It only reads
the term; `snapshot_in_steps` keeps node entries in the loop's memory
(`LoopMemory`, invariant 4).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable

from llmgw.controller.loop.fleet_snapshot import node_capacity, weights_index
from llmgw.controller.loop.loop_memory import LoopMemory, Picture
from llmgw.controller.term import Term
from llmgw.scheduler import NodeCapacity, placer_in_steps
from llmgw.wire import NodeState

__all__ = [
    "NODES_PER_STEP",
    "picture_in_steps",
    "snapshot",
    "snapshot_in_steps",
    "wanted_classes",
]

# Nodes per step of building the snapshot and the scheduler's index: a step is
# short enough to leave the event loop free between them (bench_reconcile.py).
NODES_PER_STEP = 200


def snapshot(
    term: Term,
    now: float,
    excluded: Iterable[str] = (),
    names: Iterable[str] | None = None,
) -> list[NodeCapacity]:
    """What placement may use: healthy idle cards not held by any replica (of
    the nodes named, when `names` is given; those gone meanwhile are left out)."""
    excluded = set(excluded)
    # A node holds a model when it has weights under the model's name or source:
    # looked up per weight held, not per declared model (200 models x 2,000 nodes).
    facts = term.facts
    by_weights = weights_index(facts.models.values())
    out = []
    entries = facts.nodes
    for name in entries if names is None else names:
        entry = entries.get(name)
        if entry is None:
            continue
        schedulable = name not in excluded and facts.state_of(name, now) is NodeState.READY
        out.append(node_capacity(name, entry, facts.replicas_on(name), by_weights, schedulable))
    return out


def wanted_classes(term: Term) -> frozenset[str]:
    """The GPU classes declared specs ask for by name: a model that fits on any
    class leaves them to those that need them (llmgw.scheduler, Classes)."""
    return frozenset(s.gpu_class for s in term.facts.models.values() if s.gpu_class)


def snapshot_in_steps(
    term: Term, memory: LoopMemory, until: float = float("inf")
) -> Generator[None, None, list[NodeCapacity] | None]:
    """`snapshot(term, now)`, a step of nodes at a time. A node's entry is
    kept from the last snapshot while nothing placement reads of it has
    changed (`Term.capacity_changed_at`) and the models are the same,
    so a busy fleet costs a rebuild of the nodes that changed, not of all.
    None when time ran out first (past `until`, after a step at least)."""
    weights = tuple(sorted((spec.name, spec.source) for spec in term.facts.models.values()))
    memory.keep_nodes_for(weights, term.facts.nodes.keys())
    out_of_date = [
        name
        for name in term.facts.nodes
        if not memory.node_current(name, term.capacity_changed_at(name))
    ]
    for start in range(0, len(out_of_date), NODES_PER_STEP):
        chunk = out_of_date[start : start + NODES_PER_STEP]
        for cap in snapshot(term, term.facts.clock(), names=chunk):
            memory.keep_node(cap, term.capacity_changed_at(cap.name))
        yield
        if start + NODES_PER_STEP < len(out_of_date) and time.perf_counter() > until:
            return None
    return memory.kept_nodes(term.facts.nodes)


def picture_in_steps(
    term: Term, memory: LoopMemory, basis: int, until: float
) -> Generator[None, None, tuple[Picture, float] | None]:
    """A fresh picture of the fleet as at capacity version `basis`: the snapshot,
    then the scheduler's index, a step of nodes at a time. With it, how long
    its index took to build; None when time ran out during the snapshot (what
    was read is kept for the next pass)."""
    nodes = yield from snapshot_in_steps(term, memory, until)
    if nodes is None:
        return None
    building = time.perf_counter()
    place_up_to = yield from placer_in_steps(nodes, NODES_PER_STEP, wanted_classes(term))
    return Picture(place_up_to, basis), time.perf_counter() - building
