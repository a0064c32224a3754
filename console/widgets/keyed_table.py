"""A DataTable patched in place by stable row keys.

Refreshes never `clear()` and refill: that would reset the cursor, the scroll
position and re-measure every cell. Instead rows are added, removed and
updated cell by cell, and the order is re-applied with `sort`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence

from rich.text import Text
from textual.coordinate import Coordinate
from textual.widgets import DataTable
from textual.widgets.data_table import RowDoesNotExist

Cells = Sequence[Text]

# DataTable.remove_row re-indexes every row (O(rows)); removing hundreds at
# once (a filter keystroke on a 2,000-node table) would stall for seconds.
# Past this many removals the rows are rebuilt in one pass instead.
BULK_REMOVE = 150


class KeyedTable(DataTable[Text]):
    """Rows keyed by a string; the key column's cell text is the row key."""

    def __init__(self, key_column: str, **kwargs: object) -> None:
        kwargs.setdefault("cursor_type", "row")
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.key_column = key_column
        self._cells: dict[str, tuple[Text, ...]] = {}
        self._order: list[str] = []

    @property
    def shown(self) -> Mapping[str, tuple[Text, ...]]:
        return self._cells

    @property
    def cursor_key(self) -> str | None:
        if not self._cells or not self.is_valid_row_index(self.cursor_row):
            return None
        row_key, _ = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0))
        return row_key.value

    def sync(self, rows: Mapping[str, Cells], order: Sequence[str] | None = None) -> int:
        """Make the table show exactly `rows`, in `order` (default: as given).

        Returns how many cells were touched (for tests and the bench).
        """
        order = list(order if order is not None else rows)
        cursor = self.cursor_key
        touched = 0
        gone = [k for k in self._cells if k not in rows]
        with self.app.batch_update():
            if len(gone) > BULK_REMOVE:
                touched += self._rebuild(rows, order)
            else:
                for key in gone:
                    self._remove(key)
                for key in order:
                    touched += self.patch_row(key, rows[key])
                if order != self._order:
                    self._apply_order(order)
            self._restore_cursor(cursor)
        return touched

    def patch_row(self, key: str, cells: Cells) -> int:
        """Add the row, or update only the cells that differ."""
        old = self._cells.get(key)
        new = tuple(cells)
        if old is None:
            self.add_row(*new, key=key)
            self._cells[key] = new
            self._order.append(key)
            return len(new)
        if old == new:
            return 0
        touched = 0
        for column, (was, now) in zip(self.columns, zip(old, new, strict=True), strict=True):
            if was != now:
                self.update_cell(key, column, now)
                touched += 1
        self._cells[key] = new
        return touched

    def patch_cell(self, key: str, index: int, cell: Text) -> bool:
        old = self._cells[key]
        if old[index] == cell:
            return False
        column = list(self.columns)[index]
        self.update_cell(key, column, cell)
        self._cells[key] = (*old[:index], cell, *old[index + 1 :])
        return True

    def drop(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._remove(key)

    def _remove(self, key: str) -> None:
        with contextlib.suppress(RowDoesNotExist):
            self.remove_row(key)
        self._cells.pop(key, None)
        if key in self._order:
            self._order.remove(key)

    def _apply_order(self, order: Sequence[str]) -> None:
        rank = {key: i for i, key in enumerate(order)}
        last = len(rank)
        self.sort(self.key_column, key=lambda cell: rank.get(cell.plain, last))
        self._order = [k for k in order if k in self._cells]

    def _rebuild(self, rows: Mapping[str, Cells], order: Sequence[str]) -> int:
        # Only for mass removal (see BULK_REMOVE): cheaper than O(n²) remove_row.
        self.clear()
        self._cells = {}
        self._order = []
        touched = 0
        for key in order:
            touched += self.patch_row(key, rows[key])
        return touched

    def _restore_cursor(self, key: str | None) -> None:
        """Keep the cursor on the same row key, wherever that row moved."""
        if key is None or key not in self._cells:
            return
        index = self.get_row_index(key)
        if index != self.cursor_row:
            self.move_cursor(row=index, animate=False)


class GlanceTable(KeyedTable):
    """A summary pane: read at a glance, scrolled with the mouse, never focused,
    so the keys always act on the nodes table."""

    can_focus = False

    def __init__(self, key_column: str, **kwargs: object) -> None:
        super().__init__(key_column, cursor_type="none", **kwargs)
