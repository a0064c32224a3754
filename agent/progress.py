"""Is an engine making progress? Hung means work and no tokens, whatever /health says.

vLLM's API server answers `/health` and `/metrics` for an engine core that does
nothing (a stopped or wedged EngineCore process): health alone cannot see a hang.
The engine's own counters can: a hung engine has requests running or waiting
and its token counters stand still. Its gauges alone do not say so: a stopped
core stops updating them, so a request that arrives after it stopped is never
counted there; the HTTP server's own count (vLLM's /load) is, and comes in the
sample (`EngineSample.in_flight` takes the higher of the two). A busy engine is
the opposite case: its `/health` may answer slowly, but its counters move. Pure, like `IdleTracker`:
feed it the samples of successive scrapes, ask how long it has been stalled.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from llmgw.agent.metrics import EngineSample

# Counters that move whenever the engine does work: prefill and decode tokens.
TOKENS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
)


def tokens(sample: EngineSample) -> float:
    return sum(sample.counters.get(n, 0.0) for n in TOKENS)


class ProgressWatch:
    """How long an engine has held work without producing a token."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tokens: float | None = None
        self._stalled_since: float | None = None  # None: no work, or tokens just moved
        self.work = 0  # requests running or waiting at the last scrape
        self.moved_at: float | None = None  # when the token counters last moved

    def observe(self, sample: EngineSample) -> None:
        """One scrape (with the server's count of what it holds, where read)."""
        now = self._clock()
        count, self.work = tokens(sample), sample.in_flight
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


# Under this much CPU in its process group since its last sign of progress, a
# starting engine that writes nothing is not moving (an engine waiting on a
# socket or a child uses hundredths of a second a minute).
START_CPU_S = 1.0


class StartWatch:
    """How long a starting engine has shown no sign of progress: nothing new in its
    log and under START_CPU_S of CPU in its process group. Downloading, loading and
    compiling each show as one or the other. Neither, for minutes, is a start that
    will not finish (seen: a vLLM process parked in the kernel by a CPU-affinity
    change, silent and idle for good), which only the start timeout would end, half
    an hour later. Pure, like `ProgressWatch`: feed it looks, ask how long it has
    been quiet."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since = clock()  # the last sign of progress (the start, at first)
        self._log_bytes: int | None = None
        self._cpu_base: float | None = None  # CPU seconds at the last sign

    def observe(self, log_bytes: int | None, cpu_s: float | None) -> None:
        """One look: the log's size and the process group's CPU seconds (None: unknown)."""
        moved = False
        if log_bytes is not None:
            moved = self._log_bytes is not None and log_bytes != self._log_bytes
            self._log_bytes = log_bytes
        if cpu_s is not None:
            if self._cpu_base is None or cpu_s < self._cpu_base:
                self._cpu_base = cpu_s  # the first look, or a busy child exited: count anew
            elif cpu_s - self._cpu_base >= START_CPU_S:
                moved = True
        if moved:
            self._since = self._clock()
            if cpu_s is not None:
                self._cpu_base = cpu_s

    def quiet_s(self) -> float:
        """Seconds since the engine started or last showed progress."""
        return self._clock() - self._since
