"""A table of rows keyed by stable strings, patched in place, drawn a line at a time.

Textual's DataTable keys all its render caches on one table-wide update
counter, so changing any cell re-renders every visible cell: at 2,000 nodes a
refresh that changed five rows cost three times a cursor move. Here each row
is rendered once into a `Strip` held by its key and dropped only when that
row's cells change; a refresh that changes two visible rows redraws two lines.

Refreshes never clear and refill: rows are added, removed and updated by key,
the order is replaced in one assignment, and the cursor follows its row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

Cells = Sequence[Text]

PAD = 1  # blank cells either side of each column, as DataTable draws them
HEADER_HEIGHT = 1


@dataclass
class Column:
    key: str
    label: Text
    width: int | None  # fixed; None: as wide as its widest cell
    content_width: int = 0  # widest cell seen (for auto-width columns)
    hidden: bool = False  # not drawn (a narrow terminal): see set_widths
    cut_middle: bool = False  # cut a long cell in the middle (names that differ at the end)

    @property
    def text_width(self) -> int:
        if self.hidden:
            return 0
        if self.width is not None:
            return self.width
        return max(self.content_width, self.label.cell_len)

    @property
    def render_width(self) -> int:
        return 0 if self.hidden else self.text_width + 2 * PAD


def cut_middle(name: str, width: int) -> str:
    """`meta-llama/…3.1-70B`: the organisation and the tail, where names that
    share a prefix differ; the end cut both to `meta-llama/Llama-3.…`."""
    if len(name) <= width:
        return name
    if width < 3:
        return name[:width]
    org, slash, _ = name.partition("/")
    head = org + slash if slash and len(org) + 1 <= width - 8 else name[: (width - 1) // 2]
    return head + "…" + name[len(name) - (width - 1 - len(head)) :]


def _one_line(cell: Text) -> Text:
    """A cell is one line: anything after a newline (say, in a reason) is cut."""
    return cell.split("\n")[0] if "\n" in cell.plain else cell


class RowMessage(Message):
    """Something happened to one row of a table (see KeyedTable's messages)."""

    def __init__(self, table: KeyedTable, key: str) -> None:
        super().__init__()
        self.table = table
        self.key = key

    @property
    def control(self) -> KeyedTable:
        return self.table


class KeyedTable(ScrollView, can_focus=True):
    """Rows of `Text` cells, each row known by a string key."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "keyed-table--header",
        "keyed-table--cursor",
        "keyed-table--even-row",
    }

    DEFAULT_CSS = """
    KeyedTable {
        background: $surface;
        color: $foreground;
        height: auto;
        max-height: 100%;
        scrollbar-size: 1 1;
        & > .keyed-table--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        & > .keyed-table--even-row {
            background: $surface-lighten-1 50%;
        }
        &:dark > .keyed-table--even-row {
            background: $surface-darken-1 40%;
        }
        & > .keyed-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        &:focus {
            background-tint: $foreground 5%;
            & > .keyed-table--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
        }
    }
    """

    # k9s and less: j/k and g/G move as well as the arrows and Home/End.
    # Priority bindings: a move is made when the app reads the key, in order
    # with the screen's keys (a `c` typed after `j j` acts on the node moved to).
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Select", show=False, priority=True),
        Binding("up,k", "cursor_up", "Cursor up", show=False, priority=True),
        Binding("down,j", "cursor_down", "Cursor down", show=False, priority=True),
        Binding("pageup", "page_up", "Page up", show=False, priority=True),
        Binding("pagedown", "page_down", "Page down", show=False, priority=True),
        Binding("home,g", "cursor_top", "Top", show=False, priority=True),
        Binding("end,G", "cursor_bottom", "Bottom", show=False, priority=True),
    ]

    class RowHighlighted(RowMessage):
        """The cursor is on a different row."""

    class RowSelected(RowMessage):
        """Enter, or a click on the row under the cursor."""

    def __init__(
        self,
        *,
        show_cursor: bool = True,
        zebra_stripes: bool = False,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.show_cursor = show_cursor
        self.zebra_stripes = zebra_stripes
        self.columns: dict[str, Column] = {}
        self.cursor_row = 0
        self._cells: dict[str, tuple[Text, ...]] = {}
        self._order: list[str] = []
        self._index: dict[str, int] = {}
        self._strips: dict[str, Strip] = {}  # each row rendered unstyled, by key
        self._header: Strip | None = None
        self._row_styles: tuple[Style, Style, Style, Style] | None = None
        self._resize_pending = False
        # At least as many rows as can be on screen, kept by on_resize: checking
        # the exact viewport (scrollbars come and go) per changed row is slow.
        self._rows_on_screen_max = 0

    def on_resize(self) -> None:
        self._rows_on_screen_max = self.region.height

    # -- reading ------------------------------------------------------------------

    @property
    def shown(self) -> Mapping[str, tuple[Text, ...]]:
        """Cells of every row in the table, by key."""
        return self._cells

    @property
    def order(self) -> Sequence[str]:
        return self._order

    @property
    def row_count(self) -> int:
        return len(self._order)

    @property
    def cursor_key(self) -> str | None:
        if not self.show_cursor or not self._order:
            return None
        return self._order[min(self.cursor_row, len(self._order) - 1)]

    def get_row_index(self, key: str) -> int:
        return self._index[key]

    def get_row_at(self, index: int) -> list[Text]:
        return list(self._cells[self._order[index]])

    # -- columns ------------------------------------------------------------------

    def add_column(
        self, label: str | Text, *, key: str, width: int | None = None, cut_middle: bool = False
    ) -> None:
        label = Text(label) if isinstance(label, str) else label
        self.columns[key] = Column(key, label, width, cut_middle=cut_middle)
        self._reshape()

    def set_column_label(self, key: str, label: str | Text) -> None:
        column = self.columns[key]
        old_width = column.render_width
        column.label = Text(label) if isinstance(label, str) else label
        if column.render_width != old_width:
            self._reshape()
        else:
            self._header = None
            self.refresh_line(self.scroll_offset.y)  # the header is the top line

    def set_widths(self, widths: Mapping[str, int | None]) -> None:
        """Fixed widths by column key (None: sized to content, 0: hidden);
        one reshape, and only if something changed."""
        changed = False
        for key, width in widths.items():
            column = self.columns[key]
            if width == 0:
                if not column.hidden:
                    column.hidden = changed = True
            elif column.hidden or column.width != width:
                column.hidden, column.width, changed = False, width, True
        if changed:
            self._reshape()

    def clear(self, columns: bool = False) -> None:
        """Remove every row (and the columns too, if asked)."""
        self._cells.clear()
        self._strips.clear()
        self._order = []
        self._index = {}
        self.cursor_row = 0
        if columns:
            self.columns.clear()
        self._reshape()

    # -- patching -------------------------------------------------------------------

    def sync(self, rows: Mapping[str, Cells], order: Sequence[str] | None = None) -> int:
        """Make the table show exactly `rows`, in `order` (default: as given).

        Returns how many cells were touched (for tests and the bench).
        """
        order = list(order if order is not None else rows)
        self.drop([k for k in self._cells if k not in rows])
        touched = sum(self.patch_row(key, rows[key]) for key in order)
        self.set_order(order)
        return touched

    def patch_row(self, key: str, cells: Cells) -> int:
        """Add the row (at the end), or replace it if any cell differs.
        Returns how many cells differ."""
        new = tuple(cells)
        old = self._cells.get(key)
        if old is None:
            self._cells[key] = new
            self._index[key] = len(self._order)
            self._order.append(key)
            self._measure(new)
            self._resize_soon()
            self._refresh_row(key)
            return len(new)
        if old == new:
            return 0
        self._cells[key] = new
        self._strips.pop(key, None)
        self._measure(new)
        self._refresh_row(key)
        return sum(1 for was, now in zip(old, new, strict=True) if was != now)

    def patch_cell(self, key: str, index: int, cell: Text) -> bool:
        old = self._cells[key]
        if old[index] == cell:
            return False
        self.patch_row(key, (*old[:index], cell, *old[index + 1 :]))
        return True

    def drop(self, keys: Iterable[str]) -> None:
        """Remove rows by key (unknown keys are ignored); one pass for all."""
        gone = {k for k in keys if k in self._cells}
        if not gone:
            return
        cursor, cursor_row = self.cursor_key, self.cursor_row
        for key in gone:
            del self._cells[key]
            self._strips.pop(key, None)
        self.set_order([k for k in self._order if k not in gone])
        if any(column.width is None for column in self.columns.values()):
            self._remeasure()
        if cursor in gone:  # the cursor stays where it was, on the next row
            self._move_to(cursor_row)

    def set_order(self, order: Sequence[str]) -> None:
        """Show the rows in `order` (keys of rows already in the table); the
        cursor stays on its row wherever that moved."""
        order = [k for k in order if k in self._cells]
        if order == self._order:
            return
        cursor = self.cursor_key
        self._order = order
        self._index = {k: i for i, k in enumerate(order)}
        self._resize()
        self.refresh()
        self.restore_cursor(cursor)

    def restore_cursor(self, key: str | None) -> None:
        """Keep the cursor on the same row key, wherever that row moved."""
        index = self._index.get(key) if key is not None else None
        if index is not None and index != self.cursor_row:
            self._move_to(index, announce=False)

    # -- cursor -----------------------------------------------------------------------

    def move_cursor(self, *, row: int, animate: bool = False) -> None:
        self._move_to(row)

    def _move_to(self, row: int, announce: bool = True) -> None:
        row = max(0, min(row, self.row_count - 1))
        old = self.cursor_row
        self.cursor_row = row
        if row != old:
            self._refresh_index(old)
            self._refresh_index(row)
            if announce and self.show_cursor and self._order:
                self.post_message(self.RowHighlighted(self, self._order[row]))
        self._scroll_into_view(row)

    def _scroll_into_view(self, row: int) -> None:
        visible = self._visible_rows()
        if visible <= 0:
            return
        top = self.scroll_offset.y
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + visible:
            self.scroll_to(y=row - visible + 1, animate=False, immediate=True)

    def _page(self) -> int:
        return max(1, self._visible_rows() - 1)

    def _visible_rows(self) -> int:
        return max(0, self.scrollable_content_region.height - HEADER_HEIGHT)

    def action_cursor_up(self) -> None:
        self._move_to(self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self._move_to(self.cursor_row + 1)

    def action_page_up(self) -> None:
        self._move_to(self.cursor_row - self._page())

    def action_page_down(self) -> None:
        self._move_to(self.cursor_row + self._page())

    def action_cursor_top(self) -> None:
        self._move_to(0)

    def action_cursor_bottom(self) -> None:
        self._move_to(self.row_count - 1)

    def action_select_cursor(self) -> None:
        key = self.cursor_key
        if key is not None:
            self.post_message(self.RowSelected(self, key))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y < HEADER_HEIGHT or not self.show_cursor:
            return
        row = self.scroll_offset.y + offset.y - HEADER_HEIGHT
        if row >= self.row_count:
            return
        if row == self.cursor_row:
            self.action_select_cursor()
        else:
            self._move_to(row)

    def on_focus(self) -> None:
        self._row_styles = None
        self._refresh_index(self.cursor_row)

    def on_blur(self) -> None:
        self._row_styles = None
        self._refresh_index(self.cursor_row)

    # -- geometry ---------------------------------------------------------------------

    def _measure(self, cells: tuple[Text, ...]) -> None:
        """Widen auto-width columns for a new or changed row."""
        grew = False
        for column, cell in zip(self.columns.values(), cells, strict=False):
            if column.width is None:
                width = _one_line(cell).cell_len
                if width > column.content_width:
                    column.content_width = width
                    grew = True
        if grew:
            self._reshape()

    def _remeasure(self) -> None:
        """After removals: auto-width columns shrink back to their widest cell."""
        changed = False
        for i, column in enumerate(self.columns.values()):
            if column.width is None:
                widest = max(
                    (_one_line(cells[i]).cell_len for cells in self._cells.values()), default=0
                )
                if widest != column.content_width:
                    column.content_width = widest
                    changed = True
        if changed:
            self._reshape()

    def _reshape(self) -> None:
        """Column widths changed: every cached line is the wrong width."""
        self._strips.clear()
        self._header = None
        self._resize()
        self.refresh()

    def _resize_soon(self) -> None:
        """Resize once after the current message: adding 2,000 rows one by one
        would otherwise re-layout 2,000 times."""
        if not self._resize_pending:
            self._resize_pending = True
            self.call_next(self._resize)

    def _resize(self) -> None:
        self._resize_pending = False
        width = sum(column.render_width for column in self.columns.values())
        size = Size(width, self.row_count + HEADER_HEIGHT)
        if size != self.virtual_size:
            self.virtual_size = size

    def _refresh_row(self, key: str) -> None:
        index = self._index.get(key)
        if index is not None:
            self._refresh_index(index)

    def _refresh_index(self, index: int) -> None:
        top = self.scroll_offset.y
        if top <= index < top + self._rows_on_screen_max:
            self.refresh_line(index + HEADER_HEIGHT)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._row_styles = None
        self._header = None

    # -- drawing ----------------------------------------------------------------------

    def _render_cells(self, cells: Iterable[Text], style: Style | None = None) -> Strip:
        console = self.app.console
        pad = Segment(" " * PAD)
        segments: list[Segment] = []
        for column, cell in zip(self.columns.values(), cells, strict=False):
            if column.hidden:
                continue
            text = _one_line(cell).copy()
            if column.cut_middle and text.cell_len > column.text_width:
                text = Text(cut_middle(text.plain, column.text_width), style=text.style)
            text.truncate(column.text_width, overflow="ellipsis", pad=True)
            segments.append(pad)
            if text.style:  # Text.render leaves the base style to the Console
                base = console.get_style(text.style)
                segments.extend(Segment.apply_style(text.render(console), base))
            else:
                segments.extend(text.render(console))
            segments.append(pad)
        strip = Strip(segments).simplify()
        return strip.apply_style(style) if style else strip

    def _render_row(self, key: str) -> Strip:
        strip = self._strips.get(key)
        if strip is None:
            strip = self._strips[key] = self._render_cells(self._cells[key])
        return strip

    def _styles(self) -> tuple[Style, Style, Style, Style]:
        """(base, header, even row, cursor) as Rich styles, worked out once per
        focus or theme change rather than once per line."""
        if self._row_styles is None:
            base = self.rich_style
            self._row_styles = (
                base,
                base + self.get_component_rich_style("keyed-table--header", partial=True),
                base + self.get_component_rich_style("keyed-table--even-row", partial=True),
                base + self.get_component_rich_style("keyed-table--cursor", partial=True),
            )
        return self._row_styles

    def render_line(self, y: int) -> Strip:
        base, header, even, cursor = self._styles()
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y < HEADER_HEIGHT:
            if self._header is None:
                self._header = self._render_cells(c.label for c in self.columns.values())
            line = self._header.apply_style(header)
        else:
            index = scroll_y + y - HEADER_HEIGHT
            if index >= len(self._order):
                return Strip.blank(width, base)
            strip = self._render_row(self._order[index])
            if self.show_cursor and index == self.cursor_row:
                style = cursor
            elif self.zebra_stripes and index % 2 == 0:
                style = even
            else:
                style = base
            line = strip.apply_style(style)
        return line.crop_extend(scroll_x, scroll_x + width, base)


class GlanceTable(KeyedTable):
    """A summary pane: read at a glance, scrolled with the mouse, never focused,
    so the keys always act on the nodes table."""

    can_focus = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(show_cursor=False, **kwargs)
