"""Slowloris against a real controller process: /healthz latency with N slow
connections trickling headers or dribbling a declared 1 MiB body, against the
same controller with none (the baseline, same run), and how long the slow
connections live.

    python bench/bench_slow_clients.py [--slow 300] [--nofile 1024] [--idle-timeout 5]
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def latencies(url: str, n: int) -> list[float]:
    out = []
    with httpx.Client(timeout=10) as c:  # a new connection each time, as a new agent would
        for _ in range(n):
            t = time.perf_counter()
            try:
                ok = c.get(url, headers={"Connection": "close"}).status_code == 200
            except httpx.HTTPError:
                ok = False
            out.append((time.perf_counter() - t) * 1000 if ok else float("inf"))
    return out


def pct(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--slow", type=int, default=300)
    p.add_argument("--nofile", type=int, default=1024)
    p.add_argument("--idle-timeout", type=float, default=5.0)
    p.add_argument("--requests", type=int, default=200)
    args = p.parse_args()
    port = free_port()
    state = tempfile.mkdtemp()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))

    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "controller", "--listen", f"127.0.0.1:{port}",
         "--state-dir", state, "--idle-timeout", str(args.idle_timeout),
         "--body-timeout", str(args.idle_timeout)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=limit,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        for _ in range(100):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        base = latencies(url, args.requests)

        socks: list[socket.socket] = []
        opened = time.monotonic()
        for i in range(args.slow):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 2:
                s.sendall(b"POST /v1/agent/report HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: 1048576\r\n\r\n{")  # fmt: skip
            else:
                s.sendall(b"GET /v1/summary HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            s.setblocking(False)
            socks.append(s)
        closed_at: dict[int, float] = {}
        stop = threading.Event()

        def trickle() -> None:
            while not stop.is_set() and len(closed_at) < len(socks):
                for i, s in enumerate(socks):
                    if i in closed_at:
                        continue
                    try:
                        s.send(b"a")
                        while s.recv(65536):
                            pass
                        closed_at[i] = time.monotonic() - opened
                    except BlockingIOError:
                        pass
                    except OSError:
                        closed_at[i] = time.monotonic() - opened
                time.sleep(0.25)

        t = threading.Thread(target=trickle)
        t.start()
        during = latencies(url, args.requests)
        t.join(timeout=max(30.0, 3 * args.idle_timeout))
        stop.set()
        for s in socks:
            s.close()
    finally:
        proc.terminate()
        proc.wait(10)
    lives = sorted(closed_at.values())
    headers = sorted(v for i, v in closed_at.items() if i % 2 == 0)
    bodies = sorted(v for i, v in closed_at.items() if i % 2)
    failed = sum(x == float("inf") for x in during)
    print(f"controller with RLIMIT_NOFILE={args.nofile}, --idle-timeout {args.idle_timeout:g}")
    print(
        f"  /healthz, no slow clients:  p50 {pct(base, 0.5):6.1f} ms  p99 {pct(base, 0.99):6.1f} ms"
    )
    print(
        f"  /healthz, {args.slow} slow clients: p50 {pct(during, 0.5):6.1f} ms  "
        f"p99 {pct(during, 0.99):6.1f} ms  failed {failed}/{len(during)}"
    )
    if lives:
        print(
            f"  slow connections cut: {len(lives)}/{len(socks)}, after "
            f"{statistics.median(lives):.1f} s median, {lives[-1]:.1f} s at most"
        )
        for what, v in (("trickling headers", headers), ("dribbling a 1 MiB body", bodies)):
            if v:
                print(f"    {what}: {v[0]:.1f}-{v[-1]:.1f} s, median {statistics.median(v):.1f} s")


if __name__ == "__main__":
    main()
