"""One column takes the width a table's others leave: the rule of the models and
events views, whose last column (a status, a message) matters most."""

from __future__ import annotations

from llmgw.console.widgets.keyed_table import PAD, KeyedTable


def fill_width(table: KeyedTable, *, rest: str, rest_min: int, give: str, give_min: int) -> None:
    """Column `rest` takes what the others leave. When that is under `rest_min`,
    column `give` gives up its tail first, down to `give_min` (the view shows the
    row under the cursor whole elsewhere); below both, the table scrolls sideways.
    A hidden `give` stays hidden."""
    others = sum(c.render_width for k, c in table.columns.items() if k not in (rest, give))
    room = table.size.width - others - 1  # the vertical scrollbar
    widths: dict[str, int | None] = {}
    column = table.columns[give]
    if not column.hidden:
        natural = max(column.content_width, column.label.cell_len)
        width = min(natural, max(give_min, room - 4 * PAD - rest_min))
        widths[give] = None if width == natural else width  # None: sized to its cells
        room -= width + 2 * PAD
    widths[rest] = max(rest_min, room - 2 * PAD)
    table.set_widths(widths)  # reshapes only when a width changed
