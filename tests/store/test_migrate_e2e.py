"""`llmgw controller migrate` with real processes: a fleet's state on SQLite (cordons,
a drain with a deadline, history, models, replicas) moves to PostgreSQL, and a
controller started there shows every view the same."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.controller.fleet_factories import report
from tests.e2e.procs import clean_env, llmgw, wait_until
from tests.store.test_state_integrity import Controller


def views(c: Controller) -> dict[str, Any]:
    """Everything durable a user sees, without what is soft or timed (ages, liveness)."""
    nodes = {r["name"]: r["admin"] for r in c.http.get("/v1/nodes").json()}
    history = {n: c.http.get(f"/v1/nodes/{n}").json()["history"] for n in sorted(nodes)}
    models = [m["spec"] for m in c.http.get("/v1/models").json()]
    replicas = sorted(
        (r["id"], r["model"], r["state"], [(s["node"], s["gpus"]) for s in r["shards"]])
        for r in c.http.get("/v1/replicas").json()
    )
    return {"nodes": nodes, "history": history, "models": models, "replicas": replicas}


@pytest.mark.slow
def test_migrate_sqlite_to_postgresql_keeps_every_view(tmp_path: Path, pg_url: str) -> None:
    sqlite = Controller(tmp_path / "state", tmp_path / "sqlite.log")
    try:
        sqlite.start()
        for name in ("n1", "n2", "n3"):
            body = report(name, n_gpus=2).model_dump(mode="json")
            sqlite.http.post("/v1/agent/report", json=body).raise_for_status()
        spec = {
            "name": "m",
            "source": "/m",
            "engine": "fake",
            "min_replicas": 2,
            "gpus_per_shard": 1,
        }
        sqlite.http.post("/v1/models", json={"models": [spec]}).raise_for_status()
        wait_until(
            lambda: len(sqlite.http.get("/v1/replicas").json()) == 2,
            timeout=10,
            what="two replicas placed",
        )
        assert sqlite.cordon("n1").status_code == 200
        sqlite.http.post("/v1/nodes/n1/uncordon").raise_for_status()
        assert sqlite.cordon("n1").status_code == 200
        drain = {"reason": "maintenance", "force_after_s": 3600}
        sqlite.http.post("/v1/nodes/n3/drain", json=drain).raise_for_status()
        time.sleep(1.5)  # the first-sighting batch is saved
        before = views(sqlite)
        assert sqlite.stop() == 0
    finally:
        sqlite.close()

    done = subprocess.run(
        llmgw("controller", "migrate", "--from", f"sqlite:{tmp_path / 'state'}", "--to", pg_url),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "copied 3 nodes" in done.stdout and "2 replicas" in done.stdout
    again = subprocess.run(
        llmgw("controller", "migrate", "--from", f"sqlite:{tmp_path / 'state'}", "--to", pg_url),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert again.returncode == 2 and "already holds state" in again.stderr

    pg = Controller(tmp_path / "unused", tmp_path / "pg.log", store=pg_url)
    try:
        pg.start()
        assert views(pg) == before
        assert before["nodes"]["n1"]["flag"] == "cordoned"
        assert before["nodes"]["n3"]["drained"] is True
        assert [e["action"] for e in before["history"]["n1"]] == ["cordon", "uncordon", "cordon"]
        assert pg.stop() == 0
    finally:
        pg.close()
