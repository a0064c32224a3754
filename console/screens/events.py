"""The events view (`e`), as `kubectl get events`: what the controller decided
by itself, newest at the bottom, following new ones as they come. Opened from
the main screen (every event), a node's detail or the models view (that
object's). `/` filters as on the nodes table; the event under the cursor is
shown whole below the table (a cell shows its first line, cut to the width).

Newest at the bottom, as `ctl events` and `kubectl get events` print them and
as a log reads: with the cursor on the last row the view follows new events
(Textual's Log auto-scrolls the same way); moved up, it stays put to be read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Footer, Static

from llmgw.common import printable
from llmgw.console.feeds import EventFeed, ViewsModel
from llmgw.console.format import styled
from llmgw.console.screens.modals import HelpScreen
from llmgw.console.state import Connection
from llmgw.console.widgets.filter_box import FilterBox, FilteredScreen
from llmgw.console.widgets.header import ConnectionBanner
from llmgw.console.widgets.keyed_table import KeyedTable
from llmgw.console.widgets.widths import fill_width
from llmgw.present import STYLE, Meaning, duration, repeats, timestamp
from llmgw.wire import EventReason, EventView

MESSAGE_MIN = 24
OBJECT_MIN = 16

# What each reason says about the fleet, in the shared colours.
REASON_MEANING: dict[EventReason, Meaning] = {
    EventReason.PLACED: Meaning.STARTING,
    EventReason.STAND_IN: Meaning.MOVING,
    EventReason.MOVED: Meaning.MOVING,
    EventReason.ROLLOUT: Meaning.MOVING,
    EventReason.ROLLOUT_STALLED: Meaning.BROKEN,
    EventReason.DRAIN_FORCED: Meaning.ATTENTION,
    EventReason.DRAINED: Meaning.ATTENTION,
    EventReason.GPU_FAULT: Meaning.BROKEN,
    EventReason.BACK_OFF: Meaning.ATTENTION,
    EventReason.NODE_LOST: Meaning.BROKEN,
    EventReason.UNPLACEABLE: Meaning.BROKEN,
    EventReason.STOPPED: Meaning.MUTED,
}


def matches(event: EventView, words: list[str]) -> bool:
    """Every word is in the event's object, reason or message (case-insensitive)."""
    hay = f"{event.object} {event.reason} {event.message}".lower()
    return all(word in hay for word in words)


class EventsTable(KeyedTable):
    """One row per event, keyed by its id; MESSAGE takes the width that is left."""

    def on_mount(self) -> None:
        for key, title, width in (
            ("age", "AGE", 6),
            ("reason", "REASON", None),
            ("object", "OBJECT", None),
            ("message", "MESSAGE", None),
        ):
            self.add_column(title, key=key, width=width)

    def show(self, shown: Iterable[EventView], now: float) -> None:
        follow = self.cursor_row >= self.row_count - 1  # on the newest: keep following
        rows = {str(e.id): event_cells(e, now) for e in shown}
        self.sync(rows)
        if follow and self.row_count:
            self.move_cursor(row=self.row_count - 1)
        self.fit()

    def on_resize(self) -> None:
        super().on_resize()
        self.fit()

    def fit(self) -> None:
        fill_width(self, rest="message", rest_min=MESSAGE_MIN, give="object", give_min=OBJECT_MIN)


def event_cells(e: EventView, now: float) -> tuple[Text, ...]:
    """AGE is since the last time; a counted event's message starts `(x12 over 2h13m)`."""
    message = styled(printable(e.message))
    counted = repeats(e)
    if counted:
        message = Text.assemble((f"({counted}) ", "dim"), message)
    return (
        styled(duration(max(0.0, now - e.at)), "dim"),
        styled(e.reason, STYLE[REASON_MEANING.get(e.reason, Meaning.MUTED)]),
        styled(printable(e.object)),
        message,
    )


