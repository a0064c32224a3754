"""The console asks only for what changed (`GET /v1/nodes?since=`) and keeps
the table true: changed rows patched, ages moving, a restart resyncing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from console_fixtures import NOW, FakeController
from console_fixtures import _row as make_row
from console_pilot import loaded, repoll

from console.app import ConsoleApp
from console.state import Fleet
from console.widgets.nodes import NodesTable
from llmgw.wire import NodesDelta

MakeApp = Callable[..., ConsoleApp]


def node_queries(fake: FakeController) -> list[str]:
    return [r.query for r in fake.requests if r.method == "GET" and r.path == "/v1/nodes"]


def table_of(app: ConsoleApp) -> NodesTable:
    return app.screen.query_one(NodesTable)


async def test_after_the_first_fetch_only_changes_are_asked_for(
    make_app: MakeApp, fake: FakeController
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        fake.put(fake.rows["gpu-a06"].model_copy(update={"gpus_used": 3}))
        await repoll(pilot)
        await repoll(pilot)
        queries = node_queries(fake)
        assert queries[0] == "since="  # everything, once
        assert queries[1] == "since=run1.1" and queries[2] == "since=run1.2"
        assert app.fleet is not None and app.fleet.changed == frozenset()  # nothing new
        assert table_of(app).shown["gpu-a06"][5].plain == "3/8"


async def test_a_delta_patches_changed_rows_removes_gone_ones_and_moves_ages(
    make_app: MakeApp, fake: FakeController, monkeypatch: pytest.MonkeyPatch
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
        fake.put(fake.rows["gpu-a02"].model_copy(update={"gpus_used": 1}))
        fake.remove("l40-02")
        fake.put(make_row("gpu-a00", "H100-SXM-80GB", 8, 0, ["ib-a"], []))
        # Only its age moved: the controller does not resend the row, the age
        # comes in report_ages and the AGE cell still follows it.
        fake.put(fake.rows["gpu-b01"].model_copy(update={"report_age_s": 75.0}))
        await repoll(pilot)
        assert applied == [frozenset({"gpu-a02", "l40-02", "gpu-a00"})]
        assert "l40-02" not in table.shown and "gpu-a00" in table.shown
        assert table.shown["gpu-a02"][5].plain == "1/8"
        assert table.shown["gpu-b01"][-1].plain == "1m00s"
        # The merged rows equal a plain full listing (ages aside).
        assert app.fleet is not None
        assert sorted(app.fleet.nodes) == sorted(fake.rows)
        assert app.fleet.ages["gpu-b01"] == 75.0


async def test_a_controller_restart_means_a_full_resync(
    make_app: MakeApp, fake: FakeController
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        fake.restart()
        fake.remove("gpu-b03")  # forgotten across the restart: no tombstone for it
        await repoll(pilot)
        assert node_queries(fake)[-1] == "since=run1.1"
        assert app.fleet is not None and app.fleet.changed is None  # a full answer
        assert "gpu-b03" not in table_of(app).shown
        assert set(table_of(app).shown) == set(fake.rows)


async def test_a_failed_fetch_keeps_the_cursor_of_the_data_on_screen(
    make_app: MakeApp, fake: FakeController
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        fake.down = True
        await repoll(pilot)
        fake.down = False
        fake.put(fake.rows["gpu-a06"].model_copy(update={"gpus_used": 5}))
        await repoll(pilot)
        assert node_queries(fake)[-1] == "since=run1.1"  # not a cursor it never got
        assert table_of(app).shown["gpu-a06"][5].plain == "5/8"


def test_merge_replaces_on_full_and_patches_otherwise() -> None:
    fake = FakeController.small()
    first = fake.nodes_delta("")
    summary = fake.summary()
    fleet = Fleet.merge(None, summary, first, NOW)
    assert fleet.changed is None and set(fleet.nodes) == set(fake.rows)

    fake.remove("l40-01")
    fake.put(fake.rows["gpu-a01"].model_copy(update={"replicas": 0}))
    delta = fake.nodes_delta(first.cursor)
    assert [r.name for r in delta.nodes] == ["gpu-a01"] and delta.removed == ["l40-01"]
    fleet = Fleet.merge(fleet, summary, delta, NOW + 1)
    assert fleet.changed == {"gpu-a01", "l40-01"}
    assert set(fleet.nodes) == set(fake.rows)
    assert fleet.nodes["gpu-a01"].replicas == 0

    full = NodesDelta(cursor="x.1", full=True, nodes=[fake.rows["gpu-a02"]], report_ages={})
    assert set(Fleet.merge(fleet, summary, full, NOW + 2).nodes) == {"gpu-a02"}


def test_age_sort_uses_current_ages_not_the_rows_own() -> None:
    table = NodesTable()
    row = make_row("n1", "H100-SXM-80GB", 8, 0, [], [])
    table.rows_by_name = {"n1": row}
    table.ages = {"n1": 300.0}
    assert table.age_of(row) == 300.0
    table.ages = {}
    assert table.age_of(row) == row.report_age_s
