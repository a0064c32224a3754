"""GPU classes as nvitop-style stacked bars, one small widget per class."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from llmgw.console.format import (
    BAR_FREE,
    BAR_UNHEALTHY,
    BAR_UNKNOWN,
    BAR_UNSCHED,
    BAR_USED,
    gpu_segments,
    load_style,
    short_class,
    stacked_bar,
)
from llmgw.wire import GpuClassCounts

MIN_BAR = 4


class GpuClassBar(Widget):
    """Two lines: the class and its numbers, then the bar at the pane's width."""

    counts: reactive[GpuClassCounts | None] = reactive(None)

    def render(self) -> Text:
        c = self.counts
        if c is None:
            return Text()
        width = max(10, self.content_size.width)
        load = c.used / c.total if c.total else 0.0
        numbers = f" {c.used}/{c.total}"
        # The name before the bar: the bar can be short, the memory size must show.
        name = short_class(c.gpu_class, max(4, width - len(numbers) - 1 - MIN_BAR))
        bar_width = max(MIN_BAR, width - len(name) - len(numbers) - 1)
        head = Text(no_wrap=True, overflow="ellipsis", end="")
        head.append(name.ljust(len(name) + 1), style="bold")
        head.append_text(stacked_bar(gpu_segments(c), bar_width))
        head.append(numbers, style=load_style(load))
        counts = Text(no_wrap=True, overflow="ellipsis", end="")
        counts.append(f"  {c.free} free", style="green" if c.free else "dim")
        # Only the buckets that hold cards: the pane is narrow.
        if c.unschedulable:
            counts.append(f" · {c.unschedulable} unsched", style="white")
        if c.unhealthy:
            counts.append(f" · {c.unhealthy} unhealthy", style="bold red")
        if c.unknown:
            counts.append(f" · {c.unknown} unknown", style="magenta")
        return Text("\n", no_wrap=True, end="").join([head, counts])


class GpuClassesPane(VerticalScroll):
    """Adds, updates and removes class bars by class name; never rebuilds."""

    BORDER_TITLE = "GPU classes"

    def compose(self) -> ComposeResult:
        yield Static("no GPUs reported yet", classes="empty")

    def on_mount(self) -> None:
        legend = Text(no_wrap=True)
        for glyph, label, style in (
            (BAR_USED, "used", "green"),
            (BAR_UNHEALTHY, "bad", "bold red"),
            (BAR_UNKNOWN, "unk", "magenta"),
            (BAR_UNSCHED, "unsched", "bright_black"),
            (BAR_FREE, "free", "green dim"),
        ):
            legend.append(f" {glyph}", style=style).append(label, style="dim")
        self.border_subtitle = legend.markup

    def show(self, classes: list[GpuClassCounts]) -> None:
        bars = {bar.name: bar for bar in self.query(GpuClassBar)}
        wanted = {c.gpu_class: c for c in classes}
        for name, bar in bars.items():
            if name not in wanted:
                bar.remove()
        new: list[GpuClassBar] = []
        for name, counts in wanted.items():
            existing = bars.get(name)
            if existing is None:
                existing = GpuClassBar(name=name)
                new.append(existing)
            existing.counts = counts  # reactive: repaints only if it changed
        if new:
            self.mount_all(new)
        self.query_one(".empty").display = not wanted
