"""Builders shared by the scheduler tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llmgw.scheduler import NodeCapacity, Placement, Unplaceable
from llmgw.wire import ModelSpec

H100 = "H100-80GB"
A100 = "A100-40GB"


def node(
    name: str,
    free: int | Mapping[str, int] = 8,
    *,
    total: int | None = None,
    fabrics: Iterable[str] = (),
    schedulable: bool = True,
    holds: Iterable[str] = (),
    runs: Iterable[str] = (),
) -> NodeCapacity:
    """A node with ``free`` free cards (H100 unless a class map is given).

    ``total`` defaults to the free count, i.e. an entirely free node.
    """
    counts = {H100: free} if isinstance(free, int) else dict(free)
    cards = {cls: tuple(f"{name}/{cls}/{i}" for i in range(n)) for cls, n in counts.items()}
    return NodeCapacity(
        name=name,
        free=cards,
        total_cards=sum(counts.values()) if total is None else total,
        fabrics=tuple(fabrics),
        schedulable=schedulable,
        holds=frozenset(holds),
        runs=frozenset(runs),
    )


def spec(
    name: str = "m",
    *,
    gpus: int = 1,
    shards: int = 1,
    cls: str | None = H100,
    min_replicas: int = 1,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        source=f"org/{name}",
        gpus_per_shard=gpus,
        shards=shards,
        gpu_class=cls,
        min_replicas=min_replicas,
    )


def placed(result: Placement | Unplaceable) -> Placement:
    assert isinstance(result, Placement), result
    return result


def refused(result: Placement | Unplaceable) -> str:
    assert isinstance(result, Unplaceable), result
    return result.reason
