"""How each model's replicas came to serve (issue 32 item 5): woken (hot, per sleep
level), or an engine started where the weights were (warm) or were not (cold);
counted when the start reaches ready, with how long the last of each took. The store
first, then this memory; read by `ctl models`, the console and `/metrics`."""

from __future__ import annotations

from dataclasses import replace

from llmgw.controller.core.records import StartCount
from llmgw.controller.store.base import StateStore
from llmgw.wire import ModelStarts, StartKind


def key_words(kind: StartKind, level: int) -> str:
    """`hot-1`, `warm`: how `ModelStarts.last_s` names a kind (and level)."""
    return f"{kind.value}-{level}" if level else kind.value


class Starts:
    def __init__(self, store: StateStore) -> None:
        self._store = store
        # model -> (kind, level) -> its count: a model's view reads its own only.
        self._counts: dict[str, dict[tuple[StartKind, int], StartCount]] = {}
        for c in store.starts():
            self._counts.setdefault(c.model, {})[c.kind, c.level] = c

    def count(
        self, model: str, kind: StartKind, level: int, seconds: float | None, *, at: float
    ) -> None:
        self._store.count_start(model, kind, level, seconds, at=at)
        mine = self._counts.setdefault(model, {})
        old = mine.get((kind, level)) or StartCount(model, kind, level, 0, None, None)
        mine[kind, level] = replace(old, count=old.count + 1, last_s=seconds, last_at=at)

    def forget(self, model: str) -> None:
        """A deleted model's counts (the store drops them with it)."""
        self._counts.pop(model, None)

    def all(self) -> list[StartCount]:
        return sorted(
            (c for mine in self._counts.values() for c in mine.values()),
            key=lambda c: (c.model, c.kind.value, c.level),
        )

    def of(self, model: str) -> ModelStarts:
        by_kind = dict.fromkeys(StartKind, 0)
        last: dict[str, float] = {}
        for (kind, level), c in sorted(self._counts.get(model, {}).items()):
            by_kind[kind] += c.count
            if c.last_s is not None:
                last[key_words(kind, level)] = round(c.last_s, 2)
        return ModelStarts(
            hot=by_kind[StartKind.HOT],
            warm=by_kind[StartKind.WARM],
            cold=by_kind[StartKind.COLD],
            last_s=last,
        )
