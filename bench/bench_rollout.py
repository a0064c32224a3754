"""A rollout of a changed spec under traffic: how long it takes, against the
starts it needs, and how many requests fail (the target is none).

Real processes: a controller, six agents with two fake cards each, fake engines
(`--load-seconds` each start), the gateway with its SMG child, and two clients
sending requests (streamed and whole) without pause. The model runs
`--replicas` replicas; the rollout changes one engine argument, with
max_surge `--max-surge` (default 1) and max_unavailable 0.

The baseline, in the same run: the same model applied fresh, from nothing to
every replica ready (its engines start side by side). A rollout with surge 1
starts them one after another and waits for the gateway to let go of each old
one, so it should take about `replicas` times the baseline plus the handshakes.

    .venv/bin/python bench/bench_rollout.py [--replicas 4] [--load-seconds 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import Gateway, Load, wait_cluster_ready

NODES = [f"gpu{i}" for i in range(1, 7)]


def spec(
    name: str, replicas: int, load_s: float, extra: list[str], surge: int = 1
) -> dict[str, Any]:
    return {
        "name": name,
        "max_surge": surge,
        "source": f"org/{name}",
        "min_replicas": replicas,
        "gpus_per_shard": 1,
        "engine": "fake",
        "engine_args": [
            "--load-seconds",
            str(load_s),
            "--host",
            "127.0.0.1",
            "--latency",
            "0.05",
            "--token-interval",
            "0.1",
            *extra,
        ],
    }


def ready(c: Cluster, name: str, n: int) -> bool:
    rs = [r for r in c.get("/v1/replicas") if r["model"] == name]
    return len(rs) == n and all(r["state"] == "ready" for r in rs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--load-seconds", type=float, default=2.0)
    p.add_argument("--max-surge", type=int, default=1)
    args = p.parse_args()
    n, load_s = args.replicas, args.load_seconds
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        c = Cluster(Path(tmp) / "cluster")
        try:
            c.start_controller("--reconcile-interval", "0.5", "--stop-grace", "20")
            for node in NODES:
                c.start_agent(node, gpus="2xH100-80GB", interval=0.5)
            wait_cluster_ready(c, NODES)

            t0 = time.monotonic()
            c.apply([spec("probe", n, load_s, [])])
            wait_until(lambda: ready(c, "probe", n), timeout=120, what="the probe ready")
            fresh = time.monotonic() - t0
            c.ctl("delete", "model", "probe")
            wait_until(
                lambda: not [r for r in c.get("/v1/replicas") if r["model"] == "probe"],
                timeout=60,
                what="the probe gone",
            )

            c.apply([spec("chat", n, load_s, [])])
            wait_until(lambda: ready(c, "chat", n), timeout=120, what="chat ready")
            gw = Gateway(c, "--policy", "round_robin")
            gw.start()
            gw.wait_serving("chat")
            load = Load(gw.url, "chat").start()
            try:
                wait_until(lambda: load.ok >= 10, timeout=30, what="requests flowing")
                before = load.ok
                t0 = time.monotonic()
                c.apply([spec("chat", n, load_s, ["--seed", "2"], args.max_surge)])
                done = subprocess.run(
                    c.ctl_argv("rollout", "status", "chat", "--wait", "--timeout", "10m"),
                    capture_output=True,
                    text=True,
                    env=c.env(),
                )
                rollout = time.monotonic() - t0
                during = load.ok - before
            finally:
                load.stop()
                gw.stop()
        finally:
            c.close()
    print(f"baseline: {n} replicas applied fresh, to all ready   {fresh:.1f} s")
    print(
        f"rollout of {n} replicas (surge {args.max_surge}, unavailable 0)      {rollout:.1f} s"
        f"  = {rollout / fresh:.2f} x baseline ({rollout / n:.1f} s a replica)"
    )
    print(
        f"ctl rollout status --wait exited {done.returncode}: {done.stdout.strip().splitlines()[-1]}"
    )
    print(
        f"requests during the rollout: {during} ok; all run: {load.ok} ok, "
        f"{len(load.failures)} failed"
    )
    for f in load.failures[:5]:
        print("  ", f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
