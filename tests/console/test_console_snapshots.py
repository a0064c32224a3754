"""SVG snapshots of the console from deterministic fixture data.

Clocks are frozen (data age 0s, ages from fixed report ages), polling is
left to the test (refresh of an hour), so every run draws the same frame.
Update with `pytest tests/console --snapshot-update`, then look at them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from console_fixtures import Faults
from console_pilot import Clock, SnapCompare, loaded, repoll, steady_cursors, until
from textual.pilot import Pilot

from llmgw.console.app import ConsoleApp
from llmgw.console.screens.modals import DrainModal, HelpScreen

MakeApp = Callable[..., ConsoleApp]


async def _loaded(pilot: Pilot[None]) -> None:
    await loaded(pilot)


@pytest.mark.reads_fleet
def test_main_120x40(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=_loaded)


@pytest.mark.reads_fleet
def test_main_200x50(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    assert snap_compare(make_app(), terminal_size=(200, 50), run_before=_loaded)


@pytest.mark.reads_fleet
def test_main_80x24_short_layout(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    """Under 34 rows the weights and idle panes give way to the nodes table;
    at 80 columns NAME, STATE, GPUS, UNH and AGE stay in view (the reason
    takes what is left, the other columns wait for a wider terminal)."""
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=_loaded)


@pytest.mark.reads_fleet
def test_main_250x60_uses_the_width(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    """Every column, and the spare width goes to reasons and models."""
    assert snap_compare(make_app(), terminal_size=(250, 60), run_before=_loaded)


@pytest.mark.reads_fleet
def test_main_readonly_marked_and_filtered(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    async def run(pilot: Pilot[None]) -> None:
        await loaded(pilot)
        await pilot.press("slash", *"ib-a", "enter", "down", "space", "space")

    assert snap_compare(make_app(readonly=True), terminal_size=(120, 40), run_before=run)


@pytest.mark.reads_fleet
def test_node_detail(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    async def run(pilot: Pilot[None]) -> None:
        app = await loaded(pilot)
        await pilot.press("down", "down", "down", "down", "down", "enter")  # gpu-a06
        await until(pilot, lambda: app.node_view is not None and app.node_view.detail is not None)
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=run)


@pytest.mark.reads_fleet
def test_drain_modal(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    async def run(pilot: Pilot[None]) -> None:
        app = await loaded(pilot)
        await pilot.press("down", "d")
        await until(pilot, lambda: isinstance(app.screen, DrainModal) and app.screen.plan)
        steady_cursors(app.screen)
        await pilot.press(*"kernel 6.8 upgrade")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=run)


@pytest.mark.reads_fleet
def test_help_120x40(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    async def run(pilot: Pilot[None]) -> None:
        app = await loaded(pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=run)


@pytest.mark.reads_fleet
def test_disconnected_banner(
    snap_compare: SnapCompare, make_app: MakeApp, faults: Faults, clock: Clock
) -> None:
    async def run(pilot: Pilot[None]) -> None:
        await loaded(pilot)
        faults.down = True
        clock.advance(35)
        await repoll(pilot)
        await repoll(pilot)

    # A realistic refresh so the banner's retry delay reads like production;
    # the next attempt (10s away) comes long after the screenshot.
    assert snap_compare(make_app(refresh=5.0), terminal_size=(120, 40), run_before=run)


@pytest.mark.reads_fleet
def test_drain_modal_80x24(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    """The fields scroll, the buttons stay in view; the deadline is echoed."""

    async def run(pilot: Pilot[None]) -> None:
        app = await loaded(pilot)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DrainModal) and app.screen.plan)
        steady_cursors(app.screen)
        await pilot.press(*"kernel 6.8 upgrade")
        app.screen.query_one("#timeout").focus()
        await pilot.press(*"20m")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run)


@pytest.mark.reads_fleet
def test_node_detail_80x24(snap_compare: SnapCompare, make_app: MakeApp) -> None:
    """HEALTH and REASON stay; IN USE, UTIL, MEMORY and UUID give way first."""

    async def run(pilot: Pilot[None]) -> None:
        app = await loaded(pilot)
        await pilot.press("slash", *"gpu-b02", "enter", "enter")
        await until(pilot, lambda: app.node_view is not None and app.node_view.detail is not None)
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run)
