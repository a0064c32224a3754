"""A failover under traffic through `llmgw gateway` (issue 13, item 4: the stop
handshake with gateways resumes): two controllers on one PostgreSQL, agents and
the gateway given both URLs, requests flowing all along. The leader is SIGKILLed
just after a drain was acknowledged; the new leader carries the drain on (a
stand-in, then the stop handshake with the gateway, which now follows it) and no
request fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.procs import wait_until
from tests.gateway.gwprocs import CONTROLLER_ARGS, Gateway, Load, model
from tests.leader.ha import LEASE_TTL_S, HaCluster

pytestmark = pytest.mark.slow


def test_a_drain_across_a_failover_fails_no_request(tmp_path: Path, pg_url: str) -> None:
    c = HaCluster(tmp_path / "ha", pg_url)
    gw = Gateway(c, "--policy", "round_robin")
    try:
        c.start(0, *CONTROLLER_ARGS, role="leader")
        c.start(1, role="follower")
        for name in ("gpu1", "gpu2"):
            c.start_agent(name, gpus="1xH100-80GB")

        def ready() -> bool:
            s = c.leader_get("/v1/summary")
            return s is not None and s["nodes"]["ready"] == 2

        wait_until(ready, timeout=30, what="two ready nodes", diagnose=c.logs)
        c.apply([model("chat")])
        gw.start()
        gw.wait_serving("chat")
        (old,) = c.get("/v1/replicas")
        node = old["shards"][0]["node"]
        load = Load(gw.url, "chat").start()
        wait_until(lambda: load.ok >= 4, timeout=20, what="requests flowing", diagnose=gw.logs)

        c.ctl("drain", node, "--reason", "maintenance, across a failover")
        c.kill(0)
        assert c.wait_leader(timeout=LEASE_TTL_S + 10) == 1

        def drained() -> bool:
            detail = c.leader_get(f"/v1/nodes/{node}")
            return bool(detail and detail["row"]["admin"]["drained"])

        wait_until(drained, timeout=60, what=f"{node} drained by the new leader", diagnose=gw.logs)
        before = load.ok
        wait_until(lambda: load.ok >= before + 4, timeout=20, what="requests after the drain")
        load.stop()
        (new,) = c.get("/v1/replicas")
        assert new["id"] != old["id"] and new["shards"][0]["node"] != node
        assert load.failures == [], "\n".join(load.failures[:10]) + "\n" + gw.logs()
        gateways = c.get("/v1/gateways")
        assert [g["name"] for g in gateways] == ["gw-test"] and gateways[0]["age_s"] < 3
    finally:
        gw.stop()
        c.close()
