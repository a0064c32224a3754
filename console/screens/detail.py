"""Node detail: GPUs with health, storage with what was and was not counted,
replicas, and the cordon/drain history. Fetched by the app's poll loop while
this screen is open, patched in place like the main screen."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static

from llmgw.console.feeds import EventsWanted
from llmgw.console.format import node_state_text, plural, size_text, state_text, styled
from llmgw.console.screens.actions import ADMIN_BINDINGS, AdminActions, NodeScreen
from llmgw.console.state import Connection, NodeView
from llmgw.console.widgets.header import ConnectionBanner
from llmgw.console.widgets.keyed_table import KeyedTable
from llmgw.present import duration, force_at_words, timestamp
from llmgw.wire import (
    AdminEvent,
    AdminFlag,
    GpuHealth,
    GpuReport,
    NodeDetail,
    NodeRow,
    ReplicaReport,
    StorageLocation,
    StorageScope,
)


class FittedTable(KeyedTable):
    """A detail table that fits the pane's width: columns in DROP_ORDER are hidden
    first when the terminal is narrow, and the FILL column (the last, free text)
    takes what is left, cut with an ellipsis at the pane's edge."""

    DROP_ORDER: tuple[str, ...] = ()
    FILL = ""

    def on_resize(self) -> None:
        super().on_resize()
        self.fit()

    def fit(self) -> None:
        total = (self.size.width or self.app.size.width - 2) - 1  # less the scrollbar
        natural = {
            key: max(column.content_width, column.label.cell_len) + 2
            for key, column in self.columns.items()
        }
        shown = list(natural)
        for key in self.DROP_ORDER:
            if sum(natural[k] for k in shown) <= total:
                break
            shown.remove(key)
        widths: dict[str, int | None] = {k: None if k in shown else 0 for k in natural}
        rest = total - sum(natural[k] for k in shown if k != self.FILL) - 2
        if rest < natural[self.FILL] - 2:
            widths[self.FILL] = max(6, rest)
        self.set_widths(widths)


class GpusTable(FittedTable):
    BORDER_TITLE = "GPUs"
    # HEALTH and REASON, the columns one opens the detail for, always show.
    DROP_ORDER = ("use", "util", "mem", "uuid")
    FILL = "why"

    def on_mount(self) -> None:
        for key, title in (
            ("idx", "#"),
            ("uuid", "UUID"),
            ("class", "CLASS"),
            ("mem", "MEMORY"),
            ("util", "UTIL"),
            ("use", "IN USE"),
            ("health", "HEALTH"),
            ("why", "REASON"),
        ):
            self.add_column(title, key=key)

    def show(self, gpus: list[GpuReport]) -> None:
        self.sync({g.uuid: self._row_cells(g) for g in sorted(gpus, key=lambda g: g.index)})
        self.fit()  # a longer reason or UUID may not fit any more

    @staticmethod
    def _row_cells(g: GpuReport) -> tuple[Text, ...]:
        used = g.memory_used_mib
        mem = (
            f"{(used or 0) / 1024:.0f}/{g.memory_total_mib / 1024:.0f}G"
            if used is not None
            else "?"
        )
        util = "?" if g.utilization_pct is None else f"{g.utilization_pct}%"
        return (
            styled(g.index),
            styled(g.uuid, "dim"),
            styled(g.gpu_class),
            styled(mem),
            styled(util, "yellow" if (g.utilization_pct or 0) > 50 else ""),
            styled("yes" if g.in_use else "no", "bold" if g.in_use else "dim"),
            state_text(g.health),
            styled(g.health_reason or "", "red" if g.health != GpuHealth.HEALTHY else "dim"),
        )


