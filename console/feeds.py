"""What the models, usage and events views show, fetched by the app's poll loop while
their screen is open (screens do no I/O and never import the app), and the
messages a screen posts to open one.

Events follow the controller's log as `kubectl get events -w` does: the first
fetch takes what the controller keeps, every later one asks only for the
events after the newest seen (`since=`), so only new ones cross the wire. The
console keeps at most `MAX_EVENTS`, dropping the oldest first, as Textual's Log
drops its oldest lines: a console left open for a week stays the same size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import ValidationError
from textual.message import Message

from llmgw.client import AdminClient, ControllerError, ControllerUnreachable, describe
from llmgw.console.state import ConsoleModel
from llmgw.wire import AdapterView, EventList, EventView, ModelView, UsageRow

MAX_EVENTS = 1000
# The usage view's windows (`w` steps through them), as `ctl usage --since` takes them.
USAGE_WINDOWS = ("1h", "24h", "7d")


@dataclass(frozen=True, eq=False)
class ModelsView:
    """The last answer to `GET /v1/models`; on a failed fetch, the one before with why.
    `adapters`: the fleet summary's (`GET /v1/summary` carries every adapter's view),
    listed under their base."""

    models: tuple[ModelView, ...]
    error: str | None = None
    adapters: tuple[AdapterView, ...] = ()


@dataclass(frozen=True, eq=False)
class UsageView:
    """The last answer to `GET /v1/usage?since=WINDOW&by=tenant,model`. `window`: what
    the rows count; on a failed fetch they stay, with why. `loaded`: an answer came."""

    window: str
    rows: tuple[UsageRow, ...] = ()
    error: str | None = None
    loaded: bool = False


class EventFeed:
    """The events of one object (`node/NAME`, `model/NAME`), or of all, oldest first.
    Owned by the app, which alone fetches into it; screens read it."""

    def __init__(self, obj: str | None, limit: int = MAX_EVENTS) -> None:
        self.obj = obj
        self.events: deque[EventView] = deque(maxlen=limit)
        self.cursor = 0  # the newest id seen: the next fetch asks for the ones after it
        self.loaded = False  # the first answer came
        self.error: str | None = None  # why the last fetch failed (the events stay)

    def take(self, page: EventList) -> int:
        """Add what the controller answered; returns how many events were new. A
        counted event (count > 1) replaces the newest of the same object and reason."""
        new = [e for e in page.events if e.id > self.cursor]
        for event in new:
            if event.count > 1:
                self._drop_replaced(event)
            self.events.append(event)
        self.cursor = max(self.cursor, page.cursor, *(e.id for e in new))
        self.loaded, self.error = True, None
        return len(new)

    def _drop_replaced(self, counted: EventView) -> None:
        for i in range(len(self.events) - 1, -1, -1):
            e = self.events[i]
            if (e.object, e.reason) == (counted.object, counted.reason):
                del self.events[i]
                return


class ViewsModel(ConsoleModel, Protocol):
    """The app as the models, usage and events screens see it."""

    models_view: ModelsView | None
    usage_view: UsageView | None
    event_feed: EventFeed | None


class ModelsWanted(Message):
    """Open the models view (the app fetches models while it is open)."""


class UsageWanted(Message):
    """Open the usage view (the app fetches usage while it is open)."""


class UsageWindowChosen(Message):
    """The usage view asks for another window (`1h`, `24h`, `7d`)."""

    def __init__(self, window: str) -> None:
        super().__init__()
        self.window = window


class EventsWanted(Message):
    """Open the events of `obj` (`node/NAME`, `model/NAME`; None: every event)."""

    def __init__(self, obj: str | None = None) -> None:
        super().__init__()
        self.obj = obj


def _why(exc: Exception, what: str) -> str:
    if isinstance(exc, ControllerError):
        if exc.status == 404:
            return f"this controller serves no {what} (404): upgrade it to see them here"
        return f"{exc.status} {exc.message}"
    if isinstance(exc, ValidationError):
        return f"answer not understood: {describe(exc)}"
    return describe(exc)


async def fetch_models(
    client: AdminClient, old: ModelsView | None, adapters: Sequence[AdapterView] = ()
) -> ModelsView:
    """Never raises for a failed request: the last models stay, with why."""
    adapters = tuple(sorted(adapters, key=lambda a: a.spec.name.lower()))
    try:
        models = await client.models()
    except (ControllerError, ControllerUnreachable, ValidationError) as exc:
        return ModelsView(old.models if old else (), _why(exc, "models"), adapters)
    return ModelsView(tuple(sorted(models, key=lambda m: m.spec.name.lower())), None, adapters)


async def fetch_usage(client: AdminClient, window: str, old: UsageView | None) -> UsageView:
    """Never raises for a failed request: the last rows stay (if of this window), with why."""
    try:
        report = await client.usage(window)
    except (ControllerError, ControllerUnreachable, ValidationError) as exc:
        kept = old if old is not None and old.window == window else UsageView(window)
        return UsageView(window, kept.rows, _why(exc, "usage figures"), kept.loaded)
    return UsageView(window, tuple(report.rows), None, True)


async def fetch_events(client: AdminClient, feed: EventFeed) -> None:
    """The events after the newest seen, into `feed`; a failure is kept as its error."""
    try:
        page = await client.events(feed.cursor, feed.obj)
    except (ControllerError, ControllerUnreachable, ValidationError) as exc:
        feed.error = _why(exc, "events")
        return
    feed.take(page)
