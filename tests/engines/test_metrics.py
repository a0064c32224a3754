"""IdleTracker rules and the vLLM/SGLang parser (pure: no network, fake clock)."""

from __future__ import annotations

from llmgw.agent.metrics import EngineSample, IdleTracker, parse_engine_metrics

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="stop",model_name="m"} 3.0
vllm:request_success_total{finished_reason="length",model_name="m"} 4.0
vllm:request_success_created{finished_reason="stop",model_name="m"} 1.7e9
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 100.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 50.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 7.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 7.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 3.0
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 1.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 0.0
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="m"} 12.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 8.1e6
"""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def sample(gauge: float = 0.0, counter: float = 0.0) -> EngineSample:
    return EngineSample(
        gauges={"vllm:num_requests_running": gauge},
        counters={"vllm:request_success_total": counter},
    )


def test_parse_vllm_sums_label_sets_and_keeps_total_suffix() -> None:
    s = parse_engine_metrics(VLLM)
    assert s is not None
    assert s.gauges == {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 2.0}
    assert s.counters == {
        "vllm:request_success_total": 7.0,
        "vllm:prompt_tokens_total": 100.0,
        "vllm:generation_tokens_total": 50.0,
    }


def test_parse_sglang() -> None:
    s = parse_engine_metrics(SGLANG)
    assert s is not None
    assert s.gauges == {"sglang:num_running_reqs": 1.0, "sglang:num_queue_reqs": 0.0}
    assert s.counters == {"sglang:num_requests_total": 12.0, "sglang:prompt_tokens_total": 8.1e6}


def test_parse_untyped_counter_is_still_recognised() -> None:
    s = parse_engine_metrics('sglang:num_requests_total{model_name="m"} 5\n')
    assert s is not None and s.counters == {"sglang:num_requests_total": 5.0}


def test_parse_rejects_garbage_and_unknown_metrics() -> None:
    assert parse_engine_metrics("this is { not prometheus") is None
    assert parse_engine_metrics("process_cpu_seconds_total 3.0\n") is None
    assert parse_engine_metrics("") is None


def test_unknown_before_first_scrape() -> None:
    clock = Clock()
    t = IdleTracker(clock)
    clock.t += 3600
    assert t.idle_seconds() is None


def test_first_scrape_starts_the_clock() -> None:
    clock = Clock()
    t = IdleTracker(clock)
    t.observe(sample(counter=500))  # old counts say nothing about *when*
    assert t.idle_seconds() == 0.0
    clock.t += 30
    assert t.idle_seconds() == 30.0


def test_gauge_above_zero_is_activity() -> None:
    clock = Clock()
    t = IdleTracker(clock)
    t.observe(sample())
    clock.t += 100
    assert t.observe(sample(gauge=1)) is True
    assert t.idle_seconds() == 0.0
    clock.t += 5
    assert t.observe(sample(gauge=0)) is False
    assert t.idle_seconds() == 5.0


def test_waiting_gauge_alone_is_activity() -> None:
    clock = Clock()
    t = IdleTracker(clock)
    t.observe(sample())
    clock.t += 100
    assert t.observe(EngineSample(gauges={"vllm:num_requests_waiting": 3.0})) is True
    assert t.idle_seconds() == 0.0


def test_counter_rise_is_activity_flat_is_not() -> None:
    clock = Clock()
    t = IdleTracker(clock)
    t.observe(sample(counter=10))
    clock.t += 50
    assert t.observe(sample(counter=10)) is False
    assert t.idle_seconds() == 50.0
    clock.t += 50
    assert t.observe(sample(counter=11)) is True
    assert t.idle_seconds() == 0.0


def test_counter_appearing_later_rises_from_zero() -> None:
    clock = Clock()
    t = IdleTracker(clock)
    t.observe(EngineSample(gauges={"vllm:num_requests_running": 0.0}))
    clock.t += 50
    assert t.observe(sample(counter=1)) is True


def test_counter_fall_resets_baseline_without_activity() -> None:
    clock = Clock()
    t = IdleTracker(clock)
    t.observe(sample(counter=100))
    clock.t += 40
    assert t.observe(sample(counter=0)) is False  # restarted, nothing served yet
    assert t.restarts == 1
    assert t.idle_seconds() == 40.0
    clock.t += 10
    # The baseline is the new value: 0 -> 2 is a rise, not a fall from 100.
    assert t.observe(sample(counter=2)) is True
    assert t.idle_seconds() == 0.0


def test_counter_fall_to_nonzero_counts_as_recent_activity() -> None:
    clock = Clock()
    t = IdleTracker(clock)
    t.observe(sample(counter=100))
    clock.t += 40
    # The restarted engine already served 3: that happened since the last scrape.
    assert t.observe(sample(counter=3)) is True
    clock.t += 10
    assert t.observe(sample(counter=3)) is False
    assert t.idle_seconds() == 10.0


def test_failed_scrapes_change_nothing() -> None:
    # A failed scrape is simply not fed to the tracker: time keeps running from
    # the last activity, and the next good scrape compares with the last good one.
    clock = Clock()
    t = IdleTracker(clock)
    t.observe(sample(counter=5))
    clock.t += 20  # (scrapes failing here)
    assert t.idle_seconds() == 20.0
    assert t.observe(sample(counter=6)) is True


def test_idle_uses_the_injected_monotonic_clock_never_negative() -> None:
    clock = Clock()
    t = IdleTracker(clock)
    t.observe(sample())
    clock.t -= 5  # a clock that went backwards must not give a negative duration
    assert t.idle_seconds() == 0.0


def test_vanished_counter_returning_is_not_a_rise() -> None:
    clock = Clock()
    t = IdleTracker(clock)
    t.observe(sample(counter=9))
    clock.t += 10
    assert t.observe(EngineSample(gauges={"vllm:num_requests_running": 0.0})) is False
    clock.t += 10
    assert t.observe(sample(counter=9)) is False
    assert t.idle_seconds() == 20.0


def test_requests_only_the_server_holds_are_activity() -> None:
    # A stopped vLLM engine core: its gauges stay at 0 and its counters still, while
    # its HTTP server holds a request (`/load`). That request is work, not idleness.
    clock = Clock()
    t = IdleTracker(clock)
    t.observe(sample())
    clock.t += 100
    held = EngineSample(gauges={"vllm:num_requests_running": 0.0}, server_load=1)
    assert held.in_flight == 1
    assert t.observe(held) is True
    assert t.idle_seconds() == 0.0
    # Its server holding nothing and gauges at 0: idle again; not read (None): gauges decide.
    clock.t += 5
    assert (
        t.observe(EngineSample(gauges={"vllm:num_requests_running": 0.0}, server_load=0)) is False
    )
    assert t.observe(EngineSample(gauges={"vllm:num_requests_waiting": 2.0})) is True
    assert EngineSample(gauges={"vllm:num_requests_running": 3.0}, server_load=1).in_flight == 3
