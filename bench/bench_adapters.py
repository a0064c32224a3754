"""LoRA adapters (issue 33): what a request for an adapter loaded nowhere costs, and
how much loading and unloading skewed traffic causes.

Real processes: a controller, two agents with two fake cards each, fake engines that
load adapters as vLLM does (`--lora-load-seconds`), the gateway with its SMG child.
One base of four replicas, each holding at most `--slots` adapters.

1. Cold, warm, engine start: a request for an adapter loaded nowhere, timed to its
   answer (held at the gateway, loaded by the controller's word, routed once the
   agent reports it), against a request for one loaded already, and against the same
   run's engine start: a model applied to its first answer (placement, the engine's
   `--load-seconds`, reports). Medians of `--rounds`.
2. Churn: `--adapters` adapters under skewed traffic (one client on each of the
   three hottest, one walking the rest) for `--churn-seconds`: loads and unloads per
   minute (what the agents did, from their logs), and requests answered.

    .venv/bin/python bench/bench_adapters.py [--rounds 3] [--churn-seconds 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from llmgw.agent.sample_models import write_adapter
from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import CONTROLLER_ARGS, ENGINE_ARGS, Gateway, wait_cluster_ready

NODES = ["gpu1", "gpu2"]


def base(name: str, slots: int, load_s: float, lora_s: float, replicas: int) -> dict[str, Any]:
    args = [*ENGINE_ARGS, "--enable-lora", "--max-loras", str(slots)]
    args += ["--max-cpu-loras", str(slots), "--lora-load-seconds", str(lora_s)]
    args[args.index("--load-seconds") + 1] = str(load_s)
    args[args.index("--token-interval") + 1] = "0.01"
    return {
        "name": name,
        "source": f"org/{name}",
        "min_replicas": replicas,
        "gpus_per_shard": 1,
        "engine": "fake",
        "engine_args": args,
        "target_in_flight": 2,
    }


def timed(gw: Gateway, name: str) -> float:
    body = {"model": name, "prompt": "hello", "max_tokens": 2}
    t0 = time.monotonic()
    r = httpx.post(f"{gw.url}/v1/completions", json=body, timeout=120)
    took = time.monotonic() - t0
    assert r.status_code == 200 and r.json()["model"] == name, r.text
    return took


def ready(c: Cluster, model: str) -> int:
    return sum(r["state"] == "ready" and r["model"] == model for r in c.get("/v1/replicas"))


def listed(gw: Gateway, name: str) -> bool:
    try:
        return name in {m["id"] for m in httpx.get(f"{gw.url}/v1/models").json()["data"]}
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--adapters", type=int, default=12)
    p.add_argument("--load-seconds", type=float, default=2.0, help="the fake engine's start")
    p.add_argument("--lora-seconds", type=float, default=0.2, help="one adapter's load")
    p.add_argument("--churn-seconds", type=float, default=30.0)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-adapters-"))
    storage = root / "adapters"
    names = [f"lora{i}" for i in range(args.adapters)]
    for name in names:
        write_adapter(storage / "acme" / name, base="org/base")
    c = Cluster(root / "cluster")
    gw = Gateway(c)
    try:
        c.start_controller(*CONTROLLER_ARGS, "--adapter-idle-after", "10s")
        for node in NODES:
            c.start_agent(node, gpus="2xH100-80GB", extra=["--storage", str(storage)])
        wait_cluster_ready(c, NODES)
        adapters = [{"name": n, "base": "base", "source": f"acme/{n}"} for n in names]
        c.apply([base("base", args.slots, args.load_seconds, args.lora_seconds, 3), *adapters])
        wait_until(lambda: ready(c, "base") == 3, timeout=60, what="the base ready")
        gw.start()
        wait_until(lambda: listed(gw, names[-1]), timeout=30, what="adapters listed")

        cold, warm, start = [], [], []
        for i in range(args.rounds):
            name = names[i]
            cold.append(timed(gw, name))
            warm.append(statistics.median(timed(gw, name) for _ in range(5)))
            model = f"fresh{i}"
            t0 = time.monotonic()
            c.apply([base(model, args.slots, args.load_seconds, args.lora_seconds, 1)])
            wait_until(lambda m=model: ready(c, m) == 1, timeout=120, what=f"{model} ready")  # type: ignore[misc]
            wait_until(lambda m=model: listed(gw, m), timeout=60, what=f"{model} routed")  # type: ignore[misc]
            timed(gw, model)
            start.append(time.monotonic() - t0)
            c.ctl("delete", "model", model)
        cm, wm, sm = (statistics.median(x) for x in (cold, warm, start))
        print(f"adapter load {args.lora_seconds:g}s, engine start {args.load_seconds:g}s")
        print(f"cold adapter request: median {cm:.2f}s  ({', '.join(f'{x:.2f}' for x in cold)})")
        print(f"warm adapter request: median {wm:.3f}s")
        print(f"engine start to first answer: median {sm:.2f}s")
        print(f"cold / warm: {cm / wm:.0f}x   cold / engine start: {cm / sm:.2f}x")

        def engine_side() -> tuple[int, int]:
            """Loads and unloads the agents did, from their logs."""
            text = "".join(c.agent_log(n) for n in NODES)
            return text.count("] loaded LoRA adapter") + text.count(
                "adapters: loaded LoRA adapter"
            ), text.count("unloaded LoRA adapter")

        loads_before, unloads_before = engine_side()
        answered = [0]
        failed: list[str] = []
        slowest = [0.0]
        stop = threading.Event()

        def client(pool: list[str]) -> None:
            i = 0
            while not stop.is_set():
                try:
                    slowest[0] = max(slowest[0], timed(gw, pool[i % len(pool)]))
                    answered[0] += 1
                except (httpx.HTTPError, AssertionError) as exc:
                    failed.append(f"{pool[i % len(pool)]}: {exc!r}"[:200])
                i += 1

        hot = [[n] for n in names[:3]]
        threads = [threading.Thread(target=client, args=(pool,)) for pool in [*hot, names[3:]]]
        for t in threads:
            t.start()
        time.sleep(args.churn_seconds)
        stop.set()
        for t in threads:
            t.join(timeout=120)
        loads_after, unloads_after = engine_side()
        loads, unloads = loads_after - loads_before, unloads_after - unloads_before
        per_min = 60 / args.churn_seconds
        print(
            f"churn over {args.churn_seconds:g}s, {args.adapters} adapters, 3 replicas x "
            f"{args.slots} slots: {loads * per_min:.0f} loads/min, {unloads * per_min:.0f} "
            f"unloads/min, {answered[0]} requests answered (slowest {slowest[0]:.1f}s), "
            f"{len(failed)} failed {failed[:3]}"
        )
    finally:
        gw.stop()
        c.close()


if __name__ == "__main__":
    main()
