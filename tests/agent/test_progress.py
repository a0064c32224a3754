"""ProgressWatch: hung means work held and token counters still (issue 24 finding 1)."""

from __future__ import annotations

from agent.metrics import EngineSample
from agent.progress import ProgressWatch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sample(tokens: float, running: float = 0.0) -> EngineSample:
    return EngineSample(
        gauges={"vllm:num_requests_running": running},
        counters={"vllm:generation_tokens_total": tokens},
    )


def test_requests_only_the_server_counts_are_work() -> None:
    # A stopped vLLM engine core: its gauges stay 0, its HTTP server holds a request.
    clock = Clock()
    watch = ProgressWatch(clock)
    watch.observe(sample(100), held=1)
    clock.now = 20
    watch.observe(sample(100), held=1)
    assert watch.work == 1 and watch.stalled_s() == 20


def test_no_work_or_moving_tokens_is_not_stalled() -> None:
    clock = Clock()
    watch = ProgressWatch(clock)
    watch.observe(sample(100))  # an engine that does not say what it holds, idle
    clock.now = 20
    watch.observe(sample(100), held=None)
    assert watch.stalled_s() == 0
    watch.observe(sample(100, running=2))
    clock.now = 30
    watch.observe(sample(140, running=2), held=2)  # busy and producing
    assert watch.stalled_s() == 0 and watch.moved_since(25)
