"""Keys in the order typed, each acted on before the next is read.

Textual hands a key to the focused widget's own message queue and moves on to
the next one at once. Whatever that key sets in motion (a screen pushed or
popped, focus moved, a message the app must act on) happens later, while the
keys typed behind it are already being routed by the state before it. On a
real terminal a burst arrives in one read, so `/ gpu-a09 Enter c` put the `c`
into the filter, and the command typed behind a confirmation's Enter went to
the closing modal.

So the app gives every key and paste to a `KeyPipeline`, which takes them one
at a time: it waits until what the previous key started has settled (the
queues it may have posted to are drained, a screen it pushed is mounted),
then acts on this one in place, as Textual would: priority bindings first,
then the screen's own `take_key` (text boxes, confirmations), and only keys
no one took go to the focused widget the ordinary way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol, runtime_checkable

from textual import events
from textual.app import App
from textual.message_pump import MessagePump
from textual.widget import Widget
from textual.widgets import Input

from llmgw.common import printable
from llmgw.console.textual_private import (
    bindings_for,
    forward_event,
    is_closing,
    restart_blink,
    run_priority_binding,
)

# How long one key waits for a queue or a new screen before going on anyway:
# a wedged widget must not swallow every key after it.
SETTLE_TIMEOUT_S = 2.0


@runtime_checkable
class TakesKeys(Protocol):
    """A screen that acts on keys itself, in place (no widget queue)."""

    async def take_key(self, event: events.Key) -> bool:
        """Act on the key now; False: not taken (it goes the ordinary way)."""
        ...

    def take_paste(self, text: str) -> bool:
        """Act on pasted text now; False: not taken."""
        ...


class KeyPipeline:
    def __init__(self, app: App[Any]) -> None:
        self.app = app
        self._queue: asyncio.Queue[events.Key | events.Paste] = asyncio.Queue()

    def put(self, event: events.Key | events.Paste) -> None:
        self._queue.put_nowait(event)

    async def run(self) -> None:
        """The app's one key consumer (a worker for the app's lifetime)."""
        while True:
            event = await self._queue.get()
            await self._settle()
            await self._deliver(event)

    async def _settle(self) -> None:
        """Until what the last key started has happened: the messages it
        posted (a focused widget's, bubbling to its screen, then to the app)
        have been handled, and a screen it pushed is mounted (a new screen
        handles its queue only once it has composed and mounted). A screen the
        app pushes while handling one (node detail) is waited for in the next round."""
        app = self.app
        for _ in range(4):
            screen = app.screen
            settled = True
            for pump in (app.focused, screen, app):
                if pump is not None:
                    settled = await _round_trip(pump) and settled
            if not settled:  # to Textual's log: stderr would draw over the screen
                app.log.warning(f"a key waited {SETTLE_TIMEOUT_S:.0f} s to settle; going on")
            if app.screen is screen:
                return

    async def _deliver(self, event: events.Key | events.Paste) -> None:
        app = self.app
        screen = app.screen
        if isinstance(event, events.Paste):
            if not (isinstance(screen, TakesKeys) and screen.take_paste(event.text)):
                forward_event(app.focused or screen, event)
            return
        if await run_priority_binding(app, event.key):
            return
        if isinstance(screen, TakesKeys) and await screen.take_key(event):
            return
        forward_event(app.focused or screen, event)


async def _round_trip(pump: MessagePump) -> bool:
    """Wait until `pump` has handled everything queued before now; False:
    it did not within SETTLE_TIMEOUT_S."""
    if is_closing(pump):
        return True
    done = asyncio.Event()
    return not pump.call_later(done.set) or await _wait(done.wait())


async def _wait(aw: Coroutine[Any, Any, Any]) -> bool:
    try:
        await asyncio.wait_for(aw, SETTLE_TIMEOUT_S)
    except TimeoutError:
        return False
    return True


# -- text boxes, edited in place ------------------------------------------------


def pasted_line(text: str) -> str:
    """A paste for a one-line box: line breaks and tabs become spaces (a reason
    holds neither), other control characters show as text (`\\x1b`)."""
    return printable(" ".join(text.replace("\t", " ").splitlines()))


def type_into(box: Input, text: str) -> None:
    """Insert text at the box's cursor (replacing a selection), as the box
    does for its own keys; the cursor shows while typing."""
    restart_blink(box)
    start, end = sorted(box.selection)
    if start == end:
        box.insert_text_at_cursor(text)
    else:
        box.replace(text, start, end)


async def run_widget_binding(widget: Widget, key: str) -> bool:
    """The widget's own binding for `key` (editing keys in a box, Enter or
    space on a button), run now. False: the widget has none."""
    for binding in bindings_for(widget, key):
        if await widget.app.run_action(binding.action, widget):
            return True
    return False
