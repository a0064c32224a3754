"""Placement benchmark: 1,000 replicas (mixed 1- and 2-shard) on 2,000 nodes in 4 fabrics.

    python bench/bench_placement.py [--nodes 2000] [--replicas 1000] [--repeat 5]

Prints figures; asserts nothing about time. Target: place_many under 1 s.

The fleet is seeded, so runs compare: 8 H100s per node, a quarter of the nodes
partly busy, a few with a broken card; some models on a shared filer (every node
of a fabric holds them), others in local copies on a handful of nodes. Baselines
from the same run put the figure in scale: sorting the snapshot by name (the least
any deterministic placement must do) and building the candidate index.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from llmgw.scheduler import NodeCapacity, Placement, _Allocation, place_many
from llmgw.wire import ModelSpec

GPU_CLASS = "H100-SXM-80GB"
CARDS = 8


def make_fleet(count: int, fabrics: int, rnd: random.Random) -> list[NodeCapacity]:
    models = [f"org/model-{i}" for i in range(20)]
    nodes: list[NodeCapacity] = []
    for i in range(count):
        name = f"gpu-{i:05d}"
        fabric = f"ib-{i % fabrics}"
        uuids = [f"GPU-{i:05d}-{j}" for j in range(CARDS)]
        busy = rnd.randint(1, CARDS - 1) if rnd.random() < 0.25 else 0
        broken = 1 if rnd.random() < 0.02 else 0
        free = tuple(uuids[busy + broken :])
        holds = {m for k, m in enumerate(models[:4]) if k % fabrics == i % fabrics}  # filers
        holds |= {m for m in models[4:] if rnd.random() < 0.003}  # local copies
        nodes.append(
            NodeCapacity(
                name=name,
                free={GPU_CLASS: free},
                total_cards=CARDS,
                fabrics=(fabric,),
                holds=frozenset(holds),
            )
        )
    rnd.shuffle(nodes)  # placement must not depend on the order it is given
    return nodes


def make_requests(count: int, rnd: random.Random) -> list[ModelSpec]:
    requests = []
    for i in range(count):
        model = f"org/model-{rnd.randrange(20)}"
        if rnd.random() < 0.3:
            shards, gpus = 2, 8
        else:
            shards, gpus = 1, rnd.choice([1, 2, 4, 8])
        requests.append(
            ModelSpec(
                name=model,
                source=model,
                gpus_per_shard=gpus,
                shards=shards,
                gpu_class=None if i % 5 == 0 else GPU_CLASS,
            )
        )
    return requests


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--fabrics", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    rnd = random.Random(args.seed)
    nodes = make_fleet(args.nodes, args.fabrics, rnd)
    requests = make_requests(args.replicas, rnd)

    results = place_many(requests, nodes)
    placed = [r for r in results if isinstance(r, Placement)]
    multi = sum(len(p.shards) > 1 for p in placed)
    holders = sum(
        any(p.model in n.holds for n in nodes if n.name == p.shards[0].node) for p in placed[:50]
    )

    sort_t = timed(lambda: sorted(nodes, key=lambda n: n.name), args.repeat)
    index_t = timed(lambda: _Allocation(nodes), args.repeat)
    place_t = timed(lambda: place_many(requests, nodes), args.repeat)
    best, median = min(place_t), statistics.median(place_t)

    print(f"fleet:      {args.nodes} nodes x {CARDS} GPUs in {args.fabrics} fabrics")
    print(
        f"requests:   {args.replicas} replicas, {multi} of the placed are 2-shard;"
        f" placed {len(placed)}, unplaceable {len(results) - len(placed)}"
    )
    print(f"            {holders} of the first 50 placed landed on a weight holder")
    print(
        f"place_many: best {best * 1e3:.1f} ms, median {median * 1e3:.1f} ms (index build included)"
    )
    print(f"            {args.replicas / best:,.0f} replicas/s at best")
    print(
        f"baseline:   sort snapshot by name {min(sort_t) * 1e3:.2f} ms;"
        f" build index {min(index_t) * 1e3:.1f} ms"
    )
    print(
        f"ratio:      place_many / sort = {best / min(sort_t):.0f}x;"
        f" place_many / index build = {best / min(index_t):.1f}x"
    )
    print(f"target:     under 1 s -> {'met' if best < 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