def event_text(e: EventView) -> Text:
    """The event under the cursor, whole: its message wraps instead of being cut."""
    text = Text()
    text.append(timestamp(e.at), style="dim")
    text.append(f"  {printable(e.object)}  ", style="bold")
    text.append(str(e.reason), style=STYLE[REASON_MEANING.get(e.reason, Meaning.MUTED)])
    if e.count > 1 and e.first_at is not None:
        text.append(f"  {repeats(e)}, first {timestamp(e.first_at)}", style="dim")
    text.append("\n" + printable(e.message, keep_lines=True))
    return text


class EventsScreen(FilteredScreen):
    # Priority: acted on as the key is read (see console/keys.py); while the
    # filter box has focus check_action turns them off, so its letters stay text.
    BINDINGS = [
        Binding("escape", "back", "Back", priority=True),
        Binding("slash", "filter", "Filter", priority=True),
        Binding("question_mark", "help", "Help", priority=True),
    ]

    def __init__(self, obj: str | None = None) -> None:
        super().__init__()
        self.obj = obj  # node/NAME or model/NAME; None: every event
        self.filter_text = ""
        self._detail: Text | None = None

    @property
    def model(self) -> ViewsModel:
        return cast(ViewsModel, self.app)

    def compose(self) -> ComposeResult:
        yield ConnectionBanner(id="banner")
        with Vertical(id="events-pane", classes="pane"):
            yield FilterBox(
                "/ filter: words match object, reason, message",
                on_text=self._filter_to,
                back_to=lambda: self.table,
            )
            yield EventsTable(id="events")
        yield Static(id="event-detail", classes="cursor-detail")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(EventsTable)
        if self.obj is not None:
            table.set_widths({"object": 0})  # every row's: said once, in the title
        table.focus()
        self._title()
        self.watch(self.app, "event_feed", self.show_feed)
        self.watch(self.app, "connection", self.show_connection)
        self.set_interval(1.0, self.tick)  # ages move with the clock between fetches

    @property
    def table(self) -> EventsTable:
        return self.query_one(EventsTable)

    # -- data in --------------------------------------------------------------

    def show_feed(self, feed: EventFeed | None = None) -> None:
        feed = feed if feed is not None else self.model.event_feed
        if feed is None or feed.obj != self.obj:
            return
        words = self.filter_text.lower().split()
        shown = [e for e in feed.events if matches(e, words)] if words else feed.events
        with self.app.batch_update():
            self.table.show(shown, self.model.clock())
            self._title(feed)
            self._show_detail()

    def tick(self) -> None:
        self.show_feed()

    def show_connection(self, conn: Connection) -> None:
        self.query_one(ConnectionBanner).show(conn, self.model.fleet, self.model.clock())
        self.set_class(not conn.healthy, "-stale")

    def _title(self, feed: EventFeed | None = None) -> None:
        pane = self.query_one("#events-pane")
        pane.border_title = f"Events of {printable(self.obj)}" if self.obj else "Events"
        if feed is None or not feed.loaded:
            pane.border_subtitle = feed.error if feed and feed.error else "loading…"
            return
        parts = [f"{self.table.row_count}/{len(feed.events)}"]
        if not feed.events:
            parts = ["none kept: the controller decided nothing by itself lately"]
        if self.filter_text:
            parts.append(f"filter: {self.filter_text}")
        if feed.error:
            parts.append(f"not updated: {feed.error}")
        pane.border_subtitle = " · ".join(parts)

    def _show_detail(self) -> None:
        feed = self.model.event_feed
        key = self.table.cursor_key
        event = None
        if feed is not None and key is not None:
            event = next((e for e in reversed(feed.events) if str(e.id) == key), None)
        text = event_text(event) if event is not None else Text("")
        if text != self._detail:
            self._detail = text
            detail = self.query_one("#event-detail", Static)
            detail.update(text)
            detail.set_class(event is not None, "-visible")

    @on(KeyedTable.RowHighlighted, "#events")
    def _row_highlighted(self) -> None:
        self._show_detail()

    # -- the filter box, its keys acted on in place (FilteredScreen) --------------

    def _filter_to(self, text: str) -> None:
        self.filter_text = text
        self.show_feed()

    # -- keys --------------------------------------------------------------------

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(self.model.readonly, self.model.about))
