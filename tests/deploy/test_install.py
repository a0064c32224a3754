"""A fleet installed as docs/deployment.md says runs: the controller (enrollment and TLS
drop-ins), an agent that enrolls and a gateway, each started from its unit's ExecStart
with the files the install steps have the operator create, as systemd would start it (the
credentials copied into a directory of their own, the unit's environment and env file)."""

from __future__ import annotations

import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.deploy.units import Service, Tls, load_credentials, make_tls, operator_files
from tests.e2e.procs import _stop, _tail, clean_env, free_port, wait_until


class Host:
    """Processes started from units, with paths moved under one temporary root."""

    def __init__(self, root: Path, ports: dict[str, int]) -> None:
        self.root = root
        self.etc = root / "etc"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports = ports

    def start(self, service: Service, env_files: dict[str, str]) -> None:
        name = service.unit.removesuffix(".service")
        creds = self.root / "run" / "credentials" / name
        load_credentials(service, self.etc, creds)
        env = service.environment(creds, env_files)
        argv = service.argv(creds, env)
        assert argv[0] == "/usr/local/bin/llmgw"
        moved = []
        for word in argv[1:]:
            word = word.replace("/var/lib/", f"{self.root}/var/lib/")
            for listen, port in self.ports.items():
                word = word.replace(listen, f"{listen.rpartition(':')[0]}:{port}")
            moved.append(word)
        log = self.root / f"{name}.log"
        with log.open("ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "llmgw", *moved],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**clean_env(), **env, "CREDENTIALS_DIRECTORY": str(creds)},
                cwd=self.root,
                start_new_session=True,
            )

    def logs(self) -> str:
        parts = []
        for name, proc in self.procs.items():
            state = "running" if proc.poll() is None else f"exited {proc.returncode}"
            parts.append(f"--- {name} ({state}) ---\n{_tail(self.root / f'{name}.log')}")
        return "\n".join(parts)

    def close(self) -> None:
        for proc in self.procs.values():
            _stop(proc, 15, timeout=10)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    ports = {p: free_port() for p in ("0.0.0.0:7460", "127.0.0.1:9460", "0.0.0.0:8000")}
    h = Host(tmp_path, ports)
    try:
        yield h
    finally:
        h.close()


def test_a_fleet_installed_as_the_docs_say_runs(host: Host) -> None:
    tls: Tls = make_tls()
    port = host.ports["0.0.0.0:7460"]
    url = f"https://localhost:{port}"
    env_files = operator_files(host.etc, url, tls)
    admin = (host.etc / "admin.tokens").read_text().split()[1]
    ca = str(host.etc / "ca.pem")
    api = httpx.Client(
        base_url=url,
        verify=ssl.create_default_context(cafile=ca),
        timeout=5,
        headers={"Authorization": f"Bearer {admin}"},
    )

    host.start(Service("llmgw-controller.service", ("enroll.conf", "tls.conf")), env_files)

    def answers() -> bool:
        try:
            return api.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(answers, timeout=30, what="the controller over TLS", diagnose=host.logs)
    host.start(Service("llmgw-agent.service", ("enroll.conf",)), env_files)
    host.start(Service("llmgw-gateway.service"), env_files)

    def node_ready() -> bool:
        nodes = api.get("/v1/nodes").json()
        return any(n["state"] == "ready" for n in nodes)

    wait_until(node_ready, timeout=40, what="the enrolled agent's node", diagnose=host.logs)
    assert (host.root / "var/lib/llmgw-agent/credential").exists()  # enrolled, kept

    def gateway_reports() -> bool:
        return any(g["name"] for g in api.get("/v1/gateways").json())

    # The controller takes the gateway's token: the stop handshake hears from it.
    wait_until(gateway_reports, timeout=60, what="the gateway's status", diagnose=host.logs)
    key = (host.etc / "client-keys").read_text().split()[1]
    gw = f"http://127.0.0.1:{host.ports['0.0.0.0:8000']}"

    def status(headers: dict[str, str]) -> int | None:
        try:
            return httpx.post(
                f"{gw}/v1/completions", json={"model": "m", "prompt": "hi"}, headers=headers
            ).status_code
        except httpx.HTTPError:
            return None

    # It runs on a public address because it has client keys: a key is asked for.
    assert wait_until(lambda: status({}), timeout=30, what="the gateway", diagnose=host.logs) == 401
    assert status({"Authorization": f"Bearer {key}"}) not in (None, 401, 403), host.logs()
    assert all(p.poll() is None for p in host.procs.values()), host.logs()
