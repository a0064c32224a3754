"""A controller that begins to lead (a start, a takeover) publishes no endpoint feed
until the nodes serving replicas have reported: a full answer before that would tell
every gateway that nothing serves (found by test_gateway_failover_e2e)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from llmgw.controller.core.records import ReplicaRecord, ShardRecord
from llmgw.controller.core.settings import ControllerSettings
from llmgw.controller.http.app import create_app
from llmgw.controller.store import Store
from llmgw.wire import ModelSpec, ReplicaState

SPEC = ModelSpec.model_validate(
    {"name": "m", "source": "/models/m", "engine": "fake", "min_replicas": 1}
)


def report(node: str, replicas: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "node": node,
        "agent_version": "test",
        "boot_id": "b",
        "interval_s": 5.0,
        "address": "127.0.0.1",
        "gpus": [],
        "fabrics": ["ib-a"],
        "replicas": replicas,
    }


def earlier_leader_left(tmp_path: Path) -> None:
    """What an earlier leader stored: nodes n1 and n2, a ready replica on n1."""
    store = Store(tmp_path)
    store.add_nodes([("n1", 1.0), ("n2", 1.0)])
    store.put_models([SPEC], 1.0)
    shard = ShardRecord(node="n1", rank=0, gpus=("GPU-1",))
    store.put_replicas([ReplicaRecord("r1", "m", ReplicaState.READY, (shard,), 1.0)])
    store.close()


async def test_the_feed_waits_for_the_nodes_serving_replicas(
    aiohttp_client: Callable[..., Awaitable[Any]], tmp_path: Path
) -> None:
    earlier_leader_left(tmp_path)
    client = await aiohttp_client(create_app(ControllerSettings(state_dir=tmp_path)))

    waiting = await client.get("/v1/endpoints")
    assert waiting.status == 503
    assert "waits for 1 node(s) serving replicas to report (n1)" in (await waiting.json())["error"]
    # n2 serves nothing: its report changes nothing; n1's does.
    assert (await client.post("/v1/agent/report", json=report("n2", []))).status == 200
    assert (await client.get("/v1/endpoints")).status == 503
    shard_report = {"id": "r1", "model": "m", "state": "ready", "gpus": ["GPU-1"], "port": 8001}
    assert (await client.post("/v1/agent/report", json=report("n1", [shard_report]))).status == 200
    feed = await client.get("/v1/endpoints")
    assert feed.status == 200
    assert [e["url"] for e in (await feed.json())["endpoints"]] == ["http://127.0.0.1:8001"]


async def test_a_node_that_never_reports_holds_the_feed_one_grace_period(
    aiohttp_client: Callable[..., Awaitable[Any]], tmp_path: Path
) -> None:
    earlier_leader_left(tmp_path)
    settings = ControllerSettings(state_dir=tmp_path, grace_intervals=0.0, grace_extra_s=0.3)
    client = await aiohttp_client(create_app(settings))
    assert (await client.get("/v1/endpoints")).status == 503
    await asyncio.sleep(0.5)  # n1's grace ran out: it is unreachable, out of routing
    feed = await client.get("/v1/endpoints")
    assert feed.status == 200 and (await feed.json())["endpoints"] == []
