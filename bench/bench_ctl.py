"""How fast a one-shot `llmgw ctl` is, as a ratio to a bare interpreter start.

Starts a real controller process, reports 2,000 nodes into it (8 GPUs each,
4 fabrics, a cordoned few), then times, interleaved so that machine load hits
each alike:

- the baseline: `python -c pass` with the same interpreter;
- `llmgw ctl status` and `llmgw ctl nodes`, output piped (as a script reads it).

Prints medians and the ratio to the baseline; never asserts timings.

    .venv/bin/python bench/bench_ctl.py [--nodes 2000] [--runs 21] [--before DIR] [--h11]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.ctl.ctl_support import ADMIN, AGENT, controller_process, report  # noqa: E402


def seed(url: str, nodes: int) -> None:
    headers = {"Authorization": f"Bearer {AGENT}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for i in range(nodes):
            client.post(
                "/v1/agent/report",
                json=report(f"gpu{i:05d}", fabrics=[f"ib-{i % 4}"], interval_s=600),
            ).raise_for_status()
        admin = {"Authorization": f"Bearer {ADMIN}"}
        for i in range(0, nodes, 97):
            client.post(
                f"/v1/nodes/gpu{i:05d}/cordon", json={"reason": "bench"}, headers=admin
            ).raise_for_status()


# `--h11`: one GET /v1/nodes from a fresh interpreter, through ctl's own HTTP/1.1
# connection and through h11 (the maintained sans-I/O library) over a socket.
GET_HTTP1 = """
import sys
from urllib.parse import urlsplit
from llmgw import http1
u = urlsplit(sys.argv[1])
c = http1.Connection(u.hostname, u.port, connect_timeout_s=3, read_timeout_s=10)
status, _, body = c.request("GET", "/v1/nodes", {"Authorization": "Bearer " + sys.argv[2]})
assert status == 200 and len(body) > 1000, status
"""
GET_H11 = """
import socket, sys
from urllib.parse import urlsplit
import h11
u = urlsplit(sys.argv[1])
s = socket.create_connection((u.hostname, u.port))
c = h11.Connection(h11.CLIENT)
headers = [("Host", u.netloc), ("Authorization", "Bearer " + sys.argv[2])]
s.sendall(c.send(h11.Request(method="GET", target="/v1/nodes", headers=headers)))
s.sendall(c.send(h11.EndOfMessage()))
parts, status = [], 0
while True:
    ev = c.next_event()
    if ev is h11.NEED_DATA:
        c.receive_data(s.recv(262144))
    elif isinstance(ev, h11.Response):
        status = ev.status_code
    elif isinstance(ev, h11.Data):
        parts.append(ev.data)
    elif isinstance(ev, h11.EndOfMessage):
        break
body = b"".join(parts)
assert status == 200 and len(body) > 1000, status
"""


def timed(cmd: list[str], env: dict[str, str], cwd: str | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, capture_output=True, check=True, cwd=cwd)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--runs", type=int, default=21)
    p.add_argument(
        "--before",
        metavar="DIR",
        help="also time ctl from another checkout (e.g. `git worktree add /tmp/before main`)",
    )
    p.add_argument(
        "--h11",
        action="store_true",
        help="also time one GET /v1/nodes from a fresh interpreter: llmgw.http1 against h11",
    )
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, controller_process(Path(tmp)) as c:
        seed(c.url, a.nodes)
        env = {**os.environ, "LLMGW_CONTROLLER": c.url, "LLMGW_TOKEN": ADMIN}
        py = sys.executable
        here = str(ROOT)
        cases: dict[str, tuple[list[str], str | None]] = {
            "python -c pass (baseline)": ([py, "-c", "pass"], None),
            "llmgw ctl status": ([py, "-m", "llmgw", "ctl", "status"], here),
            "llmgw ctl nodes": ([py, "-m", "llmgw", "ctl", "nodes"], here),
        }
        if a.h11:
            cases["GET /v1/nodes, llmgw.http1"] = ([py, "-c", GET_HTTP1, c.url, ADMIN], here)
            cases["GET /v1/nodes, h11"] = ([py, "-c", GET_H11, c.url, ADMIN], here)
        if a.before:  # `python -m` runs the package found in the working directory first
            cases["before: llmgw ctl status"] = ([py, "-m", "llmgw", "ctl", "status"], a.before)
            cases["before: llmgw ctl nodes"] = ([py, "-m", "llmgw", "ctl", "nodes"], a.before)
        times: dict[str, list[float]] = {k: [] for k in cases}
        for where in {here, a.before or here}:  # bytecode, as an installed package has
            subprocess.run([py, "-m", "compileall", "-q", "llmgw"], cwd=where, check=True)
        for cmd, cwd in cases.values():  # warm the page cache and the controller's caches
            timed(cmd, env, cwd)
        for _ in range(a.runs):
            for name, (cmd, cwd) in cases.items():
                times[name].append(timed(cmd, env, cwd))
    base = statistics.median(times["python -c pass (baseline)"])
    print(f"{a.nodes} nodes, {a.runs} runs each, medians (interleaved):")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<30} {med * 1e3:7.1f} ms   {med / base:5.2f} x baseline")


if __name__ == "__main__":
    main()
