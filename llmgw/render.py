"""Text rendering for `llmgw ctl`: the fleet summary the way `ray status` and
`sinfo` show it, and tables the way `kubectl get` prints them. Pure functions
from wire types to plain strings: columns separated by three spaces, no
trailing blanks, one line per row; colour (ANSI) only when asked for (a
terminal), and the last column cut to the terminal width only when one is given.
Free text (reasons, errors) is escaped so it cannot move the cursor or split a row.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import groupby
from typing import TYPE_CHECKING, Any

from llmgw import present
from llmgw.common import printable
from llmgw.durations import format_duration

if TYPE_CHECKING:
    from llmgw.wire import (
        DrainPlan,
        FleetSummary,
        GpuReport,
        ModelStarts,
        ModelView,
        NodeDetail,
        NodeRow,
        ReplicaView,
    )

# One vocabulary with the console: durations, zoned timestamps, state words and colours.
duration = present.duration
timestamp = present.timestamp
# Styles by meaning, defined once (llmgw.present); `paint` turns them into ANSI codes.
FINE = present.STYLE[present.Meaning.FINE]
ATTENTION = present.STYLE[present.Meaning.ATTENTION]
BROKEN = present.STYLE[present.Meaning.BROKEN]
MOVING = present.STYLE[present.Meaning.MOVING]
STARTING = present.STYLE[present.Meaning.STARTING]
MUTED = present.STYLE[present.Meaning.MUTED]


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


# -- cells, tables, formatting ---------------------------------------------------

_ANSI = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "magenta": "35",
    "cyan": "36",
}

# Free text on one line, control characters shown, never obeyed (the one escaping
# function: llmgw.common.printable; `clean` is its name in the tables).
clean = printable


class Cell:
    """A table cell with a style or a sort key; a plain `str` is a cell with neither.
    A plain class: a dataclass costs a one-shot its code generation at import."""

    __slots__ = ("key", "style", "text")

    def __init__(self, text: str, style: str | None = None, key: Any = None) -> None:
        self.text = text
        self.style = style
        self.key = key  # what --sort-by compares (default: the text)


AnyCell = Cell | str


def _style(cell: AnyCell) -> str | None:
    return None if type(cell) is str else cell.style  # type: ignore[union-attr]


def _sort_key(cell: AnyCell) -> tuple[int, Any]:
    k = cell if type(cell) is str else cell.text if cell.key is None else cell.key  # type: ignore[union-attr]
    return (1, "") if k is None else (0, k)  # None (unknown) sorts last


def paint(text: str, style: str | None, color: bool) -> str:
    if not color or not style or not text:
        return text
    codes = ";".join(_ANSI[s] for s in style.split() if s in _ANSI)
    return f"\x1b[{codes}m{text}\x1b[0m" if codes else text


class Table:
    """Rows of cells, formatted column by column: `ctl nodes` at 2,000 nodes
    formats 20,000 cells, so each column is measured, padded and joined by
    list comprehensions, never cell by cell through a Python method."""

    def __init__(self, columns: Sequence[str], right: frozenset[str] = frozenset()) -> None:
        self.columns = list(columns)
        self.rows: list[Sequence[AnyCell]] = []
        self.names: list[str] = []  # `-o name` per row ("node/gpu-a01")
        self.right = right  # right-aligned (numeric) columns

    def add(self, name: str, *cells: AnyCell) -> None:
        self.rows.append(cells)
        self.names.append(name)

    def sort_by(self, column: str) -> None:
        """Stable sort on one column; a bad name is a ValueError naming the valid ones."""
        wanted = column.strip().upper()
        if wanted not in self.columns:
            raise ValueError(
                f"cannot sort by {column!r}: the columns are {', '.join(self.columns)}"
            )
        i = self.columns.index(wanted)
        order = sorted(range(len(self.rows)), key=lambda r: _sort_key(self.rows[r][i]))
        self.rows = [self.rows[r] for r in order]
        self.names = [self.names[r] for r in order]

    def format(self, *, headers: bool = True, color: bool = False, width: int | None = None) -> str:
        """Aligned columns; with `width`, the last column is cut (…) to fit it."""
        lines: list[Sequence[AnyCell]] = (
            [[Cell(c, "bold") for c in self.columns]] if headers else []
        )
        lines += self.rows
        if not lines:
            return ""
        last = len(self.columns) - 1
        out_columns = []
        used = 0  # every row's cells before the last are padded to the same widths
        for i, name in enumerate(self.columns):
            cells = [line[i] for line in lines]
            texts = [c if type(c) is str else c.text for c in cells]  # type: ignore[union-attr]
            if i == last:
                if width is not None:
                    room = max(width - used, 1)
                    texts = [t[: room - 1] + "…" if len(t) > room else t for t in texts]
                w, right = 0, False  # never padded
            else:
                w, right = max(map(len, texts)), name in self.right
                used += w + 3
            if color:  # the codes go around the text, not its padding
                painted = [paint(t, _style(c), True) for t, c in zip(texts, cells, strict=True)]
                pads = [" " * (w - len(t)) for t in texts]
                pairs = zip(pads, painted, strict=True)
                out_columns.append(
                    [p + t for p, t in pairs] if right else [t + p for p, t in pairs]
                )
            else:
                out_columns.append(
                    [t.rjust(w) for t in texts] if right else [t.ljust(w) for t in texts]
                )
        return "".join("   ".join(row).rstrip() + "\n" for row in zip(*out_columns, strict=True))


NUMERIC_COLUMNS = frozenset(
    {
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
        "DESIRED",
        "MAX",
        "AGE",
        "REPLICAS",
        "STARTING",
        "FAILED",
        "REQ/S",
        "IN FLIGHT",
        "P50",
        "CACHE HIT",
        "WAKING FOR",
        "HELD",
        "RPM",
        "TPM",
        "BUDGET",
        "REQUESTS",
        "PROMPT",
        "COMPLETION",
        "ERRORS",
        "LIMITED",
    }
)


def _table(*columns: str, text: Iterable[str] = ()) -> Table:
    """Numbers right-aligned, text left; `text`: columns named like a number column
    elsewhere that hold text here (a replica's NODES is a hostlist)."""
    return Table(list(columns), right=NUMERIC_COLUMNS.difference(text))


def _n(value: int, style: str | None = None) -> Cell:
    return Cell(str(value), style if value else MUTED, key=value)


def _age(seconds: float | None) -> Cell:
    return Cell(duration(seconds), key=seconds)


# -- the fleet summary -------------------------------------------------------------


def _counts(pairs: Iterable[tuple[str, int]], color: bool) -> str:
    """`3 ready, 1 cordoned`: each count in its state's colour (none when zero)."""
    return ", ".join(
        paint(f"{n} {label}", present.style_of(label) if n else MUTED, color) for label, n in pairs
    )


def status(summary: FleetSummary, controller: str, *, color: bool = False) -> str:
    """The whole fleet in one screen."""
    b = lambda text: paint(text, "bold", color)  # noqa: E731
    n = summary.nodes
    r = summary.replicas
    m = summary.models
    parts = [
        f"{b('Fleet')} at {controller}\n",
        f"{b('Nodes')}     {n.total} total: "
        + _counts(
            [
                ("ready", n.ready),
                ("cordoned", n.cordoned),
                ("draining", n.draining),
                ("unreachable", n.unreachable),
            ],
            color,
        )
        + "\n",
        f"{b('Replicas')}  "
        + _counts(
            [
                ("ready", r.ready),
                ("starting", r.starting),
                ("draining", r.draining),
                ("failed", r.failed),
            ],
            color,
        )
        + "\n",
        f"{b('Models')}    {m.total} declared: "
        + _counts([("satisfied", m.satisfied), ("short", m.short)], color)
        + "\n",
    ]

    def section(title: str, table: Table, empty: str | None = None) -> None:
        if table.rows:
            parts.append(f"\n{b(title)}\n" + table.format(color=color))
        elif empty:
            parts.append("\n" + paint(f"{title:<10}{empty}", MUTED, color) + "\n")

    gpus = _table("CLASS", "TOTAL", "USED", "FREE", "UNSCHED", "UNHEALTHY", "UNKNOWN")
    for g in summary.gpus:
        gpus.add(
            g.gpu_class,
            g.gpu_class,
            str(g.total),
            str(g.used),
            _n(g.free, FINE),
            _n(g.unschedulable, ATTENTION),
            _n(g.unhealthy, BROKEN),
            _n(g.unknown, ATTENTION),
        )
    section("GPUs", gpus, "none reported")

    fabrics = _table("FABRIC", "NODES", "WITH WEIGHTS", "MODELS", "FREE BLOCK")
    for f in summary.fabrics:
        fabrics.add(
            f.fabric,
            f.fabric,
            str(f.nodes),
            str(f.nodes_with_weights),
            str(f.models_present),
            Cell(str(f.largest_free_block), FINE if f.largest_free_block else BROKEN),
        )
    section("Fabrics", fabrics, "none reported")

    unplaceable = _table("MODEL", "WHY")
    for name in summary.unplaceable:
        reason = present.short_words(summary.unplaceable_reasons.get(name))
        unplaceable.add(name, Cell(name, BROKEN), clean(reason))
    section("Unplaceable", unplaceable)

    waking = _table("MODEL", "WAKING FOR", "HELD")
    for w in getattr(summary, "waking", None) or []:  # absent from older controllers
        waking.add(w.model, Cell(w.model, ATTENTION), duration(w.seconds), str(w.held))
    section("Waking (from zero replicas)", waking)

    adapters = _table("ADAPTER", "BASE", "LOADED ON", "HELD", "IN FLIGHT", "REQUESTS", "LAST USED")
    for a in getattr(summary, "adapters", None) or []:  # absent from older controllers
        if not (a.loaded_on or a.loading_on or a.held or a.in_flight):
            continue  # idle and unloaded: `ctl models` lists every one
        used = "-" if a.last_used_s is None else f"{duration(a.last_used_s)} ago"
        adapters.add(
            a.spec.name,
            a.spec.name,
            a.spec.base,
            f"{len(a.loaded_on)}" + (f" (+{len(a.loading_on)} loading)" if a.loading_on else ""),
            str(a.held),
            str(a.in_flight),
            str(a.requests),
            used,
        )
    section("LoRA adapters (loaded or asked for)", adapters)

    traffic = _table("MODEL", "REPLICAS", "REQ/S", "IN FLIGHT", "P50", "CACHE HIT")
    for tr in getattr(summary, "traffic", None) or []:  # absent from older controllers
        traffic.add(
            tr.model,
            tr.model,
            str(tr.replicas),
            f"{tr.requests_per_s:.1f}",
            str(tr.in_flight),
            present.p50(tr),
            present.percent(tr.prefix_hit_rate),
        )
    section("Traffic", traffic)

    idle = _table("REPLICA", "MODEL", "GPUS", "IDLE")
    for i in summary.idle_replicas:
        idle.add(i.id, i.id, i.model, str(i.gpus), duration(i.idle_seconds))
    section(f"Idle replicas (nothing asked for {format_duration(summary.idle_after_s)}+)", idle)

    asleep = _table("REPLICA", "MODEL", "GPUS", "ASLEEP")
    for r in getattr(summary, "sleeping_replicas", None) or []:  # absent from older controllers
        asleep.add(r.id, r.id, r.model, str(r.gpus), duration(r.asleep_seconds))
    section("Sleeping replicas (holding their cards, woken by a request)", asleep)

    reasons = _table("REASON", "STATE", "USER", "TIMESTAMP", "NODELIST")
    for group in summary.reasons:
        reasons.add(
            group.reason,
            clean(group.reason),
            str(group.flag),
            clean(group.by or "-"),
            timestamp(group.at),
            hostlist(group.nodes),
        )
    section("Reasons", reasons)
    return "".join(parts)


# -- tables --------------------------------------------------------------------------


_STATE_CELLS: dict[tuple[Any, Any, bool, bool], Cell] = {}


def node_state(row: NodeRow) -> Cell:
    # A handful of distinct states among thousands of rows: one Cell for each
    # (ctl nodes at 2,000 rows spent a fifth of its table time here). Keys
    # mix the wire's StrEnums and ctl's plain strings: they hash alike.
    if isinstance(row, dict):  # a JSON object (ctl)
        admin = row["admin"]
        key = (row["state"], admin["flag"], admin["drained"], row["report_age_s"] is None)
    else:
        admin = row.admin
        key = (row.state, admin.flag, admin.drained, row.report_age_s is None)
    cell = _STATE_CELLS.get(key)
    if cell is None:
        state, flag, drained, unheard = key
        words = "".join(w for w, _ in present.state_parts(str(state), str(flag), drained, unheard))
        cell = Cell(words, present.style_of(str(state)))
        _STATE_CELLS[key] = cell
    return cell


def node_reason(row: NodeRow) -> str:
    # Rows are wire models or JSON objects (ctl): the same reading either way.
    get: Callable[..., Any] = dict.get if isinstance(row, dict) else getattr
    admin = get(row, "admin")
    reason = get(admin, "reason") or ""
    if get(admin, "flag") == "draining":
        force_at = get(admin, "force_at", None)  # absent from older controllers
        if force_at is not None:
            when = "forced" if get(admin, "force") else present.force_at_words(force_at)
            reason = f"{reason} ({when})" if reason else when
    if blocked := get(row, "drain_blocked"):
        reason = f"{reason}; waiting: {blocked}" if reason else blocked
    if gpu_error := get(row, "gpu_error"):
        reason = f"{reason}; {gpu_error}" if reason else gpu_error
    return reason if reason.isprintable() else clean(reason)  # most need no escaping


NODE_COLUMNS = ["NODE", "STATE", "GPUS", "USED", "UNHEALTHY", "CLASSES", "FABRICS", "MODELS", "AGE"]
NODE_WIDE = ["UNKNOWN", "REPLICAS", "BY", "SINCE"]

# Cells shared by many rows: numbers (sorted as numbers), and a clean node's reason.
_COUNTS = tuple(Cell(str(n), None, n) for n in range(65))
_UNHEALTHY = tuple(Cell(str(n), BROKEN if n else MUTED, n) for n in range(65))


def _count(n: int, cells: tuple[Cell, ...] = _COUNTS) -> Cell:
    return cells[n] if 0 <= n < len(cells) else Cell(str(n), cells[1].style, n)


def _classes(classes: dict[str, int]) -> str:
    if len(classes) == 1:  # the common node: one kind of card
        ((cls, n),) = classes.items()
        return f"{n}x{cls}"
    return ",".join(f"{n}x{c}" for c, n in sorted(classes.items())) or "-"


def nodes_table(rows: Sequence[NodeRow], *, wide: bool = False) -> Table:
    table = _table(*NODE_COLUMNS, *(NODE_WIDE if wide else []), "REASON")
    add = table.add
    for row in rows:
        # ctl's rows are JSON objects, read by item; wire models (tests, the
        # console's vocabulary checks) by attribute.
        get: Callable[[Any, str], Any] = dict.__getitem__ if isinstance(row, dict) else getattr
        name, admin, age = get(row, "name"), get(row, "admin"), get(row, "report_age_s")
        cells: list[AnyCell] = [
            name,
            node_state(row),
            _count(get(row, "gpus_total")),
            _count(get(row, "gpus_used")),
            _count(get(row, "gpus_unhealthy"), _UNHEALTHY),
            _classes(get(row, "classes")),
            ",".join(get(row, "fabrics")) or "-",
            _count(len(get(row, "models"))),
            Cell(duration(age), None, age),
        ]
        if wide:
            cells += [
                _n(get(row, "gpus_unknown"), ATTENTION),
                _count(get(row, "replicas")),
                clean(get(admin, "by") or "-"),
                Cell(timestamp(get(admin, "at")), key=get(admin, "at")),
            ]
        plain = not (get(admin, "reason") or get(row, "drain_blocked") or get(row, "gpu_error"))
        cells.append("" if plain and get(admin, "flag") != "draining" else node_reason(row))
        add(f"node/{name}", *cells)
    return table


MODEL_COLUMNS = ["MODEL", "READY", "MIN", "DESIRED", "MAX", "SHAPE", "CLASS", "ENGINE"]
MODEL_WIDE = ["STARTING", "FAILED", "REV", "STARTS H/W/C", "LAST WAKE", "SOURCE"]


def models_table(
    models: Sequence[ModelView], *, wide: bool = False, adapters: Sequence[Any] = ()
) -> Table:
    """Each model, and under it the LoRA adapters it is the base of."""
    table = _table(*MODEL_COLUMNS, *(MODEL_WIDE if wide else []), "STATUS")
    by_base: dict[str, list[Any]] = {}
    for a in adapters:
        by_base.setdefault(a.spec.base, []).append(a)
    for m in models:
        s = m.spec
        words, meaning = present.model_words(m)
        status_cell = Cell(clean(words), present.STYLE[meaning])
        cells = [
            Cell(s.name),
            Cell(str(m.ready), key=m.ready),
            Cell(str(s.min_replicas), key=s.min_replicas),
            _replica_count(getattr(m, "desired", None)),
            _replica_count(getattr(s, "max_replicas", None) or s.min_replicas),
            Cell(f"{s.shards}x{s.gpus_per_shard}", key=s.shards * s.gpus_per_shard),
            Cell(s.gpu_class or "any"),
            Cell(s.engine),
        ]
        if wide:
            cells += [
                Cell(str(m.starting), key=m.starting),
                Cell(str(m.failed), key=m.failed),
                _revision(getattr(m, "rollout", None)),
                *start_cells(m.starts),
                Cell(clean(s.source)),
            ]
        table.add(f"model/{s.name}", *cells, status_cell)
        for a in by_base.get(s.name, ()):
            table.add(f"adapter/{a.spec.name}", *adapter_cells(a, wide))
    return table


def start_cells(starts: ModelStarts) -> list[Cell]:
    """How its replicas came to serve: woken (hot), started with the weights on the
    node (warm) or not (cold); and the last wake's time per sleep level."""
    total = starts.hot + starts.warm + starts.cold
    counts = Cell(f"{starts.hot}/{starts.warm}/{starts.cold}", key=total)
    wakes = [v for k, v in starts.last_s.items() if k.startswith("hot-")]
    last = present.last_wakes(starts.last_s) or "-"
    return [counts, Cell(last, key=min(wakes, default=-1.0))]


def adapter_cells(a: Any, wide: bool) -> list[Cell | str]:
    """An adapter's line under its base: how many replicas hold it, what it serves."""
    loaded = len(a.loaded_on)
    cells: list[Cell | str] = [Cell(f"  + {a.spec.name}"), Cell(str(loaded), key=loaded)]
    cells += [Cell("-", key=-1)] * 3 + [Cell("lora"), Cell(""), Cell("")]
    if wide:
        cells += [Cell(str(len(a.loading_on)), key=len(a.loading_on)), Cell(""), Cell("")]
        cells += [Cell(""), Cell("")]
        cells.append(Cell(clean(a.spec.source)))
    cells.append(clean(present.adapter_words(a)[0]))
    return cells


def adapter_dry_run(spec: Any, current: Any | None) -> str:
    """`ctl apply --dry-run`: what applying an adapter would do."""
    if current is None:
        return f"adapter {spec.name}: would be created (base {spec.base}, source {spec.source})\n"
    if current == spec:
        return f"adapter {spec.name}: unchanged\n"
    return (
        f"adapter {spec.name}: would change (base {current.base} -> {spec.base}, "
        f"source {current.source} -> {spec.source}): loaded again where it is held\n"
    )


def _replica_count(n: int | None) -> Cell:
    """A count an older controller may not send: `-` then."""
    return Cell("-", key=-1) if n is None else Cell(str(n), key=n)


def rollout_line(m: Any) -> str:
    """`ctl rollout status`: one line on where a model's rollout stands."""
    name, rollout = m.spec.name, getattr(m, "rollout", None)
    if rollout is None:
        return f"model {name}: this controller keeps no revisions (upgrade it for rollouts)"
    rev = f"revision {rollout.revision}"
    if rollout.state == "complete":
        return f"model {name}: {rev} rolled out: {rollout.updated} of {rollout.desired} ready"
    words, _ = present.model_words(m)
    old = f"; {rollout.outdated} of an older revision still running" if rollout.outdated else ""
    return f"model {name}: {words} to {rev}{old}"


REVISION_COLUMNS = ["REVISION", "WHEN", "BY", "CHANGE"]


def revisions_table(revisions: Sequence[Any]) -> Table:
    """`ctl rollout history`: each kept revision, when, by whom, what changed."""
    table = _table(*REVISION_COLUMNS)
    for r in revisions:
        table.add(
            f"revision/{r.revision}",
            Cell(str(r.revision), key=r.revision),
            Cell(timestamp(r.at), key=r.at),
            Cell(clean(r.by)),
            clean(r.change),
        )
    return table


EVENT_COLUMNS = ["AGE", "REASON", "OBJECT"]
EVENT_WIDE = ["TIME", "ID"]


def events_table(events: Sequence[Any], *, wide: bool = False) -> Table:
    """`ctl events`: oldest first, as `kubectl get events`; AGE is since the last time,
    and a counted event says how often over how long: `4m10s (x12 over 2h13m)`."""
    now = time.time()
    table = _table(*EVENT_COLUMNS, *(EVENT_WIDE if wide else []), "MESSAGE")
    for e in events:
        age, counted = max(now - e.at, 0.0), present.repeats(e)
        shown = f"{duration(age)} ({counted})" if counted else duration(age)
        cells = [Cell(shown, key=age), Cell(str(e.reason)), Cell(clean(e.object))]
        if wide:
            cells += [Cell(timestamp(e.at), key=e.at), Cell(str(e.id), key=e.id)]
        table.add(f"event/{e.id}", *cells, clean(e.message))
    return table


def _revision(rollout: Any) -> Cell:
    revision = rollout.revision if rollout is not None else None
    return Cell(str(revision) if revision else "-", key=revision or 0)


REPLICA_COLUMNS = ["REPLICA", "MODEL", "STATE", "NODES", "GPUS", "URL", "IDLE"]
REPLICA_WIDE = ["CREATED", "REPLACES", "REV"]


def _replica_state(r: ReplicaView) -> Cell:
    """Its state; `ready?` while that is the last known one, before its nodes report
    to a controller that just began to lead (the ERROR column says how long at most)."""
    unconfirmed = getattr(r, "unconfirmed_s", None) is not None
    return Cell(f"{r.state}?" if unconfirmed else str(r.state), present.style_of(str(r.state)))


def replicas_table(replicas: Sequence[ReplicaView], *, wide: bool = False) -> Table:
    table = _table(*REPLICA_COLUMNS, *(REPLICA_WIDE if wide else []), "ERROR", text=["NODES"])
    for r in replicas:
        cells = [
            Cell(r.id),
            Cell(r.model),
            _replica_state(r),
            Cell(hostlist(s.node for s in r.shards)),
            Cell(str(r.gpus), key=r.gpus),
            Cell(getattr(r, "url", None) or "-"),
            _age(r.idle_seconds),
        ]
        if wide:
            revision = getattr(r, "revision", 0)
            cells += [
                Cell(timestamp(r.created_at), key=r.created_at),
                Cell(r.replaces or "-"),
                Cell(str(revision) if revision else "-", key=revision),
            ]
        unconfirmed = getattr(r, "unconfirmed_s", None)
        note = present.unconfirmed_words(unconfirmed) if unconfirmed is not None else ""
        table.add(f"replica/{r.id}", *cells, clean(present.one_line(r.error or note)))
    return table


CREDENTIAL_COLUMNS = ["NODE", "SOURCE", "ISSUED", "BY", "APPROVAL", "EXPIRES"]


def credentials_table(creds: Sequence[Any]) -> Table:
    """`ctl credentials list`; `-o name` prints node/NAME, which `credentials revoke` takes.
    EXPIRES: when a credential its node has not reported with yet goes ("-": never)."""
    table = _table(*CREDENTIAL_COLUMNS)
    for c in creds:
        at, expires = c.get("issued_at"), c.get("expires_at")
        table.add(
            f"node/{c['node']}",
            Cell(c["node"]),
            Cell(c["source"]),
            Cell(timestamp(at), key=at),
            Cell(clean(c.get("by") or "-")),
            Cell("awaiting approval" if c.get("awaiting_approval") else "-"),
            Cell(timestamp(expires), key=expires),
        )
    return table


CLIENT_KEY_COLUMNS = ["ID", "TENANT", "MODELS", "STATE", "CREATED", "EXPIRES", "LAST USED"]


def client_keys_table(keys: Sequence[Any]) -> Table:
    """`ctl keys list`: never a key (the controller has none to give)."""
    table = _table(*CLIENT_KEY_COLUMNS)
    for k in keys:
        created, expires, used = k.get("created_at"), k.get("expires_at"), k.get("last_used")
        table.add(
            k["id"],
            Cell(k["id"]),
            Cell(clean(k["tenant"])),
            Cell(clean(" ".join(k["models"]))),
            Cell(k["state"]),
            Cell(timestamp(created), key=created),
            Cell(timestamp(expires) if expires else "never", key=expires or 0),
            Cell(timestamp(used) if used else "-", key=used or 0),
        )
    return table


LIMIT_COLUMNS = ["TENANT", "MODEL", "RPM", "TPM", "BUDGET", "PER", "SET BY", "SET"]
USAGE_COLUMNS = ["TENANT", "MODEL", "REQUESTS", "PROMPT", "COMPLETION", "ERRORS", "LIMITED"]
_USAGE_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "errors", "rate_limited")