class ReplicasTable(FittedTable):
    BORDER_TITLE = "Replicas on this node"
    # REPLICA, MODEL, STATE and ERROR always show.
    DROP_ORDER = ("port", "rank", "gpus", "idle")
    FILL = "error"

    def on_mount(self) -> None:
        for key, title in (
            ("id", "REPLICA"),
            ("model", "MODEL"),
            ("rank", "RANK"),
            ("state", "STATE"),
            ("gpus", "GPUS"),
            ("port", "PORT"),
            ("idle", "IDLE"),
            ("error", "ERROR"),
        ):
            self.add_column(title, key=key)

    def show(self, replicas: list[ReplicaReport]) -> None:
        self.sync({r.id: self._row_cells(r) for r in replicas})
        self.fit()

    @staticmethod
    def _row_cells(r: ReplicaReport) -> tuple[Text, ...]:
        return (
            styled(r.id, "bold"),
            styled(r.model),
            styled(r.rank),
            state_text(r.state),
            styled(len(r.gpus)),
            styled(r.port if r.port else "-"),
            styled(duration(r.idle_seconds) if r.idle_seconds is not None else "unknown", "dim"),
            styled(r.error or "", "red"),
        )


class HistoryTable(FittedTable):
    BORDER_TITLE = "Cordon / drain history"
    # Every column stays; a long reason is cut at the pane's edge (`ctl node` has it whole).
    FILL = "reason"

    def on_mount(self) -> None:
        for key, title in (
            ("at", "WHEN"),
            ("action", "ACTION"),
            ("by", "BY"),
            ("reason", "REASON"),
        ):
            self.add_column(title, key=key)

    def show(self, events: list[AdminEvent]) -> None:
        # Listed as the controller sends them, newest first (as `ctl node`);
        # keyed by position from the oldest so keys stay stable as events arrive.
        n = len(events)
        self.sync({str(n - i): self._row_cells(e) for i, e in enumerate(events)})
        self.fit()  # a longer reason may not fit any more

    @staticmethod
    def _row_cells(e: AdminEvent) -> tuple[Text, ...]:
        return (
            styled(timestamp(e.at)),
            state_text(e.action),
            styled(e.by),
            styled(e.reason or "", ""),
        )


def storage_text(detail: NodeDetail) -> Text:
    text = Text()
    if not detail.storage_configured:
        text.append(
            "Storage observation is off for this node: its agent was told no\n"
            "directories to look in. It ranks like a node that found nothing.",
            style="dim",
        )
        return text
    if not detail.storage:
        text.append("No storage locations reported.", style="dim")
    for n, loc in enumerate(detail.storage):
        if n:
            text.append("\n")
        _location(text, loc)
    text.rstrip()
    return text


def _location(text: Text, loc: StorageLocation) -> None:
    text.append(loc.path, style="bold")
    text.append(f"  {loc.fs_type or '?'}  ")
    scope_style = "bold blue" if loc.scope == StorageScope.SHARED else "green"
    text.append(loc.scope.upper(), style=scope_style)
    if loc.scope_overridden:
        text.append(" (set by operator)", style="dim")
    if loc.mount_source:
        text.append(f"  {loc.mount_source}", style="dim")
    text.append(f"  {plural(len(loc.models), 'model')}\n")
    if loc.error:
        text.append(f"  ✗ {loc.error}\n", style="bold red")
    for m in loc.models:
        text.append("  ✓ ", style="green")
        text.append(m.name, style="bold")
        text.append(
            f"  {size_text(m.size_bytes)}, {plural(m.files, 'file')}, {m.format}\n", style="dim"
        )
    for bad in loc.incomplete:
        text.append("  ✗ ", style="yellow")
        text.append(bad.name)
        text.append(f"  not counted: {bad.reason}\n", style="yellow")


