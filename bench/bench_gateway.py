"""The gateway's data plane and control plane, measured in one run.

Data plane, on the same fake engines (`python -m llmgw.agent.fake_engine`, with a
simulated prefix cache each):

* direct to the engines (client-side round robin): the floor;
* through SMG as `llmgw gateway` runs it (same options), `round_robin`;
* the same, `cache_aware`;
* through llmgw's front door (gateway/front.py, in a process of its own, as
  `llmgw gateway` runs it) and SMG `round_robin` behind it, with a client key of
  the controller's: one that allows every model (`front`), and one limited by a
  pattern (`front+models`); `front+meter`, the model declared so its tokens are
  metered (each stream asked for its usage, which is cut out of what the client
  gets); `front+limits`, metered and under a tenant's limits and the same on its
  model (rpm, tpm and a budget, never reached); and, with `--baseline-src DIR`,
  the front as another tree has it (`front@base`, e.g. an export of main).

Workload: 32 system prompts of ~2,000 tokens, each behind many short user
turns, streamed; at a fixed arrival rate and at saturation (closed loop).
Each engine's cache holds about a quarter of all prefixes, so routing decides
the hit rate. Figures: throughput, p50/p99 latency and time to first token, the
latency the gateway adds over direct, the prefix-cache hit rate from the
engines' own counters, and imbalance (max/mean requests per engine).

Control plane: the time from a replica turning ready, or being marked
stopping, to a long-polling gateway receiving the change, at 2,000 replicas
(an in-process controller app over real HTTP).

    python bench/bench_gateway.py [--engines 4] [--seconds 4] [--rate 40] [--rounds 3]

Every mode runs once a round, in an order turned each round, for `--rounds` rounds.
The front's added latency is its p50 less `round_robin`'s, SMG alone, in the same
round; its throughput at saturation a ratio to `round_robin`'s in the same round;
each printed as the median over the rounds with their range in brackets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# LLMGW_BENCH_SRC: the llmgw tree a front runs from (the baseline's: `--baseline-src`).
sys.path.insert(0, os.environ.get("LLMGW_BENCH_SRC") or str(Path(__file__).resolve().parent.parent))

from llmgw.gateway.front import Front, new_upstream_key
from llmgw.gateway.keyring import Keyring
from llmgw.gateway.keys import ApiKey
from llmgw.gateway.main import event_loop_factory
from llmgw.gateway.smg import Smg, SmgOptions, free_loopback_port
from llmgw.tenant_keys import digest
from llmgw.wire import ClientKeyEntry

KEY_ALL, KEY_LIMITED = "sk-llmgw-benchall-0123456789", "sk-llmgw-benchlim-0123456789"

PROMPTS = 32
PROMPT_TOKENS = 2000
WORDS = [f"w{i}" for i in range(5000)]


def system_prompts(seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=PROMPT_TOKENS)) for _ in range(PROMPTS)]


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name in (
                "vllm:prefix_cache_queries_total",
                "vllm:prefix_cache_hits_total",
                "vllm:request_success_total",
            ):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def one(
    http: aiohttp.ClientSession,
    url: str,
    prompt: str,
    turn: str,
    lat: list[float],
    ttft: list[float],
) -> bool:
    body = {
        "model": "bench",
        "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": turn}],
        "max_tokens": 4,
        "stream": True,
    }
    t0 = time.perf_counter()
    first = None
    async with http.post(f"{url}/v1/chat/completions", json=body) as r:
        if r.status != 200:
            return False
        async for line in r.content:
            if first is None and line.startswith(b"data: "):
                first = time.perf_counter() - t0
    lat.append(time.perf_counter() - t0)
    ttft.append(first or 0.0)
    return True


async def run_load(
    targets: list[str],
    prompts: list[str],
    seconds: float,
    rate: float | None,
    seed: int,
    headers: dict[str, str] | None = None,
) -> dict[str, float]:
    """rate: Poisson arrivals per second; None: saturation with 32 clients."""
    rng = random.Random(seed)
    lat: list[float] = []
    ttft: list[float] = []
    failed = 0
    counter = iter(range(10**9))
    conn = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=conn, headers=headers) as http:

        async def fire() -> None:
            nonlocal failed
            n = next(counter)
            url = targets[n % len(targets)]
            prompt = prompts[rng.randrange(PROMPTS)]
            try:
                ok = await one(http, url, prompt, f"user turn {n} {rng.random()}", lat, ttft)
            except aiohttp.ClientError:
                ok = False
            failed += not ok

        t0 = time.perf_counter()
        if rate is None:

            async def client() -> None:
                while time.perf_counter() - t0 < seconds:
                    await fire()

            await asyncio.gather(*(client() for _ in range(32)))
        else:
            tasks = []
            while time.perf_counter() - t0 < seconds:
                tasks.append(asyncio.create_task(fire()))
                await asyncio.sleep(rng.expovariate(rate))
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return {
        "rps": len(lat) / wall,
        "p50": pct(lat, 50) * 1e3,
        "p99": pct(lat, 99) * 1e3,
        "ttft50": pct(ttft, 50) * 1e3,
        "ttft99": pct(ttft, 99) * 1e3,
        "failed": failed,
    }


@dataclasses.dataclass
class Round:
    """One mode's run in one round: its load figures, the front's CPU seconds, and the
    engines' routing figures."""

    figures: dict[str, float]
    cpu: float
    routing: str


