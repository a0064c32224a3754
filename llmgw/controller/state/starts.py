"""How each model's replicas came to serve (issue 32 item 5): woken (hot, per sleep
level), or an engine started where the weights were (warm) or were not (cold);
counted when the start reaches ready, with how long the last of each took. The store
first, then this memory; read by `ctl models`, the console and `/metrics`."""

from __future__ import annotations

from dataclasses import replace

from llmgw.controller.core.records import StartCount
from llmgw.controller.store.base import StateStore
from llmgw.wire import ModelStarts, StartKind

Key = tuple[str, StartKind, int]  # model, kind, sleep level (0 but for hot)


def key_words(kind: StartKind, level: int) -> str:
    """`hot-1`, `warm`: how `ModelStarts.last_s` names a kind (and level)."""
    return f"{kind.value}-{level}" if level else kind.value


class Starts:
    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._counts: dict[Key, StartCount] = {
            (c.model, c.kind, c.level): c for c in store.starts()
        }

    def count(
        self, model: str, kind: StartKind, level: int, seconds: float | None, *, at: float
    ) -> None:
        self._store.count_start(model, kind, level, seconds, at=at)
        key = (model, kind, level)
        old = self._counts.get(key) or StartCount(model, kind, level, 0, None, None)
        self._counts[key] = replace(old, count=old.count + 1, last_s=seconds, last_at=at)

    def forget(self, model: str) -> None:
        """A deleted model's counts (the store drops them with it)."""
        for key in [k for k in self._counts if k[0] == model]:
            del self._counts[key]

    def all(self) -> list[StartCount]:
        return sorted(self._counts.values(), key=lambda c: (c.model, c.kind.value, c.level))

    def of(self, model: str) -> ModelStarts:
        by_kind = {kind: 0 for kind in StartKind}
        last: dict[str, float] = {}
        for (name, kind, level), c in sorted(self._counts.items()):
            if name != model:
                continue
            by_kind[kind] += c.count
            if c.last_s is not None:
                last[key_words(kind, level)] = round(c.last_s, 2)
        return ModelStarts(
            hot=by_kind[StartKind.HOT],
            warm=by_kind[StartKind.WARM],
            cold=by_kind[StartKind.COLD],
            last_s=last,
        )
