"""A model's in-flight figure (issue 35 item 5): never more than was in flight.

The engines' counts and the gateways' are read at different moments; taking
the higher of the two per replica and adding them up counted requests that
moved between replicas twice (16 clients read as 16.2-17.1)."""

from __future__ import annotations

from llmgw.controller.core.nodes import ShardDigest
from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.state.replicas import ReplicaStatus, model_in_flight
from llmgw.wire import EngineTraffic, ReplicaState, ShardState


def ready(rid: str, engine: int | None) -> ReplicaStatus:
    shard = ShardRecord(node="n1", rank=0, gpus=("GPU-1",))
    record = ReplicaRecord(rid, "chat", ReplicaState.READY, (shard,), 1.0)
    traffic = None if engine is None else EngineTraffic(requests_per_s=1.0, in_flight=engine)
    digest = ShardDigest(rid, 0, ShardState.READY, None, None, 8000, traffic)
    return ReplicaStatus(record, ReplicaState.READY, (digest,), None)


def test_readings_of_moving_requests_never_add_up_to_more_than_were_in_flight() -> None:
    # Four clients always in flight. The engines were scraped while three ran on
    # r1 and one on r2; the gateways read them a moment later, one on r1, three on r2.
    replicas = [ready("r1", 3), ready("r2", 1)]
    gateways = {"r1": 1, "r2": 3}
    assert model_in_flight(replicas, gateways) == 4  # not max(3,1) + max(1,3) = 6


def test_each_source_still_counts_what_only_it_sees() -> None:
    # Sent to the engines directly: the gateways see none of it.
    assert model_in_flight([ready("r1", 2), ready("r2", 3)], {}) == 5
    # A stalled engine counts nothing; the gateways still hold its requests.
    assert model_in_flight([ready("r1", 0), ready("r2", None)], {"r1": 2, "r2": 1}) == 3
    assert model_in_flight([], {"gone": 4}) == 0  # only the replicas asked about


def test_requests_held_through_a_wake_are_counted_once() -> None:
    """Issue 35: three clients' requests held while the model woke, then sent on to
    the woken replica. Whichever source was read last, the figure is at most three."""
    woken = [ready("r1", 3)]  # the engine's scrape has them
    # The gateway's status from before the send still says held; the engine's is newer.
    assert model_in_flight(woken, {}, held=3) == 3  # not 3 + 3
    # The gateway's status after the send: the replica's in flight, nothing held.
    assert model_in_flight(woken, {"r1": 3}, held=0) == 3
    # The engine's scrape not there yet: the gateway's figure alone.
    assert model_in_flight([ready("r1", 0)], {"r1": 3}) == 3
    assert model_in_flight([], {}, held=3) == 3  # at zero: held is all there is
    # Held for a model that also serves: the gateways' whole figure against the engines'.
    assert model_in_flight([ready("r1", 2)], {"r1": 2}, held=1) == 3
