"""The console asks only for what changed (`GET /v1/nodes?since=`) and keeps
the table true: changed rows patched, ages moving, a restart resyncing.
Against the real controller (console_fixtures)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from console_fixtures import NOW, Faults, LiveController, node_report
from console_pilot import loaded, repoll

from llmgw.console.app import ConsoleApp
from llmgw.console.state import FleetView
from llmgw.console.widgets.nodes import NodesTable
from llmgw.wire import AdminInfo, FleetSummary, NodeRow, NodesDelta

MakeApp = Callable[..., ConsoleApp]


def node_queries(faults: Faults) -> list[str]:
    return [r.query for r in faults.requests if r.method == "GET" and r.path == "/v1/nodes"]


def table_of(app: ConsoleApp) -> NodesTable:
    return app.screen.query_one(NodesTable)


def make_row(name: str, used: int = 0, age: float | None = 2.0) -> NodeRow:
    return NodeRow(
        name=name,
        state="ready",
        admin=AdminInfo(),
        report_age_s=age,
        classes={"H100-SXM-80GB": 8},
        gpus_total=8,
        gpus_used=used,
        gpus_unhealthy=0,
        gpus_unknown=0,
        fabrics=[],
        models=[],
        replicas=0,
    )


async def test_after_the_first_fetch_only_changes_are_asked_for(
    make_app: MakeApp, controller: LiveController, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        first = app._nodes_cursor
        controller.report(node_report("gpu-b03", used=3))
        await repoll(pilot)
        second = app._nodes_cursor
        await repoll(pilot)
        queries = node_queries(faults)
        assert queries[0] == "since="  # everything, once
        assert queries[1:3] == [f"since={first}", f"since={second}"]
        assert app.fleet is not None and app.fleet.changed == frozenset()  # nothing new
        assert table_of(app).shown["gpu-b03"][5].plain == "3/8"


async def test_a_delta_patches_changed_rows_and_moves_ages(
    make_app: MakeApp, controller: LiveController, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        table = table_of(app)
        applied: list[frozenset[str] | None] = []
        real_apply = table.apply

        def spy(rows, ages=None, changed=None):  # type: ignore[no-untyped-def]
            applied.append(changed)
            return real_apply(rows, ages, changed)

        monkeypatch.setattr(table, "apply", spy)
        # 15 s on, every node but gpu-b03 reports again, gpu-b03 with a change.
        controller.clock.advance(15)
        controller.report(node_report("gpu-b03", used=1))
        await repoll(pilot)
        # Only gpu-b03's row came back; the others' ages come in report_ages
        # and the AGE cells still follow them.
        assert applied and applied[-1] == frozenset({"gpu-b03"})
        assert table.shown["gpu-b03"][5].plain == "1/8"
        assert table.shown["gpu-b01"][-1].plain == "10s"
        assert app.fleet is not None and app.fleet.ages["gpu-b01"] == 17.0


async def test_a_controller_restart_means_a_full_resync(
    make_app: MakeApp, controller: LiveController, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        cursor = app._nodes_cursor
        controller.restart()
        await repoll(pilot)
        assert node_queries(faults)[-1] == f"since={cursor}"
        assert app.fleet is not None and app.fleet.changed is None  # a full answer
        assert len(table_of(app).shown) == 12


async def test_a_failed_fetch_keeps_the_cursor_of_the_data_on_screen(
    make_app: MakeApp, controller: LiveController, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        cursor = app._nodes_cursor
        faults.down = True
        await repoll(pilot)
        faults.down = False
        controller.report(node_report("gpu-b03", used=5))
        await repoll(pilot)
        assert node_queries(faults)[-1] == f"since={cursor}"  # not a cursor it never got
        assert table_of(app).shown["gpu-b03"][5].plain == "5/8"


def test_merge_replaces_on_full_and_patches_otherwise(summary: FleetSummary) -> None:
    rows = [make_row(n) for n in ("n1", "n2", "n3")]
    first = NodesDelta(cursor="a.1", full=True, nodes=rows, report_ages={})
    fleet = FleetView.merge(None, summary, first, NOW)
    assert fleet.changed is None and set(fleet.nodes) == {"n1", "n2", "n3"}

    delta = NodesDelta(
        cursor="a.2", full=False, nodes=[make_row("n1", used=4)], removed=["n3"], report_ages={}
    )
    fleet = FleetView.merge(fleet, summary, delta, NOW + 1)
    assert fleet.changed == {"n1", "n3"}
    assert set(fleet.nodes) == {"n1", "n2"}
    assert fleet.nodes["n1"].gpus_used == 4

    full = NodesDelta(cursor="b.1", full=True, nodes=[make_row("n2")], report_ages={})
    assert set(FleetView.merge(fleet, summary, full, NOW + 2).nodes) == {"n2"}


@pytest.fixture
def summary() -> FleetSummary:
    return FleetSummary.model_validate(
        {
            "nodes": {"total": 0, "ready": 0, "cordoned": 0, "draining": 0, "unreachable": 0},
            "gpus": [],
            "fabrics": [],
            "replicas": {"ready": 0, "starting": 0, "draining": 0, "failed": 0},
            "models": {"total": 0, "satisfied": 0, "short": 0},
            "unplaceable": [],
            "idle_replicas": [],
        }
    )


def test_age_sort_uses_current_ages_not_the_rows_own() -> None:
    table = NodesTable()
    row = make_row("n1")
    table.rows_by_name = {"n1": row}
    table.ages = {"n1": 300.0}
    assert table.age_of(row) == 300.0
    table.ages = {}
    assert table.age_of(row) == row.report_age_s