def title_text(
    name: str, row: NodeRow | None, detail: NodeDetail | None, error: str | None
) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f" {name} ", style="bold reverse")
    if row is not None:
        text.append(" ")
        text.append_text(node_state_text(row))
        if row.admin.reason:
            text.append(f"  “{row.admin.reason}”", style="yellow")
            text.append(f" by {row.admin.by or '?'} at {timestamp(row.admin.at)}", style="dim")
        if row.admin.force_at is not None and row.admin.flag == AdminFlag.DRAINING:
            text.append(f"  {force_at_words(row.admin.force_at)}", style="bold magenta")
        if row.drain_blocked:
            text.append(f"  ⚠ drain blocked: {row.drain_blocked}", style="bold red")
    if detail is not None:
        text.append(f"\n agent {detail.agent_version or '?'}", style="dim")
        text.append(f"  address {detail.address or '?'}", style="dim")
        if detail.row.report_age_s is not None:
            text.append(f"  last report {duration(detail.row.report_age_s)} ago", style="dim")
        if detail.row.fabrics:
            text.append("  fabrics ", style="dim").append(", ".join(detail.row.fabrics), "cyan")
        if detail.row.gpu_error:
            text.append(f"  GPUs: {detail.row.gpu_error}", style="red")
    if error:
        text.append(f"\n {error}", style="bold red")
    elif detail is None:
        text.append("\n loading…", style="dim")
    return text


class NodeDetailScreen(NodeScreen):
    # Priority: acted on as the key is read (see console/keys.py).
    BINDINGS = [
        Binding("escape", "back", "Back", priority=True),
        Binding("question_mark", "help", "Help", priority=True),
        Binding("e", "events", "Events", show=False, priority=True),
    ]

    def __init__(self, name: str) -> None:
        super().__init__()
        self.node_name = name
        self._texts: dict[str, Text] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        yield ConnectionBanner(id="banner")
        with VerticalScroll(id="detail-body"):
            yield GpusTable(id="detail-gpus", classes="pane")
            yield Static(id="detail-storage", classes="pane")
            yield ReplicasTable(id="detail-replicas", classes="pane")
            yield HistoryTable(id="detail-history", classes="pane")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#detail-storage").border_title = "Storage: weights found and not counted"
        self.watch(self.app, "node_view", self.show_view)
        self.watch(self.app, "connection", self.show_connection)

    def show_connection(self, conn: Connection) -> None:
        self.query_one(ConnectionBanner).show(conn, self.model.fleet, self.model.clock())
        self.set_class(not conn.healthy, "-stale")

    def show_view(self, view: NodeView | None) -> None:
        if view is None or view.name != self.node_name:
            return
        detail = view.detail
        row = detail.row if detail else self.row()
        self._update_if_changed(
            "#detail-title", title_text(self.node_name, row, detail, view.error)
        )
        if detail is not None:
            with self.app.batch_update():
                self.query_one(GpusTable).show(detail.gpus)
                self._update_if_changed("#detail-storage", storage_text(detail))
                replicas = self.query_one(ReplicasTable)
                replicas.show(detail.replicas)
                replicas.border_subtitle = "" if detail.replicas else "none running here"
                history = self.query_one(HistoryTable)
                history.show(detail.history)
                history.border_subtitle = "" if detail.history else "never cordoned or drained"
                gpus = self.query_one(GpusTable)
                bad = sum(1 for g in detail.gpus if g.health != GpuHealth.HEALTHY)
                gpus.border_subtitle = f"{len(detail.gpus)} cards" + (
                    f", {bad} not healthy" if bad else ""
                )
        self.update_footer()

    def _update_if_changed(self, selector: str, text: Text) -> None:
        # Statics re-layout the screen on update: skip the ones that did not change.
        if self._texts.get(selector) != text:
            self._texts[selector] = text
            self.query_one(selector, Static).update(text)

    def row(self) -> NodeRow | None:
        view = self.model.node_view
        if view is not None and view.detail is not None and view.name == self.node_name:
            return view.detail.row
        fleet = self.model.fleet
        return fleet.nodes.get(self.node_name) if fleet else None

    def targets(self) -> list[NodeRow]:
        row = self.row()
        return [row] if row else []

    def action_events(self) -> None:
        self.post_message(EventsWanted(f"node/{self.node_name}"))

    def action_back(self) -> None:
        self.dismiss(None)  # the app's callback stops fetching this node


class AdminNodeDetailScreen(AdminActions, NodeDetailScreen):
    BINDINGS = ADMIN_BINDINGS
