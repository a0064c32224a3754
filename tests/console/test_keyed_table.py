"""KeyedTable on its own: patching by key, the cursor following its row, and
redrawing only the rows that changed."""

from __future__ import annotations

import pytest
from console_pilot import spy_renders
from rich.text import Text
from textual.app import App, ComposeResult

from llmgw.console.widgets.keyed_table import KeyedTable


def row(name: str, value: str = "0") -> tuple[Text, Text]:
    return Text(name), Text(value)


class TableApp(App[None]):
    def __init__(self, rows: int = 50) -> None:
        super().__init__()
        self.rows = rows
        self.selected: list[str] = []
        self.highlighted: list[str] = []

    def compose(self) -> ComposeResult:
        yield KeyedTable(zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(KeyedTable)
        table.add_column("NAME", key="name")
        table.add_column("VALUE", key="value", width=6)
        table.sync({f"n{i:02}": row(f"n{i:02}") for i in range(self.rows)})
        table.focus()

    def on_keyed_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        self.selected.append(event.key)

    def on_keyed_table_row_highlighted(self, event: KeyedTable.RowHighlighted) -> None:
        self.highlighted.append(event.key)


def screen_text(table: KeyedTable) -> list[str]:
    return [table.render_line(y).text.rstrip() for y in range(table.size.height)]


async def test_a_changed_cell_redraws_only_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    async with TableApp().run_test(size=(40, 12)) as pilot:
        table = pilot.app.query_one(KeyedTable)
        await pilot.pause()
        rendered = spy_renders(table, monkeypatch)
        assert table.patch_row("n03", row("n03", "7")) == 1
        assert table.patch_row("n04", row("n04")) == 0  # unchanged: nothing to do
        await pilot.pause()
        assert rendered == ["n03"]
        assert screen_text(table)[4].split() == ["n03", "7"]


async def test_reordering_reuses_every_rendered_row(monkeypatch: pytest.MonkeyPatch) -> None:
    async with TableApp(rows=5).run_test(size=(40, 12)) as pilot:
        table = pilot.app.query_one(KeyedTable)
        await pilot.pause()
        rendered = spy_renders(table, monkeypatch)
        table.set_order(list(reversed(table.order)))
        await pilot.pause()
        assert rendered == []  # zebra and cursor styles are applied, not re-rendered
        assert screen_text(table)[1].split() == ["n04", "0"]


async def test_cursor_follows_its_row_through_sorts_and_removals() -> None:
    async with TableApp(rows=20).run_test(size=(40, 12)) as pilot:
        table = pilot.app.query_one(KeyedTable)
        await pilot.press("j", "j", "j")
        assert table.cursor_key == "n03"
        table.set_order(list(reversed(table.order)))
        assert table.cursor_key == "n03" and table.cursor_row == 16
        table.drop(["n19", "n18", "nope"])  # rows above the cursor go: it stays on n03
        assert table.cursor_key == "n03" and table.cursor_row == 14
        table.drop(["n03"])  # its own row goes: the cursor stays at that line
        assert table.cursor_row == 14 and table.cursor_key == "n02"


async def test_cursor_keys_scroll_and_select() -> None:
    app = TableApp(rows=50)
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(KeyedTable)
        await pilot.press("G")
        assert table.cursor_key == "n49"
        assert table.scroll_offset.y > 0
        assert "n49" in screen_text(table)[-1]
        await pilot.press("g", "pagedown")
        assert table.cursor_row == table.size.height - 2
        await pilot.press("k", "enter")
        assert app.selected == [table.cursor_key]
        assert app.highlighted[-1] == table.cursor_key


async def test_click_highlights_then_selects() -> None:
    app = TableApp(rows=5)
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(KeyedTable)
        await pilot.click(KeyedTable, offset=(2, 3))  # header, n00, n01, n02
        assert table.cursor_key == "n02" and app.selected == []
        await pilot.click(KeyedTable, offset=(2, 3))
        assert app.selected == ["n02"]
        await pilot.click(KeyedTable, offset=(2, 0))  # the header selects nothing
        assert table.cursor_key == "n02" and app.selected == ["n02"]


async def test_auto_width_columns_grow_and_shrink() -> None:
    async with TableApp(rows=3).run_test(size=(60, 12)) as pilot:
        table = pilot.app.query_one(KeyedTable)
        assert table.columns["name"].text_width == 4  # "NAME" is wider than "n00"
        table.patch_row("long", row("a-much-longer-name"))
        assert table.columns["name"].text_width == len("a-much-longer-name")
        await pilot.pause()
        assert "a-much-longer-name  0" in " ".join(screen_text(table))
        table.drop(["long"])
        assert table.columns["name"].text_width == 4


async def test_fixed_width_cells_are_cut_with_an_ellipsis() -> None:
    async with TableApp(rows=1).run_test(size=(60, 12)) as pilot:
        table = pilot.app.query_one(KeyedTable)
        table.patch_row("n00", row("n00", "123456789"))
        await pilot.pause()
        assert screen_text(table)[1].split() == ["n00", "12345…"]


async def test_a_header_label_change_keeps_rows_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    async with TableApp(rows=3).run_test(size=(60, 12)) as pilot:
        table = pilot.app.query_one(KeyedTable)
        await pilot.pause()
        rendered = spy_renders(table, monkeypatch)
        table.set_column_label("value", "VAL▲")
        await pilot.pause()
        assert rendered == ["NAME"]  # the header line only (its first cell)
        assert screen_text(table)[0].split() == ["NAME", "VAL▲"]
