"""Text rendering for `llmgw ctl`: the fleet summary the way `ray status` and
`sinfo` show it, and the nodes table. Pure functions from wire types to rich
renderables, so they are easy to test and to reuse.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from itertools import groupby

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from llmgw.wire import (
    AdminFlag,
    FleetSummary,
    GatewayView,
    ModelView,
    NodeRow,
    NodeState,
    ReplicaView,
)

STATE_STYLE = {
    NodeState.READY: "green",
    NodeState.CORDONED: "yellow",
    NodeState.DRAINING: "magenta",
    NodeState.UNREACHABLE: "red",
}


def duration(seconds: float | None) -> str:
    """Compact human durations: 45s, 12m, 2h13m, 3d4h."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def timestamp(at: float | None) -> str:
    if at is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at))


def deadline(at: float, now: float | None = None) -> str:
    """A drain's deadline in UTC: `14:05 UTC`, with the date when not within a day."""
    now = time.time() if now is None else now
    fmt = "%H:%M UTC" if abs(at - now) < 86_400 else "%Y-%m-%d %H:%M UTC"
    return time.strftime(fmt, time.gmtime(at))


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def hostlist(names: Iterable[str]) -> str:
    """Compress node names as Slurm does: gpu[001-003,007],login1."""
    plain: list[str] = []
    numbered: dict[tuple[str, int], list[int]] = {}
    for name in sorted(set(names)):
        m = _NUMBERED.match(name)
        if m:
            numbered.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
        else:
            plain.append(name)
    parts = list(plain)
    for (prefix, width), numbers in sorted(numbered.items()):
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        ranges = []
        for _, run in groupby(enumerate(sorted(numbers)), key=lambda iv: iv[1] - iv[0]):
            values = [v for _, v in run]
            lo, hi = values[0], values[-1]
            ranges.append(f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}")
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(sorted(parts))


def _table(*columns: str, title: str | None = None) -> Table:
    table = Table(
        box=box.SIMPLE_HEAD,
        title=title,
        title_justify="left",
        title_style="bold",
        show_edge=False,
        pad_edge=False,
    )
    # Every column keeps its width; only the last (a reason, a status) wraps
    # when the terminal is narrow, as `sinfo -R` and `ray status` read best.
    for i, col in enumerate(columns):
        last = i == len(columns) - 1
        table.add_column(
            col,
            justify="right" if col in NUMERIC_COLUMNS else "left",
            no_wrap=not last,
            overflow="fold" if last else "ellipsis",
            min_width=None if last else len(col),
        )
    return table


NUMERIC_COLUMNS = {
    "TOTAL",
    "USED",
    "FREE",
    "UNSCHED",
    "UNHEALTHY",
    "UNKNOWN",
    "NODES",
    "WITH WEIGHTS",
    "MODELS",
    "FREE BLOCK",
    "GPUS",
    "IDLE",
    "READY",
    "MIN",
    "AGE",
}


def _counts(pairs: Iterable[tuple[str, int, str]]) -> Text:
    text = Text()
    for i, (label, n, style) in enumerate(pairs):
        if i:
            text.append(", ")
        text.append(f"{n} {label}", style=style if n else "dim")
    return text


