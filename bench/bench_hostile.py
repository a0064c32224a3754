"""Report latency and RSS of a real controller while hostile clients send gzip
bodies and gateway statuses, against the same run without them (issue 25).

    python bench/bench_hostile.py [--nodes 500] [--seconds 10] [--rounds 2]

A `llmgw controller` process (SQLite, tokens) takes reports from `--nodes`
registered nodes at a steady closed-loop load. Each round has a quiet phase (the
reports only) and a hostile phase (the same reports, plus a child process that
sends, each as fast as `--hostile-rate` allows per client):

- 1 MiB gzip bodies that inflate to 256 MiB, unauthenticated and with the agent
  token (aiohttp used to inflate them on the event loop, before auth);
- gateway statuses under ever new names, with maps of 20,000 replica ids that
  do not exist (700 KB), of 1,500 (48 KB), and of 1,500 with two control characters
  (every name used to be kept for ever, with its maps).

Prints report p50/p99 and the controller's RSS for each phase, and the ratio
hostile / quiet. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))

from bench_controller import free_port, pct, synthetic_report

AGENT, GATEWAY, ADMIN = "bench-agent", "bench-gateway", "bench-admin"
BOMB = gzip.compress(b"\0" * (256 << 20), compresslevel=9)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_controller(state_dir: str, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "LLMGW_AGENT_TOKEN": AGENT,
        "LLMGW_GATEWAY_TOKEN": GATEWAY,
        "LLMGW_ADMIN_TOKEN": ADMIN,
    }
    argv = [sys.executable, "-m", "llmgw", "controller", "--listen", f"127.0.0.1:{port}"]
    argv += ["--state-dir", state_dir, "--allow-shared-agent-token", "--log-level", "warning"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)


# -- the hostile child --------------------------------------------------------------------


def gateway_status_bodies(n: int, entries: int, bad_keys: bool) -> list[bytes]:
    """`n` statuses under new names, each with `entries` replica ids that do not
    exist (and, with `bad_keys`, two with control characters: refused with 400)."""
    keys = [f"ghost-{i}" for i in range(entries)] + (["\x1b[2J", "a\nb"] if bad_keys else [])
    maps = json.dumps(dict.fromkeys(keys, 1))
    return [
        (
            f'{{"name": "gw-{uuid.uuid4().hex[:12]}", "cursor": "", "in_flight": {maps}, '
            f'"requests": {maps}}}'
        ).encode()
        for _ in range(n)
    ]


async def hostile(url: str, rate: float, seconds: float, kinds: set[str]) -> None:
    """Every client sends at most `rate` requests a second for `seconds`. Bodies
    are made before the clock starts, so this process costs the machine little."""
    statuses: dict[int, int] = {}
    n = int(rate * seconds) + 1

    async def client(bodies: list[bytes], headers: dict[str, str], path: str) -> None:
        gap = 1.0 / rate
        end = time.monotonic() + seconds
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            for body in bodies:
                if time.monotonic() >= end:
                    break
                t0 = time.monotonic()
                try:
                    async with session.post(url + path, data=body, headers=headers) as resp:
                        await resp.read()
                        statuses[resp.status] = statuses.get(resp.status, 0) + 1
                except aiohttp.ClientError:
                    statuses[0] = statuses.get(0, 0) + 1
                await asyncio.sleep(max(0.0, gap - (time.monotonic() - t0)))

    gz = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    status = {"Content-Type": "application/json", "Authorization": f"Bearer {GATEWAY}"}
    clients = []
    if "gzip" in kinds:
        clients.append(client([BOMB] * n, gz, "/v1/agent/report"))
        auth = {**gz, "Authorization": f"Bearer {AGENT}"}
        clients.append(client([BOMB] * n, auth, "/v1/agent/report"))
    if "status" in kinds:
        for entries, bad in ((20_000, False), (1_500, False), (1_500, True)):
            bodies = gateway_status_bodies(n, entries, bad)
            clients.append(client(bodies, status, "/v1/gateways/status"))
    print("  hostile clients start", flush=True)
    await asyncio.gather(*clients)
    print(
        f"  hostile answers (status: count, 0 = connection error): {dict(sorted(statuses.items()))}"
    )


# -- the measured load --------------------------------------------------------------------


async def reports(
    session: aiohttp.ClientSession, url: str, bodies: list[bytes], seconds: float, concurrency: int
) -> list[float]:
    latencies: list[float] = []
    end = time.monotonic() + seconds
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {AGENT}"}

    async def worker(k: int) -> None:
        i = k
        while time.monotonic() < end:
            t0 = time.perf_counter()
            async with session.post(url, data=bodies[i % len(bodies)], headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"report answered {resp.status}: {await resp.text()}")
            latencies.append(time.perf_counter() - t0)
            i += concurrency
            await asyncio.sleep(0.005)  # a steady load, not a saturating one

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return latencies


def start_hostile(url: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    """The hostile child, once its bodies are made and it starts sending."""
    argv = [sys.executable, __file__, "--hostile", url, "--only", args.only]
    argv += ["--seconds", str(args.seconds), "--hostile-rate", str(args.hostile_rate)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    child.stdout.readline()
    return child


async def main_async(args: argparse.Namespace) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    bodies = [json.dumps(synthetic_report(i)).encode() for i in range(args.nodes)]
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_controller(tmp, port)
        try:
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=args.concurrency)
            ) as session:
                for _ in range(200):
                    try:
                        async with session.get(f"{url}/healthz") as resp:
                            if resp.status == 200:
                                break
                    except aiohttp.ClientConnectionError:
                        await asyncio.sleep(0.05)
                report_url = f"{url}/v1/agent/report"
                await reports(session, report_url, bodies, 3, args.concurrency)  # register, warm
                print(
                    f"controller RSS after registering {args.nodes} nodes: {rss_mib(proc.pid):.0f} MiB"
                )
                rows = []
                for r in range(args.rounds):
                    for phase in ("quiet", "hostile"):
                        child = None
                        if phase == "hostile":
                            child = await asyncio.to_thread(start_hostile, url, args)
                        lat = await reports(
                            session, report_url, bodies, args.seconds, args.concurrency
                        )
                        if child is not None:
                            out, _ = await asyncio.to_thread(child.communicate, timeout=60)
                            print(out.rstrip())
                        ms = [x * 1e3 for x in lat]
                        row = (
                            r,
                            phase,
                            statistics.median(ms),
                            pct(ms, 0.99),
                            len(ms),
                            rss_mib(proc.pid),
                        )
                        rows.append(row)
                        print(
                            f"round {r} {phase:8s} reports {row[4]:6d}  p50 {row[2]:6.2f} ms  "
                            f"p99 {row[3]:7.2f} ms  RSS {row[5]:6.0f} MiB"
                        )
                for r in range(args.rounds):
                    quiet, bad = rows[2 * r], rows[2 * r + 1]
                    print(
                        f"round {r} hostile / quiet: p50 {bad[2] / quiet[2]:.2f}x  "
                        f"p99 {bad[3] / quiet[3]:.2f}x  RSS {bad[5] / quiet[5]:.2f}x"
                    )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--hostile-rate", type=float, default=10, help="requests a second per client")
    p.add_argument(
        "--only", choices=["gzip", "status", "both"], default="both", help="hostile kinds"
    )
    p.add_argument("--hostile", metavar="URL", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.hostile:
        kinds = {"gzip", "status"} if args.only == "both" else {args.only}
        asyncio.run(hostile(args.hostile, args.hostile_rate, args.seconds, kinds))
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
