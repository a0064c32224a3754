"""The `/` filter box of a listing screen, written once (nodes, events, usage), and
`FilteredScreen`, the keys of a listing screen whose box has them all while it types.

Its keys are acted on in place (console/keys.py): the rows are filtered and
focus is back on the table before the next key is read, so `/ gpu-a09 Enter c`
cordons gpu-a09. The screen says what a filter does (`on_text`) and which
widget the keys go back to (`back_to`); the box keeps what it last applied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual import events, on
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Input

from llmgw.console.keys import pasted_line, run_widget_binding, type_into


class FilterBox(Input):
    def __init__(
        self,
        placeholder: str,
        *,
        on_text: Callable[[str], None],
        back_to: Callable[[], Widget],
    ) -> None:
        super().__init__(placeholder=placeholder, id="filter")
        self._on_text = on_text
        self._back_to = back_to
        self._applied = ""

    @property
    def shown(self) -> bool:
        """Open, or holding a filter: the first Escape is the box's."""
        return bool(self.value) or self.has_class("-active")

    def open(self) -> None:
        self.add_class("-active")
        self.screen.set_focus(self)  # now: the next key typed is already for the box

    async def take_key(self, event: events.Key) -> bool:
        """A key typed while the box has focus; False: not the box's, so the
        screen's bindings get it (Escape, for one)."""
        if event.key == "enter":
            self.done()
            return True
        if event.is_printable and event.character:
            type_into(self, event.character)
        elif not await run_widget_binding(self, event.key):
            return False
        self.apply()
        return True

    def take_paste(self, text: str) -> None:
        type_into(self, pasted_line(text))
        self.apply()

    @on(Input.Changed)
    def apply(self) -> None:
        # The box as it is now, not as a queued Changed saw it: the Changed that
        # follows a key already applied in take_key has nothing to do.
        text = self.value.strip()
        if text != self._applied:
            self._applied = text
            self._on_text(text)

    @on(Input.Submitted)
    def done(self) -> None:
        """Enter: the keys go back to the table, the filter stays."""
        if not self.value:
            self.remove_class("-active")
        self.screen.set_focus(self._back_to())

    def clear(self) -> None:
        """Escape: no filter, the box closed, the keys back to the table."""
        self.value = ""
        self.remove_class("-active")
        self.screen.set_focus(self._back_to())
        self.apply()


class FilteredScreen(Screen[Any]):
    """A listing screen with a `FilterBox`: `/` opens it; while it has focus every key
    is its (Escape clears it, Enter goes back to the table), only `back` stays on; the
    first Escape outside it clears a filter, the next leaves the screen."""

    def typing(self) -> bool:
        return isinstance(self.focused, Input)

    def action_filter(self) -> None:
        self.query_one(FilterBox).open()

    async def take_key(self, event: events.Key) -> bool:
        if not self.typing():
            return False
        box = self.query_one(FilterBox)
        if event.key == "escape":  # check_action leaves only `back` on: the box's first
            box.clear()
            return True
        return await box.take_key(event)

    def take_paste(self, text: str) -> bool:
        if not self.typing():
            return False
        self.query_one(FilterBox).take_paste(text)
        return True

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not self.typing() or action == "back"  # the filter box has the keys

    def action_back(self) -> None:
        """Escape: first the filter, then back to where the view was opened (whose
        callback stops fetching what this screen showed)."""
        box = self.query_one(FilterBox)
        if box.shown:
            box.clear()
        else:
            self.dismiss(None)
