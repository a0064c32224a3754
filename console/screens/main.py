"""The main fleet screen: header, summary panes, nodes table."""

from __future__ import annotations

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import Footer

from llmgw.console.feeds import EventsWanted, ModelsWanted, UsageWanted
from llmgw.console.screens.actions import ADMIN_BINDINGS, AdminActions, NodeScreen
from llmgw.console.state import Connection, FleetView
from llmgw.console.widgets.filter_box import FilterBox
from llmgw.console.widgets.gpus import GpuClassesPane
from llmgw.console.widgets.header import ConnectionBanner, FleetHeader
from llmgw.console.widgets.nodes import SORTS, NodesTable
from llmgw.console.widgets.summary import (
    FabricsTable,
    IdleTable,
    TrafficTable,
    UnplaceableList,
    WeightsMatrix,
)
from llmgw.wire import NodeRow


class MainScreen(NodeScreen):
    """Read-only by construction; `AdminMainScreen` adds marks and the admin keys."""

    # Priority bindings: acted on when the app reads the key, in the order
    # typed. (A plain binding waits for its key to bubble up from the table,
    # and keys typed behind it are meanwhile delivered: `g j j c` could cordon
    # the node the cursor was on before the j's.) While the filter box has
    # focus check_action turns them off, so its letters stay text.
    BINDINGS = [
        Binding("enter", "open_detail", "Details", priority=True),
        Binding("slash", "filter", "Filter", priority=True),
        Binding("s", "sort", "Sort", priority=True),
        Binding("S", "reverse_sort", "Reverse", show=False, priority=True),
        # k9s: shift+letter sorts by that column; again reverses.
        *(
            Binding(sort.letter, f"sort_by('{sort.label}')", show=False, priority=True)
            for sort in SORTS
        ),
        Binding("escape", "clear", "Clear", show=False, priority=True),
        Binding("question_mark", "help", "Help", priority=True),
        # Views of their own (console/screens/models.py, events.py, usage.py), in the help.
        Binding("m", "models", "Models", show=False, priority=True),
        Binding("e", "events", "Events", show=False, priority=True),
        Binding("t", "usage", "Usage", show=False, priority=True),
        # Under 34 rows the summary panes take turns (k9s switches views the same way).
        Binding("p", "next_panes", "Panes", priority=True),
    ]

    # The short layout's pages of summary panes, by id: the first is the glance
    # (cards and what cannot be placed); the others need the whole width.
    PANE_PAGES: tuple[tuple[str, ...], ...] = (
        ("gpus", "unplaceable"),
        ("fabrics",),
        ("idle",),
        ("traffic",),
        ("weights",),
    )
    pane_page = 0
    FOOTER_ACTIONS = (*NodeScreen.FOOTER_ACTIONS, "next_panes")

    class DetailRequested(Message):
        """Open the detail of node `name` (the app fetches it while open)."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def compose(self) -> ComposeResult:
        yield FleetHeader(id="header")
        yield ConnectionBanner(id="banner")
        with Grid(id="panes"):
            yield GpuClassesPane(id="gpus", classes="pane")
            yield FabricsTable(id="fabrics", classes="pane")
            yield IdleTable(id="idle", classes="pane")
            yield WeightsMatrix(id="weights", classes="pane")
            yield TrafficTable(id="traffic", classes="pane")
            yield UnplaceableList(id="unplaceable", classes="pane")
        with Vertical(id="nodes-pane", classes="pane"):
            yield FilterBox(
                "/ filter: words match name, state, reason, class, fabric, model",
                on_text=self._filter_to,
                back_to=lambda: self.nodes_table,
            )
            yield NodesTable(id="nodes")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#nodes-pane").border_title = "Nodes"
        self._show_pane_page()
        self.query_one(NodesTable).focus()
        self.watch(self.app, "fleet", self.show_fleet)
        self.watch(self.app, "connection", self.show_connection)
        # Ages on screen move with the clock even between fetches.
        self.set_interval(1.0, self.tick)

    @property
    def nodes_table(self) -> NodesTable:
        return self.query_one(NodesTable)

    # -- data in --------------------------------------------------------------

    def show_fleet(self, fleet: FleetView | None) -> None:
        if fleet is None:
            return
        s = fleet.summary
        with self.app.batch_update():
            self.query_one(GpuClassesPane).show(s.gpus)
            self.query_one(FabricsTable).show(s.fabrics)
            self.query_one(TrafficTable).show(s.traffic)
            self.query_one(IdleTable).show(s.idle_replicas, s.idle_after_s, s.sleeping_replicas)
            self.query_one(WeightsMatrix).show(s)
            self.query_one(UnplaceableList).show(s)
            self.nodes_table.age_offset = max(0.0, self.model.clock() - fleet.fetched_at)
            self.nodes_table.apply(fleet.nodes, fleet.ages, fleet.changed)
            self._title_nodes()
            self.tick()
        self.update_footer()

    def show_connection(self, conn: Connection) -> None:
        self.set_class(not conn.healthy and self.model.fleet is not None, "-stale")
        self.tick()

    def tick(self) -> None:
        app = self.model
        now = app.clock()
        header = self.query_one(FleetHeader)
        # READ-ONLY once the controller has said so, not while it is still asked.
        readonly = app.readonly and app.role_known
        header.show(app.fleet, app.connection, now, app.controller_label, readonly, app.gateway)
        self.query_one(ConnectionBanner).show(app.connection, app.fleet, now)
        if app.fleet is not None:
            self.nodes_table.set_age_offset(max(0.0, now - app.fleet.fetched_at))

    def _title_nodes(self) -> None:
        table = self.nodes_table
        parts = [f"{len(table.shown)}/{len(table.rows_by_name)}"]
        if table.filter_text:
            parts.append(f"filter: {table.filter_text}")
        if table.marks:
            hidden = len(table.hidden_by_filter(table.marks))
            parts.append(f"{len(table.marks)} marked" + (f" ({hidden} hidden)" if hidden else ""))
        pane = self.query_one("#nodes-pane")
        pane.border_title = "Nodes"
        pane.border_subtitle = " · ".join(parts)

    # -- what the admin keys act on ----------------------------------------------

    def targets(self) -> list[NodeRow]:
        """Marked nodes if any, else the one under the cursor."""
        try:
            table = self.nodes_table
        except NoMatches:  # asked by the footer before compose or after unmount
            return []
        if table.marks:
            return [table.rows_by_name[n] for n in sorted(table.marks)]
        row = table.selected
        return [row] if row else []

    def out_of_view(self, names: list[str]) -> list[str]:
        return self.nodes_table.hidden_by_filter(names)

    def acted_on(self, names: list[str]) -> None:
        # The marks were for this action: the next key acts on what is in view.
        if self.nodes_table.marks:
            self.nodes_table.clear_marks()

    # -- keys ------------------------------------------------------------------

    def action_filter(self) -> None:
        self.query_one(FilterBox).open()

    async def take_key(self, event: events.Key) -> bool:
        if not self.typing():
            return False  # the table's and the screen's keys are priority bindings
        return await self.query_one(FilterBox).take_key(event)

    def take_paste(self, text: str) -> bool:
        if not self.typing():
            return False
        self.query_one(FilterBox).take_paste(text)
        return True

    def _filter_to(self, text: str) -> None:
        self.nodes_table.set_filter(text)
        self._title_nodes()
        self.update_footer()

    def action_clear(self) -> None:
        """Escape: first the filter, then the marks."""
        box = self.query_one(FilterBox)
        if box.shown:
            box.clear()
        elif self.nodes_table.marks:
            self.nodes_table.clear_marks()
        self._title_nodes()
        self.update_footer()

    def action_sort(self) -> None:
        sort = self.nodes_table.cycle_sort()
        self.notify(f"Nodes sorted by {sort.title}", timeout=1.5)

    def action_reverse_sort(self) -> None:
        self.nodes_table.cycle_sort(reverse=True)

    def action_sort_by(self, label: str) -> None:
        table = self.nodes_table
        sort = table.sort_by(label)
        order = "reversed" if table.reverse else ""
        hidden = " (column hidden at this width)" if table.columns[label].hidden else ""
        self.notify(f"Nodes sorted by {sort.title} {order}".rstrip() + hidden, timeout=1.5)

    def action_mark(self) -> None:
        table = self.nodes_table
        key = table.cursor_key
        if key is None:
            return
        table.toggle_mark(key)
        # k9s: space marks and moves on, so a run of nodes is quick to mark.
        if table.cursor_row < table.row_count - 1:
            table.move_cursor(row=table.cursor_row + 1)

    def action_next_panes(self) -> None:
        self.pane_page = (self.pane_page + 1) % len(self.PANE_PAGES)
        self._show_pane_page()

    def _show_pane_page(self) -> None:
        """Mark the panes of the page (app.tcss shows only them when short); when
        short, the first pane's title says where the page is in the turn."""
        page = self.PANE_PAGES[self.pane_page]
        short = self.has_class("-short")
        # 80 columns hold every key only without the padding between them.
        self.query_one(Footer).compact = short
        for pane in self.query("#panes > .pane"):
            pane.set_class(pane.id in page, "-page")
            title = str(getattr(type(pane), "BORDER_TITLE", ""))
            if short and pane.id == page[0]:
                title += f" · p {self.pane_page + 1}/{len(self.PANE_PAGES)}"
            pane.border_title = title

    def on_resize(self) -> None:
        # The app sets -short on a resize; read it once it has.
        self.call_after_refresh(self._show_pane_page)
        self.call_after_refresh(self.update_footer)

    def action_models(self) -> None:
        self.post_message(ModelsWanted())

    def action_events(self) -> None:
        self.post_message(EventsWanted())

    def action_usage(self) -> None:
        self.post_message(UsageWanted())

    def action_open_detail(self) -> None:
        row = self.nodes_table.selected
        if row is not None:
            self.post_message(self.DetailRequested(row.name))

    @on(NodesTable.RowSelected, "#nodes")
    def _row_selected(self) -> None:
        self.action_open_detail()

    @on(NodesTable.RowHighlighted, "#nodes")
    def _row_highlighted(self) -> None:
        self.update_footer()

    @on(NodesTable.MarksChanged)
    def _marks_changed(self) -> None:
        self._title_nodes()
        self.update_footer()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if self.typing() and action != "clear":
            return False  # the filter box has the keys (Escape still leaves it)
        if action == "open_detail":
            return bool(self.targets())
        if action == "next_panes":
            return self.has_class("-short")  # a tall terminal shows every pane
        return True


class AdminMainScreen(AdminActions, MainScreen):
    """The main screen with marks and cordon / uncordon / drain."""

    BINDINGS = [Binding("space", "mark", "Mark", priority=True), *ADMIN_BINDINGS]
