"""How late the agent's own event loop runs: a busy node is not a hung engine.

On a loaded node (load average 11 in the demo) the agent's timers fire late,
so a `/health` check can time out for the agent's sake, not the engine's. The
supervisor's monitor records how late each of its sleeps woke; a check that
timed out while the loop ran late by a good part of the timeout is not held
against the engine.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class LoopLag:
    """The largest lateness seen over the last `window_s` seconds."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._seen: deque[tuple[float, float]] = deque()

    def record(self, late_s: float) -> None:
        now = self._clock()
        self._seen.append((now, max(0.0, late_s)))
        while self._seen and now - self._seen[0][0] > self.window_s:
            self._seen.popleft()

    def worst_s(self) -> float:
        now = self._clock()
        return max((late for at, late in self._seen if now - at <= self.window_s), default=0.0)
