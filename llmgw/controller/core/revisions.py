"""Model revisions: what each model's engines ran, numbered, with who changed it.

A model's revision moves when a field the engine sees changes (`ENGINE_FIELDS`);
fields that only set counts or policy (replicas, surge, unavailability) move
nothing, so applying them restarts nothing. Each replica records the revision it
was placed at and keeps that revision's engine fields in its assignment for as
long as it lives: a changed spec is rolled out by placing new replicas and
stopping old ones (`llmgw.controller.core.rollout`), never by restarting in place.

`Revisions` is the in-memory history, owned by `Facts` (facts.py), which writes
each new revision to the store in the same transaction as the spec. The store keeps
the last `KEPT` revisions of each model (as Kubernetes keeps ten ReplicaSets).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from llmgw.controller.core.admin_flags import BY_LLMGW
from llmgw.errors import BadRequest
from llmgw.wire import ModelRevision, ModelSpec

__all__ = [
    "ENGINE_FIELDS",
    "KEPT",
    "SEEDED",
    "Revisions",
    "describe_change",
    "same_engine",
    "undone",
]

# `sleeps`: whether the engine starts able to sleep (vLLM's --enable-sleep-mode); how
# long an idle replica waits before it sleeps is policy, and moves nothing.
ENGINE_FIELDS = (
    "source",
    "engine",
    "engine_args",
    "gpus_per_shard",
    "shards",
    "gpu_class",
    "sleeps",
    "gpu_memory_share",
)
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
    """Each declared model's revisions, oldest first. Read by the views and the
    reconcile loop; changed only through `Facts`."""

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

    def created_by(
        self,
        models: Mapping[str, ModelSpec],
        specs: list[ModelSpec],
        by: str,
        at: float,
        why: str | None = None,
    ) -> list[ModelRevision]:
        """The revisions applying `specs` over `models` creates: one per spec whose
        engine fields change (and a first one for a new model). A model declared
        before revisions were kept first gets revision 1 for the spec it had, which
        its replicas run. `why`: said before each new revision's change (an undo)."""
        out = []
        for spec in specs:
            old = models.get(spec.name)
            current = self.current(spec.name)
            if old is not None and current == 0:
                out.append(ModelRevision(revision=1, at=at, by=BY_LLMGW, change=SEEDED, spec=old))
                current = 1
            if old is None or current == 0 or not same_engine(old, spec):
                change = describe_change(old, spec)
                if why is not None:
                    change = f"{why}: {change}"
                out.append(
                    ModelRevision(revision=current + 1, at=at, by=by, change=change, spec=spec)
                )
        return out


def undone(revisions: Revisions, spec: ModelSpec, to_revision: int | None) -> tuple[ModelSpec, int]:
    """What `ctl rollout undo` applies: the current spec with an earlier revision's
    engine fields (the last one before the current, or `to_revision`), and that
    revision's number. Counts and policy stay as they are now, as `kubectl rollout
    undo` keeps the replica count. `BadRequest` when there is nothing to go back to."""
    model = spec.name
    current = revisions.current(model)
    kept = [r for r in revisions.history(model) if r.revision < current]
    if to_revision is None:
        if not kept:
            raise BadRequest(f"{model} has no earlier revision to go back to")
        target = kept[-1]
    else:
        found = [r for r in kept if r.revision == to_revision]
        if not found:
            have = ", ".join(str(r.revision) for r in kept) or "none"
            raise BadRequest(
                f"revision {to_revision} of {model} is not an earlier revision kept "
                f"(current {current}; earlier kept: {have})"
            )
        target = found[0]
    back = spec.model_copy(update={f: getattr(target.spec, f) for f in ENGINE_FIELDS})
    if same_engine(back, spec):
        raise BadRequest(
            f"{model} already runs what revision {target.revision} ran: nothing to undo"
        )
    return back, target.revision
