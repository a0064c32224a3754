"""At 80x24, what a pane is for stays on screen (issue 23 item 7): read from
the lines the widgets draw, with Pilot, against the real controller."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from console_fixtures import LiveController
from console_pilot import loaded, open_detail
from textual.geometry import Region
from textual.widget import Widget

from llmgw.console.app import ConsoleApp
from llmgw.console.format import short_class
from llmgw.console.screens.detail import GpusTable, HistoryTable, ReplicasTable
from llmgw.console.widgets.gpus import GpuClassBar
from llmgw.console.widgets.summary import FabricsTable, UnplaceableList

MakeApp = Callable[..., ConsoleApp]


def drawn(widget: Widget) -> list[str]:
    """The lines the widget draws now, as text, inside its border."""
    size = widget.outer_size
    lines = [strip.text for strip in widget.render_lines(Region(0, 0, size.width, size.height))]
    if widget.styles.border_top[0]:
        lines = [line[1:-1] for line in lines[1:-1]]
    return lines


def test_a_short_class_keeps_its_memory_size() -> None:
    assert short_class("A100-SXM-40GB", 20) == "A100-SXM-40GB"
    assert short_class("A100-SXM-40GB", 9) == "A100-40GB"
    assert short_class("A100-SXM-80GB", 8) == "A1…-80GB"
    assert short_class("L40S-48GB", 6) == "L…-48GB"  # never the memory, even if too wide
    assert short_class("weird-name", 6) == "weird…"  # no memory size to keep


@pytest.mark.reads_fleet
async def test_the_main_screen_at_80x24_keeps_what_each_pane_is_for(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        app = await loaded(pilot)
        await pilot.pause()
        # GPU classes keep their memory: A100-SXM-40GB and -80GB are different cards.
        heads = [drawn(bar)[0] for bar in app.screen.query(GpuClassBar)]
        assert len(heads) == 3
        for head, memory in zip(heads, ("-40GB", "-80GB", "-48GB"), strict=True):
            assert memory in head, heads
        # The unplaceable model's name is never broken across lines.
        unplaceable = drawn(app.screen.query_one(UnplaceableList))
        assert unplaceable[0].strip() == "✗ Llama-3.1-70B"
        assert "Llama-3.1-70B" not in " ".join(unplaceable[1:])
        # Fabrics keep BLOCK, on the next page of panes (`p`), whole.
        await pilot.press("p")
        await pilot.pause()
        fabrics = drawn(app.screen.query_one(FabricsTable))
        assert "BLOCK" in fabrics[0]
        assert fabrics[1].split()[:2] == ["ib-a", "0"] and fabrics[2].split()[:2] == ["ib-b", "1"]
        assert "MODELS" in fabrics[0]  # the last column: nothing cut


@pytest.mark.reads_fleet
async def test_the_node_detail_at_80x24_keeps_health_and_reason(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        app = await loaded(pilot)
        await open_detail(pilot, "gpu-b02")
        gpus = drawn(app.screen.query_one(GpusTable))
        assert "HEALTH" in gpus[0] and "REASON" in gpus[0]
        lost = next(line for line in gpus if line.split()[:1] == ["7"])
        assert "unknown" in lost and "NVML: GPU is lost" in lost


@pytest.mark.reads_fleet
async def test_the_node_detail_replicas_fit_80_columns(make_app: MakeApp) -> None:
    """REPLICA, MODEL, STATE and ERROR stay; PORT and RANK give way first, so the
    table needs no sideways scroll."""
    async with make_app().run_test(size=(80, 24)) as pilot:
        app = await loaded(pilot)
        await open_detail(pilot, "gpu-b02")
        table = app.screen.query_one(ReplicasTable)
        heading = drawn(table)[0].split()
        assert heading[:3] == ["REPLICA", "MODEL", "STATE"] and heading[-1] == "ERROR", heading
        assert "PORT" not in heading and "RANK" not in heading
        assert table.virtual_size.width <= table.size.width


async def test_the_node_detail_history_fits_80_columns(
    controller: LiveController, make_app: MakeApp
) -> None:
    """Issue 35: the cordon/drain history at 80 columns, as the replicas table: WHEN,
    ACTION, BY and REASON stay; a long reason is cut at the pane's edge (the whole of
    it is in `ctl node`), so the table needs no sideways scroll."""
    why = "RMA: " + "fan tray 2 failing, PSU 1 replaced, BMC firmware to update, " * 3
    controller.admin("bob", lambda a: a.cordon("gpu-a01", why.strip()))
    async with make_app().run_test(size=(80, 24)) as pilot:
        app = await loaded(pilot)
        await open_detail(pilot, "gpu-a01")
        table = app.screen.query_one(HistoryTable)
        lines = drawn(table)
        assert lines[0].split() == ["WHEN", "ACTION", "BY", "REASON"], lines[0]
        assert any("RMA: fan tray" in line and "bob" in line for line in lines), lines
        assert table.virtual_size.width <= table.size.width
