"""What one gateway's status costs the controller each second, whole or as changes.

    python bench/bench_gateway_status.py [--replicas 10000] [--seconds 30]

A controller term in process holds `--replicas` serving replicas (one a node, as
bench_gateway.py's control plane builds them). A gateway's StatusFigures makes each
second's status from figures that move as traffic does: each second a share of the
replicas (`--active`) sees its in-flight count change and its request count grow.
The same figures are posted two ways side by side: whole every second (as every
gateway did before), and as changes once the controller says it takes them. For
each: bytes a status, and the controller's CPU per status (parsing the body into
GatewayStatus plus Gateways.report, what the handler does besides aiohttp's fixed
cost), median over the seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.loop.reconcile import Reconciler
from llmgw.controller.store import Store
from llmgw.controller.term import Term
from llmgw.controller.views.endpoints import Gateways
from llmgw.gateway.status_figures import StatusFigures
from llmgw.wire import GatewayStatus, GatewayStatusReply, ModelSpec, NodeReport


def fleet(replicas: int) -> Gateways:
    state = Path(tempfile.mkdtemp(prefix="bench-gw-status-"))
    term = Term.begin(Store(state), ControllerSettings(state_dir=state))
    per = 500  # a model's replicas are bounded; enough models for `replicas`
    term.facts.put_models(
        [
            ModelSpec(
                name=f"m{k}",
                source=f"org/m{k}",
                min_replicas=min(per, replicas - k * per),
                gpus_per_shard=1,
            )
            for k in range((replicas + per - 1) // per)
        ]
    )

    def report(i: int, ready: bool) -> NodeReport:
        node = f"n{i:05d}"
        shards = [
            {"id": a.replica_id, "model": a.model, "state": "ready", "gpus": a.gpus, "port": 8000}
            for a in term.assignments_for(node)
        ]
        return NodeReport.model_validate(
            {
                "node": node,
                "agent_version": "bench",
                "boot_id": "b",
                "interval_s": 3600,
                "address": f"10.{i // 250}.{i % 250}.1",
                "gpus": [
                    {
                        "uuid": f"GPU-{i}",
                        "index": 0,
                        "gpu_class": "H100-SXM-80GB",
                        "memory_total_mib": 81920,
                        "health": "healthy",
                    }
                ],
                "replicas": shards if ready else [],
            }
        )

    reconciler = Reconciler(term)
    for i in range(replicas):
        term.ingest(report(i, False))
    while len(term.facts.records) < replicas:  # a pass places a bounded number
        before = len(term.facts.records)
        reconciler.tick()
        if len(term.facts.records) == before:
            raise SystemExit(f"placed {before} of {replicas} replicas, no more")
    for i in range(replicas):
        term.ingest(report(i, True))
    reconciler.tick()
    return term.gateways


def run(gateways: Gateways, rids: list[str], seconds: int, active: float, changes: bool) -> dict:
    rng = random.Random(1)
    figures = StatusFigures()
    in_flight = dict.fromkeys(rids, 0)
    requests = dict.fromkeys(rids, 0)
    sizes: list[int] = []
    cpu: list[float] = []
    name = f"gw-{'changes' if changes else 'whole'}-{active}"
    for second in range(seconds + 2):  # the first two: whole, then the base
        for rid in rng.sample(rids, int(len(rids) * active)):
            in_flight[rid] = rng.randint(0, 8)
            requests[rid] += rng.randint(1, 20)
        body = json.dumps(
            {"name": name, "cursor": "", **figures.body(dict(in_flight), dict(requests))}
        ).encode()
        t0 = time.process_time()
        took = gateways.report(GatewayStatus.model_validate_json(body))
        spent = time.process_time() - t0
        if changes:
            figures.answered(GatewayStatusReply(full=not took).model_dump_json().encode())
        if second >= 2:
            sizes.append(len(body))
            cpu.append(spent)
    return {"bytes": statistics.median(sizes), "cpu_ms": statistics.median(cpu) * 1e3}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--replicas", type=int, default=10_000)
    p.add_argument("--seconds", type=int, default=30)
    p.add_argument("--active", type=float, nargs="+", default=[0.01, 0.1, 0.5, 1.0])
    args = p.parse_args()
    t0 = time.perf_counter()
    gateways = fleet(args.replicas)
    rids = sorted(gateways._facts.records)
    print(
        f"python {sys.version.split()[0]}; {len(rids)} replicas (built in "
        f"{time.perf_counter() - t0:.0f} s); {args.seconds} statuses each, one gateway"
    )
    print(f"{'changing/s':>10}  {'whole':>22}  {'changes':>22}  {'bytes':>6}  {'cpu':>6}")
    for active in args.active:
        whole = run(gateways, rids, args.seconds, active, changes=False)
        delta = run(gateways, rids, args.seconds, active, changes=True)
        print(
            f"{active:>10.0%}  {whole['bytes'] / 1024:8.1f} KiB {whole['cpu_ms']:7.2f} ms  "
            f"{delta['bytes'] / 1024:8.1f} KiB {delta['cpu_ms']:7.2f} ms  "
            f"{delta['bytes'] / whole['bytes']:5.2f}x  {delta['cpu_ms'] / whole['cpu_ms']:5.2f}x"
        )


if __name__ == "__main__":
    main()
