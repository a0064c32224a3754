"""The header totals line and the connection banner."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from console.state import Connection, FleetView, Link, next_step
from llmgw.present import duration, style_of

LINK_STYLE = {
    Link.CONNECTING: ("◌ connecting", "yellow"),
    Link.LIVE: ("● live", "bold green"),
    Link.LOST: ("✗ unreachable", "bold red"),
    Link.ERROR: ("! error", "bold red"),
}


def _part(text: Text, label: str, n: int, style: str) -> None:
    text.append(f" {n}", style=style if n else "dim")
    text.append(f" {label}", style="dim" if not n else "")


class FleetHeader(Static):
    """Two lines: where we are connected and how fresh; then fleet totals."""

    _last: Text | None = None

    def show(
        self, fleet: FleetView | None, conn: Connection, now: float, url: str, ro: bool
    ) -> None:
        text = self.render_text(fleet, conn, now, url, ro)
        if text != self._last:
            self._last = text
            # Fixed height: a repaint, never a re-layout of 2,000 rows below.
            self.update(text, layout=False)

    @staticmethod
    def render_text(
        fleet: FleetView | None, conn: Connection, now: float, url: str, readonly: bool
    ) -> Text:
        top = Text(no_wrap=True, overflow="ellipsis")
        top.append(" llmgw ", style="bold reverse")
        top.append(f" {url} ", style="bold")
        label, style = LINK_STYLE[conn.link]
        top.append(label, style=style)
        if fleet is not None:
            age = max(0.0, now - fleet.fetched_at)
            stale = not conn.healthy
            top.append("  data ", style="dim")
            top.append(
                f"{duration(age)} old" + (" · STALE" if stale else ""),
                style="bold red" if stale else ("yellow" if age > 3 else "green"),
            )
        if readonly:
            top.append("  READ-ONLY", style="bold blue")
        if fleet is None:
            wait = Text(" waiting for the first answer from the controller…", style="dim")
            return Text("\n", no_wrap=True, overflow="ellipsis").join([top, wait])
        s = fleet.summary
        top.append("  │ models", style="bold")
        top.append(f" {s.models.total}:")
        _part(top, "satisfied", s.models.satisfied, style_of("satisfied"))
        _part(top, "short", s.models.short, style_of("short"))
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(" nodes", style="bold")
        line.append(f" {s.nodes.total}:")
        _part(line, "ready", s.nodes.ready, style_of("ready"))
        _part(line, "cordoned", s.nodes.cordoned, style_of("cordoned"))
        _part(line, "draining", s.nodes.draining, style_of("draining"))
        _part(line, "unreachable", s.nodes.unreachable, style_of("unreachable"))
        r = s.replicas
        line.append("  │ replicas", style="bold")
        line.append(f" {r.ready + r.starting + r.draining + r.failed}:")
        _part(line, "ready", r.ready, style_of("ready"))
        _part(line, "starting", r.starting, style_of("starting"))
        _part(line, "draining", r.draining, style_of("draining"))
        _part(line, "failed", r.failed, style_of("failed"))
        # Never wrap: a wrapped first line would push the totals out of sight.
        return Text("\n", no_wrap=True, overflow="ellipsis").join([top, line])


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
