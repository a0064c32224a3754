"""The systemd units verify, and each one's ExecStart, with each set of its drop-ins and
the files docs/deployment.md tells the operator to create, parses with llmgw's own CLI parser."""

from __future__ import annotations

import argparse
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.cli import PROGRAMS
from tests.deploy.units import (
    INSTALL_DOC,
    NAMES,
    UNITS,
    VARIANTS,
    Service,
    directives,
    dropin,
    load_credentials,
    operator_files,
)

LLMGW = Path(sys.executable).parent / "llmgw"
CASES = [(unit, dropins) for unit in NAMES for dropins in VARIANTS[unit]]


def cli_parser(program: str) -> argparse.ArgumentParser:
    module = importlib.import_module(PROGRAMS[program][0])
    parser: argparse.ArgumentParser = module.parser()
    return parser


@pytest.mark.parametrize(("name", "dropins"), CASES)
def test_exec_start_parses_with_the_llmgw_cli(
    name: str, dropins: tuple[str, ...], tmp_path: Path
) -> None:
    etc, creds = tmp_path / "etc", tmp_path / "creds"
    env_files = operator_files(etc, "https://controller:7460", tls=None)
    for tls_file in ("tls.crt", "tls.key"):
        (etc / tls_file).write_text("PEM\n")  # parsed here, read in test_install
    service = Service(name, dropins)
    load_credentials(service, etc, creds)
    argv = service.argv(creds, service.environment(creds, env_files))
    assert argv[0] == "/usr/local/bin/llmgw"
    args = cli_parser(argv[1]).parse_args(argv[2:])  # exits (SystemExit) on a bad option
    for value in vars(args).values():  # every credential named is one systemd hands over
        if str(value).startswith(str(creds)):
            assert Path(str(value)).exists(), f"{name} {dropins}: {value} is not loaded"


def test_each_way_to_run_a_unit_is_in_the_install_steps() -> None:
    steps = INSTALL_DOC.read_text()
    for unit, variants in VARIANTS.items():
        assert f"deploy/systemd/{unit}" in steps
        for dropins in variants:
            for name in dropins:
                assert f"{unit}.d/{name}" in steps, (
                    f"docs/deployment.md does not mention {unit}.d/{name}"
                )
    for path in UNITS.glob("*.service.d/*.conf"):
        assert path.name in {d for v in VARIANTS[path.parent.name[:-2]] for d in v}, path


def test_agent_needs_one_credential_drop_in() -> None:
    """Without a drop-in the agent has no credential: the unit says so up front."""
    assert "--token-file" not in Service("llmgw-agent.service").values("ExecStart")[0]
    for name in ("enroll.conf", "token.conf"):
        assert "LLMGW_AGENT_CREDENTIAL" in dropin("llmgw-agent.service", name).read_text()


@pytest.mark.parametrize("name", NAMES)
def test_units_have_what_operators_expect(name: str) -> None:
    keys = dict(directives(UNITS / name))
    for key in ("EnvironmentFile", "StateDirectory", "Restart", "ProtectSystem", "NoNewPrivileges"):
        assert key in keys, f"{name} lacks {key}="
    assert keys["ProtectSystem"] == "strict" and keys["NoNewPrivileges"] == "yes"
    assert keys.get("User") or keys.get("DynamicUser") == "yes", f"{name} runs as root"


def test_agent_unit_lets_engines_outlive_an_agent_restart() -> None:
    text = (UNITS / "llmgw-agent.service").read_text()
    assert dict(directives(UNITS / "llmgw-agent.service"))["KillMode"] == "process"
    assert "outlive" in text or "keep serving" in text  # the reason is written down
    assert "PrivateDevices" not in dict(directives(UNITS / "llmgw-agent.service"))  # NVML


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze not found: install Debian's `systemd` package",
)
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """verify reads the drop-ins beside each unit; it checks that ExecStart's binary
    exists, so the units point at this checkout's llmgw."""
    for name in NAMES:
        text = (UNITS / name).read_text().replace("/usr/local/bin/llmgw", str(LLMGW))
        (tmp_path / name).write_text(text)
        if (UNITS / f"{name}.d").is_dir():
            shutil.copytree(UNITS / f"{name}.d", tmp_path / f"{name}.d")
    out = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / n) for n in NAMES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and not out.stderr.strip(), out.stdout + out.stderr
