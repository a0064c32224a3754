"""Controller cost of a console poll: `GET /v1/nodes` against `?since=CURSOR`.

Builds a real `Term` (SQLite store in a temporary directory), lets half the
fleet re-report unchanged and 5 % change, then times the full listing (the
baseline, measured in the same run) and the delta a polling console gets,
both encoded as the endpoint does it (each row's JSON kept from when it last
changed, `row_json`), and for reference the same two built as models and dumped.

    python bench/bench_nodes_delta.py [--nodes 2000 10000]

Prints figures; never asserts timings.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "controller"))

from fleet_factories import FakeClock, gpu, location, make_fleet, report  # noqa: E402

from llmgw.controller.http.web_io import json_model, json_models  # noqa: E402
from llmgw.wire import NodeReport  # noqa: E402

MODELS = ["org/a", "org/b"]


def best(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def node_report(i: int, used: int = 0) -> NodeReport:
    name = f"gpu{i:05d}"
    return report(
        name,
        gpus=[gpu(name, k, in_use=k < used) for k in range(8)],
        fabrics=[f"ib-{i % 4}"],
        storage=[location("/models", MODELS)],
    )


def run(nodes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        clock = FakeClock()
        fleet = make_fleet(Path(tmp), clock)
        for i in range(nodes):
            fleet.ingest(node_report(i))
        fleet.facts.flush()
        cursor = fleet.rows.nodes_since("").cursor
        clock.advance(1)
        for i in range(0, nodes, 2):  # half the fleet reports, nothing new
            fleet.ingest(node_report(i))
        for i in range(0, nodes, 20):  # 5 % change what they use
            fleet.ingest(node_report(i, used=1))

        delta = fleet.rows.nodes_since(cursor)
        full_bytes = len(b"".join(r.model_dump_json().encode() for r in fleet.rows.rows()))
        delta_bytes = len(delta.model_dump_json().encode())
        reps = max(3, 20_000 // nodes)
        t_full = best(fleet.rows.rows_json, reps)
        # A console's cursor moves with each poll; a fixed one keeps the work equal.
        t_delta = best(lambda: fleet.rows.nodes_since_json(cursor), reps)
        t_full_models = best(lambda: json_models(fleet.rows.rows()), reps)
        t_delta_models = best(lambda: json_model(fleet.rows.nodes_since(cursor)), reps)

    print(f"{nodes} nodes, {len(delta.nodes)} rows changed since the console's last poll")
    print(f"  baseline GET /v1/nodes          {t_full * 1e3:7.1f} ms  {full_bytes / 1024:6.0f} KiB")
    print(
        f"  GET /v1/nodes?since=CURSOR      {t_delta * 1e3:7.1f} ms  {delta_bytes / 1024:6.0f} KiB"
        f"   = {t_delta / t_full:.2f} x the baseline's time, {delta_bytes / full_bytes:.2f} x its bytes"
    )
    print(
        f"  (as models dumped per row: full {t_full_models * 1e3:.1f} ms, ?since= "
        f"{t_delta_models * 1e3:.1f} ms: {t_full_models / t_full:.1f} x and "
        f"{t_delta_models / t_delta:.1f} x the kept encodings)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2000, 10000])
    for nodes in parser.parse_args().nodes:
        run(nodes)


if __name__ == "__main__":
    main()
