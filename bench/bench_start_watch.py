"""The agent's look at starting engines: prints figures, asserts nothing.

    python bench/bench_start_watch.py [--procs 0 500 2000] [--looks 50]

While an engine starts, the supervisor looks every START_LOOK_S (10 s) at its log's
size and at its process group's CPU, summed from one pass over /proc
(`engine_proc.cpu_by_group`). This times one such pass with N extra processes on the
machine (idle `sleep`s, as a busy node's daemons and engine workers would be), against
listing /proc alone in the same run, and says what share of one core it costs at one
look per 10 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable

from llmgw.agent.engine_proc import cpu_by_group
from llmgw.agent.engine_settings import START_LOOK_S


def timed(fn: Callable[[], object], looks: int) -> float:
    """Median seconds of one call."""
    runs = []
    for _ in range(looks):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, nargs="+", default=[0, 500, 2000])
    p.add_argument("--looks", type=int, default=50)
    args = p.parse_args()
    print(f"{'extra procs':>11} {'in /proc':>9} {'listdir ms':>11} {'look ms':>8} {'x list':>7} "
          f"{'core share':>11}")  # fmt: skip
    started: list[subprocess.Popen[bytes]] = []
    try:
        for n in sorted(args.procs):
            while len(started) < n:
                started.append(subprocess.Popen(["sleep", "3600"]))
            time.sleep(0.5)
            total = sum(1 for e in os.scandir("/proc") if e.name.isdigit())
            floor = timed(lambda: [e.name for e in os.scandir("/proc")], args.looks)
            look = timed(cpu_by_group, args.looks)
            print(
                f"{n:>11} {total:>9} {floor * 1e3:>11.2f} {look * 1e3:>8.2f} "
                f"{look / floor:>7.1f} {look / START_LOOK_S:>10.3%}"
            )
    finally:
        for proc in started:
            proc.kill()
        for proc in started:
            proc.wait()


if __name__ == "__main__":
    main()
