"""The fleet as placement sees it: snapshots, and the picture a pass places on.

Who calls: every step of the reconcile loop that places (`snapshot`,
`wanted_classes`); the shortfall step (`llmgw.controller.shortfalls`) for the
picture it keeps across slices and passes (`picture_in_steps`, `still_free`);
the drain pre-check (`llmgw.controller.drains.drain_plan`). What it may touch:
it only reads the fleet; `snapshot_in_steps` keeps node entries in the loop's
memory (`LoopMemory`, invariant 4).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Generator, Iterable

from llmgw.controller.loop_memory import LoopMemory, Picture
from llmgw.controller.term import Term
from llmgw.scheduler import NodeCapacity, Placement, placer_in_steps
from llmgw.wire import NodeState

__all__ = [
    "NODES_PER_STEP",
    "picture_in_steps",
    "snapshot",
    "snapshot_in_steps",
    "still_free",
    "wanted_classes",
]

# Nodes per step of building the snapshot and the scheduler's index (~2 ms each).
NODES_PER_STEP = 200


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


def wanted_classes(fleet: Term) -> frozenset[str]:
    """The GPU classes declared specs ask for by name: a model that fits on any
    class leaves them to those that need them (llmgw.scheduler, Classes)."""
    return frozenset(s.gpu_class for s in fleet.facts.models.values() if s.gpu_class)


def snapshot_in_steps(
    fleet: Term, memory: LoopMemory, until: float = float("inf")
) -> Generator[None, None, list[NodeCapacity] | None]:
    """`snapshot(fleet, now)`, a step of nodes at a time. A node's entry is
    kept from the last snapshot while nothing placement reads of it has
    changed (`Term.capacity_changed_at`) and the models are the same,
    so a busy fleet costs a rebuild of the nodes that changed, not of all.
    None when time ran out first (past `until`, after a step at least)."""
    weights = tuple(sorted((spec.name, spec.source) for spec in fleet.facts.models.values()))
    memory.keep_nodes_for(weights, fleet.facts.nodes.keys())
    out_of_date = [
        name
        for name in fleet.facts.nodes
        if not memory.node_current(name, fleet.capacity_changed_at(name))
    ]
    for start in range(0, len(out_of_date), NODES_PER_STEP):
        chunk = out_of_date[start : start + NODES_PER_STEP]
        for cap in snapshot(fleet, fleet.facts.clock(), names=chunk):
            memory.keep_node(cap, fleet.capacity_changed_at(cap.name))
        yield
        if start + NODES_PER_STEP < len(out_of_date) and time.perf_counter() > until:
            return None
    return memory.kept_nodes(fleet.facts.nodes)


def picture_in_steps(
    fleet: Term, memory: LoopMemory, basis: int, until: float
) -> Generator[None, None, tuple[Picture, float] | None]:
    """A fresh picture of the fleet as at capacity version `basis`: the snapshot,
    then the scheduler's index, a step of nodes at a time. With it, how long
    its index took to build; None when time ran out during the snapshot (what
    was read is kept for the next pass)."""
    nodes = yield from snapshot_in_steps(fleet, memory, until)
    if nodes is None:
        return None
    building = time.perf_counter()
    place_up_to = yield from placer_in_steps(nodes, NODES_PER_STEP, wanted_classes(fleet))
    return Picture(place_up_to, basis), time.perf_counter() - building


def still_free(fleet: Term, placement: Placement, now: float) -> bool:
    """Whether a placement made on an older picture still fits the fleet as it is."""
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
