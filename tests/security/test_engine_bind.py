"""Engines listen on the node's address (--engine-host, else --address), never
on every interface by default."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.agent.cli import make_builder, make_engines, parser
from llmgw.agent.engine_settings import SupervisorSettings
from llmgw.agent.engines import EngineSupervisor
from llmgw.wire import ShardAssignment, ShardState


def listening(pid_port: int) -> list[str]:
    """IPv4 addresses with a socket listening on this TCP port (from /proc/net/tcp)."""
    out = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, port = local.split(":")
        if state == "0A" and int(port, 16) == pid_port:
            out.append(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return out


@pytest.fixture
async def supervisors(tmp_path: Path) -> AsyncIterator[list[EngineSupervisor]]:
    made: list[EngineSupervisor] = []
    yield made
    for sup in made:
        pids = [v["pid"] for v in sup.debug_state().values() if v["pid"]]
        await sup.close()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def agent_supervisor(tmp_path: Path, *flags: str) -> EngineSupervisor:
    args = parser().parse_args(
        ["--node", "n1", "--fake-gpus", "1xH100-80GB", "--state-dir", str(tmp_path), *flags]
    )
    engines = make_engines(args, make_builder(args))
    assert isinstance(engines, EngineSupervisor)
    return engines


def test_the_engine_host_is_the_address_unless_given(tmp_path: Path) -> None:
    sup = agent_supervisor(tmp_path / "a", "--address", "10.1.2.3")
    assert sup.settings.engine_host == "10.1.2.3"
    sup = agent_supervisor(tmp_path / "b", "--address", "10.1.2.3", "--engine-host", "10.9.9.9")
    assert sup.settings.engine_host == "10.9.9.9"
    sup = agent_supervisor(tmp_path / "c")
    assert sup.settings.engine_host == socket.gethostname()
    assert SupervisorSettings(state_dir=tmp_path / "d", node="n").engine_host == "127.0.0.1"


async def test_a_fake_engine_listens_only_on_the_given_address(
    tmp_path: Path, supervisors: list[EngineSupervisor]
) -> None:
    sup = agent_supervisor(tmp_path, "--address", "127.0.0.3")
    supervisors.append(sup)
    await sup.apply(
        [
            ShardAssignment(
                replica_id="r1",
                model="org/m",
                source="org/m",
                engine="fake",
                engine_args=["--load-seconds", "0.1"],
                gpus=["GPU-a"],
            )
        ],
        {},
    )
    deadline = time.monotonic() + 20
    while not any(r.state is ShardState.READY for r in sup.reports()):
        assert time.monotonic() < deadline, sup.reports()
        await asyncio.sleep(0.05)
    (rep,) = sup.reports()
    assert rep.port is not None
    assert listening(rep.port) == ["127.0.0.3"]
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", rep.port), timeout=2):
        pass
