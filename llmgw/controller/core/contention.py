"""`Contention`: the warm tier's switches on each card lately, and the models moved.

A switch (`loop.warm`) puts the awake replica on a card to sleep so that a sleeping
one of another model wakes there. Two models that keep switching each other out on
one card are both popular, and each of their requests waits for the other to make
way; the spread step (`loop.spread`) moves one of them to a quieter card. It reads
what this keeps: each card's switches over the last `WINDOW_S`, and when each model
was last moved (or its move called off), so that a model is not moved again within
the window.

Soft state of the term, like `Decisions`: a new term starts without it and learns
it again from its own switches.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import NamedTuple

# How far back switches count, and how long a moved model stays where it went.
WINDOW_S = 120.0

Card = tuple[str, str]  # (node, GPU uuid)


class Switch(NamedTuple):
    at: float  # controller monotonic time
    out: str  # the model put to sleep
    woken: str  # the model woken in its place


class Contention:
    def __init__(self) -> None:
        self._switches: dict[Card, deque[Switch]] = {}
        self._moved: dict[str, float] = {}  # model -> when last moved or called off

    def switched(self, card: Card, out: str, woken: str, at: float) -> None:
        self._switches.setdefault(card, deque()).append(Switch(at, out, woken))
        self._forget_before(at - WINDOW_S)

    def moved(self, model: str, at: float) -> None:
        self._moved[model] = at

    def recent(self, now: float) -> Mapping[Card, tuple[Switch, ...]]:
        """Each card's switches in the last `WINDOW_S`, oldest first."""
        self._forget_before(now - WINDOW_S)
        return {card: tuple(seen) for card, seen in self._switches.items()}

    def moved_lately(self, now: float) -> frozenset[str]:
        """Models moved (or whose move was called off) in the last `WINDOW_S`."""
        return frozenset(m for m, at in self._moved.items() if now - at < WINDOW_S)

    def _forget_before(self, horizon: float) -> None:
        for card in list(self._switches):
            seen = self._switches[card]
            while seen and seen[0].at < horizon:
                seen.popleft()
            if not seen:
                del self._switches[card]
        for model in [m for m, at in self._moved.items() if at < horizon]:
            del self._moved[model]