def spread(xs: list[float], fmt: str) -> str:
    """The median of per-round figures, with their range when there are several."""
    mid = format(statistics.median(xs), fmt)
    if len(xs) < 2:
        return mid
    return f"{mid} [{format(min(xs), fmt)}..{format(max(xs), fmt)}]"


def mode_line(mode: str, rounds: dict[str, list[Round]], seconds: float) -> str:
    """One mode's figures: medians over the rounds, and what it adds over the mode it
    stands on, paired round by round. round_robin routes as the direct client does, so
    the difference is SMG's own cost; a front's is its p50 less round_robin's (the
    same SMG policy behind it) in the same round, its throughput a ratio to it."""
    mine = rounds[mode]

    def median(name: str) -> float:
        return statistics.median(r.figures[name] for r in mine)

    added = ""
    under = "direct" if mode == "round_robin" else "round_robin" if mode.startswith("front") else ""
    if under:
        pairs = list(zip(mine, rounds[under], strict=True))
        added = (
            f"  +p50 {spread([a.figures['p50'] - b.figures['p50'] for a, b in pairs], '.2f')} ms"
        )
    if mode.startswith("front"):
        added += f" over SMG  {spread([a.figures['rps'] / b.figures['rps'] for a, b in pairs], '.2f')}x SMG's req/s"
        per = [r.cpu / (r.figures["rps"] * seconds) * 1e6 for r in mine if r.figures["rps"]]
        added += f"  front CPU {spread(per, '.0f')} us/req" if per else ""
    failed = sum(int(r.figures["failed"]) for r in mine)
    return (
        f"{mode:13} {median('rps'):7.1f} req/s  p50 {median('p50'):6.1f} ms  p99 {median('p99'):6.1f} ms"
        f"  ttft p50 {median('ttft50'):5.1f} p99 {median('ttft99'):5.1f} ms"
        f"  {mine[-1].routing}  failed {failed}{added}"
    )


def start_engines(n: int, cache_blocks: int) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    procs, urls = [], []
    for _ in range(n):
        port = free_loopback_port()
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "llmgw.agent.fake_engine",
                    "--port",
                    str(port),
                    "--model",
                    "bench",
                    "--load-seconds",
                    "0",
                    "--latency",
                    "0.030",
                    "--cached-latency",
                    "0.003",
                    "--cache-blocks",
                    str(cache_blocks),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        urls.append(f"http://127.0.0.1:{port}")
    return procs, urls


