"""Enrollment and impersonation with real controller and agent processes."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from tests.e2e.procs import Cluster, wait_until

pytestmark = pytest.mark.slow
ADMIN = "admin-secret"


def agent_args(
    c: Cluster, node: str, state: str, *extra: str, gpus: str = "2xH100-80GB"
) -> list[str]:
    return [
        "--controller", c.url, "--node", node, "--interval", "0.3", "--fake-gpus", gpus,
        "--address", "127.0.0.1", "--state-dir", str(c.state_dir(state)), *extra,
    ]  # fmt: skip


def row(c: Cluster, node: str) -> dict[str, object] | None:
    return next((r for r in c.get("/v1/nodes") if r["name"] == node), None)


def test_agents_enroll_once_and_cannot_report_as_another_node(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    enroll = tmp_path / "enroll-token"
    enroll.write_text("enroll-secret\n")
    admins = tmp_path / "admins"
    admins.write_text(f"alice {ADMIN}\n")
    c.start_controller(
        "--enroll-token-file",
        str(enroll),
        "--allow-static-enroll-token",
        "--admin-token-file",
        str(admins),
    )
    c.http.headers["Authorization"] = f"Bearer {ADMIN}"

    # First contact: each agent trades the enrollment token for its own credential.
    for node in ("gpu01", "gpu02"):
        c.agent_args[node] = agent_args(c, node, node, "--enroll-token-file", str(enroll))
        c.start_agent(node)
    for node in ("gpu01", "gpu02"):
        wait_until(lambda n=node: row(c, n), timeout=20, what=f"{node} to report", diagnose=c.logs)
        cred = c.state_dir(node) / "credential"
        assert stat.S_IMODE(cred.stat().st_mode) == 0o600
    gpu02_credential = (c.state_dir("gpu02") / "credential").read_text().strip()

    # From then on the stored credential is used: no enrollment token needed.
    c.stop_agent("gpu01")
    c.agent_args["gpu01"] = agent_args(c, "gpu01", "gpu01")
    c.start_agent("gpu01")

    # gpu02's credential, used by a process claiming to be gpu01, is refused.
    stolen = tmp_path / "stolen"
    stolen.write_text(gpu02_credential + "\n")
    c.agent_args["impostor"] = agent_args(
        c, "gpu01", "impostor", "--token-file", str(stolen), gpus="8xB200-192GB"
    )
    c.start_agent("impostor")
    # A second enrollment of a name that holds a credential is refused.
    c.agent_args["twin"] = agent_args(c, "gpu02", "twin", "--enroll-token-file", str(enroll))
    c.start_agent("twin")

    wait_until(lambda: "HTTP 403" in c.agent_log("impostor"), timeout=20, what="impostor refused")
    wait_until(
        lambda: "already holds a credential" in c.agent_log("twin"),
        timeout=20,
        what="second enrollment refused",
    )
    time.sleep(1.5)  # several more refused reports
    detail = c.get("/v1/nodes/gpu01")
    assert detail["row"]["gpus_total"] == 2 and detail["row"]["classes"] == {"H100-80GB": 2}
    age = detail["row"]["report_age_s"]
    assert age is not None and age < 2, "the real gpu01 still reports with its stored credential"
    assert not (c.state_dir("twin") / "credential").exists()
    log = (c.root / "controller.log").read_text()
    assert log.count("refused a report from gpu02") == 1, log

    # ctl lists and revokes credentials, and forgets a node.
    listed = c.ctl("--token", ADMIN, "credentials", "list")
    assert "gpu01" in listed and "gpu02" in listed and "enrolled" in listed
    c.stop_agent("twin")
    c.stop_agent("gpu02")
    out = c.ctl("--token", ADMIN, "node", "forget", "gpu02")
    assert "forgotten" in out and "revoked" in out
    assert row(c, "gpu02") is None
    assert "gpu02" not in c.ctl("--token", ADMIN, "credentials", "list")
    assert c.get("/v1/summary")["nodes"]["total"] == 1


def test_an_agent_enrolls_with_a_limited_token_and_waits_for_approval(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 25 item 4 with real processes: a token an admin made enrolls one node,
    which reports but gets no replica until `ctl credentials approve`."""
    c = cluster
    admins = tmp_path / "admins"
    admins.write_text(f"alice {ADMIN}\n")
    c.start_controller(
        "--admin-token-file", str(admins), "--enroll-approval", "--reconcile-interval", "0.5"
    )
    c.http.headers["Authorization"] = f"Bearer {ADMIN}"
    made = c.ctl("--token", ADMIN, "credentials", "token", "create", "--ttl", "1h", "--uses", "1")
    token_file = tmp_path / "enroll-token"
    token_file.write_text(made)
    token_file.chmod(0o600)
    c.agent_args["gpu01"] = agent_args(c, "gpu01", "gpu01", "--enroll-token-file", str(token_file))
    c.start_agent("gpu01")
    wait_until(lambda: row(c, "gpu01"), timeout=20, what="gpu01 to report", diagnose=c.logs)
    spec = {
        "name": "m",
        "source": "org/m",
        "min_replicas": 1,
        "gpus_per_shard": 1,
        "engine": "fake",
        "engine_args": ["--load-seconds", "0.3", "--host", "127.0.0.1"],
    }
    assert c.http.post("/v1/models", json={"models": [spec]}).status_code == 200
    # The token was good for one node: a second agent with it is refused.
    c.agent_args["gpu02"] = agent_args(c, "gpu02", "gpu02", "--enroll-token-file", str(token_file))
    c.start_agent("gpu02")
    wait_until(lambda: "used up" in c.agent_log("gpu02"), timeout=20, what="gpu02 refused")
    # Several reconcile passes: nothing placed on a node awaiting approval.
    time.sleep(2)
    assert c.get("/v1/replicas") == []
    nodes = c.ctl("--token", ADMIN, "nodes")
    assert "awaiting approval" in nodes and "cordoned" in nodes, nodes
    assert "gets no replicas until an admin approves it" in c.agent_log("gpu01")
    assert "awaiting approval" in c.ctl("--token", ADMIN, "credentials", "list")

    out = c.ctl("--token", ADMIN, "credentials", "approve", "gpu01")
    assert "approved" in out

    def serving() -> bool:
        return any(r["state"] == "ready" for r in c.get("/v1/replicas"))

    wait_until(serving, timeout=30, what="a replica on gpu01 once approved", diagnose=c.logs)
    assert [s["node"] for r in c.get("/v1/replicas") for s in r["shards"]] == ["gpu01"]
    assert row(c, "gpu02") is None
    tokens = c.ctl("--token", ADMIN, "credentials", "token", "list")
    assert "used up" in tokens and "used 1 of 1" in tokens, tokens
