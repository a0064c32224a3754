"""A card fails under a serving replica (issue 21 items 5 and 6), end to end: real
controller, agents whose fake GPUs come from a file (`--fake-gpus @FILE`, read at
every scan), fake engines, and the gateway with its SMG child under steady
traffic. The replica is replaced on another node before it stops, no request
fails, and the node is cordoned by llmgw naming the card."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.procs import Cluster, wait_until
from tests.gateway.gwprocs import CONTROLLER_ARGS, Gateway, Load, model, wait_cluster_ready

pytestmark = pytest.mark.slow

NODES = ["gpu1", "gpu2", "gpu3"]


def write_spec(path: Path, spec: str) -> None:
    """As an operator's script would: whole, never half-written."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"# fake cards of this node\n{spec}\n")
    os.replace(tmp, path)


def chat_replicas(c: Cluster) -> list[dict[str, Any]]:
    return [r for r in c.get("/v1/replicas") if r["model"] == "chat"]


def test_a_card_failing_under_traffic_moves_its_replica_and_fails_no_request(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    c.start_controller(*CONTROLLER_ARGS)
    specs = {name: tmp_path / f"{name}.gpus" for name in NODES}
    for name in NODES:
        write_spec(specs[name], "2xH100-80GB")
        c.start_agent(name, gpus=f"@{specs[name]}")
    wait_cluster_ready(c, NODES)
    c.apply([model("chat", min_replicas=2)])
    gw = Gateway(c, "--policy", "round_robin")
    gw.start()
    gw.wait_serving("chat")
    wait_until(
        lambda: len(c.get("/v1/endpoints")["endpoints"]) == 2, timeout=30, what="two endpoints"
    )
    before = {r["id"]: r for r in chat_replicas(c)}
    # Spread: one replica per node.
    assert len({r["shards"][0]["node"] for r in before.values()}) == 2, before
    victim = min(before.values(), key=lambda r: r["shards"][0]["node"])
    node = victim["shards"][0]["node"]
    [uuid] = victim["shards"][0]["gpus"]
    index = next(g["index"] for g in c.get(f"/v1/nodes/{node}")["gpus"] if g["uuid"] == uuid)

    load = Load(gw.url, "chat").start()
    try:
        wait_until(lambda: load.ok >= 4, timeout=20, what="requests flowing", diagnose=gw.logs)
        write_spec(specs[node], f"2xH100-80GB,unhealthy={index}")

        def replaced() -> list[dict[str, Any]] | None:
            now = chat_replicas(c)
            gone = victim["id"] not in {r["id"] for r in now}
            ready = [r for r in now if r["state"] == "ready"]
            return now if gone and len(ready) == 2 else None

        after = wait_until(replaced, timeout=60, what="the replica replaced", diagnose=gw.logs)
        served = load.ok
        wait_until(lambda: load.ok >= served + 6, timeout=20, what="requests after the move")
    finally:
        load.stop()
    assert load.failures == [], "\n".join(load.failures[:10]) + "\n" + gw.logs()
    # The stand-in went to the node that ran neither replica.
    hosts = sorted(r["shards"][0]["node"] for r in after)
    assert node not in hosts and len(set(hosts)) == 2, after
    # The node is cordoned by llmgw, naming the card and why.
    detail = c.get(f"/v1/nodes/{node}")
    admin = detail["row"]["admin"]
    assert detail["row"]["state"] == "cordoned" and admin["by"] == "llmgw", admin
    assert admin["reason"].startswith(f"card fault: GPU {index} ({uuid[:8]}…)"), admin
    assert "simulated fault" in admin["reason"], admin
    assert [e["action"] for e in detail["history"] if e["by"] == "llmgw"] == ["cordon"]
    # And why, as events: the fault on the node, the stand-in and the move on the model.
    on_node = c.ctl("events", "--for", f"node/{node}")
    assert "GpuFault" in on_node and f"GPU {index} ({uuid[:8]}…)" in on_node, on_node
    on_model = c.ctl("events", "--for", "model/chat")
    assert "StandIn" in on_model and "Moved" in on_model, on_model
    assert f"to stand in for {victim['id']} (card fault: GPU {index}" in on_model, on_model
    # The card recovers: the node stays cordoned until an operator says otherwise.
    write_spec(specs[node], "2xH100-80GB")
    wait_until(
        lambda: all(g["health"] == "healthy" for g in c.get(f"/v1/nodes/{node}")["gpus"]),
        timeout=10,
        what="the card healthy again",
    )
    assert c.get(f"/v1/nodes/{node}")["row"]["state"] == "cordoned"
    out = c.ctl("uncordon", node)
    assert node in out
    gw.stop()