def limit_scope(limit: Any) -> str:
    model = limit.get("model")
    return f"{clean(limit['tenant'])}" + (f" on {clean(model)}" if model else "")


def limit_text(limit: Any) -> str:
    parts = [f"{limit[k]} {k}" for k in ("rpm", "tpm") if limit.get(k) is not None]
    if limit.get("budget") is not None:
        parts.append(f"budget {limit['budget']} tokens per {limit['per']}")
    return ", ".join(parts)


def limits_table(limits: Sequence[Any]) -> Table:
    """`ctl limits list`."""
    table = _table(*LIMIT_COLUMNS)
    for k in limits:
        model = k.get("model")
        table.add(
            f"{k['tenant']}/{model or ''}",
            Cell(clean(k["tenant"])),
            Cell(clean(model) if model else "*"),
            *(_n(k[c]) if k.get(c) is not None else Cell("-") for c in ("rpm", "tpm", "budget")),
            Cell(k.get("per") or "-"),
            Cell(clean(k["by"])),
            Cell(timestamp(k["at"]), key=k["at"]),
        )
    return table


def usage_table(rows: Sequence[Any]) -> Table:
    """`ctl usage`: a column summed over (not in --by) shows `*`."""
    table = _table(*USAGE_COLUMNS)
    for r in rows:
        table.add(
            f"{r['tenant']}/{r['model']}",
            Cell(clean(r["tenant"]) or "*"),
            Cell(clean(r["model"]) or "*"),
            *(_n(r.get(f, 0)) for f in _USAGE_FIELDS),
        )
    return table


