"""Placement on cards shared by sleeping replicas (issue 32 item 4): a card whose
replicas all sleep there, and whose measured memory leaves room for an awake engine,
is free for one replica, taken after the empty cards of a node; anything awake on it,
or too little room, and it is not."""

from __future__ import annotations

from llmgw.controller.core.nodes import NodeEntry, has_room
from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.loop.fleet_snapshot import free_cards, node_capacity
from llmgw.scheduler import place
from llmgw.wire import (
    GpuHealth,
    GpuReport,
    ModelSpec,
    NodeReport,
    ReplicaReport,
    ReplicaState,
    ShardState,
)

TOTAL = 81920  # MiB, an 80 GB card


def card(i: int, used: int = 0) -> GpuReport:
    return GpuReport(
        uuid=f"GPU-{i}",
        index=i,
        gpu_class="H100-SXM-80GB",
        memory_total_mib=TOTAL,
        memory_used_mib=used,
        in_use=used > 0,
        health=GpuHealth.HEALTHY,
    )


def entry(cards: list[GpuReport], shards: dict[str, ShardState]) -> NodeEntry:
    report = NodeReport(
        node="n1",
        agent_version="t",
        boot_id="b",
        interval_s=5,
        gpus=cards,
        replicas=[
            ReplicaReport(id=rid, model="m", state=state, gpus=["GPU-0"])
            for rid, state in shards.items()
        ],
    )
    e = NodeEntry("n1", first_seen=0.0)
    e.update(report, b"", 0.0)
    return e


def rec(rid: str, state: ReplicaState, asleep_since: float | None = None) -> ReplicaRecord:
    shard = ShardRecord("n1", 0, ("GPU-0",))
    return ReplicaRecord(rid, "m", state, (shard,), 0.0, asleep_since=asleep_since)


ASLEEP = rec("a", ReplicaState.SLEEPING, asleep_since=10.0)


def test_the_room_rule_is_what_an_awake_engine_claims() -> None:
    assert has_room(512, TOTAL) and has_room(TOTAL // 10, TOTAL)
    assert not has_room(TOTAL // 10 + 1, TOTAL) and not has_room(None, TOTAL)


def test_a_card_whose_replica_sleeps_with_room_is_free_and_shared() -> None:
    e = entry([card(0, used=512), card(1)], {"a": ShardState.SLEEPING})
    free, shared = free_cards("n1", e, [ASLEEP])
    assert free["H100-SXM-80GB"] == ["GPU-0", "GPU-1"] and shared == {"GPU-0"}


def test_not_free_while_awake_falling_asleep_or_keeping_its_memory() -> None:
    falling = rec("a", ReplicaState.SLEEPING)  # not told yet: still awake
    told_not_done = entry([card(0, used=512), card(1)], {"a": ShardState.READY})
    kept = entry([card(0, used=TOTAL - 1024), card(1)], {"a": ShardState.SLEEPING})
    awake = rec("a", ReplicaState.READY)
    for e, r in ((told_not_done, ASLEEP), (kept, ASLEEP), (told_not_done, falling), (kept, awake)):
        free, shared = free_cards("n1", e, [r])
        assert free["H100-SXM-80GB"] == ["GPU-1"] and not shared, (r, e.digest.roomy)


def test_one_awake_replica_beside_the_sleeping_one_and_no_more() -> None:
    placed_since = rec("b", ReplicaState.STARTING)  # placed on the shared card
    e = entry([card(0, used=512)], {"a": ShardState.SLEEPING})
    free, _ = free_cards("n1", e, [ASLEEP, placed_since])
    assert free["H100-SXM-80GB"] == []


def test_placement_takes_the_empty_card_before_the_shared_one() -> None:
    # GPU-0 sorts first, but a replica there would stand in the sleeping one's way.
    e = entry([card(0, used=512), card(1)], {"a": ShardState.SLEEPING})
    cap = node_capacity("n1", e, [ASLEEP], {}, True)
    spec = ModelSpec(name="x", source="org/x", gpus_per_shard=1)
    first = place(spec, [cap])
    assert first.shards[0].gpus == ("GPU-1",)  # type: ignore[union-attr]
    both = ModelSpec(name="y", source="org/y", gpus_per_shard=2)
    assert place(both, [cap]).shards[0].gpus == ("GPU-0", "GPU-1")  # type: ignore[union-attr]
