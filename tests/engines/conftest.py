"""Fixtures for supervisor tests: short timings, loopback only, no leftovers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.engine_settings import SupervisorSettings
from llmgw.agent.engine_state import load_state
from llmgw.agent.engine_templates import merged_templates
from llmgw.agent.engines import EngineSupervisor
from llmgw.wire import ShardAssignment

SupervisorFactory = Callable[..., EngineSupervisor]


def assignment(**kw: Any) -> ShardAssignment:
    base: dict[str, Any] = {
        "replica_id": "r1",
        "model": "org/m",
        "source": "org/m",
        "engine": "fake",
        "engine_args": ["--load-seconds", "0.3"],
        "gpus": ["GPU-aaaa", "GPU-bbbb"],
    }
    base.update(kw)
    return ShardAssignment(**base)


async def wait_for(pred: Callable[[], bool], within_s: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + within_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or pred}")
        await asyncio.sleep(0.02)


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (an exited child we have not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "agent-state"


@pytest.fixture
async def make_supervisor(state_dir: Path) -> AsyncIterator[SupervisorFactory]:
    made: list[EngineSupervisor] = []
    pids: set[int] = set()

    def factory(**kw: Any) -> EngineSupervisor:
        """Settings by name, operator templates as the agent reads them (merged with
        the built-ins here), and the supervisor's card_memory and host_memory."""
        measures = {k: kw.pop(k) for k in ("card_memory", "host_memory") if k in kw}
        if "templates" in kw:
            kw["templates"] = merged_templates(kw["templates"])
        opts: dict[str, Any] = {
            "state_dir": state_dir,
            "node": "n1",
            "address": "127.0.0.1",
            "grace_s": 1.0,
            "poll_interval_s": 0.05,
            "scrape_interval_s": 0.1,
            "health_timeout_s": 0.5,
            "engine_host": "127.0.0.1",
        }
        opts.update(kw)
        sup = EngineSupervisor(SupervisorSettings(**opts), **measures)
        made.append(sup)
        return sup

    yield factory
    for sup in made:
        await sup.close()
        pids.update(p for p in (v["pid"] for v in sup.debug_state().values()) if p)
    pids.update(r.pid for r in load_state(state_dir / "engines.json"))
    for pid in pids:  # never leave an engine behind, whatever the test did
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
