"""An engine's traffic from its counters (agent/traffic.py), against the
fake engine's real /metrics body as well as hand-made samples."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from llmgw.agent.fake_engine import EngineMetrics
from llmgw.agent.metrics import EngineSample, parse_engine_metrics
from llmgw.agent.traffic import TrafficMeter, quantile


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def sample(served: float, running: float = 0, queries: float = 0, hits: float = 0,
           buckets: dict[float, float] | None = None) -> EngineSample:  # fmt: skip
    return EngineSample(
        gauges={"vllm:num_requests_running": running},
        counters={
            "vllm:request_success_total": served,
            "vllm:prefix_cache_queries_total": queries,
            "vllm:prefix_cache_hits_total": hits,
        },
        latency_buckets=buckets or {},
    )


def test_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    # 10 requests: 4 under 0.1 s, 6 more under 0.5 s: the 5th sits 1/6 into (0.1, 0.5].
    found = quantile(0.5, {0.1: 4, 0.5: 10, float("inf"): 10})
    assert found is not None and found[0] == pytest.approx(0.1 + 0.4 / 6) and not found[1]
    assert quantile(0.5, {0.1: 0, float("inf"): 0}) is None
    assert quantile(0.5, {0.1: 0, 1.0: 0, float("inf"): 3}) == (1.0, False)  # open top bucket
    assert quantile(0.5, {}) is None


def test_a_median_below_the_first_bucket_is_a_bound_not_a_value() -> None:
    # vLLM's e2e buckets start at 0.3 s: 10 requests of 33 ms all land in (0, 0.3].
    # Interpolating would say 150 ms for any of them; the bound is all we know.
    assert quantile(0.5, {0.3: 10, 0.5: 10, float("inf"): 10}) == (0.3, True)


def test_rates_over_the_window_and_a_restart_starts_it_again() -> None:
    clock = Clock()
    meter = TrafficMeter(clock, window_s=30)
    meter.observe(sample(100, queries=1000, hits=0, buckets={0.1: 50, float("inf"): 100}))
    assert meter.traffic() is None  # one scrape says nothing about a rate
    clock.t += 10
    meter.observe(
        sample(150, running=3, queries=2000, hits=750, buckets={0.1: 100, float("inf"): 150})
    )
    t = meter.traffic()
    assert t is not None
    assert t.requests_per_s == 5.0 and t.in_flight == 3
    assert t.prefix_hit_rate == 0.75
    # All 50 new ones under the first bound, 0.1 s: that bound, marked as one.
    assert (t.p50_latency_s, t.p50_upper_bound, t.p50_metric) == (0.1, True, "e2e")
    # Quiet for a whole window: the rate falls to 0, latency and hit rate unknown.
    for _ in range(4):
        clock.t += 10
        meter.observe(sample(150, queries=2000, hits=750, buckets={0.1: 100, float("inf"): 150}))
    t = meter.traffic()
    assert t is not None and t.requests_per_s == 0.0
    assert t.p50_latency_s is None and t.prefix_hit_rate is None
    # Restarted: counters fell; the window begins again with the new process.
    clock.t += 10
    meter.observe(sample(2))
    assert meter.traffic() is None


def test_the_fake_engines_metrics_body_reads_as_vllms() -> None:
    m = EngineMetrics("chat")
    for latency in (0.02, 0.03, 0.2, 0.04):
        m.finished(10, 5, "length", latency)
    m.cache_queries.inc(64)
    m.cache_hits.inc(16)
    parsed = parse_engine_metrics(generate_latest(m.registry).decode())
    assert parsed is not None
    assert parsed.counters["vllm:request_success_total"] == 4
    assert parsed.counters["vllm:prefix_cache_hits_total"] == 16
    assert parsed.latency_buckets[float("inf")] == 4 and parsed.latency_buckets[0.3] == 4
    assert parsed.ttft_buckets[0.02] == 1 and parsed.ttft_buckets[0.04] == 3
    clock = Clock()
    meter = TrafficMeter(clock)
    meter.observe(EngineSample(counters={"vllm:request_success_total": 0}))
    clock.t += 4
    meter.observe(parsed)
    t = meter.traffic()
    assert t is not None and t.requests_per_s == 1.0 and t.prefix_hit_rate == 0.25
    # From the fine time-to-first-token histogram, not e2e's first bucket (0.15 s before).
    assert t.p50_metric == "ttft" and not t.p50_upper_bound
    assert t.p50_latency_s is not None and 0.02 < t.p50_latency_s <= 0.04


def test_in_flight_counts_what_only_the_server_holds() -> None:
    # A stopped engine core: gauges at 0, the server's `/load` says 2 held.
    clock = Clock()
    meter = TrafficMeter(clock, window_s=30)
    meter.observe(sample(10))
    clock.t += 5
    stopped = EngineSample(
        gauges={"vllm:num_requests_running": 0.0},
        counters={"vllm:request_success_total": 10},
        server_load=2,
    )
    meter.observe(stopped)
    t = meter.traffic()
    assert t is not None and t.in_flight == 2
    assert meter.busy
