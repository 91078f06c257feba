"""Pieces every screen of the TUI uses: state colours, a table filled in place, a chart."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable
from textual_plotext import PlotextPlot

from tui.data import AMBER, GREEN, GREY, RED
from tui.history import Series

STYLE = {GREEN: "bold green", AMBER: "bold yellow", RED: "bold red", GREY: "dim"}
GLYPH = {GREEN: "●", AMBER: "▲", RED: "✖", GREY: "○"}


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
             ylabel: str = "µs", yright: str = "") -> None:  # fmt: skip
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        drawn = 0
        for side, series in (("left", left), ("right", right or [])):
            for s in series:
                if s.x:
                    plt.plot(s.x, s.y, label=s.label, yside=side, marker="braille")
                    drawn += 1
        plt.title(title if drawn else f"{title}: no data in the store for this window yet")
        plt.xlabel("minutes ago")
        plt.ylabel(ylabel, yside="left")  # type: ignore[call-arg]  # plotext has it; its stub not
        if right:
            plt.ylabel(yright, yside="right")  # type: ignore[call-arg]
        self.refresh()
