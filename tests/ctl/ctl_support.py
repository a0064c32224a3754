"""A real controller process and `llmgw ctl` run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.procs import ControllerProcess

AGENT, ADMIN, READ = "agent-t0ken", "admin-t0ken", "read-t0ken"


def gpu(node: str, index: int, cls: str = "H100-SXM-80GB") -> dict[str, Any]:
    return {
        "uuid": f"GPU-{node}-{index}",
        "index": index,
        "gpu_class": cls,
        "memory_total_mib": 81920,
        "health": "healthy",
    }


def report(
    node: str,
    *,
    n_gpus: int = 8,
    fabrics: Sequence[str] = ("ib-a",),
    replicas: Sequence[dict[str, Any]] = (),
    interval_s: float = 30.0,
    engines: Sequence[str] | None = None,
) -> dict[str, Any]:
    return {
        **({"engines": list(engines)} if engines is not None else {}),
        "node": node,
        "agent_version": "test",
        "boot_id": "boot-1",
        "interval_s": interval_s,
        "gpus": [gpu(node, i) for i in range(n_gpus)],
        "fabrics": list(fabrics),
        "replicas": list(replicas),
    }


class Controller:
    def __init__(self, url: str, proc: ControllerProcess) -> None:
        self.url = url
        self.proc = proc
        # One client throughout: each new httpx client sets up TLS (~40 ms).
        self.http = httpx.Client(base_url=url, timeout=10)

    def report(self, node: str, **kw: Any) -> dict[str, Any]:
        resp = self.http.post(
            "/v1/agent/report",
            json=report(node, **kw),
            headers={"Authorization": f"Bearer {AGENT}"},
        )
        resp.raise_for_status()
        reply: dict[str, Any] = resp.json()
        return reply

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        resp = self.http.request(
            method, path, json=body, headers={"Authorization": f"Bearer {ADMIN}"}
        )
        resp.raise_for_status()
        return resp.json() if resp.content else None

    def serve_assigned(self, node: str, timeout_s: float = 15) -> list[str]:
        """Report `node` running every shard assigned to it, ready; their replica ids."""
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self.report(node)
            if reply["assignments"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        shards = [
            {
                "id": a["replica_id"],
                "model": a["model"],
                "rank": a["rank"],
                "state": "ready",
                "gpus": a["gpus"],
                "port": 9000 + i,
                "idle_seconds": 0.0,
            }
            for i, a in enumerate(reply["assignments"])
        ]
        self.report(node, replicas=shards)
        return [s["id"] for s in shards]


@contextmanager
def controller_process(state: Path, **env_extra: str) -> Iterator[Controller]:
    proc = ControllerProcess(
        state.with_name(f"{state.name}-controller.log"),
        state_dir=state,
        args=["--allow-shared-agent-token"],  # the bench-style fleet reports with one token
        env={
            "LLMGW_AGENT_TOKEN": AGENT,
            "LLMGW_ADMIN_TOKEN": ADMIN,
            "LLMGW_READ_TOKEN": READ,
            **env_extra,
        },
    )
    proc.start()
    controller = Controller(proc.url, proc)
    try:
        yield controller
    finally:
        controller.http.close()
        proc.stop()
        proc.close()


def llmgw(
    *args: str,
    env: dict[str, str] | None = None,
    input: str | None = None,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        env={**base, "XDG_CONFIG_HOME": "/nonexistent", **(env or {})},
    )


def ctl(
    url: str, *args: str, token: str | None = ADMIN, **kw: Any
) -> subprocess.CompletedProcess[str]:
    env = {"LLMGW_CONTROLLER": url, **({"LLMGW_TOKEN": token} if token else {})}
    env.update(kw.pop("env", {}))
    return llmgw("ctl", *args, env=env, **kw)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The command failed with `code` and said so in exactly one line on stderr."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result))
