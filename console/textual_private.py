"""Every use of Textual's private members in the console, and only here.

The key pipeline (console/keys.py) acts on each key in place, as Textual's
own App would, so it needs a few of Textual's internals. They may change in
any release: Textual is pinned (pyproject.toml), and
tests/console/test_textual_private.py checks that each one listed in
`PRIVATE_MEMBERS` still exists with the signature used here. Nothing else in
console/ touches a Textual object's `_name` (that test checks that too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.dom import DOMNode
from textual.message_pump import MessagePump
from textual.widget import Widget
from textual.widgets import Input

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
