"""Pilot tests: an admin action hits exactly the nodes the operator sees, and
the drain dialog's gates (issue 23 items 2, 3, 4, 8), against the real controller."""

from __future__ import annotations

from collections.abc import Callable

from console_fixtures import Faults, Recorded
from console_pilot import loaded, until

from console.app import ConsoleApp
from console.screens.modals import CordonModal, DrainModal, UncordonModal
from console.widgets.nodes import NodesTable

MakeApp = Callable[..., ConsoleApp]


def nodes(app: ConsoleApp) -> NodesTable:
    return app.screen.query_one(NodesTable)


async def test_marks_clear_once_their_action_is_confirmed(
    make_app: MakeApp, faults: Faults
) -> None:
    """Filter `cordoned`, mark, `u`, confirm; later `/ gpu-b01 Enter d` drains
    gpu-b01 alone, not the nodes marked for the uncordon (issue 23 item 2)."""
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        table = nodes(app)
        await pilot.press("slash", *"cordoned", "enter", "space", "space")
        assert table.marks == {"gpu-a03", "gpu-a06"}
        await pilot.press("u", "escape")  # cancelled: the marks stay
        assert table.marks == {"gpu-a03", "gpu-a06"}
        await pilot.press("u")
        modal = app.screen
        assert isinstance(modal, UncordonModal) and modal.names == ["gpu-a03", "gpu-a06"]
        await pilot.press("tab", "enter")
        await until(pilot, lambda: len(faults.mutations) == 2, "two uncordons")
        assert table.marks == set()
        await pilot.press("escape", "slash", *"gpu-b01", "enter", "d")
        modal = app.screen
        assert isinstance(modal, DrainModal)
        assert modal.names == ["gpu-b01"] and modal.hidden == []
        assert not modal.query("#hidden")


async def test_an_action_on_marks_the_filter_hides_says_so(
    make_app: MakeApp, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("space", "space", "slash", *"ib-b", "enter")  # gpu-a01, gpu-a02
        subtitle = str(app.screen.query_one("#nodes-pane").border_subtitle)
        assert "2 marked (2 hidden)" in subtitle
        await pilot.press("c")
        modal = app.screen
        assert isinstance(modal, CordonModal)
        assert modal.names == modal.hidden == ["gpu-a01", "gpu-a02"]
        warning = str(modal.query_one("#hidden").render())
        assert "Not in view: gpu-a01, gpu-a02" in warning and "hidden by the filter" in warning
        await pilot.press(*"rack 7", "enter")
        await until(pilot, lambda: len(faults.mutations) == 2, "two cordons")
        assert [m.path for m in faults.mutations] == [
            "/v1/nodes/gpu-a01/cordon",
            "/v1/nodes/gpu-a02/cordon",
        ]
        assert faults.mutations[0] == Recorded(
            "POST", "/v1/nodes/gpu-a01/cordon", {"reason": "rack 7"}
        )
