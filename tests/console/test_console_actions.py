"""Pilot tests: an admin action hits exactly the nodes the operator sees, and
the drain dialog's gates (issue 23 items 2, 3, 4, 8), against the real controller."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from console_fixtures import Faults, Recorded
from console_pilot import loaded, until
from textual import events
from textual.pilot import Pilot
from textual.widgets import Button, Input

from llmgw.console.app import ConsoleApp
from llmgw.console.screens.modals import CordonModal, DrainModal, ForceConfirmModal, UncordonModal
from llmgw.console.widgets.nodes import NodesTable

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


def notes(app: ConsoleApp, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every notification the app shows from now on."""
    shown: list[str] = []
    real = app.notify

    def spy(message: str, *args: object, **kwargs: object) -> None:
        shown.append(message)
        real(message, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(app, "notify", spy)
    return shown


async def drain_dialog(pilot: Pilot[None], *keys: str) -> DrainModal:
    app = pilot.app
    await pilot.press(*keys, "d")
    modal = app.screen
    assert isinstance(modal, DrainModal)
    await until(pilot, lambda: modal.plan is not None, "the drain plan")
    return modal


def deadline(modal: DrainModal) -> str:
    return str(modal.query_one("#deadline").render())


async def test_force_after_takes_durations_and_echoes_the_deadline(
    make_app: MakeApp, faults: Faults, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`1h` was read as 1 minute and `abc` as no deadline, both silently
    (issue 23 item 3): one syntax with ctl, refused with a message, echoed."""
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        shown = notes(app, monkeypatch)
        modal = await drain_dialog(pilot, "slash", *"gpu-b03", "enter")  # nothing runs there
        assert "No deadline" in deadline(modal)
        await pilot.press(*"reboot")
        modal.query_one("#timeout", Input).focus()
        await pilot.press(*"abc")
        assert "'abc' is not a duration" in deadline(modal)
        await pilot.press("enter")  # refused in the dialog: nothing sent, text kept
        assert app.screen is modal and faults.mutations == []
        error = str(modal.query_one("#error").render())
        assert "Not drained: 'abc' is not a duration: use a number with a unit" in error
        assert modal.query_one("#reason", Input).value == "reboot"
        await pilot.press("ctrl+u", *"20m")  # the fixtures' clock: 09:20:00 UTC
        assert "force at 09:40:00 UTC (in 20m)" in deadline(modal)
        await pilot.press("ctrl+u", *"1h")
        assert "force at 10:20 UTC (in 1h)" in deadline(modal)
        await pilot.press("enter")
        await until(pilot, lambda: faults.mutations, "the drain request")
        assert faults.mutations == [
            Recorded(
                "POST",
                "/v1/nodes/gpu-b03/drain",
                {"reason": "reboot", "force": False, "force_after_s": 3600.0},
            )
        ]
        # The result says the deadline the controller recorded.
        await until(pilot, lambda: any("Draining" in n for n in shown), "the result")
        assert [n for n in shown if n.startswith("Draining: gpu-b03, force at ")]


async def test_force_after_below_a_minimum_asks_again_naming_the_models(
    make_app: MakeApp, faults: Faults
) -> None:
    """Force after, like force now, can stop the last replicas of a model: the
    same second yes naming the models, Cancel focused (issue 23 item 4)."""
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        modal = await drain_dialog(pilot)  # gpu-a01: a shard of the only DeepSeek replica
        await pilot.press(*"psu")
        modal.query_one("#timeout", Input).focus()
        await pilot.press(*"20s", "enter")
        await until(pilot, lambda: isinstance(app.screen, ForceConfirmModal), "the second ask")
        second = app.screen
        await until(pilot, lambda: bool(second.query("#confirm")), "its buttons")
        assert second.focused is second.query_one("#cancel", Button)
        below = str(second.query_one("#below").render())
        assert "deepseek-ai/DeepSeek-V3" in below and "force at 09:20:20 UTC (in 20s)" in below
        await pilot.press("enter")  # Cancel: back to the form, nothing sent
        await until(pilot, lambda: app.screen is modal, "back to the drain")
        assert faults.mutations == []
        await pilot.press("enter")  # focus is back in the force-after box: submits again
        await until(pilot, lambda: isinstance(app.screen, ForceConfirmModal), "asked again")
        await until(pilot, lambda: bool(app.screen.query("#confirm")), "its buttons")
        await pilot.press("right", "enter")
        await until(pilot, lambda: faults.mutations, "the drain request")
        assert faults.mutations[0].body == {"reason": "psu", "force": False, "force_after_s": 20.0}


async def test_the_drain_dialogs_buttons_stay_in_view_at_80x24(make_app: MakeApp) -> None:
    """Three Tabs did not scroll Cancel/Drain into view (issue 23 item 7): the
    fields scroll, the buttons stay."""
    async with make_app().run_test(size=(80, 24)) as pilot:
        modal = await drain_dialog(pilot)
        await pilot.press(*"kernel")
        modal.query_one("#timeout", Input).focus()
        await pilot.press(*"abc", "enter")  # an error line too
        await pilot.pause()
        dialog = modal.query_one("#dialog").region
        assert modal.region.contains_region(dialog)
        for selector in ("#error", "#cancel", "#confirm"):
            assert dialog.contains_region(modal.query_one(selector).region), selector
        for _ in range(6):  # every field, then the buttons: each in view when focused
            await pilot.press("tab")
            await pilot.pause()
            focused = modal.focused
            assert focused is not None
            body = modal.query_one("#body").region
            assert focused.id in ("cancel", "confirm") or body.overlaps(focused.region)


async def test_a_pasted_reason_keeps_its_order_and_a_tab_is_a_space(
    make_app: MakeApp, faults: Faults
) -> None:
    """A tab in a paste was shown, then refused by the controller (`invalid
    ReasonRequest`) and the text lost (issue 23 item 8)."""
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("c")
        app.post_message(events.Paste("RMA\tticket 7\nrack 3"))
        await pilot.pause()
        await pilot.press("enter")
        await until(pilot, lambda: faults.mutations, "the cordon request")
        assert faults.mutations == [
            Recorded("POST", "/v1/nodes/gpu-a01/cordon", {"reason": "RMA ticket 7 rack 3"})
        ]


async def test_a_reason_the_controller_would_refuse_is_refused_in_the_dialog(
    make_app: MakeApp, faults: Faults
) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("c")
        modal = app.screen
        assert isinstance(modal, CordonModal)
        box = modal.query_one("#reason", Input)
        box.value = "bell\x07here"  # no key types this; a bug or a widget might
        box.focus()
        await pilot.press("enter")
        assert app.screen is modal and faults.mutations == []
        error = str(modal.query_one("#error").render())
        assert "Not sent: in the reason, control characters" in error
        assert "Reason" not in error.replace("reason", "")  # no class name
        assert box.value == "bell\x07here"  # kept, to edit


async def test_a_request_the_controller_refuses_comes_back_in_its_dialog(
    make_app: MakeApp, faults: Faults
) -> None:
    """Refused by the API, the reason was lost (issue 23 item 8): the dialog
    opens again as it was filled in, with the controller's words, Cancel first."""
    async with make_app().run_test(size=(120, 40)) as pilot:
        app = await loaded(pilot)
        await pilot.press("c", *"fan tray 2")
        faults.status_error = 400
        await pilot.press("enter")
        await until(
            pilot,
            lambda: isinstance(app.screen, CordonModal) and bool(app.screen.why),
            "the dialog again",
        )
        faults.status_error = None
        modal = app.screen
        assert isinstance(modal, CordonModal)
        await until(pilot, lambda: bool(modal.query("#confirm")), "its buttons")
        assert modal.query_one("#reason", Input).value == "fan tray 2"
        error = str(modal.query_one("#error").render())
        assert "Refused by the controller: controller is restarting. Nothing was changed" in error
        assert modal.focused is modal.query_one("#cancel", Button)
        await pilot.press("tab", "enter")
        await until(pilot, lambda: len(faults.mutations) == 2, "sent again")
        assert faults.mutations[1] == Recorded(
            "POST", "/v1/nodes/gpu-a01/cordon", {"reason": "fan tray 2"}
        )


async def test_one_cordon_of_two_marked_nodes_is_one_request_each_and_one_toast(
    make_app: MakeApp, faults: Faults
) -> None:
    """Issue 35 item 13. Typed, the action runs once: one request per node and
    one toast. A second answer on its way before the first one's pop lands
    (Enter in the box and a click on Cordon, both queued) sent nothing more
    but popped the screen below (Textual's dismiss pops whatever is on top):
    the dialog answers once."""
    async with make_app().run_test(size=(80, 24)) as pilot:
        app = await loaded(pilot)
        main = app.screen
        toasts: list[str] = []  # every one, however briefly shown
        notify = app.notify
        app.notify = lambda message, **kw: (toasts.append(message), notify(message, **kw))[1]  # type: ignore[method-assign]
        await pilot.press("space", "space", "c", *"rack 4 power", "enter")
        await until(pilot, lambda: toasts, "the toast")
        cordons = [r.path for r in faults.mutations]
        assert cordons == ["/v1/nodes/gpu-a01/cordon", "/v1/nodes/gpu-a02/cordon"]
        assert toasts == ["Cordoned: gpu-a01, gpu-a02"]

        await pilot.press("space", "space", "c", *"rack 5 power")
        modal = app.screen
        assert isinstance(modal, CordonModal) and modal.names  # gpu-a03 is cordoned already
        names = modal.names
        modal.confirm()
        modal.confirm()
        await until(pilot, lambda: len(toasts) == 2, "one more toast")
        await pilot.pause()
        assert app.screen is main and len(app.screen_stack) == 1
        assert [r.path for r in faults.mutations[2:]] == [f"/v1/nodes/{n}/cordon" for n in names]
        assert toasts[1:] == [f"Cordoned: {', '.join(names)}"]
