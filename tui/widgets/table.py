"""A table that redraws only the rows that changed.

Textual's DataTable re-renders every visible cell after any cell update, which
at 10 updates a second and 500 graphs costs more than the whole dashboard may
spend. :class:`LiveTable` uses the line API instead: each row is rendered once
into a cached strip; :meth:`LiveTable.put_row` compares the new cells with the
old ones (text and style) and, when they differ, drops that row's strip and
refreshes that one line if it is on screen. The header stays on top while
the rows scroll.

Keys: up/down, page up/down, home/end move the cursor (when the table has
one); enter posts :class:`LiveTable.Selected`; moving posts
:class:`LiveTable.Highlighted`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tui.widgets.common import cell_signature

GAP = 2  # cells between columns
Column = tuple[str, str, int | None]  # key, label, width (None: share what is left)


class LiveTable(ScrollView, can_focus=True):
    """Rows keyed by string, drawn from cached strips, optionally with a cursor."""

    DEFAULT_CSS = """
    LiveTable { height: auto; scrollbar-size-vertical: 1; overflow-x: hidden; }
    LiveTable > .live-table--header { text-style: bold; }
    LiveTable > .live-table--cursor { background: $block-cursor-background;
                                      color: $block-cursor-foreground; }
    LiveTable:blur > .live-table--cursor { background: $block-cursor-blurred-background; }
    """
    COMPONENT_CLASSES = {"live-table--header", "live-table--cursor"}
    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "cursor(-1000000000)", "First", show=False),
        Binding("end", "cursor(1000000000)", "Last", show=False),
        Binding("enter", "select", "Select", show=False),
    ]

    class Highlighted(Message):
        """The cursor moved to row ``key``."""

        def __init__(self, table: LiveTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> LiveTable:
            return self.table

    class Selected(Message):
        """Enter (or a click) on row ``key``."""

        def __init__(self, table: LiveTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> LiveTable:
            return self.table

    def __init__(self, *, cursor: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.show_cursor = cursor
        self.cursor_row = 0
        self.user_moved = False  # the user moved the cursor (else it may follow the top)
        self.row_keys: list[str] = []
        self._lt_index: dict[str, int] = {}
        self._lt_cells: dict[str, dict[str, object]] = {}
        self._lt_sigs: dict[str, list[object]] = {}
        self._lt_strips: dict[str, Strip] = {}
        self._lt_columns: list[Column] = []
        self._lt_widths: list[int] = []
        self._lt_header: Strip | None = None
        self._lt_layout_width = -1
        self._lt_resize_pending = False
        self._lt_batch: list[int] | None = None  # rows changed inside :meth:`batch`

    # Data -------------------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self.row_keys)

    @property
    def cursor_key(self) -> str | None:
        """The key of the row under the cursor."""
        if self.show_cursor and 0 <= self.cursor_row < len(self.row_keys):
            return self.row_keys[self.cursor_row]
        return None

    def reset(self, columns: Sequence[Column]) -> None:
        """Drops every row and sets the columns."""
        self._lt_columns = list(columns)
        self.row_keys, self._lt_index = [], {}
        self._lt_cells.clear()
        self._lt_sigs.clear()
        self._lt_strips.clear()
        self._lt_header = None
        self._lt_layout_width = -1
        self.cursor_row = 0
        self.user_moved = False
        self._resize()
        self.refresh()

    def get_cell(self, key: str, column: str) -> object:
        """What row ``key`` shows in ``column``."""
        return self._lt_cells[key].get(column, "")

    def put_row(self, key: str, cells: Mapping[str, object]) -> bool:
        """Adds row ``key`` (at the end) or updates it; True if anything changed."""
        sigs = [cell_signature(cells.get(c[0], "")) for c in self._lt_columns]
        if key in self._lt_index:
            if self._lt_sigs[key] == sigs:
                return False
            self._lt_cells[key], self._lt_sigs[key] = dict(cells), sigs
            self._lt_strips.pop(key, None)
            self._refresh_row(self._lt_index[key])
            return True
        self._lt_index[key] = len(self.row_keys)
        self.row_keys.append(key)
        self._lt_cells[key], self._lt_sigs[key] = dict(cells), sigs
        self._resize()
        self.refresh()
        return True

    def put_cell(self, key: str, column: str, value: object) -> bool:
        """Updates one cell of row ``key`` (which exists); True if it changed."""
        i = next(i for i, c in enumerate(self._lt_columns) if c[0] == column)
        sig = cell_signature(value)
        sigs = self._lt_sigs[key]
        if sigs[i] == sig:
            return False
        sigs[i] = sig
        self._lt_cells[key][column] = value
        self._lt_strips.pop(key, None)
        self._refresh_row(self._lt_index[key])
        return True

    def batch(self) -> _Batch:
        """``with table.batch():`` row changes inside it are drawn with one
        refresh at the end instead of one per row (many rows changing at once,
        e.g. every cost cell after a step, cost far less)."""
        return _Batch(self)

    def drop_row(self, key: str) -> None:
        """Removes row ``key`` if present."""
        if key not in self._lt_index:
            return
        self.row_keys.remove(key)
        self._lt_index = {k: i for i, k in enumerate(self.row_keys)}
        for store in (self._lt_cells, self._lt_sigs, self._lt_strips):
            store.pop(key, None)  # type: ignore[attr-defined]
        self.cursor_row = min(self.cursor_row, max(0, len(self.row_keys) - 1))
        self._resize()
        self.refresh()

    def order(self, key: Callable[[str], Any], reverse: bool = False) -> None:
        """Re-orders the rows by ``key(row_key)``; the cursor stays on its row."""
        current = self.cursor_key
        before = list(self.row_keys)
        self.row_keys.sort(key=key, reverse=reverse)
        if self.row_keys == before:
            return  # the same order: nothing to redraw
        self._lt_index = {k: i for i, k in enumerate(self.row_keys)}
        if current is not None:
            self.cursor_row = self._lt_index[current]
        self.refresh()

    def move_cursor(self, row: int, announce: bool = True) -> None:
        """Puts the cursor on ``row`` (clamped) and scrolls it into view;
        posts :class:`Highlighted` if it moved, unless ``announce`` is False
        (the owner placing it where its data says, not the user moving it)."""
        if not self.row_keys:
            self.cursor_row = 0
            return
        row = max(0, min(len(self.row_keys) - 1, row))
        old, self.cursor_row = self.cursor_row, row
        if old != row:
            self._refresh_row(old)
            self._refresh_row(row)
            if announce:
                self.post_message(self.Highlighted(self, self.row_keys[row]))
        top = int(self.scroll_offset.y)
        visible = max(1, self.scrollable_content_region.height - 1)
        if row < top:
            self.scroll_to(y=row, animate=False)
        elif row >= top + visible:
            self.scroll_to(y=row - visible + 1, animate=False)

    # Keys -------------------------------------------------------------------

    def action_cursor(self, step: int) -> None:
        self.user_moved = True
        if self.show_cursor:
            self.move_cursor(self.cursor_row + step)
        else:
            self.scroll_to(y=self.scroll_offset.y + step, animate=False)

    def action_page(self, step: int) -> None:
        self.action_cursor(step * max(1, self.scrollable_content_region.height - 1))

    def action_select(self) -> None:
        key = self.cursor_key
        if key is not None:
            self.post_message(self.Selected(self, key))

    def on_click(self, event: Click) -> None:
        row = int(self.scroll_offset.y) + event.y - 1
        if self.show_cursor and 0 <= row < len(self.row_keys):
            self.user_moved = True
            self.move_cursor(row)
            if event.chain >= 2:
                self.action_select()

    # Drawing ----------------------------------------------------------------

    def _resize(self) -> None:
        """Sets the virtual size once per batch of row changes (a change of it
        costs a layout pass)."""
        if not self._lt_resize_pending:
            self._lt_resize_pending = True
            self.call_later(self._apply_size)

    def _apply_size(self) -> None:
        self._lt_resize_pending = False
        size = Size(max(1, self.scrollable_content_region.width), len(self.row_keys) + 1)
        if size != self.virtual_size:
            self.virtual_size = size

    def _refresh_row(self, index: int) -> None:
        if self._lt_batch is not None:
            self._lt_batch.append(index)
            return
        top = int(self.scroll_offset.y)
        if top <= index < top + self.size.height:
            self.refresh_line(index + 1)  # virtual line: the header is line 0

    def on_resize(self) -> None:
        self._apply_size()

    def _fit_columns(self, width: int) -> None:
        fixed = sum(w for _, _, w in self._lt_columns if w is not None)
        auto = [c for c in self._lt_columns if c[2] is None]
        room = max(0, width - fixed - GAP * max(0, len(self._lt_columns) - 1) - 1)
        share = max(4, room // len(auto)) if auto else 0
        self._lt_widths = [w if w is not None else share for _, _, w in self._lt_columns]
        self._lt_layout_width = width
        self._lt_strips.clear()
        self._lt_header = None

    def _render_cells(self, cells: Sequence[object], style: Style) -> Strip:
        line = Text(no_wrap=True, overflow="ellipsis")
        for i, (value, width) in enumerate(zip(cells, self._lt_widths, strict=True)):
            t = value.copy() if isinstance(value, Text) else Text(str(value))
            t.no_wrap = True
            t.truncate(width, overflow="ellipsis")
            pad = width - t.cell_len
            if pad > 0:
                if t.justify == "right":
                    t.pad_left(pad)
                else:
                    t.pad_right(pad)
            if i:
                line.append(" " * GAP)
            line.append_text(t)
        segments = list(line.render(self.app.console))
        return Strip(segments, line.cell_len).apply_style(style)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if width != self._lt_layout_width:
            self._fit_columns(width)
        base = self.rich_style
        if y == 0:
            if self._lt_header is None:
                style = base + self.get_component_rich_style("live-table--header")
                labels = [Text(label, justify="right" if self._right(key) else "left")
                          for key, label, _ in self._lt_columns]
                self._lt_header = self._render_cells(labels, style).crop_extend(0, width, style)
            return self._lt_header
        index = int(self.scroll_offset.y) + y - 1
        if index >= len(self.row_keys):
            return Strip([Segment(" " * width, base)], width)
        key = self.row_keys[index]
        strip = self._lt_strips.get(key)
        if strip is None:
            row = self._lt_cells[key]
            strip = self._render_cells([row.get(c[0], "") for c in self._lt_columns], base)
            strip = strip.crop_extend(0, width, base)
            self._lt_strips[key] = strip
        if self.show_cursor and index == self.cursor_row:
            cursor = self.get_component_rich_style("live-table--cursor")
            return Strip(list(Segment.apply_style(iter(strip), post_style=cursor)),
                         strip.cell_length)
        return strip

    def _right(self, column: str) -> bool:
        for row in self._lt_cells.values():
            value = row.get(column)
            return isinstance(value, Text) and value.justify == "right"
        return False


class _Batch:
    """:meth:`LiveTable.batch`: one refresh for the rows changed inside it
    (each row alone when only a few did)."""

    FEW = 8

    def __init__(self, table: LiveTable) -> None:
        self.table = table

    def __enter__(self) -> None:
        self.table._lt_batch = []

    def __exit__(self, *exc: object) -> None:
        t = self.table
        rows, t._lt_batch = t._lt_batch or [], None
        if len(rows) > self.FEW:
            t.refresh()
        else:
            for index in rows:
                t._refresh_row(index)
