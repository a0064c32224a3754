"""Model revisions: what each model's engines ran, numbered, with who changed it.

A model's revision moves when a field the engine sees changes (`ENGINE_FIELDS`);
fields that only set counts or policy (replicas, surge, unavailability) move
nothing, so applying them restarts nothing. Each replica records the revision it
was placed at and keeps that revision's engine fields in its assignment for as
long as it lives: a changed spec is rolled out by placing new replicas and
stopping old ones (`llmgw.controller.rollout`), never by restarting in place.

`Revisions` is the in-memory history, owned by `FleetState`, which writes each
new revision to the store in the same transaction as the spec. The store keeps
the last `KEPT` revisions of each model (as Kubernetes keeps ten ReplicaSets).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from llmgw.wire import ModelRevision, ModelSpec

__all__ = ["ENGINE_FIELDS", "KEPT", "SEEDED", "Revisions", "describe_change", "same_engine"]

ENGINE_FIELDS = ("source", "engine", "engine_args", "gpus_per_shard", "shards", "gpu_class")
KEPT = 10
# The change a model declared before revisions were kept gets as its revision 1.
SEEDED = "as declared before revisions were kept"


def engine_fields(spec: ModelSpec) -> tuple[Any, ...]:
    return tuple(tuple(v) if isinstance(v := getattr(spec, f), list) else v for f in ENGINE_FIELDS)


def same_engine(a: ModelSpec, b: ModelSpec) -> bool:
    return engine_fields(a) == engine_fields(b)


def describe_change(old: ModelSpec | None, new: ModelSpec) -> str:
    """`engine_args: --load-seconds 5 -> --load-seconds 6`, one clause per field."""
    if old is None:
        return "created"
    parts = []
    for field in ENGINE_FIELDS:
        before, after = getattr(old, field), getattr(new, field)
        if before != after:
            parts.append(f"{field}: {_shown(before)} -> {_shown(after)}")
    return "; ".join(parts) or "no engine change"


def _shown(value: object) -> str:
    if isinstance(value, list):
        return " ".join(value) if value else "(none)"
    return "(none)" if value is None else str(value)


class Revisions:
    """Each declared model's revisions, oldest first. Read by the fleet's views
    and the reconcile loop; changed only through `FleetState`."""

    def __init__(self, stored: Mapping[str, list[ModelRevision]]) -> None:
        self._by_model: dict[str, list[ModelRevision]] = {m: list(rs) for m, rs in stored.items()}

    def current(self, model: str) -> int:
        """The model's revision now (0: none recorded, a model from before revisions)."""
        revs = self._by_model.get(model)
        return revs[-1].revision if revs else 0

    def history(self, model: str) -> list[ModelRevision]:
        return list(self._by_model.get(model, ()))

    def spec(self, model: str, revision: int) -> ModelSpec | None:
        """The spec a revision was created with (None: not kept)."""
        for rev in self._by_model.get(model, ()):
            if rev.revision == revision:
                return rev.spec
        return None

    def add(self, revisions: Iterable[ModelRevision]) -> None:
        for rev in revisions:
            kept = self._by_model.setdefault(rev.spec.name, [])
            kept.append(rev)
            del kept[:-KEPT]

    def forget(self, model: str) -> None:
        self._by_model.pop(model, None)
