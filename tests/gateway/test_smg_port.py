"""A port taken between the gateway's pick and SMG's bind (CI saw one held for good, so
every restart on it failed): the next start takes fresh ports, and the front follows."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest

from llmgw.gateway.smg import Smg, SmgOptions

pytestmark = pytest.mark.timeout(60)


async def test_smg_moves_off_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        smg = Smg(
            SmgOptions(host="127.0.0.1", port=port, policy="round_robin", keys=[], workdir=tmp_path)
        )
        running = asyncio.create_task(smg.run())
        try:
            await asyncio.wait_for(smg.started.wait(), 45)
            assert smg.port != port
            assert smg.base == f"http://127.0.0.1:{smg.port}"
            assert await smg.workers() == {}  # this SMG answers, on its new port
            assert smg.runs == 2
            assert "Address already in use" in (tmp_path / "smg.log").read_text()
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
