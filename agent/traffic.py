"""An engine's traffic from its own Prometheus counters: requests per second,
requests in flight, median latency and prefix-cache hit rate.

Pure, like `IdleTracker`: feed it the samples of successive scrapes
(`llmgw.agent.metrics.EngineSample`), ask for the figures over the last window.
Rates come from counter differences between the oldest and newest sample in
the window, so one scrape's jitter does not swing them; a counter that falls
(the engine restarted) starts the window again. The median is read from the
finest latency histogram the engine exports: time to first token (vLLM's
buckets start at 1 ms), else end to end (vLLM's start at 0.3 s), from bucket
differences, interpolated inside the bucket as Prometheus's `histogram_quantile`
does, except in the first bucket: there nothing says how far below its bound
the requests were, so the bound is reported, marked as a bound (vLLM's fast
requests would otherwise all read 150 ms, half of 0.3 s).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Literal

from llmgw.agent.metrics import EngineSample, counters_fell
from llmgw.wire import EngineTraffic

WINDOW_S = 30.0
REQUESTS = ("vllm:request_success_total", "sglang:num_requests_total")
CACHE_QUERIES = "vllm:prefix_cache_queries_total"
CACHE_HITS = "vllm:prefix_cache_hits_total"


def _sum(values: Mapping[str, float], names: tuple[str, ...]) -> float:
    return sum(values.get(n, 0.0) for n in names)


def quantile(q: float, buckets: Mapping[float, float]) -> tuple[float, bool] | None:
    """The q-quantile of a cumulative histogram ({upper bound: count}) and whether it is
    only an upper bound (it lies in the first bucket); None when empty."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for i, bound in enumerate(bounds):
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower, False  # in the open top bucket: its lower edge is all we know
            if i == 0:
                return bound, True  # below the first bound: how far below is unknown
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0), False
        lower, below = bound, count
    return lower, False


def _delta(first: Mapping[float, float], last: Mapping[float, float]) -> dict[float, float]:
    return {le: n - first.get(le, 0.0) for le, n in last.items()}


Metric = Literal["ttft", "e2e"]


def median(first: EngineSample, last: EngineSample) -> tuple[float, bool, Metric] | None:
    """(p50, only an upper bound, which metric) over the window; TTFT when exported."""
    ttft = quantile(0.5, _delta(first.ttft_buckets, last.ttft_buckets))
    if ttft is not None:
        return (*ttft, "ttft")
    e2e = quantile(0.5, _delta(first.latency_buckets, last.latency_buckets))
    return None if e2e is None else (*e2e, "e2e")


class TrafficMeter:
    """Traffic of one engine over the last `window_s` seconds of scrapes."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, window_s: float = WINDOW_S
    ) -> None:
        self._clock = clock
        self._window_s = window_s
        self._samples: deque[tuple[float, EngineSample]] = deque()

    def observe(self, sample: EngineSample) -> None:
        now = self._clock()
        if self._samples and counters_fell(self._samples[-1][1].counters, sample.counters):
            self._samples.clear()  # restarted: its counters began again from zero
        self._samples.append((now, sample))
        # Keep one sample older than the window, so the window is always spanned.
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window_s:
            self._samples.popleft()

    @property
    def busy(self) -> bool:
        """The last scrape saw requests in it (running or queued)."""
        return bool(self._samples) and self._samples[-1][1].in_flight > 0

    def traffic(self) -> EngineTraffic | None:
        """The figures, or None before two scrapes have been seen."""
        if len(self._samples) < 2:
            return None
        (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        span = t1 - t0
        if span <= 0:
            return None
        served = _sum(last.counters, REQUESTS) - _sum(first.counters, REQUESTS)
        queries = last.counters.get(CACHE_QUERIES, 0.0) - first.counters.get(CACHE_QUERIES, 0.0)
        hits = last.counters.get(CACHE_HITS, 0.0) - first.counters.get(CACHE_HITS, 0.0)
        p50 = median(first, last)
        return EngineTraffic(
            requests_per_s=round(max(0.0, served) / span, 3),
            in_flight=last.in_flight,  # running and queued, or the server's count (`/load`)
            p50_latency_s=None if p50 is None else round(p50[0], 4),
            p50_upper_bound=p50 is not None and p50[1],
            p50_metric=None if p50 is None else p50[2],
            prefix_hit_rate=round(min(1.0, hits / queries), 4) if queries > 0 else None,
        )
