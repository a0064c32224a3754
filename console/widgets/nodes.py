"""The nodes table: k9s-style filter, sort cycling, marks, patched in place."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.message import Message

from llmgw.console.format import (
    age_bucket,
    age_text,
    classes_text,
    count_text,
    gpus_cell,
    join_short,
    node_state_text,
    styled,
)
from llmgw.console.widgets.keyed_table import KeyedTable
from llmgw.present import NODE_STATE_WIDTH, timestamp
from llmgw.wire import NodeRow, NodeState

MARK = "●"
NEVER = age_bucket(None)[0]  # the AGE of a node not heard from since the controller started

# Trouble sorts first when sorting by state: that is what an operator looks for.
STATE_RANK = {
    NodeState.UNREACHABLE: 0,
    NodeState.DRAINING: 1,
    NodeState.CORDONED: 2,
    NodeState.READY: 3,
}


def natural(name: str) -> tuple[Any, ...]:
    """gpu-a2 before gpu-a10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def age_rank(seconds: float | None) -> float:
    """Report age in the buckets the AGE column shows, so sorting by age does
    not reshuffle rows on every refresh as ages tick; never reported is oldest."""
    if seconds is None:
        return float("inf")
    if seconds < 10:
        return 0.0
    if seconds < 60:
        return float(int(seconds) // 10 * 10)
    return float(int(seconds) // 60 * 60)


@dataclass(frozen=True)
class SortSpec:
    label: str  # column key it marks
    title: str
    key: Callable[[NodeRow, float | None], Any]  # (row, its current report age)
    letter: str  # shift+letter sorts by this column, as in k9s (S and G are taken)
    # Most first (GPUs used, oldest report): the header's arrow points down.
    descending: bool = False


def _reason_key(row: NodeRow) -> tuple[bool, str]:
    reason = row.admin.reason or row.drain_blocked or row.gpu_error or ""
    return (not reason, reason.lower())  # nodes with a reason first


# One sort per column, in column order: `s` steps through every one shown.
SORTS: tuple[SortSpec, ...] = (
    SortSpec("name", "name", lambda r, _: natural(r.name), "N"),
    SortSpec("state", "state", lambda r, _: (STATE_RANK[r.state], natural(r.name)), "T"),
    SortSpec("reason", "reason", lambda r, _: (_reason_key(r), natural(r.name)), "R"),
    SortSpec("classes", "GPU classes", lambda r, _: (sorted(r.classes), natural(r.name)), "C"),
    SortSpec("gpus", "GPUs used", lambda r, _: (-r.gpus_used, natural(r.name)), "P", True),
    SortSpec(
        "unh",
        "unhealthy",
        lambda r, _: (-(r.gpus_unhealthy + r.gpus_unknown), natural(r.name)),
        "U",
        True,
    ),
    SortSpec("fabrics", "fabric", lambda r, _: (r.fabrics or ["~"], natural(r.name)), "F"),
    SortSpec("models", "models held", lambda r, _: (-len(r.models), natural(r.name)), "M", True),
    SortSpec("repl", "replicas", lambda r, _: (-r.replicas, natural(r.name)), "L", True),
    SortSpec("age", "report age", lambda r, age: (-age_rank(age), natural(r.name)), "A", True),
)

# (key, title, width); None width: sized to content. Widths leave room for
# the sort arrow after the title (a sorted UNH must not read "UN…").
COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("mark", " ", 1),
    ("name", "NAME", None),
    ("state", "STATE", NODE_STATE_WIDTH),
    ("reason", "REASON", 16),
    ("classes", "CLASSES", 15),
    ("gpus", "GPUS", 5),
    ("unh", "UNH", 4),
    ("fabrics", "FABRIC", 7),
    ("models", "MODELS", 12),
    ("repl", "REPL", 5),
    ("age", "AGE", 5),
)
# Shown at every width (issue 11: at 80 columns these must stay in view).
KEY_COLUMNS = frozenset({"mark", "name", "state", "gpus", "unh", "age"})
# The others, in the order they get room: (key, least width, usual width).
OPTIONAL_COLUMNS: tuple[tuple[str, int, int], ...] = (
    ("reason", 12, 16),
    ("classes", 15, 15),
    ("models", 8, 12),
    ("fabrics", 7, 7),
    ("repl", 5, 5),
)
MODELS_MAX = 40  # past this, spare width goes to the reason


def column_widths(total: int, name_width: int, classes_width: int = 0) -> dict[str, int | None]:
    """Each column's width for a table `total` cells wide (0: not shown).

    Key columns always; then the others, in order, while they fit at their least width;
    then spare width raises them to their usual width, the classes to their
    widest cell (`classes_width`: a node with two classes), and what is left
    goes to the reason (and some to models): a wide terminal shows whole
    classes and reasons rather than blank space."""
    pad = 2  # KeyedTable's blank either side of a column
    widths: dict[str, int | None] = {key: width for key, _, width in COLUMNS}
    used = sum(
        (name_width if width is None else width) + pad
        for key, _, width in COLUMNS
        if key in KEY_COLUMNS
    )
    sized: dict[str, int] = {}
    for key, least, _ in OPTIONAL_COLUMNS:
        if used + least + pad > total:
            break  # strictly in order: a wider reason beats a far-right REPL
        used += least + pad
        sized[key] = least
    spare = total - used
    for key, least, usual in OPTIONAL_COLUMNS:
        if key in sized:
            grow = min(spare, usual - least)
            sized[key] += grow
            spare -= grow
    if spare > 0 and "classes" in sized:
        grow = max(0, min(spare, classes_width - sized["classes"]))
        sized["classes"] += grow
        spare -= grow
    if spare > 0 and "models" in sized:
        grow = max(0, min(spare // 3, MODELS_MAX - sized["models"]))
        sized["models"] += grow
        spare -= grow
    if spare > 0 and "reason" in sized:
        sized["reason"] += spare
    widths.update({key: sized.get(key, 0) for key, _, _ in OPTIONAL_COLUMNS})
    return widths


AGE_INDEX = len(COLUMNS) - 1
# Rows added per frame when many arrive at once (first load of a big fleet).
FIRST_ROWS = 150
MORE_ROWS = 500
MARK_INDEX = 0


def _same_but_age(a: NodeRow, b: NodeRow) -> bool:
    """Equal apart from report age, which moves on every refresh."""
    da = a.__dict__
    return da == {**b.__dict__, "report_age_s": da["report_age_s"]}


def reason_text(row: NodeRow) -> Text:
    """The reason first (a narrow column cuts the rest), then who set it and
    when, as `sinfo -R` lists them: a wide terminal shows it all."""
    text = Text(no_wrap=True, end="")
    if row.admin.reason:
        text.append(row.admin.reason)
        if row.admin.by:
            text.append(f" · {row.admin.by}", style="dim")
        if row.admin.at is not None:
            text.append(f" {timestamp(row.admin.at)}", style="dim")
    if row.drain_blocked:
        text.append(f"{' ' if text else ''}⚠ {row.drain_blocked}", style="bold red")
    if row.gpu_error:
        text.append(f"{' ' if text else ''}{row.gpu_error}", style="red")
    return text if text else styled("-", "dim")


def unhealthy_text(row: NodeRow) -> Text:
    if row.gpus_unhealthy:
        text = styled(row.gpus_unhealthy, "bold red")
        if row.gpus_unknown:
            text.append(f"{row.gpus_unknown}?", style="magenta")
        return text
    if row.gpus_unknown:
        return styled(f"{row.gpus_unknown}?", "magenta")
    return styled(0, "dim")


def models_text(row: NodeRow) -> Text:
    if not row.models:
        return styled("-", "dim")
    names = sorted(m.rsplit("/", 1)[-1] for m in row.models)
    text = styled(names[0])
    if len(names) > 1:
        text.append(f" +{len(names) - 1}", style="dim")
    return text


def haystack(row: NodeRow) -> str:
    """What `/` matches against, lower-cased once per change."""
    parts = [row.name, row.state, row.admin.reason or "", *row.classes, *row.fabrics, *row.models]
    if row.admin.flag != "none":
        parts.append(row.admin.flag)
    if row.admin.drained:
        parts.append("drained")
    return " ".join(parts).lower()


class NodesTable(KeyedTable):
    """All nodes; `apply()` diffs against what is shown and patches only that."""

    class Filled(Message):
        """Every row of the first load is in the table (posted once)."""

    class MarksChanged(Message):
        def __init__(self, marks: frozenset[str]) -> None:
            super().__init__()
            self.marks = marks

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(zebra_stripes=True, **kwargs)
        self.rows_by_name: dict[str, NodeRow] = {}
        self.ages: Mapping[str, float | None] = {}
        self.marks: set[str] = set()
        self.filter_text = ""
        self.sort_index = 0
        self.reverse = False
        self._hay: dict[str, str] = {}
        self._sort_keys: dict[str, Any] = {}
        self._filling = False
        self._filled = False
        self._age_buckets: dict[str, tuple[str, str]] = {}  # AGE cell shown, by name
        self._classes_widths: dict[str, int] = {}  # CLASSES cell's width, by name
        self.age_offset = 0.0  # seconds since the ages were measured (set_age_offset)

    def on_mount(self) -> None:
        for key, title, width in COLUMNS:
            self.add_column(title, key=key, width=width)
        self._label_sort_column()
        self._layout()

    def on_resize(self) -> None:
        self._layout()

    def _layout(self) -> None:
        # Before the first layout the size is not known: the app's, less borders.
        total = self.size.width or self.app.size.width - 2
        total -= 1  # the vertical scrollbar, once rows overflow
        name = self.columns["name"]
        classes = max(self._classes_widths.values(), default=0)
        self.set_widths(column_widths(total, max(name.content_width, name.label.cell_len), classes))

    # -- data -------------------------------------------------------------------

    def apply(
        self,
        rows: Mapping[str, NodeRow],
        ages: Mapping[str, float | None] | None = None,
        changed: AbstractSet[str] | None = None,
    ) -> int:
        """Show `rows` (filtered and sorted); returns cells touched.

        `ages`: every node's current report age (a row's own `report_age_s` is
        as old as the row). `changed`: the names whose rows may differ from the
        last call, as the controller's delta says; None compares every row.
        """
        old_rows = self.rows_by_name
        self.rows_by_name = dict(rows)
        self.ages = ages if ages is not None else {}
        if self.marks - rows.keys():  # a marked node left the fleet
            self.marks &= rows.keys()
            self.post_message(self.MarksChanged(frozenset(self.marks)))
        if changed is None:
            changed = {
                name
                for name, row in rows.items()
                if (old := old_rows.get(name)) is None or not _same_but_age(old, row)
            }
        else:
            changed = (changed & rows.keys()) | (rows.keys() - old_rows.keys())
        for name in changed:
            self._hay[name] = haystack(rows[name])
        for name in set(self._hay) - set(rows):
            del self._hay[name]
            self._sort_keys.pop(name, None)
            self._age_buckets.pop(name, None)
            self._classes_widths.pop(name, None)
        visible = [n for n in rows if self._matches(n)]
        visible_set = set(visible)
        gone = [k for k in self.shown if k not in visible_set]
        sort = SORTS[self.sort_index]
        resort = False
        by_age = sort.label == "age"
        touched = 0
        missing = len(visible) - (len(self.shown) - len(gone))
        if missing:
            # New rows go in in display order, so a capped first batch is the top.
            visible = self._ordered(visible)
        budget = FIRST_ROWS if not self.shown else MORE_ROWS
        with self.app.batch_update():
            self.drop(gone)
            for name in visible:
                row = rows[name]
                if name in self.shown:
                    if name not in changed:
                        # The common case: only the (bucketed) age may differ.
                        age = age_bucket(self.age_of(row))
                        old_age = self._age_buckets.get(name)
                        if old_age != age:
                            self._age_buckets[name] = age
                            if old_age is not None and (old_age[0] == NEVER) != (age[0] == NEVER):
                                # Heard from at last (or no longer): the state words change too.
                                touched += self.patch_row(name, self._cells_for(row))
                            else:
                                touched += self.patch_cell(name, AGE_INDEX, styled(*age))
                            if by_age:
                                self._sort_keys[name] = sort.key(row, self.age_of(row))
                                resort = True
                        continue
                elif budget <= 0:
                    continue  # added on a later frame, see below
                else:
                    budget -= 1
                    resort = True
                if self._sort_keys.get(name) != sort.key(row, self.age_of(row)):
                    resort = True
                touched += self.patch_row(name, self._cells_for(row))
            if resort:
                self.set_order(self._ordered([n for n in visible if n in self.shown]))
        self._layout()  # a longer name may take room from the reason
        if len(self.shown) < len(visible):
            self._schedule_fill()
        elif not self._filled:
            self._filled = True
            self.post_message(self.Filled())
        return touched

    def _schedule_fill(self) -> None:
        """Add the remaining rows a batch per frame: the first screenful paints
        at once instead of after measuring every cell of 2,000 rows."""
        if not self._filling:
            self._filling = True
            self.call_after_refresh(self._fill)

    def _fill(self) -> None:
        self._filling = False
        self.apply(self.rows_by_name, self.ages, changed=frozenset())

    @property
    def complete(self) -> bool:
        """Every row that matches the filter is in the table (no batch pending)."""
        return not self._filling

    def age_of(self, row: NodeRow) -> float | None:
        """The node's report age now: as the controller last said, plus the
        time since it said so (which keeps growing while it cannot be reached)."""
        age = self.ages.get(row.name, row.report_age_s)
        return None if age is None else age + self.age_offset

    def set_age_offset(self, seconds: float) -> None:
        """Ages on screen move on with the clock between fetches, and while
        the controller is away: rows must not say `<10s` a minute after the
        last answer. Cells change only where a bucket does (see age_bucket)."""
        if abs(seconds - self.age_offset) < 1.0:
            return
        self.age_offset = seconds
        if self.rows_by_name:
            self.apply(self.rows_by_name, self.ages, changed=frozenset())

    def _cells_for(self, row: NodeRow) -> tuple[Text, ...]:
        age = self.age_of(row)
        self._sort_keys[row.name] = SORTS[self.sort_index].key(row, age)
        self._age_buckets[row.name] = age_bucket(age)
        classes = classes_text(row.classes)
        self._classes_widths[row.name] = classes.cell_len
        return (
            self._mark_cell(row.name),
            styled(row.name, "bold"),
            node_state_text(row, age),
            reason_text(row),
            classes,
            gpus_cell(row),
            unhealthy_text(row),
            styled(join_short(row.fabrics, 2) or "-", "cyan" if row.fabrics else "dim"),
            models_text(row),
            count_text(row.replicas, "bold"),
            age_text(age),
        )

    def _mark_cell(self, name: str) -> Text:
        return styled(MARK, "bold cyan") if name in self.marks else styled(" ")

    def _ordered(self, names: list[str]) -> list[str]:
        key, rows, age_of = SORTS[self.sort_index].key, self.rows_by_name, self.age_of
        return sorted(names, key=lambda n: key(rows[n], age_of(rows[n])), reverse=self.reverse)

    def hidden_by_filter(self, names: Iterable[str]) -> list[str]:
        """Of `names`, those the filter hides, in natural order."""
        return sorted((n for n in names if not self._matches(n)), key=natural)

    def _matches(self, name: str) -> bool:
        if not self.filter_text:
            return True
        hay = self._hay.get(name)
        if hay is None:
            hay = self._hay[name] = haystack(self.rows_by_name[name])
        return all(word in hay for word in self.filter_text.lower().split())

    # -- view controls -------------------------------------------------------------

    def set_filter(self, text: str) -> None:
        if text == self.filter_text:
            return
        self.filter_text = text
        self.apply(self.rows_by_name)

    def sort_by(self, label: str) -> SortSpec:
        """Sort by one column (k9s' shift+letter); again on the same column: reverse."""
        index = next(i for i, sort in enumerate(SORTS) if sort.label == label)
        if index == self.sort_index:
            return self.cycle_sort(reverse=True)
        self.sort_index, self.reverse = index, False
        return self._resort()

    def cycle_sort(self, reverse: bool = False) -> SortSpec:
        if reverse:
            self.reverse = not self.reverse
        else:
            # The next column on screen (a narrow terminal hides some).
            for step in range(1, len(SORTS) + 1):
                index = (self.sort_index + step) % len(SORTS)
                if not self.columns[SORTS[index].label].hidden:
                    break
            self.sort_index = index
            self.reverse = False
        return self._resort()

    def _resort(self) -> SortSpec:
        sort = SORTS[self.sort_index]
        self._sort_keys = {n: sort.key(r, self.age_of(r)) for n, r in self.rows_by_name.items()}
        self._label_sort_column()
        self.set_order(self._ordered(list(self.shown)))
        return sort

    def _label_sort_column(self) -> None:
        sort = SORTS[self.sort_index]
        arrow = "▼" if sort.descending != self.reverse else "▲"
        for key, title, _ in COLUMNS:
            if key in self.columns:
                self.set_column_label(key, title + (arrow if key == sort.label else ""))

    def toggle_mark(self, name: str) -> None:
        if name in self.marks:
            self.marks.discard(name)
        else:
            self.marks.add(name)
        if name in self.shown:
            self.patch_cell(name, MARK_INDEX, self._mark_cell(name))
        self.post_message(self.MarksChanged(frozenset(self.marks)))

    def clear_marks(self) -> None:
        marked, self.marks = self.marks, set()
        for name in marked:
            if name in self.shown:
                self.patch_cell(name, MARK_INDEX, self._mark_cell(name))
        self.post_message(self.MarksChanged(frozenset()))

    @property
    def selected(self) -> NodeRow | None:
        key = self.cursor_key
        return self.rows_by_name.get(key) if key else None
