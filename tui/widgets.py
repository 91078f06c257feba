"""Pieces every screen of the TUI uses: state colours, a table filled in place, a chart."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import DataTable
from textual_plotext import PlotextPlot

from tui.data import AFFECTED, AMBER, CULPRIT, GREEN, GREY, RED
from tui.history import Series

STYLE = {GREEN: "bold green", AMBER: "bold yellow", RED: "bold red", GREY: "dim",
         CULPRIT: "bold reverse red", AFFECTED: "cyan"}  # fmt: skip
GLYPH = {GREEN: "●", AMBER: "▲", RED: "✖", GREY: "○", CULPRIT: "◆", AFFECTED: "◌"}


def us(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def fill(table: DataTable, rows: list[tuple[str, tuple[Any, ...]]]) -> None:
    """Show ``rows`` (key, cells): when the keys are the same rows in the same order, only
    the cells that changed are updated (DataTable measures every cell it is given, so a
    rebuild of every row each second would cost more than the refresh budget), and the
    cursor stays where the user put it."""
    # Plain strings become Text here: DataTable would parse each as markup on every render
    # (a bracket in a name or an evidence string is not markup), and every cell of the
    # visible rows is rendered again after any update.
    rows = [(k, tuple(Text(c, no_wrap=True, end="") if isinstance(c, str) else c for c in cells))
            for k, cells in rows]  # fmt: skip
    keys = [k for k, _ in rows]
    if keys != [r.value for r in table.rows] or table.columns is None:
        cursor = table.cursor_row
        table.clear()
        for key, cells in rows:
            table.add_row(*cells, key=key)
        if rows:
            table.move_cursor(row=min(cursor, len(rows) - 1))
        return
    columns = list(table.columns)
    for key, cells in rows:
        old = table.get_row(key)
        for col, new, was in zip(columns, cells, old, strict=True):
            if str(new) != str(was):
                table.update_cell(key, col, new)  # columns have fixed widths: no re-measure


class Chart(PlotextPlot):
    """Lines over the last minutes (x: minutes before now); a second y axis on the right
    for a series in other units or at another scale (raw delay carries clock offsets)."""

    def show(self, title: str, left: list[Series], right: list[Series] | None = None,
             ylabel: str = "µs", yright: str = "", minutes: float = 60) -> None:  # fmt: skip
        """Draw the series over the last ``minutes`` (the x axis spans all of it, so one
        minute of data sits where it belongs instead of stretching the axis)."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        drawn = 0
        for side, series in (("left", left), ("right", right or [])):
            for s in series:
                if s.x:
                    plt.plot(s.x, s.y, label=s.label, yside=side, marker="hd")
                    drawn += 1
        plt.title(title if drawn else f"{title}: no data in the store for this window yet")
        plt.xlim(-minutes, 0)
        plt.xlabel("minutes ago")
        plt.ylabel(ylabel, yside="left")  # type: ignore[call-arg]  # plotext has it; its stub not
        if right:
            plt.ylabel(yright, yside="right")  # type: ignore[call-arg]
        self.refresh()


Cell = str | Text | tuple[str, str]  # plain, rich Text, or (text, rich style)


