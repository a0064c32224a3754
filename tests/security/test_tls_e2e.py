"""TLS with real processes: the controller serves HTTPS; agents, ctl and the
console's client verify it against the CA given, and refuse a mismatch with a
message that says what to do. The CAs are made here with trustme."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from llmgw.client import AdminClient, ControllerUnreachable
from tests.e2e.procs import ControllerProcess, clean_env, llmgw, wait_until

pytestmark = pytest.mark.slow


class Tls:
    def __init__(self, root: Path) -> None:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        self.ca = root / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca))
        self.cert = root / "cert.pem"
        cert.private_key_and_cert_chain_pem.write_to_path(str(self.cert))
        self.key = root / "key.pem"
        cert.private_key_pem.write_to_path(str(self.key))
        self.other_ca = root / "other-ca.pem"
        trustme.CA().cert_pem.write_to_path(str(self.other_ca))


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    return Tls(tmp_path)


@pytest.fixture
def https_controller(tmp_path: Path, tls: Tls) -> Iterator[str]:
    log = tmp_path / "controller.log"
    proc = ControllerProcess(
        log,
        state_dir=tmp_path / "state",
        args=["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)],
        scheme="https",
    )
    url = proc.url
    try:
        proc.start(
            ready=lambda: ctl(url, "--ca-file", str(tls.ca), "status").returncode == 0,
            what="https controller",
        )
        yield url
    finally:
        proc.terminate()
        assert proc.wait(10) == 0, log.read_text()[-2000:]
        proc.close()


def ctl(
    url: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw("ctl", "--controller", url, *args),
        capture_output=True,
        text=True,
        timeout=30,
        env={**clean_env(), **(env or {})},
    )


def test_ctl_verifies_the_controller(https_controller: str, tls: Tls) -> None:
    url = https_controller
    assert ctl(url, "--ca-file", str(tls.ca), "nodes").returncode == 0
    assert ctl(url, "nodes", env={"LLMGW_CA_FILE": str(tls.ca)}).returncode == 0
    for bad in (["--ca-file", str(tls.other_ca)], []):  # another CA; the system's CAs
        done = ctl(url, *bad, "nodes")
        assert done.returncode != 0
        assert "not trusted" in done.stderr and "--ca-file" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


async def test_the_consoles_client_verifies_with_the_env_ca(
    https_controller: str, tls: Tls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_CA_FILE", str(tls.ca))
    async with AdminClient(https_controller) as client:
        assert (await client.summary()).nodes.total == 0
    monkeypatch.setenv("LLMGW_CA_FILE", str(tls.other_ca))
    async with AdminClient(https_controller) as client:
        with pytest.raises(ControllerUnreachable, match="not trusted"):
            await client.summary()


def test_agents_verify_the_controller(https_controller: str, tls: Tls, tmp_path: Path) -> None:
    url = https_controller
    procs = []
    logs = {}
    for node, ca in (("good", tls.ca), ("bad", tls.other_ca)):
        logs[node] = tmp_path / f"agent-{node}.log"
        with logs[node].open("wb") as out:
            procs.append(
                subprocess.Popen(
                    llmgw(
                        "agent",
                        "--controller",
                        url,
                        "--node",
                        node,
                        "--interval",
                        "0.3",
                        "--fake-gpus",
                        "1xL4-24GB",
                        "--address",
                        "127.0.0.1",
                        "--state-dir",
                        str(tmp_path / node),
                        "--ca-file",
                        str(ca),
                    ),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=clean_env(),
                )
            )
    try:
        wait_until(
            lambda: "good" in ctl(url, "--ca-file", str(tls.ca), "nodes").stdout,
            timeout=20,
            what="the agent with the right CA to report",
        )
        wait_until(
            lambda: "not trusted" in logs["bad"].read_text(),
            timeout=20,
            what="the agent with the wrong CA to say so",
        )
        assert "--ca-file" in logs["bad"].read_text()
        assert "bad" not in ctl(url, "--ca-file", str(tls.ca), "nodes").stdout
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def test_a_public_bind_without_tls_is_warned_about(tmp_path: Path) -> None:
    env = {"LLMGW_ADMIN_TOKEN": "a", "LLMGW_ENROLL_TOKEN": "e"}
    proc = ControllerProcess(
        tmp_path / "controller.log",
        state_dir=tmp_path / "state",
        host="0.0.0.0",
        env=env,
        args=["--allow-static-enroll-token"],
    )
    try:
        proc.start(ready=lambda: "listening on" in proc.output(), what="listening on")
        lines = []
        for line in proc.output().splitlines(keepends=True):
            lines.append(line)
            if "listening on" in line:
                break
        assert any("without TLS" in line for line in lines), lines
    finally:
        proc.terminate()
        proc.wait(10)
        proc.close()


def test_the_console_takes_a_ca_file(tls: Tls, tmp_path: Path) -> None:
    from llmgw.console.cli import main as console_main
    from llmgw.console.cli import parse_args

    assert parse_args(["--ca-file", str(tls.ca)]).ca_file == str(tls.ca)
    missing = tmp_path / "missing.pem"
    assert console_main(["--controller", "https://127.0.0.1:1", "--ca-file", str(missing)]) == 2
