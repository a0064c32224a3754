"""Issue 35 item 8: at 80x24 every summary pane can be reached (`p` turns the
short layout's pages, as k9s switches views), each snapshotted."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from console_fixtures import Faults, LiveController
from console_pilot import Clock, SnapCompare, loaded
from textual.pilot import Pilot

from llmgw.console.app import ConsoleApp
from llmgw.console.screens.main import MainScreen
from llmgw.console.state import Connection, FleetView, Link
from llmgw.console.widgets.header import FleetHeader
from llmgw.wire import AdminInfo, FleetSummary, NodeRow, NodeState

MakeApp = Callable[..., ConsoleApp]
PANES = ("gpus", "fabrics", "idle", "weights", "traffic", "unplaceable")


def shown(app: ConsoleApp) -> list[str]:
    return [p.id or "" for p in app.screen.query("#panes > .pane") if p.display and p.region]


@pytest.mark.reads_fleet
async def test_p_turns_every_pane_into_view_at_80x24(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        app = await loaded(pilot)
        seen: list[str] = []
        for _ in MainScreen.PANE_PAGES:
            page = shown(app)
            assert page and all(app.screen.query_one(f"#{p}").region.width >= 38 for p in page)
            seen += page
            await pilot.press("p")
            await pilot.pause()
        assert sorted(seen) == sorted(PANES)
        assert shown(app) == list(MainScreen.PANE_PAGES[0])  # round again


@pytest.mark.reads_fleet
async def test_a_tall_terminal_shows_every_pane_and_no_p(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        assert sorted(shown(app)) == sorted(PANES)
        assert app.screen.check_action("next_panes", ()) is False


@pytest.mark.reads_fleet
@pytest.mark.parametrize("page", range(len(MainScreen.PANE_PAGES)))
def test_panes_80x24(snap_compare: SnapCompare, make_app: MakeApp, page: int) -> None:
    async def run(pilot: Pilot[None]) -> None:
        await loaded(pilot)
        await pilot.press(*["p"] * page)
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run)


@pytest.mark.reads_fleet
def test_help_80x24_with_the_demos_banner(
    snap_compare: SnapCompare, controller: LiveController, faults: Faults, clock: Clock
) -> None:
    """Issue 35 item 9: the curl line unwrapped (scrolled sideways), `y` copies it;
    the header names the gateway."""
    from llmgw.demo import gateway_banner

    gateway = "http://127.0.0.1:8000"
    about = "llmgw demo: 12 simulated nodes in 2 fabrics (ib-a, ib-b)\n" + gateway_banner(gateway)
    app = ConsoleApp(
        controller.client(faults), refresh=3600.0, clock=clock, about=about, gateway=gateway
    )

    async def run(pilot: Pilot[None]) -> None:
        await loaded(pilot)
        app.clear_notifications()
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run)


def _fleet(awaiting: int) -> FleetView:
    summary = FleetSummary.model_validate(
        {
            "nodes": {"total": 12, "ready": 9, "cordoned": 2, "draining": 0, "unreachable": 1},
            "gpus": [],
            "fabrics": [],
            "replicas": {"ready": 5},
            "models": {"total": 5, "satisfied": 4, "short": 1},
            "unplaceable": [],
            "idle_replicas": [],
        }
    )
    rows = {
        f"gpu-n{i}": NodeRow(
            name=f"gpu-n{i}",
            state=NodeState.CORDONED,
            admin=AdminInfo(awaiting_approval=i < awaiting),
            report_age_s=1.0,
            classes={},
            gpus_total=0,
            gpus_used=0,
            gpus_unhealthy=0,
            gpus_unknown=0,
            fabrics=[],
            models=[],
            replicas=0,
        )
        for i in range(2)
    }
    return FleetView(summary=summary, nodes=rows, fetched_at=0.0)


def test_the_header_fits_80_columns_and_counts_nodes_awaiting_approval() -> None:
    """Issue 35 item 8 and the alerts' loose end: at 80 columns each header line
    is whole (zero counts and labels give way first), the gateway is named,
    and nodes awaiting approval are counted (they are among the cordoned)."""
    conn = Connection(link=Link.LIVE)
    url, gateway = "http://127.0.0.1:7460", "http://127.0.0.1:8000"
    text = FleetHeader.render_text(_fleet(1), conn, 0.0, url, False, gateway, width=80)
    lines = text.plain.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].endswith(f"gateway {gateway}")
    assert "1 awaiting approval" in lines[1]
    assert lines[2] == " models 5: 4 satisfied 1 short  │ replicas 5: 5 ready"
    wide = FleetHeader.render_text(_fleet(0), conn, 0.0, url, False, "", width=200).plain
    assert "awaiting" not in wide and "gateway" not in wide
    assert "0 starting 0 draining 0 failed" in wide  # the zeros, where there is room
