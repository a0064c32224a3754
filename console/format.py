"""Console cells: the shared vocabulary (llmgw/present.py) as rich Text, plus
report-age buckets and stacked GPU bars.

Everything here returns `rich.text.Text`, never markup strings: node names,
reasons and model names come from operators and agents, and a reason such as
"[bold]rma" must be shown as typed, not interpreted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.text import Text

from llmgw.present import (
    AGE_OF_ROW,
    STYLE,
    Meaning,
    duration,
    load_meaning,
    node_state_parts,
    style_of,
)
from llmgw.wire import GpuClassCounts, NodeRow

# Colours come from the shared vocabulary (llmgw/present.py): one meaning,
# one style, in ctl and here.
VERDICT_STYLE = {v: style_of(v) for v in ("ok", "below_minimum", "unplaceable")}

# Glyphs of the stacked GPU bar, in the order the segments are drawn.
BAR_USED = "█"
BAR_UNHEALTHY = "✗"
BAR_UNKNOWN = "?"
BAR_UNSCHED = "▒"
BAR_FREE = "░"


def styled(value: object, style: str = "") -> Text:
    return Text(str(value), style=style, no_wrap=True, end="")


def state_text(state: str) -> Text:
    return styled(state.replace("_", " "), style_of(state))


def node_state_text(row: NodeRow, age: float | object | None = AGE_OF_ROW) -> Text:
    """The displayed state, in the words `ctl nodes` uses (`unreachable (cordoned)`).
    `age`: the report age now, where newer than the row's (see node_state_parts)."""
    text = Text(no_wrap=True, end="")
    for words, style in node_state_parts(row, age):
        text.append(words, style=style)
    return text


def size_text(n: int) -> str:
    """Bytes, binary units, one decimal below 10: 512 B, 1.5 MiB, 140 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if value < 10 and unit != "B" else f"{value:.0f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def age_bucket(seconds: float | None) -> tuple[str, str]:
    """Report age as (label, style), quantised so a healthy fleet's rows do not
    change every second.

    Agents report every few seconds, so exact ages would touch every row on
    every refresh; buckets keep the table patch small and still show lateness.
    """
    if seconds is None:
        return "never", STYLE[Meaning.BROKEN]
    if seconds < 10:
        return "<10s", STYLE[Meaning.FINE]
    if seconds < 60:
        return f"{int(seconds) // 10 * 10}s", STYLE[Meaning.ATTENTION]
    return duration(seconds // 60 * 60), STYLE[Meaning.BROKEN]


def age_text(seconds: float | None) -> Text:
    return styled(*age_bucket(seconds))


def load_style(fraction: float) -> str:
    return STYLE[load_meaning(fraction)]


def split_width(counts: Sequence[int], width: int) -> list[int]:
    """Share `width` cells between counts in proportion (largest remainder).

    A non-zero count always gets at least one cell, taken from the largest
    segment: one broken card among two thousand must still be visible.
    """
    total = sum(counts)
    if total <= 0 or width <= 0:
        return [0 for _ in counts]
    exact = [c * width / total for c in counts]
    cells = [int(e) for e in exact]
    by_remainder = sorted(range(len(counts)), key=lambda i: exact[i] - cells[i], reverse=True)
    for i in by_remainder[: width - sum(cells)]:
        cells[i] += 1
    for i, count in enumerate(counts):
        if count and not cells[i]:
            donor = max(range(len(cells)), key=lambda j: cells[j])
            if cells[donor] > 1:
                cells[donor] -= 1
                cells[i] = 1
    return cells


def gpu_segments(c: GpuClassCounts) -> list[tuple[int, str, str]]:
    """(count, glyph, style) of each bar segment; unaccounted cards count as free."""
    load = c.used / c.total if c.total else 0.0
    accounted = c.used + c.unhealthy + c.unknown + c.unschedulable + c.free
    free = c.free + max(0, c.total - accounted)
    return [
        (c.used, BAR_USED, load_style(load)),
        (c.unhealthy, BAR_UNHEALTHY, style_of("unhealthy")),
        (c.unknown, BAR_UNKNOWN, style_of("unknown")),
        (c.unschedulable, BAR_UNSCHED, "bright_black"),
        (free, BAR_FREE, "green dim"),
    ]


def stacked_bar(segments: Iterable[tuple[int, str, str]], width: int) -> Text:
    segs = list(segments)
    cells = split_width([n for n, _, _ in segs], width)
    bar = Text(no_wrap=True, end="")
    for n, (_, glyph, style) in zip(cells, segs, strict=True):
        if n:
            bar.append(glyph * n, style=style)
    return bar


def gpus_cell(row: NodeRow) -> Text:
    """'used/total' coloured by load; no GPUs at all is shown, not hidden."""
    if row.gpus_total == 0:
        return styled("none", STYLE[Meaning.BROKEN if row.gpu_error else Meaning.MUTED])
    load = row.gpus_used / row.gpus_total
    return styled(f"{row.gpus_used}/{row.gpus_total}", load_style(load))


def count_text(n: int, style: str) -> Text:
    """A count that only draws the eye when it is non-zero."""
    return styled(n, style if n else "dim")


def join_short(items: Sequence[str], limit: int = 3) -> str:
    if len(items) <= limit:
        return ",".join(items)
    return ",".join(items[:limit]) + f",+{len(items) - limit}"


def classes_text(classes: dict[str, int]) -> Text:
    """`8xH100-SXM-80GB`, spelled as `ctl nodes` spells it."""
    if not classes:
        return styled("-", "dim")
    return styled(" ".join(f"{n}x{name}" for name, n in sorted(classes.items())))


def short_class(gpu_class: str, width: int) -> str:
    """A GPU class in at most `width` cells, the memory always whole: A100-SXM-40GB
    and A100-SXM-80GB are different cards. The product is shortened instead:
    `A100-SXM-40GB`, `A100-40GB`, `A1…-40GB`."""
    product, dash, memory = gpu_class.rpartition("-")
    if not dash or not memory.endswith("GB") or len(gpu_class) <= width:
        return gpu_class if len(gpu_class) <= width else gpu_class[: max(1, width - 1)] + "…"
    first = product.split("-")[0]
    if len(first) + 1 + len(memory) <= width:
        return f"{first}-{memory}"
    room = width - len(memory) - 2  # the product, then "…-"
    return f"{first[: max(1, room)]}…-{memory}"
