"""A card failing under a serving replica: how long until its stand-in serves and
the original is gone, against one fresh replica's start in the same run.

Real processes: a controller, three agents whose fake GPUs come from files
(`--fake-gpus @FILE`), fake engines, the gateway with its SMG child, and a
client sending requests (streamed and whole) all along. Each round fails the
card under one replica by rewriting its node's file, waits for the node's
cordon, the stand-in ready and the original gone, then heals the card and
uncordons the node.

The baseline is the same pipeline without a fault: a model applied to its
replica ready (placement, the agent's next report, the engine's load). A
stand-in costs that plus the report that carries the fault.

    .venv/bin/python bench/bench_faults.py [--rounds 3] [--load-seconds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.procs import Cluster
from tests.gateway.gwprocs import Gateway, Load, wait_cluster_ready

NODES = ["gpu1", "gpu2", "gpu3"]
POLL_S = 0.05


def spec_file(path: Path, unhealthy: int | None = None) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("2xH100-80GB" + (f",unhealthy={unhealthy}" if unhealthy is not None else ""))
    os.replace(tmp, path)


def model(name: str, replicas: int, load_s: float) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"org/{name}",
        "min_replicas": replicas,
        "gpus_per_shard": 1,
        "engine": "fake",
        "engine_args": ["--load-seconds", str(load_s), "--host", "127.0.0.1", "--latency", "0.05"],
    }


def until(check: Callable[[], Any], timeout: float = 120.0) -> float:
    """Seconds until `check()` is true (polled)."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("the fleet did not get there in time")
        time.sleep(POLL_S)
    return time.monotonic() - t0


def of(c: Cluster, name: str) -> list[dict[str, Any]]:
    return [r for r in c.get("/v1/replicas") if r["model"] == name]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--load-seconds", type=float, default=2.0, help="fake engine load time")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        c = Cluster(Path(tmp) / "cluster")
        try:
            c.start_controller("--reconcile-interval", "0.2", "--stop-grace", "20")
            files = {n: Path(tmp) / f"{n}.gpus" for n in NODES}
            for n in NODES:
                spec_file(files[n])
                c.start_agent(n, gpus=f"@{files[n]}", interval=0.5)
            wait_cluster_ready(c, NODES)

            starts = []
            for i in range(args.rounds):
                c.apply([model(f"probe-{i}", 1, args.load_seconds)])
                starts.append(
                    until(lambda i=i: [r for r in of(c, f"probe-{i}") if r["state"] == "ready"])
                )
            for i in range(args.rounds):
                c.ctl("delete", "model", f"probe-{i}")
            until(lambda: not [r for r in c.get("/v1/replicas") if r["model"] != "chat"])

            c.apply([model("chat", 2, args.load_seconds)])
            until(lambda: len([r for r in of(c, "chat") if r["state"] == "ready"]) == 2)
            gw = Gateway(c, "--policy", "round_robin")
            gw.start()
            gw.wait_serving("chat")
            load = Load(gw.url, "chat").start()
            cordons, serving, gone = [], [], []
            try:
                for _ in range(args.rounds):
                    victim = min(of(c, "chat"), key=lambda r: r["shards"][0]["node"])
                    node = victim["shards"][0]["node"]
                    [uuid] = victim["shards"][0]["gpus"]
                    detail = c.get(f"/v1/nodes/{node}")
                    index = next(g["index"] for g in detail["gpus"] if g["uuid"] == uuid)
                    t0 = time.monotonic()
                    spec_file(files[node], index)
                    until(
                        lambda node=node: c.get(f"/v1/nodes/{node}")["row"]["state"] == "cordoned"
                    )
                    cordons.append(time.monotonic() - t0)

                    def stand_in_ready(victim: dict[str, Any] = victim) -> bool:
                        return any(
                            r["replaces"] == victim["id"] and r["state"] == "ready"
                            for r in of(c, "chat")
                        ) or victim["id"] not in {r["id"] for r in of(c, "chat")}

                    until(stand_in_ready)
                    serving.append(time.monotonic() - t0)
                    until(
                        lambda victim=victim: (
                            victim["id"]
                            not in {e["replica_id"] for e in c.get("/v1/endpoints")["endpoints"]}
                            and victim["id"] not in {r["id"] for r in of(c, "chat")}
                        )
                    )
                    gone.append(time.monotonic() - t0)
                    spec_file(files[node])
                    c.ctl("uncordon", node)
                    until(
                        lambda: (
                            len([r for r in of(c, "chat") if r["state"] == "ready"]) == 2
                            and all(r["replaces"] is None for r in of(c, "chat"))
                        )
                    )
            finally:
                load.stop()
                gw.stop()
        finally:
            c.close()

    def fmt(xs: list[float]) -> str:
        return f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f})"

    base = statistics.median(starts)
    print(f"baseline: a fresh replica, apply to ready       {fmt(starts)}")
    print(f"card fault to node cordoned                       {fmt(cordons)}")
    print(
        f"card fault to stand-in ready                      {fmt(serving)}"
        f"  = {statistics.median(serving) / base:.2f} x baseline"
    )
    print(
        f"card fault to original out of routing and gone    {fmt(gone)}"
        f"  = {statistics.median(gone) / base:.2f} x baseline"
    )
    print(f"requests through the gateway: {load.ok} ok, {len(load.failures)} failed")
    for f in load.failures[:5]:
        print("  ", f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
