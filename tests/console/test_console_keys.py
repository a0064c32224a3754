"""Pilot tests for every key path, against the real controller (console_fixtures)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from console_fixtures import H100, Faults, LiveController, Recorded, node_report
from console_pilot import Clock, loaded, open_detail, repoll, spy_renders, until
from fleet_factories import gpu, report
from rich.text import Text
from textual import events
from textual.command import CommandList, CommandPalette
from textual.widgets import Button, Checkbox, DataTable, Input

from llmgw.console.app import ConsoleApp
from llmgw.console.screens.detail import NodeDetailScreen
from llmgw.console.screens.main import MainScreen
from llmgw.console.screens.modals import (
    REASON_REQUIRED,
    CordonModal,
    DrainModal,
    ForceConfirmModal,
    HelpScreen,
    UncordonModal,
    sort_letters,
)
from llmgw.console.state import backoff
from llmgw.console.widgets.keyed_table import KeyedTable
from llmgw.console.widgets.nodes import COLUMNS, SORTS, NodesTable, column_widths

MakeApp = Callable[..., ConsoleApp]


def nodes(app: ConsoleApp) -> NodesTable:
    return app.screen.query_one(NodesTable)


@pytest.mark.reads_fleet
async def test_first_paint_shows_the_fleet(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        table = nodes(app)
        assert table.row_count == 12
        assert table.cursor_key == "gpu-a01"
        assert app.connection.link == "live"


async def test_cordon_with_a_reason_reaches_the_controller(
    make_app: MakeApp, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("c")
        assert isinstance(app.screen, CordonModal)
        # Destructive confirmations open with Cancel focused …
        assert app.screen.focused is app.screen.query_one("#cancel", Button)
        # … and typing goes to the reason box.
        await pilot.press(*"quarantine fan", "enter")  # "q" does not quit here
        await until(pilot, lambda: faults.mutations, "the cordon request")
        assert faults.mutations == [
            Recorded("POST", "/v1/nodes/gpu-a01/cordon", {"reason": "quarantine fan"})
        ]
        # The change shows without waiting for the next scheduled refresh.
        await until(pilot, lambda: nodes(app).rows_by_name["gpu-a01"].state == "cordoned")
        assert nodes(app).shown["gpu-a01"][2].plain == "cordoned"


@pytest.mark.reads_fleet
async def test_cancel_changes_nothing(make_app: MakeApp, faults: Faults) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("c", *"oops", "escape")
        # Closed once the key is handled (on a busy machine, after more than one pause).
        await until(pilot, lambda: not isinstance(app.screen, CordonModal), "escape closed it")
        await pilot.press("c", "enter")  # Enter on the focused Cancel button
        await until(pilot, lambda: not isinstance(app.screen, CordonModal), "cancel closed it")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DrainModal))
        await pilot.click("#cancel")
        # The dialog closes once the click is handled: one pause was not always enough
        # on a busy machine (the screen was still the dialog).
        await until(pilot, lambda: not isinstance(app.screen, DrainModal), "the dialog closed")
        assert not isinstance(app.screen, DrainModal)
        assert faults.mutations == []


@pytest.mark.reads_fleet
async def test_an_empty_reason_is_refused_in_the_ui(make_app: MakeApp, faults: Faults) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("c", "tab")  # Cancel -> Cordon
        assert app.screen.focused is app.screen.query_one("#confirm", Button)
        await pilot.press("enter")
        assert isinstance(app.screen, CordonModal)
        error = app.screen.query_one("#error")
        assert error.display and REASON_REQUIRED in str(error.render())
        await pilot.press(*"   ", "enter")  # whitespace is not a reason either
        assert isinstance(app.screen, CordonModal)
        assert faults.mutations == []


async def test_a_drain_from_the_modal_starts_the_drain(make_app: MakeApp, faults: Faults) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("down", "d")  # gpu-a02
        modal = app.screen
        assert isinstance(modal, DrainModal)
        assert modal.focused is modal.query_one("#cancel", Button)
        # The pre-check asked the controller what the drain would do.
        await until(pilot, lambda: modal.plan is not None, "the drain plan")
        assert Recorded("POST", "/v1/drain-plan", {"nodes": ["gpu-a02"]}) in faults.requests
        plan = modal.query_one("#plan", DataTable)
        # gpu-a02 holds a shard of the only DeepSeek replica, which cannot move.
        assert plan.row_count == 1
        assert "below minimum" in plan.get_row("deepseek-ai/DeepSeek-V3")[4].plain
        await pilot.press(*"kernel upgrade", "enter")
        await until(pilot, lambda: faults.mutations, "the drain request")
        assert faults.mutations == [
            Recorded(
                "POST", "/v1/nodes/gpu-a02/drain", {"reason": "kernel upgrade", "force": False}
            )
        ]
        await until(pilot, lambda: nodes(app).rows_by_name["gpu-a02"].state == "draining")


def asked(app: ConsoleApp) -> bool:
    """The forced drain's second ask is up, its buttons mounted (not just pushed)."""
    screen = app.screen
    return isinstance(screen, ForceConfirmModal) and bool(screen.query("#confirm"))


