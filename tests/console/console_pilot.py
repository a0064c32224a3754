"""Helpers for Pilot tests: wait on a condition (never sleep blindly), spy on renders."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
from console_fixtures import NOW
from rich.style import Style
from rich.text import Text
from textual.pilot import Pilot
from textual.screen import Screen
from textual.strip import Strip
from textual.widgets import Input

from llmgw.console.app import ConsoleApp
from llmgw.console.screens.detail import NodeDetailScreen
from llmgw.console.widgets.keyed_table import KeyedTable

SnapCompare = Callable[..., bool]  # pytest-textual-snapshot's snap_compare fixture


class Clock:
    """A console clock that moves only when a test says so."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def until(
    pilot: Pilot[None], cond: Callable[[], object], what: str = "", tries: int = 200
) -> None:
    for _ in range(tries):
        if cond():
            return
        await pilot.pause(0.01)
    raise AssertionError(f"timed out waiting for {what or cond}")


async def loaded(pilot: Pilot[None]) -> ConsoleApp:
    app = pilot.app
    assert isinstance(app, ConsoleApp)
    await until(
        pilot,
        lambda: app.fleet is not None and app.polls >= 1 and app.role_known,
        "first fetch and the token's role",
    )
    await pilot.pause()
    return app


def steady_cursors(screen: Screen[object]) -> None:
    """Stop the screen's input cursors blinking, before typing. A focused input
    then always shows its cursor; otherwise it hides for the half second after
    each 0.5 s since the last key, and a snapshot on a busy machine drew none."""
    for box in screen.query(Input):
        box.cursor_blink = False


async def open_detail(pilot: Pilot[None], node: str) -> ConsoleApp:
    """From the loaded main screen: filter to `node`, open its detail, wait for it."""
    app = pilot.app
    assert isinstance(app, ConsoleApp)
    await pilot.press("slash", *node, "enter", "enter")
    await until(pilot, lambda: isinstance(app.screen, NodeDetailScreen), "the detail screen")
    await until(pilot, lambda: app.node_view is not None and app.node_view.detail is not None)
    await pilot.pause()
    return app


async def repoll(pilot: Pilot[None]) -> None:
    """Trigger one fetch now and wait until it has been applied."""
    app = pilot.app
    assert isinstance(app, ConsoleApp)
    before = app.polls
    app.poll_now()
    await until(pilot, lambda: app.polls > before, "a poll")
    await pilot.pause()


def spy_renders(table: KeyedTable, monkeypatch: pytest.MonkeyPatch, column: int = 0) -> list[str]:
    """The `column` cell of every row the table renders afresh (cache misses
    only: a row drawn from its cached line is not listed)."""
    rendered: list[str] = []
    real = table._render_cells

    def spy(cells: Iterable[Text], style: Style | None = None) -> Strip:
        cells = list(cells)
        rendered.append(cells[column].plain)
        return real(cells, style)

    monkeypatch.setattr(table, "_render_cells", spy)
    return rendered
