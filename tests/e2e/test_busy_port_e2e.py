"""A port already in use at start is one readable line and exit code 2, never a
traceback (issue 25 item 7): the controller's API and --metrics-listen, the agent's
--metrics-listen and the gateway, each against a port this test holds."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.procs import ControllerProcess, clean_env, free_port, llmgw

pytestmark = pytest.mark.slow


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port held by a listening socket for the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def start_fails(argv: list[str]) -> str:
    """The one line that says why (INFO logs of the start may come before it)."""
    done = subprocess.run(argv, capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 2, done
    out = done.stderr + done.stdout
    assert "Traceback" not in out and " ERROR " not in out, out
    said = [line for line in done.stderr.splitlines() if line.startswith("llmgw ")]
    assert len(said) == 1 and done.stderr.strip().endswith(said[0]), done.stderr
    return said[0]


def test_the_controller_on_a_taken_port(taken: int, tmp_path: Path) -> None:
    state = tmp_path / "state"
    controller = ControllerProcess(tmp_path / "controller.log", state_dir=state, port=taken)
    line = start_fails(controller.argv())
    assert line.startswith("llmgw controller: cannot listen on 127.0.0.1:")
    assert f":{taken} for the API: the address is already in use" in line
    assert "choose another address" in line
    # The port is checked first: no empty state database is left behind.
    assert not state.exists() or list(state.iterdir()) == []


def test_the_controllers_metrics_port_taken(taken: int, tmp_path: Path) -> None:
    state = tmp_path / "state"
    controller = ControllerProcess(
        tmp_path / "controller.log",
        state_dir=state,
        args=["--metrics-listen", f"127.0.0.1:{taken}"],
    )
    line = start_fails(controller.argv())
    assert f"cannot listen on 127.0.0.1:{taken} for --metrics-listen" in line
    assert not state.exists() or list(state.iterdir()) == []


def test_a_taken_port_moves_no_state_aside(taken: int, tmp_path: Path) -> None:
    """--reset-state with the port taken: refused before anything is renamed."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "controller.sqlite3").write_bytes(b"damaged")
    controller = ControllerProcess(
        tmp_path / "controller.log", state_dir=state, port=taken, args=["--reset-state"]
    )
    line = start_fails(controller.argv())
    assert f":{taken} for the API: the address is already in use" in line
    assert [p.name for p in state.iterdir()] == ["controller.sqlite3"]


def test_the_agents_metrics_port_taken(taken: int, tmp_path: Path) -> None:
    argv = llmgw(
        "agent",
        "--controller",
        f"http://127.0.0.1:{free_port()}",
        "--node",
        "n1",
        "--fake-gpus",
        "2xH100-80GB",
        "--state-dir",
        str(tmp_path),
        "--metrics-listen",
        f"127.0.0.1:{taken}",
    )
    line = start_fails(argv)
    assert line.startswith(f"llmgw agent: cannot listen on 127.0.0.1:{taken} for --metrics-listen")


def test_the_gateway_on_a_taken_port(taken: int, tmp_path: Path) -> None:
    argv = llmgw(
        "gateway",
        "--controller",
        f"http://127.0.0.1:{free_port()}",
        "--listen",
        f"127.0.0.1:{taken}",
        "--work-dir",
        str(tmp_path / "gw"),
    )
    line = start_fails(argv)
    assert line.startswith(f"llmgw gateway: cannot listen on 127.0.0.1:{taken} for the gateway")
