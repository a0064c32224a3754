"""How long a request waits for its model to wake, with the agents' assignments feed and
without it, side by side (issue 32's latency, the eighth session).

Two fleets run at once, the same in all but one thing: a controller (its default
1-s reconcile interval), one agent reporting at its default 5-s interval with one fake
card, and the gateway. In the *feed* fleet the agent long-polls its assignments (the
default); in the *reports* fleet it learns them only from its reports'
replies (`--assignments-wait 0`, as every agent did before). Two models share the
card (`sleep_after_s` 300: neither sleeps on its own) and are asked in turn, one
streamed request at a time, `--switches` times: each request finds its model asleep
and the other awake and idle, so each is a switch (the idle one sleeps, the asked one
wakes). Printed per fleet: time to first token of those requests (median, 90th
percentile, worst), and the feed's figures as ratios of the reports'.

    .venv/bin/python bench/bench_wake.py [--switches 12] [--wake-seconds 1]
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

from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import Gateway, model, wait_cluster_ready

MODELS = ("alpha", "beta")


def specs(wake_s: float) -> list[dict[str, Any]]:
    out = []
    for name in MODELS:
        spec = model(name, min_replicas=0)
        args = list(spec["engine_args"])
        args[args.index("--load-seconds") + 1] = "2"
        args += ["--wake-seconds", str(wake_s)]
        out.append(
            {**spec, "engine_args": args, "max_replicas": 1, "sleep_after_s": 300, "sleep_level": 1}
        )
    return out


class Fleet:
    def __init__(self, root: Path, name: str, agent_extra: list[str]) -> None:
        self.name = name
        self.c = Cluster(root / name)
        self.c.start_controller("--stop-grace", "20")
        self.c.start_agent("gpu1", gpus="1xH100-80GB", interval=5.0, extra=agent_extra)
        wait_cluster_ready(self.c, ["gpu1"])
        self.gw = Gateway(self.c, name=f"gw-{name}")
        self.ttft: list[float] = []
        self.failed = 0

    def start(self, wake_s: float) -> None:
        self.c.apply(specs(wake_s))
        self.gw.start()

        def listed() -> bool:
            try:
                got = httpx.get(f"{self.gw.url}/v1/models", timeout=5).json()["data"]
            except (httpx.HTTPError, ValueError, KeyError):
                return False
            return {m["id"] for m in got} >= set(MODELS)

        wait_until(listed, timeout=60, what=f"the {self.name} gateway listing both models")

    def ask(self, name: str) -> float | None:
        """A streamed request; seconds to its first token (None: it failed)."""
        body = {
            "model": name,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 2,
            "stream": True,
        }
        sent = time.monotonic()
        try:
            with httpx.stream(
                "POST", f"{self.gw.url}/v1/chat/completions", json=body, timeout=300
            ) as r:
                if r.status_code != 200:
                    return None
                for line in r.iter_lines():
                    if line.startswith("data:") and '"content"' in line:
                        return time.monotonic() - sent
        except httpx.HTTPError:
            return None
        return None

    def state(self, name: str) -> str | None:
        reps = [r for r in self.c.get("/v1/replicas") if r["model"] == name]
        return reps[0]["state"] if reps else None

    def run(self, switches: int) -> None:
        # Both placed once (the second start puts the first to sleep on the one card).
        for name in MODELS:
            if self.ask(name) is None:
                self.failed += 1
        for i in range(switches):
            name = MODELS[i % 2]
            wait_until(
                lambda name=name: self.state(name) == "sleeping",
                timeout=120,
                what=f"{name} asleep in the {self.name} fleet",
            )
            took = self.ask(name)
            if took is None:
                self.failed += 1
            else:
                self.ttft.append(took)
            time.sleep(1.0)

    def close(self) -> None:
        self.gw.stop()
        self.c.close()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--switches", type=int, default=12)
    p.add_argument("--wake-seconds", type=float, default=1.0)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-wake-"))
    print(f"logs in {root}", flush=True)
    fleets = [Fleet(root, "feed", []), Fleet(root, "reports", ["--assignments-wait", "0"])]
    try:
        for f in fleets:
            f.start(args.wake_seconds)
        threads = [threading.Thread(target=f.run, args=(args.switches,)) for f in fleets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for f in fleets:
            f.close()
    print(
        f"python {sys.version.split()[0]}; {args.switches} switches a fleet, wake "
        f"{args.wake_seconds:g} s, agents reporting every 5 s, controller reconciling every 1 s"
    )
    rows = {}
    for f in fleets:
        rows[f.name] = {
            "p50": statistics.median(f.ttft) if f.ttft else float("nan"),
            "p90": pct(f.ttft, 0.9),
            "max": max(f.ttft, default=float("nan")),
        }
        print(
            f"{f.name:8} TTFT after a switch: p50 {rows[f.name]['p50']:5.2f} s  p90 "
            f"{rows[f.name]['p90']:5.2f} s  worst {rows[f.name]['max']:5.2f} s  "
            f"({len(f.ttft)} answered, {f.failed} failed)"
        )
    feed, reports = rows["feed"], rows["reports"]
    print(
        "feed / reports: "
        + ", ".join(f"{k} {feed[k] / reports[k]:.2f}x" for k in ("p50", "p90", "max"))
    )


if __name__ == "__main__":
    main()