def status(summary: FleetSummary, controller: str) -> RenderableType:
    """The whole fleet in one screen."""
    n = summary.nodes
    parts: list[RenderableType] = [
        Text.assemble(("Fleet", "bold"), f" at {controller}"),
        Text.assemble(
            ("Nodes     ", "bold"),
            f"{n.total} total: ",
            _counts(
                [
                    ("ready", n.ready, "green"),
                    ("cordoned", n.cordoned, "yellow"),
                    ("draining", n.draining, "magenta"),
                    ("unreachable", n.unreachable, "red"),
                ]
            ),
        ),
    ]
    r = summary.replicas
    parts.append(
        Text.assemble(
            ("Replicas  ", "bold"),
            _counts(
                [
                    ("ready", r.ready, "green"),
                    ("starting", r.starting, "cyan"),
                    ("draining", r.draining, "magenta"),
                    ("failed", r.failed, "red"),
                ]
            ),
        )
    )
    m = summary.models
    parts.append(
        Text.assemble(
            ("Models    ", "bold"),
            f"{m.total} declared: ",
            _counts([("satisfied", m.satisfied, "green"), ("short", m.short, "red")]),
        )
    )

    gpus = _table(
        "CLASS", "TOTAL", "USED", "FREE", "UNSCHED", "UNHEALTHY", "UNKNOWN", title="\nGPUs"
    )
    for g in summary.gpus:
        gpus.add_row(
            g.gpu_class,
            str(g.total),
            str(g.used),
            Text(str(g.free), style="green" if g.free else "dim"),
            Text(str(g.unschedulable), style="yellow" if g.unschedulable else "dim"),
            Text(str(g.unhealthy), style="red" if g.unhealthy else "dim"),
            Text(str(g.unknown), style="yellow" if g.unknown else "dim"),
        )
    parts.append(gpus if summary.gpus else Text("\nGPUs      none reported", style="dim"))

    fabrics = _table("FABRIC", "NODES", "WITH WEIGHTS", "MODELS", "FREE BLOCK", title="\nFabrics")
    for f in summary.fabrics:
        fabrics.add_row(
            f.fabric,
            str(f.nodes),
            str(f.nodes_with_weights),
            str(f.models_present),
            Text(str(f.largest_free_block), style="green" if f.largest_free_block else "red"),
        )
    parts.append(fabrics if summary.fabrics else Text("\nFabrics   none reported", style="dim"))

    if summary.unplaceable:
        table = _table("MODEL", "WHY", title="\nUnplaceable")
        for name in summary.unplaceable:
            reason = summary.unplaceable_reasons.get(name, "short, and no replica is starting")
            table.add_row(Text(name, style="red"), reason)
        parts.append(table)

    if summary.idle_replicas:
        table = _table(
            "REPLICA", "MODEL", "GPUS", "IDLE", title="\nIdle replicas (nothing asked for 10m+)"
        )
        for idle in summary.idle_replicas:
            table.add_row(idle.id, idle.model, str(idle.gpus), duration(idle.idle_seconds))
        parts.append(table)

    if summary.reasons:
        table = _table("REASON", "STATE", "USER", "TIMESTAMP", "NODELIST", title="\nReasons")
        for group in summary.reasons:
            table.add_row(
                group.reason,
                group.flag.value,
                group.by or "-",
                timestamp(group.at),
                hostlist(group.nodes),
            )
        parts.append(table)
    return Group(*parts)


def nodes_table(rows: list[NodeRow]) -> Table:
    table = _table(
        "NODE",
        "STATE",
        "GPUS",
        "USED",
        "UNHEALTHY",
        "CLASSES",
        "FABRICS",
        "MODELS",
        "AGE",
        "REASON",
    )
    for row in rows:
        state = Text(row.state.value, style=STATE_STYLE[row.state])
        if row.admin.flag.value != "none" and row.state is NodeState.UNREACHABLE:
            state.append(f" ({row.admin.flag.value})", style="yellow")
        elif row.admin.drained:
            state.append(" (drained)", style="dim")
        reason = row.admin.reason or ""
        if row.admin.flag is AdminFlag.DRAINING and row.admin.force_at is not None:
            when = "forced" if row.admin.force else f"force at {deadline(row.admin.force_at)}"
            reason = f"{reason} ({when})" if reason else when
        if row.drain_blocked:
            reason = f"{reason}; waiting: {row.drain_blocked}" if reason else row.drain_blocked
        if row.gpu_error:
            reason = f"{reason}; {row.gpu_error}" if reason else row.gpu_error
        table.add_row(
            row.name,
            state,
            str(row.gpus_total),
            str(row.gpus_used),
            Text(str(row.gpus_unhealthy), style="red" if row.gpus_unhealthy else "dim"),
            ",".join(f"{n}x{c}" for c, n in sorted(row.classes.items())) or "-",
            ",".join(row.fabrics) or "-",
            str(len(row.models)),
            duration(row.report_age_s),
            reason,
        )
    return table


def models_table(models: list[ModelView]) -> Table:
    table = _table("MODEL", "READY", "MIN", "SHAPE", "CLASS", "ENGINE", "STATUS")
    for m in models:
        s = m.spec
        if m.satisfied:
            status_text = Text("satisfied", style="green")
        else:
            status_text = Text("short", style="red")
            why = m.unplaceable_reason or m.last_failure
            if why:
                status_text.append(f": {why}")
        table.add_row(
            s.name,
            str(m.ready),
            str(s.min_replicas),
            f"{s.shards}x{s.gpus_per_shard}",
            s.gpu_class or "any",
            s.engine,
            status_text,
        )
    return table


def gateways_table(gateways: list[GatewayView]) -> Table:
    table = _table("GATEWAY", "LAST REPORT", "IN FLIGHT", "REQUESTS")
    for g in gateways:
        table.add_row(g.name, f"{g.age_s:.1f}s ago", str(g.in_flight), str(g.requests))
    return table


def replicas_table(replicas: list[ReplicaView]) -> Table:
    table = _table("REPLICA", "MODEL", "STATE", "NODES", "GPUS", "URL", "IDLE", "ERROR")
    for r in replicas:
        table.add_row(
            r.id,
            r.model,
            r.state.value,
            hostlist(s.node for s in r.shards),
            str(r.gpus),
            r.url or "-",
            duration(r.idle_seconds),
            r.error or "",
        )
    return table
