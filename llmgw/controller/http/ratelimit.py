"""A token bucket: at most `rate` per second on average, bursts of `burst`.

One bucket per limited route, shared by every caller: a limit per address would
let anyone with many addresses through, and what is bounded is the controller's
work (a credential written per enrollment), whoever asks.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self._clock = clock
        self._level = self.burst
        self._at = clock()

    def take(self) -> float:
        """Take one: 0 when there was one, else the seconds until there is (nothing taken)."""
        now = self._clock()
        self._level = min(self.burst, self._level + (now - self._at) * self.rate)
        self._at = now
        if self._level >= 1:
            self._level -= 1
            return 0.0
        return (1 - self._level) / self.rate


class Once:
    """Says yes for a key at most once per `every_s` (events of refusals a caller can
    repeat); remembers at most `max_keys`, forgetting the oldest first."""

    def __init__(
        self, every_s: float, max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = every_s
        self.max_keys = max_keys
        self._clock = clock
        self._last: dict[str, float] = {}

    def due(self, key: str) -> bool:
        now = self._clock()
        last = self._last.pop(key, None)  # re-inserted last: the dict stays oldest first
        if last is not None and now - last < self.every_s:
            self._last[key] = last
            return False
        self._last[key] = now
        while len(self._last) > self.max_keys:
            del self._last[next(iter(self._last))]
        return True
