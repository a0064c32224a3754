"""An enrollment flood against a real controller process (issue 25 item 4): a client
holding the enrollment token enrolls fabricated names as fast as it can, while one
honest agent reports. Two controllers in one run: `--enroll-rate 10000` (as good as
no limit: the code before) and the default limit. Prints names enrolled per second,
429s, and the honest agent's report latency during the flood against the same
controller with no flood (the baseline, same run).

    python bench/bench_enroll.py [--seconds 5] [--clients 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp

ADMIN, ENROLL, AGENT = "bench-admin", "bench-enroll", "bench-agent"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def report(node: str) -> dict[str, Any]:
    gpus = [
        {
            "uuid": f"GPU-{node}-{i}",
            "index": i,
            "gpu_class": "H100-SXM-80GB",
            "memory_total_mib": 81920,
            "health": "healthy",
        }
        for i in range(8)
    ]
    return {"node": node, "agent_version": "bench", "boot_id": "b", "interval_s": 5.0, "gpus": gpus}


def pct(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def reports(url: str, seconds: float) -> list[float]:
    """The honest agent: one report every 20 ms; latencies in ms."""
    out = []
    headers = {"Authorization": f"Bearer {AGENT}"}
    async with aiohttp.ClientSession() as s:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            async with s.post(
                f"{url}/v1/agent/report", json=report("honest"), headers=headers
            ) as r:
                await r.read()
            out.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(0.02)
    return out


async def flood(url: str, seconds: float, clients: int, start: int) -> tuple[int, int]:
    """Fabricated enrollments from `clients` connections: (enrolled, refused with 429)."""
    names = (f"fake{i:06d}" for i in itertools.count(start))
    counts = {200: 0, 429: 0}
    headers = {"Authorization": f"Bearer {ENROLL}"}

    async def one(s: aiohttp.ClientSession, end: float) -> None:
        while time.monotonic() < end:
            body = {"node": next(names)}
            async with s.post(f"{url}/v1/agent/enroll", json=body, headers=headers) as r:
                await r.read()
                counts[r.status] = counts.get(r.status, 0) + 1

    async with aiohttp.ClientSession() as s:
        end = time.monotonic() + seconds
        await asyncio.gather(*(one(s, end) for _ in range(clients)))
    return counts[200], counts[429]


async def measure(url: str, seconds: float, clients: int) -> dict[str, float]:
    base = await reports(url, seconds)
    during, (enrolled, refused) = await asyncio.gather(
        reports(url, seconds), flood(url, seconds, clients, 0)
    )
    return {
        "enrolled_per_s": enrolled / seconds,
        "refused_per_s": refused / seconds,
        "base_p50": pct(base, 0.5),
        "base_p99": pct(base, 0.99),
        "flood_p50": pct(during, 0.5),
        "flood_p99": pct(during, 0.99),
    }


def run(rate: str, seconds: float, clients: int) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "LLMGW_ADMIN_TOKEN": ADMIN,
        "LLMGW_ENROLL_TOKEN": ENROLL,
        "LLMGW_AGENT_TOKEN": AGENT,
    }
    with tempfile.TemporaryDirectory() as state:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw", "controller", "--listen", f"127.0.0.1:{port}",
             "--state-dir", state, "--allow-shared-agent-token", "--allow-static-enroll-token",
             "--enroll-rate", rate],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            for _ in range(200):
                with contextlib.suppress(OSError):
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                time.sleep(0.05)
            return asyncio.run(measure(url, seconds, clients))
        finally:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", type=int, default=16)
    args = p.parse_args()
    print(f"{args.clients} flooding clients for {args.seconds:g} s; one honest agent reporting")
    print("controller            enrolled/s  429/s   report p50/p99 idle   during flood   p99 x")
    for label, rate in (("no limit (before)", "10000"), ("--enroll-rate 5", "5")):
        m = run(rate, args.seconds, args.clients)
        print(
            f"{label:<21} {m['enrolled_per_s']:>10.1f} {m['refused_per_s']:>6.0f}"
            f"   {m['base_p50']:5.1f} / {m['base_p99']:5.1f} ms"
            f"   {m['flood_p50']:5.1f} / {m['flood_p99']:5.1f} ms"
            f"   {m['flood_p99'] / m['base_p99']:4.1f}"
        )


if __name__ == "__main__":
    main()
