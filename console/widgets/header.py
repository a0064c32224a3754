"""The header totals line and the connection banner."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import events
from textual.widgets import Static

from llmgw.console.state import Connection, FleetView, Link, next_step
from llmgw.present import duration, style_of

LINK_STYLE = {
    Link.CONNECTING: ("◌ connecting", "yellow"),
    Link.LIVE: ("● live", "bold green"),
    Link.LOST: ("✗ unreachable", "bold red"),
    Link.ERROR: ("! error", "bold red"),
}


def _part(text: Text, label: str, n: int, style: str, zeros: bool) -> None:
    if n or zeros:
        text.append(f" {n}", style=style if n else "dim")
        text.append(f" {label}", style="dim" if not n else "")


def _fitted(build: Callable[[bool], Text], width: int) -> Text:
    """The line in full, or without what can go (zero counts, labels) where it
    would not fit."""
    line = build(True)
    return build(False) if width and line.cell_len > width else line


class FleetHeader(Static):
    """Three lines: where we are connected (and the gateway, when known) and
    how fresh; the nodes; the models and replicas. Each fits 80 columns."""

    _last: Text | None = None
    _shown: tuple[FleetView | None, Connection, float, str, bool, str] | None = None

    def show(
        self,
        fleet: FleetView | None,
        conn: Connection,
        now: float,
        url: str,
        ro: bool,
        gateway: str = "",
    ) -> None:
        self._shown = (fleet, conn, now, url, ro, gateway)
        text = self.render_text(fleet, conn, now, url, ro, gateway, self.size.width)
        if text != self._last:
            self._last = text
            # Fixed height: a repaint, never a re-layout of 2,000 rows below.
            self.update(text, layout=False)

    def on_resize(self, event: events.Resize) -> None:
        # Fitted to the width it has: a fleet shown before the first layout (width 0)
        # was drawn whole, and stayed so until the next tick.
        if self._shown is not None:
            self.show(*self._shown)

    @staticmethod
    def render_text(
        fleet: FleetView | None,
        conn: Connection,
        now: float,
        url: str,
        readonly: bool,
        gateway: str = "",
        width: int = 0,
    ) -> Text:
        def where(full: bool) -> Text:
            top = Text(no_wrap=True, overflow="ellipsis")
            top.append(" llmgw ", style="bold reverse")
            top.append(f" {url} ", style="bold")
            label, style = LINK_STYLE[conn.link]
            top.append(label, style=style)
            if fleet is not None:
                age = max(0.0, now - fleet.fetched_at)
                stale = not conn.healthy
                top.append("  data " if full else " · ", style="dim")
                top.append(
                    f"{duration(age)} old" + (" · STALE" if stale else ""),
                    style="bold red" if stale else ("yellow" if age > 3 else "green"),
                )
            if readonly:
                top.append("  READ-ONLY" if full else " READ-ONLY", style="bold blue")
            if gateway:  # whoever started the console knows it (the demo does)
                top.append("  │ gateway " if full else " │ gateway ", style="bold")
                top.append(gateway)
            return top

        top = _fitted(where, width)
        lines = Text("\n", no_wrap=True, overflow="ellipsis")
        if fleet is None:
            wait = Text(" waiting for the first answer from the controller…", style="dim")
            return lines.join([top, wait])
        s = fleet.summary
        # Cordoned by llmgw until `ctl credentials approve`: counted among the
        # cordoned, and named, as nothing else says why they take no work.
        awaiting = sum(1 for row in fleet.nodes.values() if row.admin.awaiting_approval)

        def nodes(zeros: bool) -> Text:
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append(" nodes", style="bold")
            line.append(f" {s.nodes.total}:")
            _part(line, "ready", s.nodes.ready, style_of("ready"), zeros)
            _part(line, "cordoned", s.nodes.cordoned, style_of("cordoned"), zeros)
            _part(line, "draining", s.nodes.draining, style_of("draining"), zeros)
            _part(line, "unreachable", s.nodes.unreachable, style_of("unreachable"), zeros)
            if awaiting:
                line.append(f" · {awaiting} awaiting approval", style="bold yellow")
            return line

        def models_and_replicas(zeros: bool) -> Text:
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append(" models", style="bold")
            line.append(f" {s.models.total}:")
            _part(line, "satisfied", s.models.satisfied, style_of("satisfied"), zeros)
            _part(line, "short", s.models.short, style_of("short"), zeros)
            r = s.replicas
            line.append("  │ replicas", style="bold")
            line.append(f" {r.ready + r.starting + r.draining + r.failed}:")
            _part(line, "ready", r.ready, style_of("ready"), zeros)
            _part(line, "starting", r.starting, style_of("starting"), zeros)
            _part(line, "draining", r.draining, style_of("draining"), zeros)
            _part(line, "failed", r.failed, style_of("failed"), zeros)
            return line

        # Never wrap: a wrapped line would push the totals out of sight.
        return lines.join([top, _fitted(nodes, width), _fitted(models_and_replicas, width)])


class ConnectionBanner(Static):
    """Shown only while the controller is not answering (CSS class `-visible`)."""

    def show(self, conn: Connection, fleet: FleetView | None, now: float) -> None:
        visible = conn.link in (Link.LOST, Link.ERROR)
        self.set_class(visible, "-visible")
        if not visible:
            return
        what = "Controller unreachable" if conn.link == Link.LOST else "Controller error"
        text = Text(no_wrap=False)
        text.append(f" ⚠ {what}: ", style="bold")
        text.append(conn.message)
        text.append(
            f"\n   Retrying in {duration(max(0.0, (conn.retry_at or now) - now))}"
            f" (attempt {conn.failures + 1}). ",
        )
        if fleet is not None:
            text.append(
                f"Showing the last data, from {duration(now - fleet.fetched_at)} ago: it is stale. "
            )
        else:
            text.append("Nothing fetched yet. ")
        text.append(next_step(conn))
        if text != self._last:
            self._last = text
            self.update(text, layout=False)  # fixed height in app.tcss

    _last: Text | None = None
