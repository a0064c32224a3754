"""Is an engine making progress? Hung means work and no tokens, whatever /health says.

vLLM's API server answers `/health` and `/metrics` for an engine core that does
nothing (a stopped or wedged EngineCore process): health alone cannot see a hang.
The engine's own counters can: a hung engine has requests running or waiting
and its token counters stand still. Its gauges alone do not say so: a stopped
core stops updating them, so a request that arrives after it stopped is never
counted there; the HTTP server's own count (vLLM's /load) is, and is passed in
as `held`. A busy engine is the opposite case: its
`/health` may answer slowly, but its counters move. Pure, like `IdleTracker`:
feed it the samples of successive scrapes, ask how long it has been stalled.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agent.metrics import EngineSample

# Counters that move whenever the engine does work: prefill and decode tokens.
TOKENS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
)
WORK = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
)


def tokens(sample: EngineSample) -> float:
    return sum(sample.counters.get(n, 0.0) for n in TOKENS)


def work(sample: EngineSample) -> int:
    return int(sum(sample.gauges.get(n, 0.0) for n in WORK))


class ProgressWatch:
    """How long an engine has held work without producing a token."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tokens: float | None = None
        self._stalled_since: float | None = None  # None: no work, or tokens just moved
        self.work = 0  # requests running or waiting at the last scrape
        self.moved_at: float | None = None  # when the token counters last moved

    def observe(self, sample: EngineSample, held: int | None = None) -> None:
        """One scrape; `held`: requests the engine's HTTP server holds, when it says."""
        now = self._clock()
        count, self.work = tokens(sample), max(work(sample), held or 0)
        moved = self._tokens is not None and count != self._tokens  # a fall is a restart
        self._tokens = count
        if moved:
            self.moved_at = now
        if self.work <= 0 or moved:
            self._stalled_since = None
        elif self._stalled_since is None:
            self._stalled_since = now

    def stalled_s(self) -> float:
        """Seconds with work in the engine and token counters still; 0 when not stalled."""
        if self._stalled_since is None:
            return 0.0
        return self._clock() - self._stalled_since

    def moved_since(self, since: float) -> bool:
        return self.moved_at is not None and self.moved_at >= since