async def test_drain_force_and_force_after_options(make_app: MakeApp, faults: Faults) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("d")  # gpu-a01: holds a shard of the only DeepSeek replica
        modal = app.screen
        assert isinstance(modal, DrainModal)
        await until(pilot, lambda: modal.plan is not None, "the drain plan")
        modal.query_one("#force", Checkbox).value = True
        modal.query_one("#timeout", Input).value = "0"
        modal.query_one("#reason", Input).value = "psu"
        modal.query_one("#confirm", Button).press()
        await pilot.pause()
        # A zero deadline is refused with a message; nothing is sent.
        assert app.screen is modal
        assert faults.mutations == []
        modal.query_one("#timeout", Input).value = "15m"
        modal.query_one("#confirm", Button).press()
        # Forcing drops DeepSeek below its minimum: a second, explicit yes naming it.
        await until(pilot, lambda: asked(app), "the second ask")
        second = app.screen
        await until(pilot, lambda: second.focused is second.query_one("#cancel", Button), "Cancel")
        assert "deepseek-ai/DeepSeek-V3" in str(second.query_one("#below").render())
        await pilot.press("enter")  # Cancel: back to the form, nothing sent
        await pilot.pause()
        assert app.screen is modal and faults.mutations == []
        modal.query_one("#confirm", Button).press()
        await until(pilot, lambda: asked(app), "asked again")
        app.screen.query_one("#confirm", Button).press()
        await until(pilot, lambda: faults.mutations, "the drain request")
        assert faults.mutations[0].body == {"reason": "psu", "force": True, "force_after_s": 900.0}


