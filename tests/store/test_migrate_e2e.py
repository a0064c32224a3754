"""`llmgw controller migrate` with real processes: a fleet's state on SQLite (cordons,
a drain with a deadline, history, models, replicas, node credentials, enrollment
tokens, approvals and allowances, decision events) moves to PostgreSQL, and a
controller started there shows every view the same and goes on where it was."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from llmgw.controller.store.sqlite import Store
from tests.controller.fleet_factories import report
from tests.e2e.procs import Cluster, clean_env, llmgw, wait_until
from tests.security.test_enroll_e2e import agent_args, row
from tests.store.test_state_integrity import Controller

ADMIN = "admin-secret"


def migrate(state_dir: Path, pg_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw("controller", "migrate", "--from", f"sqlite:{state_dir}", "--to", pg_url),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )


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

    done = migrate(tmp_path / "state", pg_url)
    assert done.returncode == 0, done.stderr
    assert "copied 3 nodes" in done.stdout and "2 replicas" in done.stdout
    again = migrate(tmp_path / "state", pg_url)
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


def make_token(c: Cluster, path: Path, uses: int) -> str:
    """An admin-made enrollment token, kept in `path` for agents; its secret."""
    made = c.ctl(
        "--token", ADMIN, "credentials", "token", "create", "--ttl", "1h", "--uses", str(uses)
    )
    path.write_text(made)
    path.chmod(0o600)
    return made.strip()


def enroll_agent(c: Cluster, node: str, state: str, token_file: Path) -> None:
    c.agent_args[node] = agent_args(c, node, state, "--enroll-token-file", str(token_file))
    c.start_agent(node)


@pytest.mark.slow
def test_migrate_keeps_credentials_enrollment_and_events(
    cluster: Cluster, tmp_path: Path, pg_url: str
) -> None:
    """Enrolled agents keep reporting with the credential they hold, a pending
    approval, an unused token and an allowance still count, and `ctl events` still
    lists what the controller decided: nobody enrolls again after a migration."""
    c = cluster
    admins = tmp_path / "admins"
    admins.write_text(f"alice {ADMIN}\n")
    c.start_controller("--admin-token-file", str(admins), "--enroll-approval")
    c.http.headers["Authorization"] = f"Bearer {ADMIN}"
    used = make_token(c, tmp_path / "used-token", uses=3)
    for node in ("gpu01", "gpu02", "gpu03"):
        enroll_agent(c, node, node, tmp_path / "used-token")
    for node in ("gpu01", "gpu02", "gpu03"):
        wait_until(lambda n=node: row(c, n), timeout=30, what=f"{node} to report", diagnose=c.logs)
    c.ctl("--token", ADMIN, "credentials", "approve", "gpu01")
    c.stop_agent("gpu03")  # gpu03 will enroll again: revoked, and allowed to
    c.ctl("--token", ADMIN, "credentials", "revoke", "gpu03", "--allow-enroll")
    spare = make_token(c, tmp_path / "spare-token", uses=1)
    client_key = c.ctl("--token", ADMIN, "keys", "create", "--tenant", "acme").strip()
    keys = c.http.get("/v1/keys").json()
    tokens = c.http.get("/v1/credentials/tokens").json()
    credentials = c.http.get("/v1/credentials").json()
    events = c.http.get("/v1/events").json()["events"]
    assert [x["node"] for x in credentials if x["awaiting_approval"]] == ["gpu02"]
    assert {e["reason"] for e in events} >= {"Enrolled", "AwaitingApproval"}
    assert c.kill_controller(signal.SIGTERM) == 0
    held = (c.state_dir("gpu01") / "credential").read_text()
    quiet_since = len(c.agent_log("gpu01"))

    done = migrate(c.root / "controller", pg_url)
    assert done.returncode == 0, done.stderr
    copied = re.findall(r"(\d+) ([a-z ]+?)(?:,| from)", done.stdout)
    counts = {what: int(n) for n, what in copied}
    assert counts["node credentials"] == 2 and counts["enrollment tokens"] == 2
    assert counts["enrollment allowances"] == 1 and counts["decision events"] == len(events)
    assert counts["client keys"] == 1
    source = Store(c.root / "controller")
    stored = source.dump()
    source.close()
    secrets = [held.strip(), used, spare, *(t.digest for t in stored.enroll_tokens)]
    secrets += [client_key, *(k.digest for k in stored.client_keys)]
    secrets += [cred.digest for cred in stored.credentials.values()]
    assert not any(x in done.stdout + done.stderr for x in secrets), "no secret is printed"

    assert c.controller is not None
    c.controller.store = pg_url  # the same controller, port and options, on PostgreSQL
    c.start_controller()

    def reports_again() -> bool:
        detail = c.http.get("/v1/nodes/gpu01").json()["row"]
        return detail["report_age_s"] is not None and detail["report_age_s"] < 2

    wait_until(reports_again, timeout=60, what="gpu01 to report to PostgreSQL", diagnose=c.logs)
    since = c.agent_log("gpu01")[quiet_since:]
    assert "HTTP 401" not in since and "enrolled as" not in since, since
    assert (c.state_dir("gpu01") / "credential").read_text() == held
    assert c.http.get("/v1/credentials").json() == credentials
    assert c.http.get("/v1/credentials/tokens").json() == tokens
    assert c.http.get("/v1/keys").json() == keys, "the client keys, as they were"
    assert c.http.get("/v1/events").json()["events"][: len(events)] == events
    listed = c.ctl("--token", ADMIN, "events", "--for", "node/gpu02")
    assert "AwaitingApproval" in listed, listed
    # The pending approval, the spare token and gpu03's allowance still work.
    assert "approved" in c.ctl("--token", ADMIN, "credentials", "approve", "gpu02")
    first_run = len(c.agent_log("gpu03"))  # it enrolled once before, in the same log
    enroll_agent(c, "gpu03", "gpu03-again", tmp_path / "spare-token")
    wait_until(
        lambda: "enrolled as node gpu03" in c.agent_log("gpu03")[first_run:],
        timeout=30,
        what="gpu03 to enroll again",
        diagnose=c.logs,
    )

    def enrolled_again() -> bool:
        after = c.http.get("/v1/events", params={"since": events[-1]["id"]}).json()["events"]
        return any(e["object"] == "node/gpu03" and e["reason"] == "Enrolled" for e in after)

    wait_until(enrolled_again, timeout=10, what="an event numbered after the copied ones")
