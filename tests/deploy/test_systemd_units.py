"""The systemd units verify, and each ExecStart parses with llmgw's own CLI parser."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.cli import PROGRAMS

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
NAMES = ["llmgw-agent.service", "llmgw-controller.service", "llmgw-gateway.service"]
LLMGW = Path(sys.executable).parent / "llmgw"


def directives(unit: Path) -> list[tuple[str, str]]:
    out = []
    for line in unit.read_text().splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            out.append((key, value))
    return out


def exec_argv(unit: Path) -> list[str]:
    """ExecStart as the service would run it with an empty EnvironmentFile:
    `${VAR}` takes the unit's Environment= default, a bare `$VAR` word vanishes."""
    d = directives(unit)
    env = dict(v.split("=", 1) for k, v in d if k == "Environment")
    (cmd,) = [v for k, v in d if k == "ExecStart"]
    cmd = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], cmd).replace("%d", "/run/credentials/u")
    return [w for w in shlex.split(cmd) if not re.fullmatch(r"\$\w+", w)]


def cli_parser(program: str) -> argparse.ArgumentParser:
    module = importlib.import_module(PROGRAMS[program][0])
    build = getattr(module, "parser", None) or module.parser
    parser: argparse.ArgumentParser = build()
    return parser


@pytest.mark.parametrize("name", NAMES)
def test_exec_start_parses_with_the_llmgw_cli(name: str) -> None:
    argv = exec_argv(UNITS / name)
    assert argv[0] == "/usr/local/bin/llmgw"
    program = argv[1]
    if program not in PROGRAMS:
        pytest.xfail(f"`llmgw {program}` is not built yet on this branch (issue 12)")
    cli_parser(program).parse_args(argv[2:])  # exits (SystemExit) on a bad option


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
    # verify checks that ExecStart's binary exists: point it at this checkout's llmgw.
    for name in NAMES:
        text = (UNITS / name).read_text().replace("/usr/local/bin/llmgw", str(LLMGW))
        (tmp_path / name).write_text(text)
    out = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / n) for n in NAMES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and not out.stderr.strip(), out.stdout + out.stderr
