"""Metered usage across a PostgreSQL failover: two controllers on one database, a
gateway given both URLs. What the leader was told before it was SIGKILLed is what
the new leader reports, and the gateway's counts go on to the new leader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.procs import wait_until
from tests.gateway.gwprocs import CONTROLLER_ARGS, Gateway, model
from tests.leader.ha import LEASE_TTL_S, HaCluster

pytestmark = pytest.mark.slow


def test_usage_survives_a_failover(tmp_path: Path, pg_url: str) -> None:
    c = HaCluster(tmp_path / "ha", pg_url)
    gw = Gateway(c)
    try:
        c.start(0, *CONTROLLER_ARGS, role="leader")
        c.start(1, role="follower")
        c.start_agent("gpu1", gpus="1xH100-80GB")

        def ready() -> bool:
            s = c.leader_get("/v1/summary")
            return s is not None and s["nodes"]["ready"] == 1

        wait_until(ready, timeout=30, what="a ready node", diagnose=c.logs)
        c.apply([model("chat")])
        gw.start()
        gw.wait_serving("chat")
        key = c.ctl("keys", "create", "--tenant", "acme").strip()
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "chat", "prompt": "a b", "max_tokens": 2}

        def send(n: int) -> None:
            for _ in range(n):
                r = httpx.post(f"{gw.url}/v1/completions", json=body, headers=headers, timeout=20)
                assert r.status_code == 200, r.text

        def requests() -> int | None:
            try:
                rows: list[dict[str, Any]] = c.ctl_json("usage", "--since", "1h")
            except AssertionError:
                return None  # no leader for a moment
            return sum(r["requests"] for r in rows if r["tenant"] == "acme")

        wait_until(
            lambda: httpx.post(f"{gw.url}/v1/completions", json=body).status_code == 401,
            timeout=5,
            what="the key at the gateway",
        )
        send(3)
        wait_until(lambda: requests() == 3, timeout=10, what="3 requests metered")
        c.kill(0)
        assert c.wait_leader(timeout=LEASE_TTL_S + 10) == 1
        assert requests() == 3, "what the old leader stored, the new one reports"
        send(2)
        wait_until(lambda: requests() == 5, timeout=15, what="counted at the new leader")
    finally:
        gw.stop()
        c.close()