def usage_csv(rows: Sequence[Any]) -> str:
    """`ctl usage -o csv`: a header line, then one line per row (RFC 4180)."""
    import csv
    import io

    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["tenant", "model", *_USAGE_FIELDS])
    for r in rows:
        w.writerow([r["tenant"], r["model"], *(r.get(f, 0) for f in _USAGE_FIELDS)])
    return out.getvalue()


# What --sort-by may name, per command (shell completion offers these).
SORT_COLUMNS = {
    "nodes": [*NODE_COLUMNS, *NODE_WIDE, "REASON"],
    "models": [*MODEL_COLUMNS, *MODEL_WIDE, "STATUS"],
    "replicas": [*REPLICA_COLUMNS, *REPLICA_WIDE, "ERROR"],
    "events": [*EVENT_COLUMNS, *EVENT_WIDE, "MESSAGE"],
    "credentials": CREDENTIAL_COLUMNS,
    "keys": CLIENT_KEY_COLUMNS,
    "limits": LIMIT_COLUMNS,
    "usage": USAGE_COLUMNS,
    "rollout": REVISION_COLUMNS,
}


def _setting(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(map(str, value)) if value else "(none)"
    return "(none)" if value is None else clean(str(value))


def dry_run_change(would: Any) -> str:
    """`ctl apply --dry-run`: one model, as applying it would change it (a ModelDryRun)."""
    spec, current = would.spec, would.current
    name = spec["name"]
    if current is None:
        return f"model {name} created (dry run)\n"
    changed = [
        f"  {field}: {_setting(current.get(field))} -> {_setting(value)}\n"
        for field, value in spec.items()
        if current.get(field) != value
    ]
    if not changed:
        return f"model {name} unchanged (dry run)\n"
    how = (
        "a new revision, rolled out with new replicas"
        if would.new_revision
        else "no engine change: no replica restarts"
    )
    return f"model {name} configured (dry run): {how}\n" + "".join(changed)


def gateways(views: Sequence[Any]) -> str:
    """`ctl status`: the gateways that post status, with their last report's age."""
    if not views:
        return ""
    table = _table("GATEWAY", "LAST REPORT", "IN FLIGHT", "REQUESTS")
    for g in views:
        table.add(
            f"gateway/{g.name}",
            Cell(clean(g.name)),
            Cell(f"{g.age_s:.1f}s ago", key=g.age_s),
            Cell(str(g.in_flight), key=g.in_flight),
            Cell(str(g.requests), key=g.requests),
        )
    # An endpoint a gateway cannot use is left out of its routing: say which, and why.
    notes = [
        f"  gateway/{clean(g.name)} leaves out replica {clean(rid)}: {clean(why)}"
        for g in views
        for rid, why in sorted(getattr(g, "rejected", {}).items())
    ]
    text = "\nGateways\n" + table.format().rstrip("\n") + "\n"
    return text + "".join(f"{n}\n" for n in notes)


def node_detail(detail: NodeDetail, *, color: bool = False) -> str:
    """`ctl node NAME`: the row, then GPUs, storage, replicas and history."""
    b = lambda text: paint(text, "bold", color)  # noqa: E731
    row = detail.row
    state = node_state(row)
    lines = [
        f"{b('Node')}       {row.name}",
        f"{b('State')}      {paint(state.text, state.style, color)}",
    ]
    if row.admin.reason:
        by = f" by {clean(row.admin.by)}" if row.admin.by else ""
        lines.append(
            f"{b('Reason')}     {clean(row.admin.reason)}{by} at {timestamp(row.admin.at)}"
        )
    if row.drain_blocked:
        lines.append(f"{b('Waiting')}    {clean(row.drain_blocked)}")
    lines += [
        f"{b('Last report')} {duration(row.report_age_s)} ago"
        if row.report_age_s is not None
        else f"{b('Last report')} never (since the controller started)",
        f"{b('Address')}    {detail.address or '-'}",
        f"{b('Agent')}      {detail.agent_version or '-'}",
        f"{b('Fabrics')}    {','.join(row.fabrics) or '-'}",
        f"{b('GPUs')}       {row.gpus_used}/{row.gpus_total} used, "
        f"{row.gpus_unhealthy} unhealthy, {row.gpus_unknown} unknown",
    ]
    if row.gpu_error:
        lines.append(f"{b('GPU error')}  {clean(row.gpu_error)}")
    out = "\n".join(lines) + "\n"

    def section(title: str, table: Table, empty: str) -> str:
        if not table.rows:
            return f"\n{b(title)}  {empty}\n"
        return f"\n{b(title)}\n" + table.format(color=color)

    gpus = _table("INDEX", "UUID", "CLASS", "HEALTH", "IN USE", "MEMORY", "REASON")
    for g in detail.gpus:
        gpus.add(
            g.uuid,
            str(g.index),
            g.uuid,
            g.gpu_class,
            Cell(str(g.health), present.style_of(str(g.health))),
            "yes" if g.in_use else "no",
            _memory(g),
            clean(g.health_reason or ""),
        )
    out += section("GPUs", gpus, "none")
    storage = _table(
        "PATH", "SCOPE", "FILESYSTEM", "SOURCE", "MODELS", "NOT COUNTED", text=["MODELS"]
    )
    for s in detail.storage:
        # What was not counted, and why: the location's error, each incomplete model's reason.
        skipped = [f"cannot read: {present.one_line(s.error)}"] if s.error else []
        skipped += [f"{i.name}: {present.one_line(i.reason)}" for i in s.incomplete]
        storage.add(
            s.path,
            clean(s.path),
            str(s.scope),
            s.fs_type or "?",
            clean(s.mount_source or "-"),
            ",".join(m.name for m in s.models) or "-",
            clean("; ".join(skipped)) or "-",
        )
    out += section(
        "Storage", storage, "none found" if detail.storage_configured else "not configured"
    )
    replicas = _table("REPLICA", "MODEL", "STATE", "GPUS", "IDLE", "ERROR")
    for r in detail.replicas:
        replicas.add(
            r.id,
            r.id,
            r.model,
            str(r.state),
            str(len(r.gpus)),
            duration(r.idle_seconds),
            clean(present.one_line(r.error or "")),
        )
    out += section("Replicas", replicas, "none")
    for r in detail.replicas:  # the cause's excerpt, under the table's one line
        if r.error and "\n" in r.error.strip():
            excerpt = r.error.strip().splitlines()[1:]
            out += f"{b('Why')} {r.id}:\n" + "".join(f"  {clean(ln)}\n" for ln in excerpt)
    history = _table("TIMESTAMP", "ACTION", "USER", "REASON")
    for e in detail.history:
        history.add(e.action, timestamp(e.at), e.action, clean(e.by), clean(e.reason or ""))
    out += section("History", history, "none")
    return out


def _memory(g: GpuReport) -> str:
    used = "?" if g.memory_used_mib is None else str(g.memory_used_mib)
    return f"{used}/{g.memory_total_mib} MiB"


def drain_plan(plan: DrainPlan, *, color: bool = False) -> str:
    lines = [f"Draining {hostlist(plan.nodes)} moves {plan.replicas_to_move} replica(s)."]
    for impact in plan.impacts:
        style = present.style_of(str(impact.verdict)) or BROKEN
        line = (
            f"  {paint(f'{impact.verdict:<14}', style, color)} {impact.model}: "
            f"{impact.replicas_on_nodes} to move, {impact.replaceable} can be placed elsewhere, "
            f"ready {impact.ready_now}/{impact.min_replicas}"
        )
        if impact.reason:
            line += f" ({clean(impact.reason)})"
        lines.append(line)
    return "\n".join(lines) + "\n"


def names(table: Table) -> str:
    return "".join(f"{n}\n" for n in table.names)


Formatter = Callable[[Table], str]
