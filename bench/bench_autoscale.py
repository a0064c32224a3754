"""Capacity follows demand: reaction to a load step, wake from zero, and flaps
under steady noisy load.

1. Load step (real processes: a controller, four agents with two fake cards
   each, fake engines whose tokens come every 0.1 s, the gateway with its SMG
   child): a model with min 1, max 3, target 2 gets eight clients at once, then
   none. Printed: load on to the decision (desired 3), to three replicas ready,
   and load off to back at one, against the same run's baseline, a model
   applied with min 3 to its three replicas ready (placement, reports, engine
   load: what a scale-up cannot do without).
2. Wake from zero: a model with min 0 asleep; one request sent, timed to its
   answer; against the engine's own load time (`--load-seconds`) and the same
   fresh-start baseline. The fake engine loads no weights, so weights local or
   absent change only where the replica lands (placement ranks weights first),
   not its load time: with a real engine the difference is the fetch.
3. Flaps (the autoscaler alone, simulated time): an hour of in-flight counts
   drawn around a replica boundary at several noise levels, counting changes
   of the desired count; against a naive rule (`ceil(in flight / target)` of
   each sample, no window, no wait): the target is 0 flaps.

    .venv/bin/python bench/bench_autoscale.py [--load-seconds 2] [--skip-processes]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.bench_faults import until
from bench.bench_rollout import spec as rollout_spec
from llmgw.controller.core.autoscale import Autoscaler
from llmgw.wire import ModelSpec
from tests.e2e.procs import Cluster
from tests.gateway.gwprocs import Gateway, Load, wait_cluster_ready

NODES = ["gpu1", "gpu2", "gpu3", "gpu4"]


def spec(name: str, load_s: float, **fields: Any) -> dict[str, Any]:
    """bench_rollout's model (fake engine, a token every 0.1 s) with demand's fields."""
    return {**rollout_spec(name, 1, load_s, []), **fields}


def of(c: Cluster, name: str, state: str | None = None) -> list[dict[str, Any]]:
    return [
        r
        for r in c.get("/v1/replicas")
        if r["model"] == name and (state is None or r["state"] == state)
    ]


def desired(c: Cluster, name: str) -> int:
    return next(m.get("desired", 0) for m in c.get("/v1/models") if m["spec"]["name"] == name)


def processes(load_s: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-autoscale-") as tmp:
        c = Cluster(Path(tmp) / "cluster")
        try:
            c.start_controller("--reconcile-interval", "0.5", "--stop-grace", "20")
            for n in NODES:
                c.start_agent(n, gpus="2xH100-80GB", interval=0.5)
            wait_cluster_ready(c, NODES)
            c.apply([spec("probe", load_s, min_replicas=3)])
            base = until(lambda: len(of(c, "probe", "ready")) == 3)
            c.ctl("delete", "model", "probe")
            until(lambda: not of(c, "probe"))

            c.apply(
                [
                    spec(
                        "chat",
                        load_s,
                        min_replicas=1,
                        max_replicas=3,
                        target_in_flight=2,
                        scale_down_after_s=5,
                    ),
                    spec("nap", load_s, min_replicas=0, max_replicas=1, scale_down_after_s=5),
                ]
            )
            until(lambda: len(of(c, "chat", "ready")) == 1)
            gw = Gateway(c, "--policy", "round_robin")
            gw.start()
            gw.wait_serving("chat")
            load = Load(gw.url, "chat").start(clients=8)
            try:
                decided = until(lambda: desired(c, "chat") == 3)
                ready = until(lambda: len(of(c, "chat", "ready")) == 3) + decided
            finally:
                load.stop()
            down = until(lambda: len(of(c, "chat")) == 1, timeout=300)

            answers: list[float] = []

            def wake() -> None:
                body = {"model": "nap", "messages": [{"role": "user", "content": "x"}]}
                t = time.monotonic()
                r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=120)
                r.raise_for_status()
                answers.append(time.monotonic() - t)

            for _ in range(3):
                until(lambda: not of(c, "nap"), timeout=120)
                th = threading.Thread(target=wake)
                th.start()
                th.join()
            gw.stop()
        finally:
            c.close()

    print(f"baseline: a model applied with min 3 to three ready     {base:6.2f} s")
    print(f"load step (8 clients, target 2): to desired 3           {decided:6.2f} s")
    print(
        f"load step: to three replicas ready                       {ready:6.2f} s"
        f"  = {ready / base:.2f} x baseline"
    )
    print(
        f"load gone: back to one replica (two steps of 5 s wait)   {down:6.2f} s"
        "  (10 s window + 2 x 5 s + two stop handshakes)"
    )
    med = statistics.median(answers)
    print(
        f"wake from zero, request to answer (median of 3)          {med:6.2f} s"
        f"  = {med / load_s:.2f} x the engine's load time, {med / base:.2f} x baseline"
    )
    print(
        f"requests through the gateway during the step: {load.ok} ok, {len(load.failures)} failed"
    )


def flaps() -> None:
    target, hour = 4, 3600
    spec_ = ModelSpec(
        name="m", source="m", min_replicas=1, max_replicas=16, target_in_flight=target
    )
    print("\nflaps in one simulated hour, load around 2.5 replicas' worth (mean 10, target 4)")
    print("noise (sd)   changes (autoscaler)   changes (naive)   down-then-up cycles")
    for sd in (0.5, 1.0, 2.0, 4.0):
        rng = random.Random(1)
        scaler = Autoscaler()
        ours = naive = cycles = 0
        last_naive, last, went_down = 3, 3, False
        for t in range(hour):
            x = max(0.0, rng.gauss(10.0, sd))
            d = scaler.decide(spec_, x, 3, float(t)).desired
            if d != last:
                ours += 1
                if d > last and went_down:
                    cycles += 1
                went_down = d < last
                last = d
            n = min(max(math.ceil(x / target), 1), 16)
            naive += n != last_naive
            last_naive = n
        print(f"{sd:9.1f}   {ours:20d}   {naive:15d}   {cycles:19d}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--load-seconds", type=float, default=2.0, help="fake engine load time")
    p.add_argument("--skip-processes", action="store_true", help="only the simulated flaps")
    args = p.parse_args()
    if not args.skip_processes:
        processes(args.load_seconds)
    flaps()
    return 0


if __name__ == "__main__":
    sys.exit(main())
