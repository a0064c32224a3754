"""The controller core's own costs, in process: this checkout against another, in one run.

Builds a fleet of synthetic nodes (8 cards, 2 fabrics' worth of weights) in a real
term (SQLite store in a temporary directory), then times, best of 5:

- a report that changes nothing (`ingest_json`: what 99 % of reports are),
- a report that changes a card in use (its row, the totals, capacity move),
- the summary, the full node listing and a `?since=` after 5 % of rows changed,
- the model views with 50 models.

`--before DIR` runs the same in a checkout of an earlier commit (`git worktree add
--detach DIR COMMIT`), alternating, and prints after/before ratios. Each side runs in
its own interpreter with its own code on `sys.path`.

    python bench/bench_core.py [--nodes 2000 10000] [--before DIR] [--rounds 3]

Prints figures; never asserts timings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs in a child interpreter whose sys.path starts with the checkout measured.
CHILD = r"""
import json, sys, tempfile, timeit
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/tests/controller")
from fleet_factories import FakeClock, gpu, location, make_fleet, report
from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.wire import ModelSpec, ReplicaState

nodes = int(sys.argv[2])
new = Path(sys.argv[1], "llmgw/controller/term.py").exists()

def node_report(i, used=0):
    name = f"gpu{i:05d}"
    return report(name, gpus=[gpu(name, k, in_use=k < used) for k in range(8)],
                  fabrics=[f"ib-{i % 4}"], storage=[location("/models", ["org/a", "org/b"])])

def best(fn, number):
    return min(timeit.repeat(fn, number=number, repeat=5)) / number

with tempfile.TemporaryDirectory() as tmp:
    clock = FakeClock()
    term = make_fleet(Path(tmp), clock)
    facts = term.facts if new else term
    rows = term.rows if new else term
    # (Before the term: FleetState's; the term's since issue 31; its replies' between.)
    ingest_json = getattr(term, "ingest_json", None) or term.replies.ingest_json
    reports = [node_report(i) for i in range(nodes)]
    for r in reports:
        ingest_json(r)
    facts.put_models([ModelSpec(name=f"m{k}", source=f"org/m{k}", min_replicas=0) for k in range(50)])
    facts.put_replicas([
        ReplicaRecord(id=f"m{k % 50}-{k}", model=f"m{k % 50}", state=ReplicaState.READY,
                      shards=(ShardRecord(f"gpu{k:05d}", 0, (f"GPU-gpu{k:05d}-7",)),), created_at=0.0)
        for k in range(0, nodes, 10)
    ])
    facts.flush()
    for r in reports:
        ingest_json(r)
    it = iter(range(10**9))
    same = reports[nodes // 2]
    out = {"report_same_us": best(lambda: ingest_json(same), 2000) * 1e6}
    busy = [node_report(i, used=(i % 3) + 1) for i in range(nodes)]
    flip = [busy, reports]
    def changed():
        n = next(it)
        ingest_json(flip[(n // nodes) % 2][n % nodes])
    out["report_changed_us"] = best(changed, 2000) * 1e6
    term.summary()
    out["summary_ms"] = best(term.summary, 20) * 1e3
    out["rows_json_ms"] = best(rows.rows_json, 20) * 1e3
    cursor = rows.nodes_since("").cursor
    clock.advance(1)
    for i in range(0, nodes, 20):
        ingest_json(node_report(i, used=4))
    out["since_json_ms"] = best(lambda: rows.nodes_since_json(cursor), 20) * 1e3
    out["model_views_ms"] = best(term.model_views, 20) * 1e3
print(json.dumps(out))
"""

FIGURES = [
    ("report_same_us", "report, nothing changed", "µs"),
    ("report_changed_us", "report, a card in use changed", "µs"),
    ("summary_ms", "summary", "ms"),
    ("rows_json_ms", "GET /v1/nodes (JSON)", "ms"),
    ("since_json_ms", "?since= after 5 % changed", "ms"),
    ("model_views_ms", "model views (50 models)", "ms"),
]


def measure(tree: Path, nodes: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), str(nodes)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--before", type=Path, help="a checkout of an earlier commit")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians)")
    args = parser.parse_args()
    for nodes in args.nodes:
        after: list[dict[str, float]] = []
        before: list[dict[str, float]] = []
        for _ in range(args.rounds):
            if args.before is not None:
                before.append(measure(args.before.resolve(), nodes))
            after.append(measure(ROOT, nodes))
        print(f"\n{nodes:,} nodes, medians of {args.rounds} rounds")
        print(f"  {'':32} {'after':>10} {'before':>10} {'ratio':>7}")
        for key, label, unit in FIGURES:
            a = statistics.median(r[key] for r in after)
            line = f"  {label:32} {a:>8.2f}{unit:>2}"
            if before:
                b = statistics.median(r[key] for r in before)
                line += f" {b:>8.2f}{unit:>2} {a / b:>6.2f}x"
            print(line)


if __name__ == "__main__":
    main()
