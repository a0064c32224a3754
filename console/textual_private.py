"""Every use of Textual's private members in the console, and only here.

The key pipeline (console/keys.py) acts on each key in place, as Textual's
own App would, so it needs a few of Textual's internals. They may change in
any release: Textual is pinned (pyproject.toml), and
tests/console/test_textual_private.py checks that each one listed in
`PRIVATE_MEMBERS` still exists with the signature used here. Nothing else in
console/ touches a Textual object's `_name` (that test checks that too).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

from textual import events
from textual._xterm_parser import XTermParser
from textual.app import App
from textual.binding import Binding
from textual.dom import DOMNode
from textual.drivers import linux_driver, linux_inline_driver
from textual.message import Message
from textual.message_pump import MessagePump
from textual.widget import Widget
from textual.widgets import Input

from llmgw.common import printable

# (owner, member, parameters after self; None: an attribute, not a method).
# Instance attributes are checked on an instance (see the test).
PRIVATE_MEMBERS: tuple[tuple[type[Any], str, tuple[str, ...] | None], ...] = (
    (Widget, "_forward_event", ("event",)),
    (App, "_check_bindings", ("key", "priority")),
    (MessagePump, "_closing", None),
    (MessagePump, "_closed", None),
    (Input, "_restart_blink", ()),
    (DOMNode, "_bindings", None),
)
# (module, name): module globals the console replaces (see keep_pastes_in_order).
PRIVATE_GLOBALS: tuple[tuple[ModuleType, str], ...] = (
    (linux_driver, "XTermParser"),
    (linux_inline_driver, "XTermParser"),
)


def forward_event(target: Widget, event: events.Event) -> None:
    """Hand `event` to the widget's own queue, as the App does for a key
    nobody bound (the widget's on_key, an Input's typing)."""
    target._forward_event(event)


async def run_priority_binding(app: App[Any], key: str) -> bool:
    """Run the priority binding for `key` (the app's and every screen's
    `priority=True` keys) as the App would; False: none took it."""
    return await app._check_bindings(key, priority=True)


def is_closing(pump: MessagePump) -> bool:
    """The pump is closing or closed: nothing sent to it will be handled."""
    return pump._closing or pump._closed


def restart_blink(box: Input) -> None:
    """Show the box's cursor now (it blinks off while idle), as typing does."""
    box._restart_blink()


def bindings_for(node: DOMNode, key: str) -> Sequence[Binding]:
    """The node's own bindings for `key` (not its ancestors')."""
    return node._bindings.key_to_bindings.get(key, ())


# -- pastes that hold an escape ----------------------------------------------------

PASTE_START = "\x1b[200~"
PASTE_END = "\x1b[201~"
ESC = "\x1b"


class OrderedPasteParser(XTermParser):
    """Textual's terminal parser, except that an ESC inside a bracketed paste
    stays in the paste, shown as text (`\\x1b`).

    Textual reads such an ESC as the start of a key sequence: the rest of the
    paste came out as keys *before* a Paste holding only the text up to the
    ESC (`alpha\\x1b[31mbeta` was recorded as `^[31mbetaalpha`). Reads may
    split a paste anywhere, so the tail of a read that may begin the end
    marker is held back until the next read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_paste = False
        self._held = ""  # in a paste: a read's tail that may begin PASTE_END
        self._tail = ""  # outside one: a read's tail that may begin PASTE_START

    def feed(self, data: str) -> Iterable[Message]:
        if not data:  # end of input
            held, self._held = self._held, ""
            return [*super().feed(held), *super().feed("")] if held else super().feed("")
        shielded = self._shield(data)
        return super().feed(shielded) if shielded else ()  # "" would mean the end

    def _shield(self, data: str) -> str:
        data, self._held = self._held + data, ""
        out: list[str] = []
        i = 0
        while i < len(data):
            if not self._in_paste:
                i = self._find_start(data, i, out)
                continue
            j = data.find(ESC, i)
            if j < 0:
                out.append(data[i:])
                break
            out.append(data[i:j])
            rest = data[j : j + len(PASTE_END)]
            if rest == PASTE_END:
                out.append(PASTE_END)
                self._in_paste = False
                i = j + len(PASTE_END)
            elif PASTE_END.startswith(rest):  # the read ends inside what may be the marker
                self._held = rest
                break
            else:
                out.append(printable(ESC))
                i = j + 1
        return "".join(out)

    def _find_start(self, data: str, i: int, out: list[str]) -> int:
        """Pass text through unchanged up to the paste's start marker (which may
        have begun in the last read); returns where to go on."""
        seen = self._tail + data[i:]
        j = seen.find(PASTE_START)
        if j < 0:
            out.append(data[i:])
            # Nothing is held outside a paste (a lone Escape must arrive now):
            # remember what may begin the marker, to match it in the next read.
            self._tail = next(
                (
                    seen[-n:]
                    for n in range(len(PASTE_START) - 1, 0, -1)
                    if PASTE_START.startswith(seen[-n:])
                ),
                "",
            )
            return len(data)
        end = i + j - len(self._tail) + len(PASTE_START)  # in `data`
        out.append(data[i:end])
        self._tail = ""
        self._in_paste = True
        return end


def keep_pastes_in_order() -> None:
    """The terminal drivers parse input with OrderedPasteParser (idempotent)."""
    for module, name in PRIVATE_GLOBALS:
        setattr(module, name, OrderedPasteParser)
