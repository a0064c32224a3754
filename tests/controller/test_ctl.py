"""`llmgw ctl` as a user runs it, against a real controller process on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fleet_factories import location, report

from llmgw.wire import NodeReport
from tests.e2e.procs import ControllerProcess, free_port

AGENT, ADMIN = "agent-t0ken", "admin-t0ken"


def llmgw(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state = tmp_path_factory.mktemp("ctl-state")
    proc = ControllerProcess(
        state.with_name(f"{state.name}-controller.log"),
        state_dir=state,
        args=["--allow-shared-agent-token"],
        env={"LLMGW_AGENT_TOKEN": AGENT, "LLMGW_ADMIN_TOKEN": ADMIN},
    )
    proc.start()
    url = proc.url
    try:
        send(
            url,
            report(
                "gpu001", storage=[location("/models", ["meta/llama-8b"], "shared", "filer:/m")]
            ),
        )
        send(url, report("gpu002", fabrics=["ib-b"]))
        send(url, report("gpu003"))
        yield url
    finally:
        proc.stop()
        proc.close()


def send(url: str, r: NodeReport) -> None:
    resp = httpx.post(
        f"{url}/v1/agent/report",
        content=r.model_dump_json(),
        headers={"Authorization": f"Bearer {AGENT}"},
    )
    resp.raise_for_status()


def ctl(url: str, *args: str, token: str | None = ADMIN) -> subprocess.CompletedProcess[str]:
    env = {"LLMGW_CONTROLLER": url, "LLMGW_TOKEN": token or ""}
    return llmgw("ctl", *args, env=env)


def test_status_json_is_the_summary_as_served(controller: str) -> None:
    result = ctl(controller, "status", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert set(summary) >= {
        "nodes",
        "gpus",
        "fabrics",
        "replicas",
        "models",
        "unplaceable",
        "idle_replicas",
    }
    assert summary["nodes"]["total"] == 3
    assert [f["fabric"] for f in summary["fabrics"]] == ["ib-a", "ib-b"]
    assert summary["gpus"][0]["class"] == "H100-SXM-80GB"


def test_status_prints_the_fleet_like_ray_status(controller: str) -> None:
    result = ctl(controller, "status")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "3 total" in out
    assert "H100-SXM-80GB" in out and "ib-a" in out and "ib-b" in out
    assert "FREE BLOCK" in out


def test_cordon_shows_in_status_and_nodes_then_uncordon(controller: str) -> None:
    result = ctl(controller, "cordon", "gpu001", "gpu003", "--reason", "PSU swap")
    assert result.returncode == 0, result.stderr
    status = ctl(controller, "status").stdout
    assert "PSU swap" in status and "gpu[001,003]" in status  # grouped like sinfo -R
    nodes = json.loads(ctl(controller, "nodes", "--json").stdout)
    cordoned = {n["name"] for n in nodes if n["state"] == "cordoned"}
    assert cordoned == {"gpu001", "gpu003"}
    assert "PSU swap" in ctl(controller, "nodes").stdout
    assert ctl(controller, "uncordon", "gpu001", "gpu003").returncode == 0
    nodes = json.loads(ctl(controller, "nodes", "--json").stdout)
    assert all(n["state"] == "ready" for n in nodes)


def test_unknown_node_is_a_controller_error(controller: str) -> None:
    result = ctl(controller, "cordon", "nope", "--reason", "x")
    assert result.returncode == 1
    assert "nope" in result.stderr


def test_missing_reason_is_a_usage_error(controller: str) -> None:
    assert ctl(controller, "cordon", "gpu001").returncode == 2
    assert ctl(controller, "drain", "gpu001").returncode == 2
    before = json.loads(ctl(controller, "nodes", "--json").stdout)
    assert all(n["admin"]["flag"] == "none" for n in before if n["name"] == "gpu001")


def test_wrong_token_prints_the_controllers_message(controller: str) -> None:
    result = ctl(controller, "cordon", "gpu001", "--reason", "x", token="wrong")
    assert result.returncode == 1
    assert "invalid token" in result.stderr


def test_unreachable_controller_names_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = ctl(url, "status")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0]


def test_apply_validates_and_lists_models(controller: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: x\n  source: org/x\n  gpus_per_shard: 0\n")
    result = ctl(controller, "apply", "-f", str(bad))
    assert result.returncode == 2
    assert "model x" in result.stderr and "gpus_per_shard" in result.stderr
    good = tmp_path / "models.toml"
    good.write_text('[[models]]\nname = "tiny"\nsource = "org/tiny"\nmin_replicas = 0\n')
    assert ctl(controller, "apply", "-f", str(good)).returncode == 0
    models = json.loads(ctl(controller, "models", "--json").stdout)
    assert [m["spec"]["name"] for m in models] == ["tiny"]
    assert ctl(controller, "delete", "model", "tiny").returncode == 0
    assert json.loads(ctl(controller, "models", "--json").stdout) == []
