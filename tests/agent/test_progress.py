"""ProgressWatch: hung means work held and token counters still (issue 24 finding 1).
StartWatch: a start with no output and no CPU is stalled."""

from __future__ import annotations

from llmgw.agent.metrics import EngineSample
from llmgw.agent.progress import START_CPU_S, ProgressWatch, StartWatch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sample(tokens: float, running: float = 0.0, held: int | None = None) -> EngineSample:
    return EngineSample(
        gauges={"vllm:num_requests_running": running},
        counters={"vllm:generation_tokens_total": tokens},
        server_load=held,
    )


def test_requests_only_the_server_counts_are_work() -> None:
    # A stopped vLLM engine core: its gauges stay 0, its HTTP server holds a request.
    clock = Clock()
    watch = ProgressWatch(clock)
    watch.observe(sample(100, held=1))
    clock.now = 20
    watch.observe(sample(100, held=1))
    assert watch.work == 1 and watch.stalled_s() == 20


def test_no_work_or_moving_tokens_is_not_stalled() -> None:
    clock = Clock()
    watch = ProgressWatch(clock)
    watch.observe(sample(100))  # an engine that does not say what it holds, idle
    clock.now = 20
    watch.observe(sample(100, held=None))
    assert watch.stalled_s() == 0
    watch.observe(sample(100, running=2))
    clock.now = 30
    watch.observe(sample(140, running=2, held=2))  # busy and producing
    assert watch.stalled_s() == 0 and watch.moved_since(25)


def test_a_start_with_no_output_and_no_cpu_is_quiet_from_its_start() -> None:
    clock = Clock()
    watch = StartWatch(clock)
    for t in (10, 20, 30):
        clock.now = t
        watch.observe(log_bytes=500, cpu_s=3.0 + 0.01 * t)  # a waiting process's trickle
    assert watch.quiet_s() == 30


def test_output_is_progress() -> None:
    clock = Clock()
    watch = StartWatch(clock)
    clock.now = 10
    watch.observe(log_bytes=500, cpu_s=3.0)
    clock.now = 20
    watch.observe(log_bytes=600, cpu_s=3.0)
    clock.now = 25
    assert watch.quiet_s() == 5


def test_cpu_is_progress_once_it_adds_up() -> None:
    clock = Clock()
    watch = StartWatch(clock)
    clock.now = 10
    watch.observe(log_bytes=500, cpu_s=3.0)
    clock.now = 20
    watch.observe(log_bytes=500, cpu_s=3.0 + START_CPU_S / 2)
    assert watch.quiet_s() == 20  # not yet a second of work
    clock.now = 30
    watch.observe(log_bytes=500, cpu_s=3.0 + START_CPU_S)
    assert watch.quiet_s() == 0
    clock.now = 40
    watch.observe(log_bytes=500, cpu_s=3.0 + START_CPU_S * 1.5)
    assert watch.quiet_s() == 10  # counted from the last sign, not from the start


def test_a_busy_child_that_exits_does_not_hide_later_work() -> None:
    """The group's CPU falls when a process in it exits: the count starts again there."""
    clock = Clock()
    watch = StartWatch(clock)
    clock.now = 10
    watch.observe(log_bytes=None, cpu_s=50.0)
    clock.now = 20
    watch.observe(log_bytes=None, cpu_s=5.0)  # the compiler child is gone
    clock.now = 30
    watch.observe(log_bytes=None, cpu_s=5.0 + START_CPU_S)
    assert watch.quiet_s() == 0


def test_nothing_known_is_no_progress() -> None:
    clock = Clock()
    watch = StartWatch(clock)
    clock.now = 10
    watch.observe(log_bytes=None, cpu_s=None)
    clock.now = 20
    watch.observe(log_bytes=None, cpu_s=None)
    assert watch.quiet_s() == 20
