"""Controller `/metrics` scrape cost at fleet scale, and whether scrapes block reports.

    python bench/bench_metrics.py [--nodes 2000 10000] [--reports 3000]

The controller runs in its own process (bench_controller's server); this process
registers every node, declares ten models, then measures in the same run:
  - GET /metrics against the baseline GET /v1/summary of the same fleet;
  - report latency with no scrapes, and with a scraper hitting /metrics back to
    back (far harder than Prometheus' one scrape every 15 s).
Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time

import aiohttp
from bench_controller import MODELS, Server, pct, post_many, synthetic_report


async def get_times(session: aiohttp.ClientSession, url: str, n: int) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        async with session.get(url) as resp:
            body = await resp.read()
            assert resp.status == 200, body[:200]
        times.append(time.perf_counter() - t0)
        size = len(body)
    return times, size


async def reports_p99(
    session: aiohttp.ClientSession,
    url: str,
    load: list[bytes],
    concurrency: int,
    scrape_url: str | None,
) -> tuple[float, float, int]:
    """Report p50/p99 (ms) while, optionally, /metrics is scraped back to back."""
    stop = asyncio.Event()
    scrapes = 0

    async def scraper() -> None:
        nonlocal scrapes
        while not stop.is_set():
            async with session.get(scrape_url or "") as resp:
                await resp.read()
            scrapes += 1

    task = asyncio.create_task(scraper()) if scrape_url else None
    _, lat = await post_many(session, f"{url}/v1/agent/report", load, concurrency)
    stop.set()
    if task:
        await task
    return statistics.median(lat) * 1e3, pct(lat, 0.99) * 1e3, scrapes


async def run(n: int, reports: int, concurrency: int) -> None:
    bodies = [json.dumps(synthetic_report(i)).encode() for i in range(n)]
    server = Server("controller")
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency + 1)
        ) as session:
            await server.wait(session)
            await post_many(session, f"{server.url}/v1/agent/report", bodies, concurrency)
            specs = [{"name": m, "source": m, "min_replicas": 0} for m in MODELS]
            async with session.post(f"{server.url}/v1/models", json={"models": specs}) as resp:
                assert resp.status == 200, await resp.text()
            base, base_size = await get_times(session, f"{server.url}/v1/summary", 50)
            scrape, size = await get_times(session, f"{server.url}/metrics", 50)
            rng = random.Random(1)
            load = [bodies[rng.randrange(n)] for _ in range(reports)]
            quiet = await reports_p99(session, server.url, load, concurrency, None)
            busy = await reports_p99(
                session, server.url, load, concurrency, f"{server.url}/metrics"
            )
    finally:
        server.stop()
    b50, s50 = statistics.median(base) * 1e3, statistics.median(scrape) * 1e3
    print(f"== {n} nodes (8 GPUs, 4 fabrics, 10 models; per-node series off)")
    print(
        f"  baseline GET /v1/summary: p50 {b50:.2f} ms  p99 {pct(base, 0.99) * 1e3:.2f} ms  "
        f"({base_size / 1024:.1f} KiB)"
    )
    print(
        f"  GET /metrics:             p50 {s50:.2f} ms  p99 {pct(scrape, 0.99) * 1e3:.2f} ms  "
        f"({size / 1024:.1f} KiB) = {s50 / b50:.2f} x baseline"
    )
    print(f"  reports, no scrapes:      p50 {quiet[0]:.2f} ms  p99 {quiet[1]:.2f} ms")
    print(
        f"  reports, scraped nonstop: p50 {busy[0]:.2f} ms  p99 {busy[1]:.2f} ms  "
        f"({busy[2]} scrapes during {reports} reports) = {busy[1] / quiet[1]:.2f} x p99\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[2000, 10000])
    p.add_argument("--reports", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; controller in its own process")
    for n in args.nodes:
        asyncio.run(run(n, args.reports, args.concurrency))


if __name__ == "__main__":
    main()
