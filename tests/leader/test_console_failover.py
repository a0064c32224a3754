"""The console's header names the controller that leads, and a failover shows as
it happens ("leader changed to URL, epoch N"): the console app (Textual, headless)
against two real controller processes on one PostgreSQL, the leader SIGKILLed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from llmgw.client import AdminClient
from llmgw.console.app import ConsoleApp
from tests.leader.ha import LEASE_TTL_S, HaCluster
from tests.leader.test_failover_e2e import REPORT

pytestmark = pytest.mark.slow


async def until(pilot: Pilot[None], cond: Callable[[], object], what: str, within: float) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def test_the_console_shows_the_leader_and_a_failover(tmp_path: Path, pg_url: str) -> None:
    c = HaCluster(tmp_path / "ha", pg_url)
    try:
        c.start(0, role="leader")
        c.start(1, role="follower")
        c.clients[0].post("/v1/agent/report", json={**REPORT, "node": "n1"}).raise_for_status()
        epoch = c.health(0)["epoch"]  # type: ignore[index]
        # The follower's URL first: the console finds the leader by itself.
        app = ConsoleApp(AdminClient(f"{c.urls[1]},{c.urls[0]}"), readonly=True, refresh=0.2)
        said: list[str] = []
        app.notify = lambda message, **kw: said.append(str(message))  # type: ignore[method-assign]
        async with app.run_test(size=(160, 40)) as pilot:
            first = f"{c.urls[0]} (leader, epoch {epoch})"
            await until(pilot, lambda: app.controller_label == first, "the leader", 20)
            assert said == [], "the first leader is no change"
            await asyncio.to_thread(c.kill, 0)
            second = f"{c.urls[1]} (leader, epoch {epoch + 1})"
            await until(
                pilot, lambda: app.controller_label == second, "the new leader", LEASE_TTL_S + 20
            )
            assert said == [f"leader changed to {c.urls[1]}, epoch {epoch + 1}"]
            await until(
                pilot,
                lambda: second in str(app.screen.query_one("FleetHeader").render()),
                "the header to name the new leader",
                5,
            )
    finally:
        c.close()
