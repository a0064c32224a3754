"""Engine idleness from the engine's own Prometheus counters.

Two pieces, kept apart so the rules are testable without a network:

* `parse_engine_metrics` turns a `/metrics` body (vLLM or SGLang) into a
  small `EngineSample` using prometheus_client's text parser.
* `IdleTracker` is pure: feed it samples, ask how long the engine has been idle.

The rules (DESIGN.md, "Replica"):

* Active when any known gauge (requests running or queued) is above 0, or any
  known counter rose since the previous good scrape.
* A counter that fell means the engine restarted. The baseline is reset to the
  new values. The fall is not activity in itself, but whatever the restarted
  engine has counted already (a new value above 0) happened after the previous
  scrape, because the previous scrape still saw the old process, so it counts.
* Idle seconds run on the monotonic clock from the last activity. Before the
  first good scrape idleness is unknown (None), and the first good scrape only
  starts the clock: we never claim idle time we did not observe.
* A failed scrape changes nothing: an engine that does not answer is neither
  idle nor active.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

# Sample names as they appear on the wire. prometheus_client strips `_total`
# from a counter *family* name but keeps it on the samples, so we match samples.
GAUGES: frozenset[str] = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
    }
)
COUNTERS: frozenset[str] = frozenset(
    {
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "sglang:num_requests_total",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    }
)
# The latency histograms the traffic view's p50 is read from (agent/traffic.py): time
# to first token has fine buckets (vLLM: from 1 ms); end to end starts at 0.3 s in vLLM.
LATENCY_BUCKETS: frozenset[str] = frozenset(
    {"vllm:e2e_request_latency_seconds_bucket", "sglang:e2e_request_latency_seconds_bucket"}
)
TTFT_BUCKETS: frozenset[str] = frozenset(
    {"vllm:time_to_first_token_seconds_bucket", "sglang:time_to_first_token_seconds_bucket"}
)

MAX_METRICS_BYTES = 4 * 1024 * 1024  # an engine's /metrics is tens of KiB; refuse a flood
DEFAULT_SCRAPE_TIMEOUT_S = 2.0
MAX_LOAD_BYTES = 4096  # {"server_load": N}


@dataclass(frozen=True)
class EngineSample:
    """Known gauges and counters of one scrape, summed over their label sets."""

    gauges: Mapping[str, float] = field(default_factory=dict)
    counters: Mapping[str, float] = field(default_factory=dict)
    # Cumulative request counts by upper bound (`le`, +Inf included) of the
    # end-to-end latency histogram; empty when the engine exports none.
    latency_buckets: Mapping[float, float] = field(default_factory=dict)
    # The same for the time-to-first-token histogram.
    ttft_buckets: Mapping[float, float] = field(default_factory=dict)
    # Requests the engine's HTTP server holds (vLLM's `/load`), where its template
    # reads it; None: not read. A stopped engine core keeps its gauges at their last
    # values (often 0), so only this count sees the requests waiting in it.
    server_load: int | None = None

    @property
    def in_flight(self) -> int:
        """Requests in the engine: its gauges (running and queued) or its server's
        count, whichever is higher."""
        return max(int(sum(self.gauges.values())), self.server_load or 0)


def parse_engine_metrics(text: str) -> EngineSample | None:
    """Parse a Prometheus text body; None when it is malformed or has no known metric.

    Label sets are summed: vLLM labels request_success by finished_reason and
    may label per engine; idleness only cares about the total.
    """
    gauges: dict[str, float] = {}
    counters: dict[str, float] = {}
    buckets: dict[float, float] = {}
    ttft: dict[float, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in GAUGES:
                    gauges[sample.name] = gauges.get(sample.name, 0.0) + float(sample.value)
                elif sample.name in COUNTERS:
                    counters[sample.name] = counters.get(sample.name, 0.0) + float(sample.value)
                elif sample.name in LATENCY_BUCKETS:
                    le = float(sample.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + float(sample.value)
                elif sample.name in TTFT_BUCKETS:
                    le = float(sample.labels["le"])
                    ttft[le] = ttft.get(le, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        log.debug("unparseable metrics: %s", exc)
        return None
    if not gauges and not counters:
        return None
    return EngineSample(
        gauges=gauges, counters=counters, latency_buckets=buckets, ttft_buckets=ttft
    )


def counters_fell(before: Mapping[str, float], after: Mapping[str, float]) -> bool:
    """A counter below its earlier value: the engine restarted in between."""
    return any(v < before.get(k, 0.0) for k, v in after.items())


class IdleTracker:
    """Idle time of one engine from successive samples. Pure; the clock is injectable."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._baseline: dict[str, float] | None = None
        self._last_activity: float | None = None
        self.restarts = 0  # counter falls seen: how often the engine restarted under us

    def observe(self, sample: EngineSample) -> bool:
        """Record a good scrape; returns whether it showed activity."""
        now = self._clock()
        active = sample.in_flight > 0
        counters = dict(sample.counters)
        if self._baseline is None:
            # First reading: start the clock now, whatever the counters say. Never
            # earlier: idleness is only what was observed, never more than the engine's age.
            self._baseline = counters
            self._last_activity = now
            return active
        if counters_fell(self._baseline, counters):
            self.restarts += 1
            # Restarted since the previous scrape: anything it counted is recent.
            active = active or any(v > 0 for v in counters.values())
        else:
            # A counter seen for the first time rose from an implicit 0.
            active = active or any(v > self._baseline.get(k, 0.0) for k, v in counters.items())
        # Keep names that vanished from this scrape, so their return is not a rise.
        self._baseline = {**self._baseline, **counters}
        if active:
            self._last_activity = now
        return active

    def idle_seconds(self) -> float | None:
        """Seconds since the last activity; None before the first good scrape."""
        if self._last_activity is None:
            return None
        return max(0.0, self._clock() - self._last_activity)


async def scrape(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S,
    headers: Mapping[str, str] | None = None,
) -> EngineSample | None:
    """Fetch and parse one engine's /metrics; None on any failure (never raises)."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url, timeout=timeout, headers=headers) as resp:
            if resp.status != 200:
                return None
            body = await resp.content.read(MAX_METRICS_BYTES + 1)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        log.debug("scrape %s failed: %s", url, exc)
        return None
    if len(body) > MAX_METRICS_BYTES:
        log.warning("scrape %s: body over %d bytes, ignored", url, MAX_METRICS_BYTES)
        return None
    return parse_engine_metrics(body.decode("utf-8", errors="replace"))


async def server_load(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S,
    headers: Mapping[str, str] | None = None,
) -> int | None:
    """The requests an engine's HTTP server holds (vLLM's `/load`: {"server_load": N});
    None on any failure or an answer of another shape (never raises)."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url, timeout=timeout, headers=headers) as resp:
            if resp.status != 200:
                return None
            raw = await resp.content.read(MAX_LOAD_BYTES + 1)
        body = json.loads(raw) if len(raw) <= MAX_LOAD_BYTES else None
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        log.debug("load %s failed: %s", url, exc)
        return None
    value = body.get("server_load") if isinstance(body, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
