"""Reclaim by priority: room for a model short of its minimum, taken from
replicas of lower-priority models above their own minimum.

Who calls: the reconcile loop (`llmgw.controller.loop.demand.reclaim`), once a pass, for the
highest-priority model that is short and cannot be placed. `choose` is pure:
it picks; the loop marks the picked replicas leaving (out of routing, stopped
once the gateways let go, as a scale-down) and the short model is placed by
the usual shortfall step once their cards are free. While it is short, models
of lower priority do not grow (`shortfalls.shortfalls`), so the room goes to it.

The rules:

- only from models of strictly lower priority, never below their minimum;
- sleeping replicas first (they serve nothing; stopped at once), then idle ones
  (`IDLE_AFTER_S`, as the summary's idle list), then the least busy, then the
  lowest priority, then the newest (the coldest cache);
- the fewest that make one replica of the short model fit, taken in that order;
  none at all when even every candidate would not make it fit;
- at most `MAX_CANDIDATES` candidates looked at in one pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

from llmgw.controller.core.records import ReplicaRecord
from llmgw.scheduler import NodeCapacity, Placement, place
from llmgw.wire import ModelSpec, ReplicaState

__all__ = ["MAX_CANDIDATES", "Candidate", "choose", "reclaimed_words"]

MAX_CANDIDATES = 64


def reclaimed_words(model: str, priority: int) -> str:
    """Why a reclaimed replica leaves, for a person (code reads `LeaveReason.RECLAIM`)."""
    return f"reclaimed for {model} (priority {priority})"


class Candidate(NamedTuple):
    record: ReplicaRecord
    spec: ModelSpec  # its model's
    idle: bool
    in_flight: int


def order(candidates: Sequence[Candidate]) -> list[Candidate]:
    return sorted(
        candidates,
        key=lambda c: (
            c.record.state is not ReplicaState.SLEEPING,
            not c.idle,
            c.in_flight,
            c.spec.priority,
            -c.record.created_at,
            c.record.id,
        ),
    )


def choose(
    short: ModelSpec,
    candidates: Sequence[Candidate],
    staying: Mapping[str, int],
    nodes: Sequence[NodeCapacity],
    card_class: Mapping[str, str],
) -> list[ReplicaRecord] | None:
    """The replicas to stop so that one replica of `short` fits, or None.

    `staying`: each model's replicas that are not leaving (a model is never
    taken below its minimum); `card_class`: each card's class, to give a
    stopped replica's cards back to its nodes."""
    by_name = {n.name: n for n in nodes}
    taken: Counter[str] = Counter()
    picked: list[ReplicaRecord] = []
    looked = 0
    for c in order(candidates):
        if looked >= MAX_CANDIDATES:
            break
        if c.spec.priority >= short.priority:
            continue
        if staying.get(c.spec.name, 0) - taken[c.spec.name] <= c.spec.min_replicas:
            continue
        looked += 1
        taken[c.spec.name] += 1
        picked.append(c.record)
        for shard in c.record.shards:
            node = by_name.get(shard.node)
            if node is None:
                continue
            free = {cls: list(uuids) for cls, uuids in node.free.items()}
            for uuid in shard.gpus:
                free.setdefault(card_class.get(uuid, ""), []).append(uuid)
            by_name[shard.node] = replace(
                node, free={cls: tuple(sorted(u)) for cls, u in free.items()}
            )
        if isinstance(place(short, by_name.values()), Placement):
            return picked
    return None
