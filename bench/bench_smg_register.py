"""How long SMG takes to route to new workers and to drop removed ones: registered
through its file discovery manifest (how the gateway did it before engine keys) against
its worker API (`POST /workers` with each engine's key, how it does it now), side by
side in one run on the same machine.

Modes, each on a fresh SMG started as `llmgw gateway` starts it (smg_child, no client
keys, the control-plane key from its secrets file):

* `file`: workers listed in a discovery manifest (`--discovery-provider file`, reread
  every second), keyless engines: the baseline;
* `api`: the same keyless engines through `Smg.write_workers` (smg.py's converge);
* `api+key`: engines that ask for a key each (VLLM_API_KEY), registered with it.

Each round adds all N workers and times until SMG routes to every one, then removes
them all and times until SMG lists none. Medians over the rounds.

    python bench/bench_smg_register.py [--engines 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.gateway.smg import Smg, SmgOptions, free_loopback_port


def start_engines(n: int, keyed: bool) -> tuple[list[subprocess.Popen[bytes]], dict[str, str]]:
    procs, keys = [], {}
    for i in range(n):
        port = free_loopback_port()
        key = secrets.token_urlsafe(32)
        env = {**os.environ, "VLLM_API_KEY": key} if keyed else None
        argv = [sys.executable, "-m", "llmgw.agent.fake_engine", "--port", str(port)]
        argv += ["--model", f"m{i}", "--load-seconds", "0"]
        procs.append(
            subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        keys[f"http://127.0.0.1:{port}"] = key
    return procs, keys


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 60) -> float:
    t0 = time.monotonic()
    while not await check():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError("SMG never got there")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def run_mode(mode: str, workers: dict[str, str | None], rounds: int) -> tuple[float, float]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-reg-{mode}-"))
    manifest = work / "w.json"
    # The file mode's SMG reads the manifest as the gateway's did before (every second).
    discovery = ["--discovery-provider", "file", "--discovery-file", str(manifest)]
    discovery += ["--discovery-check-interval-secs", "1"]
    smg = Smg(
        SmgOptions(
            host="127.0.0.1",
            port=free_loopback_port(),
            policy="round_robin",
            keys=[],
            workdir=work,
            extra=discovery if mode == "file" else [],
        )
    )
    manifest.write_text(json.dumps({"version": 1, "workers": []}))

    def write_manifest(urls: list[str]) -> None:
        tmp = manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": 1, "workers": [{"url": u} for u in urls]}))
        os.replace(tmp, manifest)

    task = asyncio.create_task(smg.run())
    adds, removes = [], []
    try:
        await smg.started.wait()

        async def all_routed() -> bool:
            got = await smg.workers()
            return all(got.get(u) for u in workers)

        async def none_listed() -> bool:
            return not await smg.workers()

        for _ in range(rounds):
            t0 = time.monotonic()
            if mode == "file":
                write_manifest(list(workers))
            else:
                smg.write_workers(workers)
            await until(all_routed)
            adds.append(time.monotonic() - t0)
            t0 = time.monotonic()
            if mode == "file":
                write_manifest([])
            else:
                smg.write_workers({})
            await until(none_listed)
            removes.append(time.monotonic() - t0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return statistics.median(adds), statistics.median(removes)


async def main(args: argparse.Namespace) -> None:
    plain, plain_keys = start_engines(args.engines, keyed=False)
    keyed, keyed_keys = start_engines(args.engines, keyed=True)
    try:
        await asyncio.sleep(2.0)
        async with aiohttp.ClientSession() as http:  # every engine answers, keyed ones with 401
            for url in [*plain_keys, *keyed_keys]:
                await until(lambda u=url: _answers(http, u))
        modes: list[tuple[str, dict[str, str | None]]] = [
            ("file", dict.fromkeys(plain_keys)),
            ("api", dict.fromkeys(plain_keys)),
            ("api+key", dict(keyed_keys)),
        ]
        print(f"{args.engines} fake engines (one model each), {args.rounds} rounds, medians\n")
        base_add = base_remove = 0.0
        for name, workers in modes:
            add, remove = await run_mode(name, workers, args.rounds)
            if name == "file":
                base_add, base_remove = add, remove
            ratio = f"  ({add / base_add:.2f}x, {remove / base_remove:.2f}x of file)"
            print(f"{name:8} all routed {add:6.2f} s   all gone {remove:6.2f} s{ratio}")
    finally:
        for p in plain + keyed:
            p.terminate()
        for p in plain + keyed:
            p.wait()


async def _answers(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(f"{url}/health") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(p.parse_args()))
