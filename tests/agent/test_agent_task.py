"""The agent as a task inside someone else's loop: it ends when cancelled, whatever
it is awaiting at that moment, and takes over no signals (issue 23 item 1)."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import pytest

from llmgw.agent.cli import make_builder, parser, run_agent
from llmgw.agent.fake_gpus import FakeGpus, parse_fake_spec
from llmgw.agent.loop import ReportLoop
from llmgw.agent.report import ReportBuilder
from llmgw.agent.storage import StorageScanner

NOBODY = "http://127.0.0.1:9"  # the discard port: refused at once


def quick_builder() -> ReportBuilder:
    return ReportBuilder(
        node="n1",
        gpus=FakeGpus("n1", [parse_fake_spec("1xH100-80GB")]),
        storage=StorageScanner([]),
        interval_s=0.001,
    )


@pytest.mark.timeout(60)
async def test_a_cancel_ends_the_loop_at_every_step(caplog: pytest.LogCaptureFixture) -> None:
    """Cancel after 0, 1, 2, ... turns of the event loop, so the cancel lands at
    every await of a cycle: while the report is built in its thread, as the build
    finishes, while posting, while sleeping. On Python 3.11 `asyncio.wait_for`
    loses a cancel that arrives as its future finishes (a handful of these
    steps hung on the old loop; test_agent_metrics once hung 19 minutes)."""
    caplog.set_level(logging.ERROR)
    hung = []
    for steps in range(400):
        loop = ReportLoop(quick_builder(), NOBODY)
        task = asyncio.create_task(loop.run(asyncio.Event()))
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=1.0)
        if not done:
            hung.append(steps)
            loop.builder.interval_s = 3600.0
            task.cancel()
            await asyncio.wait([task], timeout=1.0)
    assert not hung, f"still running after a cancel at steps {hung}"


async def test_run_agent_takes_over_no_signals(tmp_path: Path) -> None:
    """Only the CLI entry point installs SIGINT/SIGTERM handlers: an agent run
    inside a test that installed its own would keep Ctrl-C from stopping pytest."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    args = parser().parse_args(
        ["--controller", NOBODY, "--node", "n1", "--fake-gpus", "1xH100-80GB",
         "--interval", "0.05", "--state-dir", str(tmp_path)]
    )  # fmt: skip
    task = asyncio.create_task(run_agent(args, make_builder(args)))
    await asyncio.sleep(0.3)
    during = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(10):
            await task
    assert during == before