async def test_uncordon_is_offered_only_for_cordoned_nodes(
    make_app: MakeApp, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        screen = app.screen
        # gpu-a01 is ready: cordon and drain apply, uncordon does not.
        assert screen.check_action("cordon", ()) is True
        assert screen.check_action("uncordon", ()) is False
        footer_keys = {k for k, b in screen.active_bindings.items() if b.enabled}
        assert {"c", "d"} <= footer_keys and "u" not in footer_keys
        await pilot.press("u")
        assert faults.mutations == []
        await pilot.press("down", "down")  # gpu-a03, cordoned
        assert nodes(app).cursor_key == "gpu-a03"
        assert screen.check_action("uncordon", ()) is True
        assert screen.check_action("cordon", ()) is False
        await pilot.press("u")
        # Uncordon confirms like the others: Cancel focused, the reason it clears shown.
        modal = app.screen
        assert isinstance(modal, UncordonModal)
        assert modal.focused is modal.query_one("#cancel", Button)
        assert "RMA: fan tray 2 failing" in str(modal.query_one("#clears").render())
        await pilot.press("enter")  # Enter on Cancel: nothing happens
        assert not isinstance(app.screen, UncordonModal) and faults.mutations == []
        await pilot.press("u", "tab", "enter")  # Cancel -> Uncordon
        await until(pilot, lambda: faults.mutations, "the uncordon request")
        assert faults.mutations == [Recorded("POST", "/v1/nodes/gpu-a03/uncordon", {})]


async def test_space_marks_several_nodes_for_one_action(make_app: MakeApp, faults: Faults) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("space", "space")  # marks gpu-a01, gpu-a02; cursor moves on
        assert nodes(app).marks == {"gpu-a01", "gpu-a02"}
        assert nodes(app).cursor_key == "gpu-a03"
        await pilot.press("c")
        modal = app.screen
        assert isinstance(modal, CordonModal)
        assert modal.names == ["gpu-a01", "gpu-a02"]
        await pilot.press(*"rack 7 maintenance", "enter")
        await until(pilot, lambda: len(faults.mutations) == 2, "two cordons")
        assert [m.path for m in faults.mutations] == [
            "/v1/nodes/gpu-a01/cordon",
            "/v1/nodes/gpu-a02/cordon",
        ]
        await pilot.press("escape")  # clears the marks
        assert nodes(app).marks == set()


@pytest.mark.reads_fleet
async def test_readonly_has_no_dangerous_keys(make_app: MakeApp, faults: Faults) -> None:
    async with make_app(readonly=True).run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        screen = app.screen
        keys = set(screen.active_bindings)
        assert not {"c", "u", "d"} & keys
        assert not any(hasattr(screen, f"action_{a}") for a in ("cordon", "uncordon", "drain"))
        await pilot.press("c", "u", "d", "space", "c")
        assert not isinstance(app.screen, CordonModal | DrainModal)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert not [t for t in titles if t.split()[0] in ("Cordon", "Uncordon", "Drain")]
        assert "Filter nodes" in titles
        await pilot.press("enter")  # detail screen: read-only too
        await until(pilot, lambda: isinstance(app.screen, NodeDetailScreen))
        await pilot.press("c", "d")
        assert faults.mutations == []


@pytest.mark.reads_fleet
async def test_palette_offers_the_same_actions(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Cordon gpu-a01" in titles and "Drain gpu-a01" in titles
        assert "Uncordon gpu-a01" not in titles  # not cordoned: does not apply
        # Through the real palette: ctrl+p, type, enter.
        await pilot.press("ctrl+p", *"Cordon gpu")
        await until(
            pilot,
            lambda: (
                isinstance(app.screen, CommandPalette)
                and app.screen.query_one(CommandList).option_count > 0
            ),
            "palette hits",
        )
        await pilot.press("down", "enter")
        await until(pilot, lambda: isinstance(app.screen, CordonModal), "cordon from the palette")


@pytest.mark.reads_fleet
async def test_lost_controller_shows_banner_and_recovery_clears_it(
    make_app: MakeApp, faults: Faults, clock: Clock
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        banner = app.screen.query_one("#banner")
        assert not banner.has_class("-visible")
        faults.down = True
        clock.advance(5)
        await repoll(pilot)
        assert app.connection.link == "unreachable"
        assert banner.has_class("-visible")
        assert "Connection refused" in str(banner.render())
        assert app.screen.has_class("-stale")
        # Last data stays on screen, marked stale.
        assert nodes(app).row_count == 12
        header = str(app.screen.query_one("#header").render())
        assert "STALE" in header and "5s old" in header
        await repoll(pilot)  # still down: counted, retried later (see test_backoff)
        assert app.connection.failures == 2
        assert app.connection.retry_at is not None and app.connection.retry_at > clock.now
        faults.down = False
        await repoll(pilot)
        assert app.connection.link == "live"
        assert not banner.has_class("-visible")
        assert not app.screen.has_class("-stale")


@pytest.mark.reads_fleet
async def test_controller_errors_never_crash_the_console(make_app: MakeApp, faults: Faults) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        faults.status_error = 503
        await repoll(pilot)
        assert app.connection.link == "error"
        assert "503 controller is restarting" in app.connection.message
        # A bug below the client (not a transport error) is caught too.
        faults.status_error = None
        faults.crash = True
        await repoll(pilot)
        assert app.is_running and app.connection.link == "error"
        # What happened and what comes next, never the exception's class name.
        assert "RuntimeError" not in app.connection.message
        assert app.connection.message.startswith("reading the fleet failed: boom"), (
            app.connection.message
        )
        faults.crash = False
        await repoll(pilot)
        assert app.connection.link == "live"


@pytest.mark.reads_fleet
async def test_failed_admin_request_is_reported_not_fatal(
    make_app: MakeApp, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        faults.down = True
        await pilot.press("c", *"x", "enter")
        await until(pilot, lambda: faults.mutations, "the attempt")
        await pilot.pause()
        assert app.is_running


@pytest.mark.reads_fleet
async def test_filter_like_k9s(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("slash", *"cordoned")
        table = nodes(app)
        # gpu-a03 is cordoned, gpu-a06 by llmgw for its failed cards; gpu-b04 is
        # unreachable but keeps its cordon flag.
        assert set(table.shown) == {"gpu-a03", "gpu-a06", "gpu-b04"}
        await pilot.press("enter")
        assert app.screen.focused is table
        await pilot.press("slash", "ctrl+u", *"ib-b 4/8")  # words must all match
        await pilot.press("backspace", "backspace", "backspace", "backspace")
        assert set(table.shown) == {"gpu-b01", "gpu-b02", "gpu-b03", "gpu-b04"}
        await pilot.press("escape")
        assert table.row_count == 12 and table.filter_text == ""


async def test_sort_cycles_and_cursor_stays_on_its_node(
    make_app: MakeApp, controller: LiveController
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        table = nodes(app)
        await pilot.press("down", "down", "down")  # gpu-a04
        await pilot.press("s")  # by state: trouble first
        assert table.get_row_at(0)[1].plain == "gpu-b04"
        assert table.cursor_key == "gpu-a04"
        await pilot.press("s")  # reason: nodes with one first, alphabetically
        # "card fault: …" (llmgw cordoned gpu-a06), "PSU swap …", "RMA: …"
        reasons = [table.get_row_at(i)[1].plain for i in range(3)]
        assert reasons == ["gpu-a06", "gpu-b04", "gpu-a03"]
        await pilot.press("s", "s")  # GPU classes, then GPUs used, most first
        assert table.get_row_at(0)[1].plain in {"gpu-a01", "gpu-a02", "gpu-a05"}
        await pilot.press("S")  # reversed
        assert table.get_row_at(0)[5].plain.startswith("0/")
        assert table.cursor_key == "gpu-a04"
        # The sorted column's header shows the arrow, whole ("UNH▲", not "UN…").
        await pilot.press("s")
        # Most unhealthy first: the arrow points down (issue 23 item 14).
        assert table.columns["unh"].label.plain == "UNH▼"
        assert table.columns["unh"].text_width >= len("UNH▼")
        await pilot.press("s", "s", "s", "s")  # fabric, models, replicas, report age
        assert table.get_row_at(0)[1].plain == "gpu-b04"  # oldest first
        await pilot.press("s")  # and round again to the name
        assert table.columns["name"].label.plain == "NAME▲"
        order = [table.get_row_at(i)[1].plain for i in range(table.row_count)]
        # Ages inside one bucket (<10s) do not reshuffle rows on refresh.
        controller.clock.advance(3)
        controller.report(node_report("gpu-a02"))
        await repoll(pilot)
        assert [table.get_row_at(i)[1].plain for i in range(table.row_count)] == order


@pytest.mark.reads_fleet
async def test_shift_letter_sorts_by_its_column_as_k9s_does(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        table = nodes(app)
        await pilot.press("down", "down", "down")  # gpu-a04
        await pilot.press("A")  # report age: oldest first, a descending sort
        assert table.columns["age"].label.plain == "AGE▼"
        assert table.get_row_at(0)[1].plain == "gpu-b04"
        await pilot.press("A")  # again: reversed, youngest first
        assert table.columns["age"].label.plain == "AGE▲"
        assert table.get_row_at(table.row_count - 1)[1].plain == "gpu-b04"
        await pilot.press("T")  # state: trouble first, not reversed
        assert table.columns["state"].label.plain == "STATE▲"
        assert table.get_row_at(0)[1].plain == "gpu-b04"
        assert table.cursor_key == "gpu-a04"
        await pilot.press("P")  # GPUs used, most first
        assert table.columns["gpus"].label.plain == "GPUS▼"
        await pilot.press("N")
        assert [table.get_row_at(i)[1].plain for i in range(2)] == ["gpu-a01", "gpu-a02"]
        # In the filter box the same letters are text.
        await pilot.press("slash", *"PUMA", "escape")
        assert table.columns["name"].label.plain == "NAME▲"


def test_every_sort_has_its_own_letter_and_no_other_key_uses_it() -> None:
    letters = [sort.letter for sort in SORTS]
    assert len(set(letters)) == len(SORTS) and all(x.isupper() for x in letters)
    taken = {"S", "G"}  # reverse, and the cursor to the bottom
    assert not taken & set(letters)
    assert [k for k, _ in sort_letters()] == letters  # the help lists them all


def test_s_steps_through_every_column() -> None:
    sortable = [key for key, _, _ in COLUMNS if key != "mark"]
    assert [sort.label for sort in SORTS] == sortable


@pytest.mark.parametrize("width", [80, 100, 120, 160, 200, 250])
def test_key_columns_fit_at_every_width(width: int) -> None:
    total = width - 3  # the pane's borders and the scrollbar
    widths = column_widths(total, len("gpu-a01"))
    shown = {key for key, w in widths.items() if w != 0}
    assert {"name", "state", "gpus", "unh", "age"} <= shown
    used = sum((len("gpu-a01") if w is None else w) + 2 for w in widths.values() if w != 0)
    assert used == total  # nothing wider than the terminal, and no width left unused
    if width >= 120:
        assert shown == {key for key, _, _ in COLUMNS}


@pytest.mark.reads_fleet
async def test_sort_cycles_skip_columns_a_narrow_terminal_hides(make_app: MakeApp) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        app = await loaded(pilot)
        table = nodes(app)
        hidden = {key for key, column in table.columns.items() if column.hidden}
        assert hidden and not hidden & {"name", "state", "gpus", "unh", "age"}
        seen = []
        for _ in SORTS:
            await pilot.press("s")
            seen.append(SORTS[table.sort_index].label)
        assert not set(seen) & hidden and "age" in seen


async def test_refresh_patches_rows_in_place(
    make_app: MakeApp, controller: LiveController, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        table = nodes(app)

        def no_clear(*_: object, **__: object) -> None:
            raise AssertionError("a refresh must not clear the table")

        monkeypatch.setattr(table, "clear", no_clear)
        await pilot.press("space", "down")  # mark gpu-a01 (moves on); cursor on gpu-a03
        patched: list[tuple[str, int]] = []
        real_patch = table.patch_row

        def spy_patch(key: str, cells: Sequence[Text]) -> int:
            touched = real_patch(key, cells)
            if touched:
                patched.append((key, touched))
            return touched

        monkeypatch.setattr(table, "patch_row", spy_patch)
        rendered = spy_renders(table, monkeypatch, column=1)  # NAME
        controller.report(node_report("gpu-a06", used=3))
        controller.report(report("gpu-a00", gpus=[gpu("gpu-a00", i, H100) for i in range(8)]))
        await repoll(pilot)
        await pilot.pause()
        # One cell of gpu-a06 changed; gpu-a00 is new. Only those two rows are
        # rendered again: the others, moved down a line, reuse their cached lines.
        # (The controller never forgets a node, so no row leaves here.)
        assert sorted(patched) == [("gpu-a00", 11), ("gpu-a06", 1)]
        # The header line may be drawn again (a style update, such as the
        # terminal gaining focus on the first key, resets it): it is not a row.
        header = table.columns["name"].label.plain
        assert set(rendered) - {header} == {"gpu-a06", "gpu-a00"}
        assert "gpu-a00" in table.shown
        assert table.get_row_at(0)[1].plain == "gpu-a00"  # sorted into place
        assert table.cursor_key == "gpu-a03"  # the cursor followed its node
        assert table.marks == {"gpu-a01"}


@pytest.mark.reads_fleet
async def test_node_detail(make_app: MakeApp, faults: Faults) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await open_detail(pilot, "gpu-a06")
        screen = app.screen
        gpus = screen.query_one("#detail-gpus", KeyedTable)
        assert gpus.row_count == 8
        health = [gpus.get_row_at(i)[6].plain for i in range(8)]
        assert health.count("unhealthy") == 2
        reasons = " ".join(gpus.get_row_at(i)[7].plain for i in range(8))
        assert "Xid 79" in reasons
        storage = str(screen.query_one("#detail-storage").render())
        assert "SHARED" in storage and "not counted: 3 of 191 shards missing" in storage
        assert "not counted: empty directory" in storage
        assert Recorded("GET", "/v1/nodes/gpu-a06", None) in faults.requests
        await pilot.press("escape")
        assert not isinstance(app.screen, NodeDetailScreen)
        assert app.watched_node is None


async def test_detail_history_and_cordon_from_detail(make_app: MakeApp, faults: Faults) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("down", "down", "enter")  # gpu-a03
        await until(pilot, lambda: app.node_view is not None and app.node_view.detail is not None)
        await pilot.pause()
        history = app.screen.query_one("#detail-history", KeyedTable)
        # Newest first, as the controller lists them.
        assert [history.get_row_at(i)[1].plain for i in range(2)] == ["drained", "drain"]
        assert app.screen.check_action("cordon", ()) is False
        await pilot.press("u")
        await until(pilot, lambda: isinstance(app.screen, UncordonModal), "the confirmation")
        await pilot.click("#confirm")
        await until(pilot, lambda: faults.mutations)
        assert faults.mutations[0].path == "/v1/nodes/gpu-a03/uncordon"


@pytest.mark.reads_fleet
async def test_help_lists_only_available_keys(make_app: MakeApp) -> None:
    async with make_app(readonly=True).run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = " ".join(str(w.render()) for w in app.screen.query("Static"))
        assert "cordon:" not in text and "Read-only" in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


def test_backoff_doubles_up_to_a_cap() -> None:
    assert [backoff(n, 1.0) for n in range(7)] == [1, 1, 2, 4, 8, 16, 30]
    assert backoff(3, 60.0) == 60.0  # never faster than the normal refresh


@pytest.mark.reads_fleet
async def test_polls_never_overlap(
    controller: LiveController, faults: Faults, clock: Clock
) -> None:
    in_flight = 0
    most = 0

    class Slow(Faults):
        async def handle_async_request(self, request):  # type: ignore[no-untyped-def]
            nonlocal in_flight, most
            if request.url.path == "/v1/whoami":  # asked once at start, not a poll
                return await super().handle_async_request(request)
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.05)
            try:
                return await super().handle_async_request(request)
            finally:
                in_flight -= 1

    app = ConsoleApp(controller.client(Slow()), refresh=0.2, clock=clock)
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(10):
            app.poll_now()  # hammering does not stack fetches
            await pilot.pause(0.01)
        await until(pilot, lambda: app.polls >= 4, "several polls")
    # summary and nodes are fetched together: two requests, never more.
    assert most == 2


async def test_filtering_a_big_fleet_keeps_the_cursor_node(tmp_path: Path, clock: Clock) -> None:
    live = LiveController(tmp_path / "big").start()
    live.report(*(report(f"node-{i:05d}", n_gpus=2) for i in range(600)))
    app = ConsoleApp(live.client(), refresh=3600.0, clock=clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        table = nodes(app)
        await until(pilot, lambda: table.row_count == 600 and table.complete, "all rows")
        table.move_cursor(row=table.get_row_index("node-00012"))
        await pilot.press("slash", *"node-0001", "enter")
        assert table.row_count == 10  # node-00010 … node-00019
        assert table.cursor_key == "node-00012"
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == 600 and table.complete, "rows back")
        assert table.cursor_key == "node-00012"
        assert [table.get_row_at(i)[1].plain for i in range(3)] == [
            "node-00000",
            "node-00001",
            "node-00002",
        ]
    live.close()


@pytest.mark.reads_fleet
async def test_detail_of_a_node_the_controller_does_not_know_says_so(
    make_app: MakeApp, controller: LiveController
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        # As after a restart from another state directory: the node is unknown.
        app.post_message(MainScreen.DetailRequested("gpu-zz9"))
        await until(pilot, lambda: app.node_view is not None, "the detail answer")
        await repoll(pilot)
        assert app.node_view is not None and app.node_view.detail is None
        title = str(app.screen.query_one("#detail-title").render())
        assert "no longer known to the controller (404)" in title
        assert app.is_running


async def test_controller_changes_show_within_two_seconds(
    controller: LiveController, clock: Clock
) -> None:
    app = ConsoleApp(controller.client(), refresh=1.0, clock=clock)  # the default refresh
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        table = nodes(app)
        controller.report(node_report("gpu-a04", used=8))
        t0 = time.monotonic()
        # No poll_now(): the one-shot timer alone must bring it in.
        await until(pilot, lambda: table.shown["gpu-a04"][5].plain == "8/8", "the change")
        assert time.monotonic() - t0 < 2.0


@pytest.mark.reads_fleet
async def test_rows_age_while_the_controller_is_away(
    make_app: MakeApp, faults: Faults, clock: Clock
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        table = nodes(app)
        assert table.shown["gpu-a01"][-1].plain == "<10s"
        faults.down = True
        clock.advance(41)
        await repoll(pilot)
        assert app.connection.link == "unreachable"
        app.screen.tick()  # the screen's one-second tick, without waiting for it
        await pilot.pause()
        # 41 s without an answer: the rows say so, not only the header.
        assert table.shown["gpu-a01"][-1].plain == "40s"
        clock.advance(60)
        app.screen.tick()
        assert table.shown["gpu-a01"][-1].plain == "1m00s"  # minutes, past one
        faults.down = False
        await repoll(pilot)  # the controller's own ages again
        assert table.shown["gpu-a01"][-1].plain == "<10s"


@pytest.mark.reads_fleet
async def test_r_retries_at_once_instead_of_waiting_out_the_backoff(
    make_app: MakeApp, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        faults.down = True
        await repoll(pilot)
        await repoll(pilot)
        assert app.connection.link == "unreachable" and app.connection.failures == 2
        faults.down = False
        # The next scheduled try is an hour away (the test's refresh); r is now.
        polls = app.polls
        await pilot.press("r")
        await until(pilot, lambda: app.connection.link == "live", "the retry")
        assert app.polls == polls + 1


async def test_a_node_unheard_since_a_controller_restart_says_so(
    make_app: MakeApp, controller: LiveController
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        table = nodes(app)
        assert table.shown["gpu-a03"][2].plain == "cordoned (drained)"
        controller.restart()  # and gpu-a03 (cordoned) does not report again: dead
        controller.report(node_report("gpu-a01"))
        await repoll(pilot)
        # Not plainly `cordoned`, AGE `never`: it may well be dead, and says so.
        assert table.shown["gpu-a03"][2].plain == "cordoned (no report)"
        assert table.shown["gpu-a03"][-1].plain == "never"
        assert table.shown["gpu-a01"][2].plain == "ready"
        controller.report(node_report("gpu-a03"))  # it was alive after all
        await repoll(pilot)
        assert table.shown["gpu-a03"][2].plain == "cordoned (drained)"
        assert table.shown["gpu-a03"][-1].plain == "<10s"


def _burst(app: ConsoleApp, keys: Sequence[str]) -> None:
    """Keys as a terminal delivers a fast typist's burst: all queued at once,
    nothing processed in between (Pilot.press waits after every key)."""
    for key in keys:
        char = key if len(key) == 1 else {"space": " "}.get(key)
        app.post_message(events.Key(key, char))


@pytest.mark.parametrize(
    ("keys", "node", "reason"),
    [
        ([*"c", *"burst reason number 1", "enter"], "gpu-a01", "burst reason number 1"),
        # moves, then every console key inside the reason is text
        ([*"jjjc", *"q/d/u/c/s/r ?", "enter"], "gpu-a04", "q/d/u/c/s/r ?"),
        # reason box -> Cancel -> Cordon
        ([*"c", *"ux tab test", "tab", "tab", "enter"], "gpu-a01", "ux tab test"),
        ([*"c", *"typo", "backspace", "backspace", *"ps", "enter"], "gpu-a01", "typs"),
    ],
)
async def test_a_burst_of_keys_is_taken_in_order(
    make_app: MakeApp, faults: Faults, keys: list[str], node: str, reason: str
) -> None:
    """Without tmux: the same bursts through Textual's own message queue."""
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        _burst(app, keys)
        await until(pilot, lambda: faults.mutations, "the cordon request")
        assert faults.mutations == [
            Recorded("POST", f"/v1/nodes/{node}/cordon", {"reason": reason})
        ]
        assert app.is_running


@pytest.mark.parametrize(
    ("keys", "cordons"),
    [
        # Enter leaves the filter: the `c` behind it is a command, on the one
        # node the filter left.
        (["slash", *"gpu-b03", "enter", "c", *"filtered", "enter"], [("gpu-b03", "filtered")]),
        # The command typed behind a confirmation's Enter reaches the main screen.
        (
            [*"c", *"one", "enter", "j", "c", *"two", "enter"],
            [("gpu-a01", "one"), ("gpu-a02", "two")],
        ),
        # Keys behind Enter go to the detail screen it opens.
        (["enter", "c", *"from the detail", "enter"], [("gpu-a01", "from the detail")]),
    ],
)
async def test_keys_behind_a_screen_or_focus_change_wait_for_it(
    make_app: MakeApp, faults: Faults, keys: list[str], cordons: list[tuple[str, str]]
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        _burst(app, keys)
        await until(pilot, lambda: len(faults.mutations) >= len(cordons), "the cordon requests")
        await pilot.pause(0.2)  # nothing more follows
        assert faults.mutations == [
            Recorded("POST", f"/v1/nodes/{node}/cordon", {"reason": reason})
            for node, reason in cordons
        ]
        assert not isinstance(app.screen, CordonModal)


async def test_left_and_right_move_between_dialog_buttons(
    make_app: MakeApp, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("down", "down", "u")  # gpu-a03, cordoned
        modal = app.screen
        assert isinstance(modal, UncordonModal)
        cancel, confirm = modal.query_one("#cancel"), modal.query_one("#confirm")
        await pilot.press("right")
        assert modal.focused is confirm
        await pilot.press("right")  # the last button: stays
        assert modal.focused is confirm
        await pilot.press("left")
        assert modal.focused is cancel
        await pilot.press("right", "enter")
        await until(pilot, lambda: faults.mutations, "the uncordon request")
        assert faults.mutations == [Recorded("POST", "/v1/nodes/gpu-a03/uncordon", {})]


@pytest.mark.reads_fleet
async def test_r_starts_the_backoff_over(make_app: MakeApp, faults: Faults, clock: Clock) -> None:
    async with make_app(refresh=5.0).run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        faults.down = True
        for _ in range(4):
            await repoll(pilot)
        assert app.connection.retry_at == clock.now + 30.0  # 5, 5, 10, 20, then the cap
        polls = app.polls
        await pilot.press("r")
        await until(pilot, lambda: app.polls > polls, "the retry")
        # It failed too: retried after one refresh, then 5, 10, 20 … again (it
        # used to double on, so `r` pushed the next try from 15 s away to 29 s).
        assert app.connection.failures == 1
        assert app.connection.retry_at == clock.now + 5.0


@pytest.mark.parametrize("width", [200, 250])
def test_wide_terminals_show_a_nodes_classes_whole(width: int) -> None:
    two = len("8xH100-SXM-80GB 2xA100-SXM-40GB")
    widths = column_widths(width - 3, len("gpu-a01"), two)
    assert widths["classes"] == two
    assert column_widths(80 - 3, len("gpu-a01"), two)["classes"] == 0  # no room: hidden


ABOUT = """llmgw demo: 3 simulated nodes in 1 fabrics (ib-a)
  controller:  http://127.0.0.1:7460
  gateway (OpenAI API, SMG): http://127.0.0.1:8000
    curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json'"""


@pytest.mark.reads_fleet
async def test_what_the_console_was_started_with_is_in_its_help(
    controller: LiveController, faults: Faults, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's banner (gateway, curl line) was hidden behind the console
    until it quit (issue 23 item 13): the help shows it, a notice points there."""
    app = ConsoleApp(controller.client(faults), refresh=3600.0, clock=clock, about=ABOUT)
    shown: list[str] = []
    monkeypatch.setattr(app, "notify", lambda message, **_: shown.append(message))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        assert shown[0].startswith("llmgw demo: 3 simulated nodes") and "(?)" in shown[0]
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        about = str(app.screen.query_one("#about").render())
        assert "curl -s http://127.0.0.1:8000/v1/chat/completions" in about


@pytest.mark.reads_fleet
async def test_the_demos_curl_line_is_one_line_in_the_help_and_y_copies_it(
    controller: LiveController, faults: Faults, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35 item 9: the help wrapped the curl line at the dialog's width, so
    a paste ran half a command. It is shown as printed (one line, scrolled
    sideways at 80 columns), `y` copies it, and the header names the gateway."""
    from llmgw.demo import curl_line, gateway_banner

    gateway = "http://127.0.0.1:8000"
    about = "llmgw demo: 3 simulated nodes in 1 fabrics (ib-a)\n" + gateway_banner(gateway)
    assert curl_line(gateway) in about.splitlines()[2]  # printed on one line
    app = ConsoleApp(
        controller.client(faults), refresh=3600.0, clock=clock, about=about, gateway=gateway
    )
    copied: list[str] = []
    monkeypatch.setattr(app, "copy_to_clipboard", copied.append)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        assert f"gateway {gateway}" in str(app.screen.query_one("#header").render())
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        lines = str(app.screen.query_one("#about").render()).splitlines()
        assert lines[2].strip() == curl_line(gateway)
        await pilot.press("y")
        assert copied == [curl_line(gateway)]
        assert isinstance(app.screen, HelpScreen)  # copying does not close the help
