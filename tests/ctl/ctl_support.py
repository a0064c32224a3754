"""A real controller process and `llmgw ctl` run as a user runs it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

AGENT, ADMIN, READ = "agent-t0ken", "admin-t0ken", "read-t0ken"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    def __init__(self, url: str, proc: subprocess.Popen[str]) -> None:
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
    port = free_port()
    env = {
        **os.environ,
        "LLMGW_AGENT_TOKEN": AGENT,
        "LLMGW_ADMIN_TOKEN": ADMIN,
        "LLMGW_READ_TOKEN": READ,
        **env_extra,
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw",
            "controller",
            "--listen",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(state),
            "--allow-shared-agent-token",  # the bench-style fleet reports with one token
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "controller did not start"
        time.sleep(0.1)
    controller = Controller(url, proc)
    try:
        yield controller
    finally:
        controller.http.close()
        proc.terminate()
        proc.wait(timeout=10)


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