class RowList(ScrollView, can_focus=True):
    """A keyed table for many rows that change every second: the fleet's NICs.

    Textual's ``DataTable`` renders every visible row again after any cell update (its
    render caches are keyed on an update counter) and measures every cell it is given;
    at 1,024 NICs that was most of a refresh and the reason the table listed only 100.
    Here each row is rendered when it is shown and kept until its cells change, so a
    refresh costs the rows that changed on screen, and every NIC can be listed.
    Keys: up/down, page up/down, home/end; enter or a click selects (``Selected``)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "cursor(-1_000_000_000)", "First", show=False),
        Binding("end", "cursor(1_000_000_000)", "Last", show=False),
        Binding("enter", "select", "Select", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "rowlist--header", "rowlist--cursor", "rowlist--even", "rowlist--odd",
    }  # fmt: skip
    DEFAULT_CSS = """
    RowList {
        background: $surface;
        color: $foreground;
        height: 1fr;
        & > .rowlist--header { text-style: bold; background: $panel; color: $foreground; }
        & > .rowlist--even { background: $surface-lighten-1 50%; }
        & > .rowlist--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
        }
        &:focus > .rowlist--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
    }
    """

    class Selected(Message):
        """A row was chosen with enter or a click."""

        def __init__(self, row_list: RowList, key: str, index: int) -> None:
            super().__init__()
            self.row_list, self.key, self.index = row_list, key, index

        @property
        def control(self) -> RowList:
            return self.row_list

    def __init__(self, columns: list[tuple[str, int]], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.columns = columns
        self._width = sum(w + 2 for _, w in columns)
        self._keys: list[str] = []
        self._rows: list[tuple[Cell, ...]] = []
        self._rendered: dict[str, tuple[tuple[Cell, ...], Strip]] = {}
        self._header: Strip | None = None
        self.cursor_row = 0
        self.virtual_size = Size(self._width, 1)

    # ---- data --------------------------------------------------------------------
    @property
    def row_count(self) -> int:
        return len(self._rows)

    def get_row_at(self, index: int) -> tuple[str, ...]:
        return tuple(_plain(c) for c in self._rows[index])

    @property
    def cursor_key(self) -> str | None:
        return self._keys[self.cursor_row] if self._keys else None

    def set_rows(self, rows: list[tuple[str, tuple[Cell, ...]]]) -> None:
        """Show ``rows`` (key, cells). The cursor stays on its row's key while that row is
        listed. Nothing is rendered here: a row is, when it is on screen and changed."""
        keys = [k for k, _ in rows]
        cells = [c for _, c in rows]
        if keys == self._keys and cells == self._rows:
            return
        at = self.cursor_key
        self._keys, self._rows = keys, cells
        if len(self._rendered) > 2 * len(keys) + 64:  # rows gone for good
            live = set(keys)
            self._rendered = {k: v for k, v in self._rendered.items() if k in live}
        if at is not None and keys[self.cursor_row : self.cursor_row + 1] != [at] and at in keys:
            self.cursor_row = keys.index(at)
        self.cursor_row = max(0, min(self.cursor_row, len(keys) - 1))
        self.virtual_size = Size(self._width, len(keys) + 1)
        self.refresh()

    # ---- rendering ---------------------------------------------------------------
    def _strip(self, cells: tuple[Cell, ...]) -> Strip:
        line = Text(no_wrap=True, end="")
        for cell, (_, width) in zip(cells, self.columns, strict=False):
            text = (cell if isinstance(cell, Text) else Text(cell[0], style=cell[1])
                    if isinstance(cell, tuple) else Text(cell)).copy()  # fmt: skip
            text.truncate(width, overflow="ellipsis", pad=True)
            line.append(" ")
            line.append_text(text)
            line.append(" ")
        return Strip(list(line.render(self.app.console)), self._width)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y == 0:
            if self._header is None:
                self._header = self._strip(tuple(Text(label) for label, _ in self.columns))
            strip = self._header
            style = self.get_component_rich_style("rowlist--header")
            return strip.apply_style(style).crop_extend(scroll_x, scroll_x + width, style)
        index = scroll_y + y - 1
        base = self.rich_style
        if index >= len(self._rows):
            return Strip.blank(width, base)
        key, cells = self._keys[index], self._rows[index]
        done = self._rendered.get(key)
        if done is None or done[0] != cells:
            done = (cells, self._strip(cells))
            self._rendered[key] = done
        name = "cursor" if index == self.cursor_row else "even" if index % 2 else "odd"
        style = base + self.get_component_rich_style(f"rowlist--{name}")
        return done[1].apply_style(style).crop_extend(scroll_x, scroll_x + width, style)

    # ---- keys and mouse -----------------------------------------------------------
    def _move_to(self, index: int) -> None:
        if not self._rows:
            return
        self.cursor_row = max(0, min(index, len(self._rows) - 1))
        visible = max(1, self.size.height - 1)
        top = self.scroll_offset.y
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + visible:
            self.scroll_to(y=self.cursor_row - visible + 1, animate=False)
        self.refresh()

    def action_cursor(self, step: int) -> None:
        self._move_to(self.cursor_row + step)

    def action_page(self, pages: int) -> None:
        self._move_to(self.cursor_row + pages * max(1, self.size.height - 2))

    def action_select(self) -> None:
        if self._rows:
            self.post_message(self.Selected(self, self._keys[self.cursor_row], self.cursor_row))

    def move_cursor(self, row: int) -> None:
        self._move_to(row)

    def on_click(self, event: events.Click) -> None:
        index = self.scroll_offset.y + event.y - 1
        if event.y >= 1 and 0 <= index < len(self._rows):
            self._move_to(index)
            self.action_select()


def _plain(cell: Cell) -> str:
    return cell if isinstance(cell, str) else cell[0] if isinstance(cell, tuple) else cell.plain
