"""Capacity follows demand: reaction to a load step, wake from zero, and flaps
under steady noisy load.

1. Load step (real processes: a controller, four agents with two fake cards
   each, fake engines whose tokens come every 0.1 s, the gateway with its SMG
   child): a model with min 1, max 3, target 2 gets eight clients at once, then
   none. Printed: load on to the decision (desired 3), to three replicas ready,
   and load off to back at one, against the same fleet's baseline, a model
   applied with min 3 to its three replicas ready (placement, reports, engine
   load: what a scale-up cannot do without). Each fleet is run twice over,
   alternately: "before" with the controller of `--baseline` (main before the
   short scale-up window: its `llmgw` package extracted and put first on the
   controller's PYTHONPATH), "after" with this checkout's; printed side by side
   with the ratio after/before.
2. Wake from zero: a model with min 0 asleep; one request sent, timed to its
   answer; against the engine's own load time (`--load-seconds`) and the same
   fresh-start baseline. The fake engine loads no weights, so weights local or
   absent change only where the replica lands (placement ranks weights first),
   not its load time: with a real engine the difference is the fetch.
3. Flaps (the autoscaler alone, simulated time): an hour of in-flight counts
   drawn around a replica boundary at several noise levels, counting changes
   of the desired count; against a naive rule (`ceil(in flight / target)` of
   each sample, no window, no wait), and before (one 10 s window) against after
   (3 s up past 110 % of the target, 10 s down): the target is 0 down-then-up cycles.

    .venv/bin/python bench/bench_autoscale.py [--load-seconds 2] [--rounds 2]
        [--baseline REF] [--skip-processes]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import subprocess
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
from llmgw.controller.core.autoscale import DOWN_WINDOW_S, Autoscaler
from llmgw.wire import ModelSpec
from tests.e2e.procs import TAG_VAR, Cluster, ControllerProcess
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


BASELINE = "0967413"  # main before the short scale-up window (issue 35)


def baseline_tree(ref: str, into: Path) -> Path:
    """`ref`'s llmgw package, extracted: a controller run with it on PYTHONPATH runs
    that commit's rules (only `llmgw` is taken: the agents and gateway are the same)."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", ref, "llmgw"], check=True, capture_output=True
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def processes(load_s: float, pythonpath: Path | None) -> dict[str, float]:
    """One fleet, its controller from `pythonpath` (None: this checkout): the figures."""
    with tempfile.TemporaryDirectory(prefix="bench-autoscale-") as tmp:
        c = Cluster(Path(tmp) / "cluster")
        try:
            env = {TAG_VAR: c.tag} | ({"PYTHONPATH": str(pythonpath)} if pythonpath else {})
            c.controller = ControllerProcess(
                c.root / "controller.log",
                state_dir=c.root / "controller",
                port=c.port,
                env=env,
                cwd=c.root,
            )
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
            time.sleep(DOWN_WINDOW_S)  # a quiet window before the step, for both rules
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
    return {
        "base": base,
        "decided": decided,
        "ready": ready,
        "down": down,
        "wake": statistics.median(answers),
        "ok": load.ok,
        "failed": len(load.failures),
    }


def compare(load_s: float, rounds: int, ref: str) -> None:
    """Fleets with the baseline's controller and with this checkout's, alternately
    (`rounds` each, so that drift in the machine's load falls on both alike)."""
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="bench-autoscale-base-") as tmp:
        tree = baseline_tree(ref, Path(tmp) / "tree")
        for _ in range(rounds):
            runs["before"].append(processes(load_s, tree))
            runs["after"].append(processes(load_s, None))

    def med(which: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[which])

    print(f"before: the controller of {ref} (one 10 s window); after: this checkout")
    print(f"medians of {rounds} fleet(s) each, run alternately\n")
    print("figure                                              before    after   after/before")
    rows = [
        ("fresh apply with min 3 to three ready (baseline)", "base"),
        ("load step (8 clients, target 2): to desired 3", "decided"),
        ("load step: to three replicas ready", "ready"),
        ("load gone: back to one replica", "down"),
        ("wake from zero, request to answer (median of 3)", "wake"),
    ]
    for words, key in rows:
        b, a = med("before", key), med("after", key)
        print(f"{words:<50} {b:7.2f} s {a:7.2f} s   {a / b:6.2f} x")
    for which in ("before", "after"):
        ratio = statistics.median(r["ready"] / r["base"] for r in runs[which])
        ok = sum(int(r["ok"]) for r in runs[which])
        failed = sum(int(r["failed"]) for r in runs[which])
        print(
            f"{which}: load step to ready = {ratio:.2f} x the fresh apply; "
            f"requests during the steps {ok} ok, {failed} failed"
        )


def flaps() -> None:
    target, hour = 4, 3600
    spec_ = ModelSpec(
        name="m", source="m", min_replicas=1, max_replicas=16, target_in_flight=target
    )
    rules = {
        "before": lambda: Autoscaler(DOWN_WINDOW_S, up_at=1.0),  # one 10 s window
        "after": Autoscaler,
    }
    print("\nflaps in one simulated hour, load around 2.5 replicas' worth (mean 10, target 4),")
    print("summed over 5 seeds; before: one 10 s window; after: 3 s up (past 110 %), 10 s down")
    print("noise (sd)   changes before/after   naive   down-then-up cycles before/after")
    for sd in (0.5, 1.0, 2.0, 4.0):
        changes = {k: 0 for k in rules}
        cycles = {k: 0 for k in rules}
        naive = 0
        for seed in range(5):
            rng = random.Random(seed)
            xs = [max(0.0, rng.gauss(10.0, sd)) for _ in range(hour)]
            for name, make in rules.items():
                scaler, last, went_down = make(), 3, False
                for t, x in enumerate(xs):
                    d = scaler.decide(spec_, x, 3, float(t)).desired
                    if d != last:
                        changes[name] += 1
                        cycles[name] += d > last and went_down
                        went_down = d < last
                        last = d
            last_naive = 3
            for x in xs:
                n = min(max(math.ceil(x / target), 1), 16)
                naive += n != last_naive
                last_naive = n
        print(
            f"{sd:9.1f}   {changes['before']:8d} / {changes['after']:<8d}   {naive:7d}"
            f"   {cycles['before']:8d} / {cycles['after']}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--load-seconds", type=float, default=2.0, help="fake engine load time")
    p.add_argument("--skip-processes", action="store_true", help="only the simulated flaps")
    p.add_argument("--rounds", type=int, default=2, help="fleets per rule, run alternately")
    p.add_argument("--baseline", default=BASELINE, help="the commit whose controller is 'before'")
    args = p.parse_args()
    if not args.skip_processes:
        compare(args.load_seconds, args.rounds, args.baseline)
    flaps()
    return 0


if __name__ == "__main__":
    sys.exit(main())