async def reset_caches(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as http:
        for u in urls:
            async with http.post(f"{u}/reset_prefix_cache") as r:
                r.raise_for_status()


async def engine_totals(urls: list[str]) -> list[dict[str, float]]:
    async with aiohttp.ClientSession() as http:
        return [await scrape(http, u) for u in urls]


def routing_figures(before: list[dict[str, float]], after: list[dict[str, float]]) -> str:
    def delta(name: str) -> list[float]:
        return [a.get(name, 0) - b.get(name, 0) for a, b in zip(after, before, strict=True)]

    q, h = sum(delta("vllm:prefix_cache_queries_total")), sum(delta("vllm:prefix_cache_hits_total"))
    per = delta("vllm:request_success_total")
    mean = statistics.mean(per) or 1
    return f"hit {h / q if q else 0:5.1%}  imbalance {max(per) / mean:4.2f}"


async def serve_front(upstream: str, port: int) -> None:
    """`--serve-front`: the gateway's front door alone, its keys (and what it meters
    and limits, when asked) read from stdin."""
    given = json.loads(sys.stdin.read())
    keyring = Keyring()
    keyring.set_controller_keys(ClientKeyEntry.model_validate(e) for e in given["keys"])
    options = {"declared": set(given["declared"])} if given.get("declared") else {}
    front = Front(keyring, lambda: upstream, given["upstream_key"], **options)  # type: ignore[arg-type]
    if given.get("limits"):
        from llmgw.wire import TenantLimitView

        front.limiter.set_limits(TenantLimitView.model_validate(k) for k in given["limits"])
    await front.start("127.0.0.1", port)
    await asyncio.Event().wait()


# Limits on tenant `a` that never refuse, so that every request takes their path.
NEVER = {"rpm": 10**9, "tpm": 10**15, "budget": 10**15, "per": "month"}
FRONTS: dict[str, dict[str, object]] = {
    "front": {},  # keys; the model not declared: neither metered nor limited
    "front+meter": {"declared": ["bench"]},  # metered: streams asked usage, and it cut out
    "front+limits": {
        "declared": ["bench"],
        "limits": [{"tenant": "a", **NEVER}, {"tenant": "a", "model": "bench", **NEVER}],
    },
}


def cpu_s(proc: subprocess.Popen[bytes] | None) -> float:
    """The CPU time (user and system) a process has used so far: what a front costs per
    request, read beside its latency, is steadier on a shared box than the latency."""
    if proc is None:
        return 0.0
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_front(
    upstream: str, upstream_key: str, options: dict[str, object], src: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_loopback_port()
    keys = [
        ClientKeyEntry(id="all", tenant="a", digest=digest(KEY_ALL), models=["*"]),
        ClientKeyEntry(id="lim", tenant="b", digest=digest(KEY_LIMITED), models=["ben*", "x"]),
    ]
    env = {**os.environ, "LLMGW_BENCH_SRC": src} if src else None
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-front", upstream, str(port)],
        stdin=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None
    body = {"upstream_key": upstream_key, "keys": [k.model_dump() for k in keys], **options}
    proc.stdin.write(json.dumps(body).encode())
    proc.stdin.close()
    return proc, f"http://127.0.0.1:{port}"


async def data_plane(args: argparse.Namespace) -> None:
    prompts = system_prompts()
    # Each engine holds about a quarter of the 32 prefixes (125 blocks each).
    cache_blocks = PROMPTS * (PROMPT_TOKENS // 16) // args.engines
    procs, urls = start_engines(args.engines, cache_blocks)
    gateways: dict[str, tuple[Smg, asyncio.Task[None]]] = {}
    upstream_key = new_upstream_key()
    fronts: list[subprocess.Popen[bytes]] = []
    try:
        await asyncio.sleep(1.5)
        for policy in ("round_robin", "cache_aware", "behind_front"):
            work = Path(tempfile.mkdtemp(prefix=f"bench-gw-{policy}-"))
            # No client keys in SMG behind the front either: the front checks them all
            # and sends none on, so that SMG gives each engine its own (smg.py).
            keys: list[ApiKey] = []
            smg = Smg(
                SmgOptions(
                    host="127.0.0.1",
                    port=free_loopback_port(),
                    policy="round_robin" if policy == "behind_front" else policy,
                    keys=keys,
                    workdir=work,
                )
            )
            smg.write_workers(dict.fromkeys(urls))
            task = asyncio.create_task(smg.run())
            await smg.started.wait()
            while sum((await smg.workers()).values()) < len(urls):  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            gateways[policy] = (smg, task)
        behind = gateways["behind_front"][0].base
        every = {"Authorization": f"Bearer {KEY_ALL}"}
        modes: list[tuple[str, list[str], dict[str, str] | None]] = [("direct", urls, None)]
        modes += [(p, [g[0].base], None) for p, g in gateways.items() if p != "behind_front"]
        proc_of: dict[str, subprocess.Popen[bytes]] = {}
        if args.baseline_src:  # the front as it was, from another tree, in this run
            proc, url = start_front(behind, upstream_key, {}, args.baseline_src)
            fronts.append(proc)
            modes.append(("front@base", [url], every))
            proc_of["front@base"] = proc
        for name, options in FRONTS.items():
            proc, url = start_front(behind, upstream_key, options)
            fronts.append(proc)
            modes.append((name, [url], every))
            proc_of[name] = proc
            if name == "front":
                modes.append(("front+models", [url], {"Authorization": f"Bearer {KEY_LIMITED}"}))
                proc_of["front+models"] = proc
        await asyncio.sleep(1.5)
        print(
            f"{args.engines} fake engines, {PROMPTS} system prompts x {PROMPT_TOKENS} tokens,"
            f" cache {cache_blocks} blocks/engine; {args.seconds:g}s per run\n"
        )
        for label, rate in ((f"fixed {args.rate:g} req/s", args.rate), ("saturation", None)):
            print(f"## {label}, {args.rounds} round(s)")
            rounds: dict[str, list[Round]] = {mode: [] for mode, _, _ in modes}
            for n in range(args.rounds):
                # Each round runs every mode once, the order turned by one each round so
                # that no mode always comes first on a box whose load drifts.
                turned = modes[n % len(modes) :] + modes[: n % len(modes)]
                for mode, targets, headers in turned:
                    await reset_caches(urls)  # every mode starts cold
                    before = await engine_totals(urls)
                    cpu0 = cpu_s(proc_of.get(mode))
                    seed = [m for m, _, _ in modes].index(mode) + 100 * n
                    r = await run_load(targets, prompts, args.seconds, rate, seed, headers)
                    cpu = cpu_s(proc_of.get(mode)) - cpu0
                    after = await engine_totals(urls)
                    rounds[mode].append(Round(r, cpu, routing_figures(before, after)))
            for mode, _, _ in modes:
                print(mode_line(mode, rounds, args.seconds))
            print()
    finally:
        for front in fronts:
            front.terminate()
            front.wait()
        for _, task in gateways.values():
            task.cancel()
        for _, task in gateways.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


def metering_cost(prompts: list[str]) -> None:
    """The work metering and limits add per request, timed in process (the least of
    several repeats: steady on a shared box, where the end-to-end figures above swing
    with the load), for this bench's request: its body parsed for the model, the
    usage asked of the engine, a 4-token stream's 7 chunks tapped (its usage read
    and cut out), the counts kept, and the limits checked and charged."""
    import timeit

    from llmgw.gateway.limits import Limiter
    from llmgw.gateway.metering import Meter, StreamTap, ask_usage
    from llmgw.wire import TenantLimitView

    body = json.dumps(
        {
            "model": "bench",
            "messages": [
                {"role": "system", "content": prompts[0]},
                {"role": "user", "content": "x"},
            ],
            "max_tokens": 4,
            "stream": True,
        }
    ).encode()
    usage = '"usage":{"prompt_tokens":2003,"completion_tokens":%d,"total_tokens":%d}'
    head = '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"bench"'
    chunks = [
        f'data: {head},"choices":[{{"index":0,"delta":{{"content":" lorem"}}}}],{usage % (i, 2003 + i)}}}\n\n'.encode()
        for i in range(1, 6)
    ]
    chunks.append(f'data: {head},"choices":[],{usage % (5, 2008)}}}\n\n'.encode())
    chunks.append(b"data: [DONE]\n\n")
    meter, limiter = Meter(), Limiter()
    limiter.set_limits(
        [TenantLimitView(tenant="a", **NEVER), TenantLimitView(tenant="a", model="bench", **NEVER)]  # type: ignore[arg-type]
    )
    parsed = json.loads(body)

    def parse() -> None:
        json.loads(body)

    def meter_stream() -> None:
        _, keep = ask_usage(body, parsed)
        tap = StreamTap(keep)
        for c in chunks:
            tap.feed(c)
        prompt, completion = tap.tokens
        meter.served("a", "bench", prompt, completion, False)

    def limits() -> None:
        limiter.check("a", "bench")
        limiter.spent("a", "bench", 2008)

    def unit() -> None:
        sum(range(100))

    def best(f: object) -> float:
        times = timeit.repeat(f, number=2000, repeat=7)  # type: ignore[arg-type]
        return min(times) / 2000 * 1e6

    print("## metering and limits, per request, in process (least of 7 x 2,000)")
    ref = best(unit)
    for name, f in (
        ("body parsed for its model", parse),
        ("stream metered", meter_stream),
        ("limits", limits),
    ):
        us = best(f)
        print(f"{name:26} {us:6.1f} us  ({us / ref:4.1f}x sum(range(100)), {ref:.2f} us here)")
    print()


async def control_plane(replicas: int) -> None:
    from aiohttp.test_utils import TestServer

    from llmgw.controller.core.settings import ControllerSettings
    from llmgw.controller.http.app import create_app
    from llmgw.controller.http.keys import term_of
    from llmgw.controller.loop.reconcile import Reconciler
    from llmgw.wire import ModelSpec, NodeReport

    state = Path(tempfile.mkdtemp(prefix="bench-gw-cp-"))
    app = create_app(
        ControllerSettings(state_dir=state, reconcile_interval_s=3600, reconcile_on_news=False)
    )
    server = TestServer(app)
    await server.start_server()
    fleet = term_of(app)
    fleet.facts.put_models(
        [ModelSpec(name="m", source="org/m", min_replicas=replicas, gpus_per_shard=1)]
    )

    def report(i: int, ready: bool) -> NodeReport:
        node = f"n{i:05d}"
        gpu = {
            "uuid": f"GPU-{i}",
            "index": 0,
            "gpu_class": "H100-SXM-80GB",
            "memory_total_mib": 81920,
            "health": "healthy",
        }
        shards = [
            {"id": a.replica_id, "model": "m", "state": "ready", "gpus": a.gpus, "port": 8000}
            for a in fleet.assignments_for(node)
        ]
        return NodeReport.model_validate(
            {
                "node": node,
                "agent_version": "bench",
                "boot_id": "b",
                "interval_s": 3600,
                "address": f"10.{i // 250}.{i % 250}.1",
                "gpus": [gpu],
                "replicas": shards if ready else [],
            }
        )

    reconciler = Reconciler(fleet)
    for i in range(replicas):
        fleet.ingest(report(i, False))
    reconciler.tick()
    for i in range(replicas - 1):  # all but one ready
        fleet.ingest(report(i, True))
    reconciler.tick()
    base = str(server.make_url(""))
    async with aiohttp.ClientSession() as http:
        t0 = time.perf_counter()
        async with http.get(f"{base}/v1/endpoints") as r:
            full = await r.json()
        full_ms = (time.perf_counter() - t0) * 1e3

        async def until(cursor: str, want: object) -> tuple[float, str]:
            t = time.perf_counter()
            while True:
                url = f"{base}/v1/endpoints?since={cursor}&wait=10"
                async with http.get(url) as r:
                    delta = await r.json()
                cursor = delta["cursor"]
                if want in {(e["replica_id"], e["state"]) for e in delta["endpoints"]}:
                    return (time.perf_counter() - t) * 1e3, cursor

        results = []
        cursor = full["cursor"]
        for what in ("ready", "stopping"):
            last = f"n{replicas - 1:05d}"
            rid = (
                fleet.facts.replicas_on(last)[0].id
                if what == "ready"
                else sorted(fleet.facts.records)[0]
            )
            want = (rid, "serving" if what == "ready" else "stopping")
            poll = asyncio.create_task(until(cursor, want))
            await asyncio.sleep(0.2)  # the poll is waiting
            t_change = time.perf_counter()
            if what == "ready":
                fleet.ingest(report(replicas - 1, True))
                reconciler.tick()
            else:
                fleet.facts.mark_stopping(rid)
            ms, cursor = await poll
            results.append((what, (time.perf_counter() - t_change) * 1e3))
    await server.close()
    print(f"## control plane at {replicas} replicas")
    print(f"full endpoint answer: {len(full['endpoints'])} endpoints in {full_ms:.1f} ms")
    for what, ms in results:
        print(f"replica {what:9} -> gateway has the change: {ms:6.1f} ms (target < 1000)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rate", type=float, default=40.0)
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run every mode this many times, interleaved; figures are medians over rounds",
    )
    p.add_argument("--replicas", type=int, default=2000)
    p.add_argument(
        "--baseline-src",
        metavar="DIR",
        help="also run the front from this llmgw tree (an export of the commit to compare with)",
    )
    p.add_argument("--no-control-plane", action="store_true", help="the data plane only")
    p.add_argument("--micro", action="store_true", help="only the in-process metering costs")
    p.add_argument("--serve-front", nargs=2, metavar=("UPSTREAM", "PORT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_front:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:  # as the gateway's
            runner.run(serve_front(args.serve_front[0], int(args.serve_front[1])))
        return
    metering_cost(system_prompts())
    if args.micro:
        return
    asyncio.run(data_plane(args))
    if not args.no_control_plane:
        asyncio.run(control_plane(args.replicas))


if __name__ == "__main__":
    main()
