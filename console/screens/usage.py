"""The usage view (`t`): requests and tokens per tenant and model over a window the
operator switches (`w`: 1h, 24h, 7d), in the columns `ctl usage` prints. Sorted as
the nodes table is (shift+letter, again reverses; `s` steps), filtered with `/`.
Read-only: it only reads `GET /v1/usage`, which the app fetches while it is open."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Footer, Static

from llmgw.common import printable
from llmgw.console.feeds import USAGE_WINDOWS, UsageView, UsageWindowChosen, ViewsModel
from llmgw.console.format import styled
from llmgw.console.screens.modals import HelpScreen
from llmgw.console.state import Connection
from llmgw.console.widgets.filter_box import FilterBox, FilteredScreen
from llmgw.console.widgets.header import ConnectionBanner
from llmgw.console.widgets.keyed_table import KeyedTable
from llmgw.console.widgets.widths import fill_width
from llmgw.present import STYLE, Meaning
from llmgw.wire import UsageRow

# At 80 columns every count stays in view: the names give up their tails first
# (the row under the cursor is shown whole below the table).
MODEL_MIN = 15
TENANT_MIN = 10


@dataclass(frozen=True)
class UsageSort:
    label: str  # the column's key
    title: str
    key: Callable[[UsageRow], Any]
    letter: str  # shift+letter sorts by this column, as in k9s
    descending: bool = False  # most first: the header's arrow points down


def _count(field: str) -> Callable[[UsageRow], Any]:
    return lambda r: (-getattr(r, field), r.tenant.lower(), r.model.lower())


# (key, title, width): the titles `ctl usage` prints (COMPLETION cut to COMPL, so
# that 80 columns hold them all); None width: sized to content. Counts are at most
# 6 cells (count_text), right-aligned in a width that leaves room for the sort arrow.
COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("tenant", "TENANT", None),
    ("model", "MODEL", None),
    ("requests", "REQUESTS", 9),
    ("prompt_tokens", "PROMPT", 7),
    ("completion_tokens", "COMPL", 7),
    ("errors", "ERRORS", 7),
    ("rate_limited", "LIMITED", 8),
)
SORTS: tuple[UsageSort, ...] = (
    UsageSort("tenant", "tenant", lambda r: (r.tenant.lower(), r.model.lower()), "T"),
    UsageSort("model", "model", lambda r: (r.model.lower(), r.tenant.lower()), "M"),
    UsageSort("requests", "requests", _count("requests"), "R", True),
    UsageSort("prompt_tokens", "prompt tokens", _count("prompt_tokens"), "P", True),
    UsageSort("completion_tokens", "completion tokens", _count("completion_tokens"), "C", True),
    UsageSort("errors", "errors", _count("errors"), "E", True),
    UsageSort("rate_limited", "rate-limited (429)", _count("rate_limited"), "L", True),
)
BY_LABEL = {s.label: s for s in SORTS}
DEFAULT_SORT = "requests"  # who used the fleet most, first


def row_key(r: UsageRow) -> str:
    # A space is in neither a tenant's name nor a model's: the key is one row's.
    return f"{r.tenant} {r.model}"


def count_text(n: int) -> str:
    """Exact below 100,000 (`84,210`), then three figures (`312k`, `19.6M`): at most 6."""
    if n < 100_000:
        return f"{n:,}"
    value = float(n)
    for unit in ("k", "M", "G", "T", "P"):
        value /= 1000
        if value < 999.5 or unit == "P":
            return f"{value:.1f}{unit}" if value < 99.95 else f"{value:.0f}{unit}"
    raise AssertionError("unreachable")


def usage_cells(r: UsageRow) -> tuple[Text, ...]:
    def count(field: str, width: int, meaning: Meaning | None = None) -> Text:
        value = int(getattr(r, field))
        style = "dim" if not value else (STYLE[meaning] if meaning else "")
        return styled(count_text(value).rjust(width - 1), style)

    widths = {key: width for key, _, width in COLUMNS}
    return (
        styled(printable(r.tenant) or "*", "bold"),
        styled(printable(r.model) or "*"),
        count("requests", widths["requests"] or 0),
        count("prompt_tokens", widths["prompt_tokens"] or 0),
        count("completion_tokens", widths["completion_tokens"] or 0),
        count("errors", widths["errors"] or 0, Meaning.BROKEN),
        count("rate_limited", widths["rate_limited"] or 0, Meaning.ATTENTION),
    )


def usage_text(r: UsageRow, window: str) -> Text:
    """The row under the cursor, exact: every count in full, with its unit."""
    text = Text()
    text.append(printable(r.tenant), style="bold")
    text.append(f" on {printable(r.model)}, the last {window}: ", style="dim")
    text.append(
        f"{r.requests:,} requests, {r.prompt_tokens:,} prompt and"
        f" {r.completion_tokens:,} completion tokens"
        f" ({r.prompt_tokens + r.completion_tokens:,} in all)"
    )
    if r.errors:
        text.append(f", {r.errors:,} {_plural(r.errors, 'error')}", style=STYLE[Meaning.BROKEN])
    if r.rate_limited:
        text.append(
            f", {r.rate_limited:,} refused over a limit (429)", style=STYLE[Meaning.ATTENTION]
        )
    return text


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def matches(r: UsageRow, words: list[str]) -> bool:
    """Every word is in the tenant's or the model's name (case-insensitive)."""
    hay = f"{r.tenant} {r.model}".lower()
    return all(word in hay for word in words)


class UsageTable(KeyedTable):
    """One row per (tenant, model), keyed by both; MODEL takes the width that is left."""

    sort_label = DEFAULT_SORT
    reverse = False

    def on_mount(self) -> None:
        for key, title, width in COLUMNS:
            self.add_column(title, key=key, width=width, cut_middle=key == "model")
        self._label_sort_column()

    def show(self, rows: Iterable[UsageRow]) -> None:
        sort = BY_LABEL[self.sort_label]
        ordered = sorted(rows, key=sort.key, reverse=self.reverse)
        self.sync({row_key(r): usage_cells(r) for r in ordered})
        self.fit()

    def sort_by(self, label: str) -> UsageSort:
        """Sort by one column; again on the same column: reverse."""
        self.reverse = not self.reverse if label == self.sort_label else False
        self.sort_label = label
        self._label_sort_column()
        return BY_LABEL[label]

    def next_sort(self) -> UsageSort:
        labels = [s.label for s in SORTS]
        label = labels[(labels.index(self.sort_label) + 1) % len(labels)]
        self.sort_label, self.reverse = label, False
        self._label_sort_column()
        return BY_LABEL[label]

    def _label_sort_column(self) -> None:
        sort = BY_LABEL[self.sort_label]
        arrow = "▼" if sort.descending != self.reverse else "▲"
        for key, title, _ in COLUMNS:
            self.set_column_label(key, f"{title}{arrow}" if key == sort.label else title)

    def on_resize(self) -> None:
        super().on_resize()
        self.fit()

    def fit(self) -> None:
        fill_width(self, rest="model", rest_min=MODEL_MIN, give="tenant", give_min=TENANT_MIN)


class UsageScreen(FilteredScreen):
    # Priority: acted on as the key is read (see console/keys.py); while the filter
    # box has focus check_action turns them off, so its letters stay text.
    BINDINGS = [
        Binding("escape", "back", "Back", priority=True),
        Binding("w", "window", "Window", priority=True),
        Binding("slash", "filter", "Filter", priority=True),
        Binding("s", "sort", "Sort", priority=True),
        *(
            Binding(sort.letter, f"sort_by('{sort.label}')", show=False, priority=True)
            for sort in SORTS
        ),
        Binding("question_mark", "help", "Help", priority=True),
    ]

    def __init__(self, window: str) -> None:
        super().__init__()
        self.window = window
        self.filter_text = ""
        self._detail: Text | None = None

    @property
    def model(self) -> ViewsModel:
        return cast(ViewsModel, self.app)

    @property
    def table(self) -> UsageTable:
        return self.query_one(UsageTable)

    def compose(self) -> ComposeResult:
        yield ConnectionBanner(id="banner")
        with Vertical(id="usage-pane", classes="pane"):
            yield FilterBox(
                "/ filter: words match tenant, model",
                on_text=self._filter_to,
                back_to=lambda: self.table,
            )
            yield UsageTable(id="usage")
        yield Static(id="usage-detail", classes="cursor-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#usage-pane").border_title = self._title()
        self.query_one("#usage-pane").border_subtitle = f"loading the last {self.window}…"
        self.table.focus()
        self.watch(self.app, "usage_view", self.show_view)
        self.watch(self.app, "connection", self.show_connection)

    def _title(self) -> str:
        windows = " ".join(f"[{w}]" if w == self.window else w for w in USAGE_WINDOWS)
        return f"Usage per tenant and model · {windows}"

    # -- data in --------------------------------------------------------------

    def show_view(self, view: UsageView | None = None) -> None:
        view = view if view is not None else self.model.usage_view
        pane = self.query_one("#usage-pane")
        pane.border_title = self._title()
        if view is None or view.window != self.window or not view.loaded:
            why = view.error if view is not None and view.window == self.window else None
            pane.border_subtitle = why or f"loading the last {self.window}…"
            return
        words = self.filter_text.lower().split()
        rows = [r for r in view.rows if matches(r, words)] if words else view.rows
        with self.app.batch_update():
            self.table.show(rows)
            self._show_detail()
        requests = sum(r.requests for r in rows)
        tokens = sum(r.prompt_tokens + r.completion_tokens for r in rows)
        parts = [f"{len(rows)}/{len(view.rows)}"]
        if view.rows:
            parts.append(f"{count_text(requests)} requests, {count_text(tokens)} tokens")
        else:
            parts = [f"nothing metered in the last {self.window}"]
        if self.filter_text:
            parts.append(f"filter: {self.filter_text}")
        if view.error:
            parts.append(f"not updated: {view.error}")
        pane.border_subtitle = " · ".join(parts)

    def show_connection(self, conn: Connection) -> None:
        self.query_one(ConnectionBanner).show(conn, self.model.fleet, self.model.clock())
        self.set_class(not conn.healthy, "-stale")

    def _show_detail(self) -> None:
        view, key = self.model.usage_view, self.table.cursor_key
        row = None
        if view is not None and key is not None:
            row = next((r for r in view.rows if row_key(r) == key), None)
        text = usage_text(row, self.window) if row is not None else Text("")
        if text != self._detail:
            self._detail = text
            detail = self.query_one("#usage-detail", Static)
            detail.update(text)
            detail.set_class(row is not None, "-visible")

    @on(KeyedTable.RowHighlighted, "#usage")
    def _row_highlighted(self) -> None:
        self._show_detail()

    # -- the filter box, its keys acted on in place (FilteredScreen) --------------

    def _filter_to(self, text: str) -> None:
        self.filter_text = text
        self.show_view()

    # -- keys --------------------------------------------------------------------

    def action_window(self) -> None:
        """`w`: the next window (1h, 24h, 7d); the rows of the last stay until it answers."""
        self.window = USAGE_WINDOWS[(USAGE_WINDOWS.index(self.window) + 1) % len(USAGE_WINDOWS)]
        self.post_message(UsageWindowChosen(self.window))
        self.show_view()

    def action_sort(self) -> None:
        sort = self.table.next_sort()
        self.show_view()
        self.notify(f"Usage sorted by {sort.title}", timeout=1.5)

    def action_sort_by(self, label: str) -> None:
        sort = self.table.sort_by(label)
        self.show_view()
        order = " reversed" if self.table.reverse else ""
        self.notify(f"Usage sorted by {sort.title}{order}", timeout=1.5)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(self.model.readonly, self.model.about))
