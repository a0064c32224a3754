"""Reconcile cost under load: 2,000 reporting agents, with and without models that
cannot be placed (issue 10 item 3).

    python bench/bench_reconcile.py [--nodes 2000] [--seconds 20] [--repeat 3] [--churn 0.01]
                                    [--before DIR]

A real controller process (`llmgw controller`, one core); this process plays the
agents over real HTTP: each of `--nodes` agents posts its report (the 3.6 KiB
synthetic one of bench_controller.py) every `--interval` seconds, at a random
phase, and `/healthz` is asked every 20 ms. Latency is measured from the moment
a request was due, so a stalled controller cannot hide behind a queue.

Two runs, each on a fresh controller: the baseline declares no model; the other
declares one `min_replicas: 10000` model that cannot fit (64 GPUs per shard) and
200 small ones that cannot either, in 60 shapes (more GPUs than a node has, a
class no node has, several nodes with more free than any node has). `--churn F` makes a fraction F
of reports flip a card's use, so capacity moves and every pass looks at every
model again. `--before DIR` runs the controller from another checkout too (e.g.
`git worktree add --detach /tmp/before main`), for a before/after in one run.
`--passes` times the reconcile passes themselves in this process instead (run
it with PYTHONPATH=DIR for another checkout). Prints ratios to the baseline (with `--repeat`, the median over rounds, each
round a baseline and a run with models back to back, as this box's load
drifts); asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from bench_controller import free_port, pct, post_many, synthetic_report

REPORT_TIMEOUT_S = 10.0  # an agent gives a report up after this long
HEALTH_EVERY_S = 0.02


def unplaceable_models() -> list[dict[str, Any]]:
    big = {"name": "big", "source": "x", "min_replicas": 10_000, "gpus_per_shard": 64}
    # 60 shapes among them: the scheduler scans the fleet once per shape that does not
    # fit (the reason), so 200 models of one shape would flatter the figures.
    small = []
    for i in range(200):
        kind, k = i % 3, i // 3
        spec: dict[str, Any] = {"name": f"small-{i:03d}", "source": f"org/small-{i}"}
        if kind == 0:  # more cards than a node has
            spec.update(min_replicas=1 + k % 3, gpus_per_shard=9 + k % 24)
        elif kind == 1:  # a class no node has
            spec.update(min_replicas=2, gpus_per_shard=1 + k % 8, gpu_class=f"X{k % 3}")
        else:  # 5..8 free on several nodes of a fabric, where every node has 4 or 3
            spec.update(min_replicas=1, gpus_per_shard=5 + k % 4, shards=2 + k % 6)
        small.append(spec)
    return [{**m, "engine": "fake"} for m in [big, *small]]


@dataclass
class Run:
    reports: list[float] = field(default_factory=list)  # seconds, from when it was due
    report_failures: int = 0
    health: list[float] = field(default_factory=list)
    health_failures: int = 0
    pass_mean_ms: float = float("nan")
    passes: int = 0
    unplaceable: int = 0


class Controller:
    """`llmgw controller` in its own process, from this checkout or `checkout`."""

    def __init__(self, checkout: str | None) -> None:
        self.port = free_port()
        self.tmp = tempfile.TemporaryDirectory()
        # `python -m` runs the package in its working directory, ahead of the install.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw", "controller", "--listen",
             f"127.0.0.1:{self.port}", "--state-dir", self.tmp.name],
            cwd=checkout or Path(__file__).resolve().parent.parent,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"

    async def wait(self, session: aiohttp.ClientSession) -> None:
        for _ in range(300):
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{self.url}/healthz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)
        raise RuntimeError("the controller did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        self.tmp.cleanup()


def churned(body: bytes, rng: random.Random) -> bytes:
    report = json.loads(body)
    card = report["gpus"][rng.randrange(4, 8)]
    card["in_use"] = not card["in_use"]
    return json.dumps(report).encode()


async def measure(
    args: argparse.Namespace,
    bodies: list[bytes],
    models: list[dict[str, Any]],
    checkout: str | None,
) -> Run:
    run = Run()
    ctrl = Controller(checkout)
    timeout = aiohttp.ClientTimeout(total=REPORT_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=256)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await ctrl.wait(session)
            await post_many(session, f"{ctrl.url}/v1/agent/report", bodies, 32)  # all register
            if models:
                async with session.post(f"{ctrl.url}/v1/models", json={"models": models}) as r:
                    r.raise_for_status()
            await asyncio.sleep(args.settle)  # without load, so the first look is left out
            end = time.perf_counter() + args.seconds
            rng = random.Random(7)

            async def agent(body: bytes) -> None:
                due = time.perf_counter() + rng.uniform(0, args.interval)
                while due < end:
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    data = churned(body, rng) if rng.random() < args.churn else body
                    try:
                        async with session.post(
                            f"{ctrl.url}/v1/agent/report",
                            data=data,
                            headers={"Content-Type": "application/json"},
                        ) as resp:
                            await resp.read()
                            ok = resp.status == 200
                    except (aiohttp.ClientError, TimeoutError):
                        ok = False
                    if ok:
                        run.reports.append(time.perf_counter() - due)
                    else:
                        run.report_failures += 1
                    due += args.interval

            async def prober() -> None:
                due = time.perf_counter()
                while due < end:
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    try:
                        async with session.get(f"{ctrl.url}/healthz") as resp:
                            await resp.read()
                            ok = resp.status == 200
                    except (aiohttp.ClientError, TimeoutError):
                        ok = False
                    if ok:
                        run.health.append(time.perf_counter() - due)
                    else:
                        run.health_failures += 1
                    due += HEALTH_EVERY_S

            await asyncio.gather(prober(), *(agent(b) for b in bodies))
            async with session.get(f"{ctrl.url}/metrics") as resp:
                text = await resp.text()
            total = re.search(r"^llmgw_reconcile_seconds_sum (\S+)", text, re.M)
            count = re.search(r"^llmgw_reconcile_seconds_count (\S+)", text, re.M)
            if total and count and float(count.group(1)):
                run.passes = int(float(count.group(1)))
                run.pass_mean_ms = float(total.group(1)) / run.passes * 1e3
            async with session.get(f"{ctrl.url}/v1/models") as resp:
                listed = await resp.json()
            rows = listed["models"] if isinstance(listed, dict) else listed
            run.unplaceable = sum(1 for m in rows if m.get("unplaceable_reason"))
    finally:
        ctrl.stop()
    return run


def line(label: str, run: Run, base: Run | None) -> str:
    rep50, rep99 = pct(run.reports, 0.5) * 1e3, pct(run.reports, 0.99) * 1e3
    h50, h99 = pct(run.health, 0.5) * 1e3, pct(run.health, 0.99) * 1e3
    out = (
        f"{label:<34} report p50 {rep50:8.2f} p99 {rep99:8.2f} ms"
        f" (failed {run.report_failures}/{len(run.reports) + run.report_failures})"
        f"  /healthz p50 {h50:8.2f} p99 {h99:8.2f} ms (failed {run.health_failures})"
        f"  pass {run.pass_mean_ms:7.2f} ms x {run.passes}  unplaceable {run.unplaceable}"
    )
    if base is not None:
        out += (
            f"\n{'':<34} ratio to baseline: report p99 "
            f"{rep99 / (pct(base.reports, 0.99) * 1e3):.2f}x"
            f"  /healthz p99 {h99 / (pct(base.health, 0.99) * 1e3):.2f}x"
        )
    return out


async def main_async(args: argparse.Namespace) -> None:
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; {args.nodes} agents reporting"
        f" every {args.interval:g} s for {args.seconds:g} s, /healthz every"
        f" {HEALTH_EVERY_S * 1e3:g} ms, churn {args.churn:g}\n"
    )
    bodies = [json.dumps(synthetic_report(i)).encode() for i in range(args.nodes)]
    models = unplaceable_models()
    ratios: list[tuple[float, float]] = []
    for round_ in range(args.repeat):
        if args.repeat > 1:
            print(f"-- round {round_ + 1} of {args.repeat}")
        base = await measure(args, bodies, [], None)
        print(line("baseline (no models)", base, None))
        after = await measure(args, bodies, models, None)
        print(line("1 + 200 unplaceable models", after, base))
        ratios.append(
            (
                pct(after.reports, 0.99) / pct(base.reports, 0.99),
                pct(after.health, 0.99) / pct(base.health, 0.99),
            )
        )
        if args.before:
            before = await measure(args, bodies, models, args.before)
            print(line("same, controller from --before", before, base))
    if len(ratios) > 1:
        reports, health = sorted(r for r, _ in ratios), sorted(h for _, h in ratios)
        print(
            f"\nratios over {len(ratios)} rounds: report p99 median"
            f" {statistics.median(reports):.2f}x (range {reports[0]:.2f}-{reports[-1]:.2f}),"
            f" /healthz p99 median {statistics.median(health):.2f}x"
            f" (range {health[0]:.2f}-{health[-1]:.2f})"
        )


def passes_in_process(args: argparse.Namespace) -> None:
    """`--passes`: the reconcile passes themselves, in this process, on this checkout
    (or another, with PYTHONPATH=DIR): the first three after declaring the models,
    against a pass with no models, for the fleet sizes of the issue."""
    from llmgw.controller.core.settings import ControllerSettings
    from llmgw.controller.loop.reconcile import Reconciler
    from llmgw.controller.main import tune_gc
    from llmgw.controller.store import Store
    from llmgw.controller.term import Term
    from llmgw.wire import ModelSpec, NodeReport

    tune_gc()
    big = unplaceable_models()[0]
    cases = [
        (f"{args.nodes} nodes, 1 model min 10000", args.nodes, [big]),
        (f"{args.nodes} nodes, the 1 + 200 models", args.nodes, unplaceable_models()),
        (
            "2 nodes, 200 models min 10000",
            2,
            [{**big, "name": f"big-{i}"} for i in range(200)],
        ),
    ]
    for label, n, models in cases:
        with tempfile.TemporaryDirectory() as tmp:
            state = Path(tmp)
            fleet = Term.begin(Store(state), ControllerSettings(state_dir=state))
            # (An older checkout's report path: its replies view took reports.)
            ingest_json = getattr(fleet, "ingest_json", None) or fleet.replies.ingest_json
            for i in range(n):
                body = json.dumps(synthetic_report(i)).encode()
                ingest_json(NodeReport.model_validate_json(body), body)
            reconciler = Reconciler(fleet)
            t0 = time.perf_counter()
            reconciler.tick()
            bare = time.perf_counter() - t0
            fleet.facts.put_models([ModelSpec.model_validate(m) for m in models])
            took = []
            for _ in range(3):
                t0 = time.perf_counter()
                reconciler.tick()
                took.append(time.perf_counter() - t0)
            shown = "  ".join(f"{t * 1e3:9.1f}" for t in took)
            print(f"{label:<38} passes {shown} ms   (no models: {bare * 1e3:.1f} ms)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--interval", type=float, default=5.0, help="each agent's report interval")
    p.add_argument("--churn", type=float, default=0.0, help="fraction of reports that change")
    p.add_argument("--before", help="a checkout whose controller to measure too")
    p.add_argument("--repeat", type=int, default=1, help="rounds of baseline and models")
    p.add_argument(
        "--settle", type=float, default=0.0, help="seconds between declaring and measuring"
    )
    p.add_argument("--passes", action="store_true", help="time passes in process instead")
    args = p.parse_args()
    if args.passes:
        passes_in_process(args)
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
