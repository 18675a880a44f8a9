"""How a table fits the terminal: column rules and the sizing that applies them.

Every column is sized here, not by rich, from its content and the terminal
width. Numbers keep their width; names, engines, addresses and causes shrink
first and end in an ellipsis; optional columns appear only when there is
room; before a name is cut or a column dropped, cells with a shorter form
(:class:`Alt`) take it. :func:`table` builds the rich ``Table`` for
:mod:`tpu_info.outputs.render`'s declared sections. Every string cell goes through
:func:`~tpu_info.contract.safe.clean` into a ``Text`` object, so it is never read as
rich markup and never carries terminal escapes.

Example:
    >>> t = table("T", [Col("Name", flex=True, min=4, want=4)], [["a very long name"]], 10)
    >>> t.columns[0].width
    10
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from tpu_info.contract.safe import clean
from tpu_info.views.values import NA, format_percent

WIDE = 120  # from here on: optional columns, HBM bars, causes inline
BAR_CELLS = 10
GAP = 2  # columns are separated by two cells


@dataclass(frozen=True, slots=True)
class Col:
    """A column's layout rules.

    ``flex`` columns shrink when the table is too wide: first down to
    ``want`` (a comfortable width), those with the highest ``give`` first;
    then ``optional`` columns are dropped (highest number first); then flex
    columns shrink down to ``min``. ``wrap`` columns fold instead of ending
    in an ellipsis.
    """

    header: str
    justify: str = "left"
    min: int = 3
    want: int = 0
    max: int = 80
    flex: bool = False
    give: int = 1
    optional: int = 0
    wrap: bool = False


@dataclass(frozen=True, slots=True)
class Alt:
    """A cell with a shorter form (``10,561 (inferred: jit(step))`` and
    ``~10,561``): the table shows the short forms of the whole column set
    when the long ones would cut names or drop a column."""

    long: Text | str
    short: Text | str


Cell = Text | str | Alt


def cell(value: Cell, style: str = "", short: bool = False) -> Text:
    """A cell as ``Text``: a plain string is cleaned first; an :class:`Alt`
    gives its long form (its short one with ``short``)."""
    if isinstance(value, Alt):
        value = value.short if short else value.long
    return value if isinstance(value, Text) else Text(clean(value), style=style)


def _cuts(cols: list[Col], cells: list[list[Text]], keep: list[int], widths: list[int]) -> bool:
    """Whether a fit drops a column or narrows one below its content."""
    if len(keep) < len(cols):
        return True
    return any(w < min(cols[i].max, max([cell_len(cols[i].header)] +
                                         [r[i].cell_len for r in cells]))
               for i, w in zip(keep, widths, strict=True))


def na() -> Text:
    """The N/A a table shows (its reason is in :mod:`tpu_info.views.derived`)."""
    return Text(NA, style="dim")


def bar(p: float) -> Text:
    """``████░░░░░░  40%`` coloured by how full it is."""
    full = max(0, min(BAR_CELLS, round(p / 100 * BAR_CELLS)))
    style = "red" if p >= 90 else "yellow" if p >= 70 else "green"
    return Text.assemble(("█" * full, style), ("░" * (BAR_CELLS - full), "dim"),
                         f" {format_percent(p):>4}")


def _shrink(cols: list[Col], keep: list[int], widths: dict[int, int], excess: int,
            floor_of: Callable[[Col], int]) -> int:
    flex = sorted((i for i in keep if cols[i].flex), key=lambda i: (-cols[i].give, -widths[i]))
    for i in flex:
        if excess <= 0:
            break
        cut = min(excess, max(0, widths[i] - floor_of(cols[i])))
        widths[i] -= cut
        excess -= cut
    return excess


def fit(cols: list[Col], rows: list[list[Text]], width: int) -> tuple[list[int], list[int]]:
    """Which columns to keep and how wide each is, so the table fits ``width``."""
    keep = list(range(len(cols)))
    natural = [min(c.max, max([cell_len(c.header)] + [r[i].cell_len for r in rows]))
               for i, c in enumerate(cols)]

    def hard_floor(c: Col) -> int:
        return max(c.min, 1 if c.wrap else cell_len(c.header))

    while True:
        widths = {i: natural[i] for i in keep}
        excess = sum(widths.values()) + GAP * (len(keep) - 1) - width
        excess = _shrink(cols, keep, widths, excess, lambda c: max(c.want, hard_floor(c)))
        optional = [i for i in keep if cols[i].optional]
        if excess > 0 and optional:
            keep.remove(max(optional, key=lambda i: (cols[i].optional, i)))
            continue
        excess = _shrink(cols, keep, widths, excess, hard_floor)
        flex = [i for i in keep if cols[i].flex]
        while excess > 0 and flex and max(widths[i] for i in flex) > 1:  # last resort
            widths[max(flex, key=lambda i: widths[i])] -= 1
            excess -= 1
        return keep, [widths[i] for i in keep]


def _records(title: str, cols: list[Col], cells: list[list[Text]], width: int) -> Table:
    """Each row as a block of ``header  value`` lines: what a table becomes when
    its numbers alone are wider than the terminal. Values fold, never cut."""
    label = min(max(cell_len(c.header) for c in cols), max(1, width // 3))
    t = Table(title=title, title_justify="left", title_style="bold", box=None,
              show_header=False, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1),
              expand=False)
    t.add_column(width=label, no_wrap=True, overflow="ellipsis", style="bold")
    t.add_column(width=max(1, width - label - GAP), overflow="fold")
    for n, row in enumerate(cells):
        if n:
            t.add_row("", "")
        for c, v in zip(cols, row, strict=True):
            if c.header or v.plain:
                t.add_row(Text(c.header), v)
    return t


def table(title: str, cols: list[Col], rows: list[list[Cell]], width: int) -> Table:
    """``rows`` under ``cols``, sized by :func:`fit` for ``width`` columns; a
    table that cannot fit without cutting a number becomes records (one block
    of ``header  value`` lines per row)."""
    cells = [[cell(v) for v in row] for row in rows]
    keep, widths = fit(cols, cells, width)
    if any(isinstance(v, Alt) for row in rows for v in row) and _cuts(cols, cells, keep, widths):
        cells = [[cell(v, short=True) for v in row] for row in rows]  # shorter cells, not cut names
        keep, widths = fit(cols, cells, width)
    if sum(widths) + GAP * (len(widths) - 1) > width:
        return _records(title, cols, cells, width)
    t = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False, padding=(0, 0, 0, 1), header_style="bold",
              expand=False)
    for i, w in zip(keep, widths, strict=True):
        c = cols[i]
        t.add_column(c.header, justify=c.justify, width=w, no_wrap=not c.wrap,  # type: ignore[arg-type]
                     overflow="fold" if c.wrap else "ellipsis")
    for row in cells:
        t.add_row(*(row[i] for i in keep))
    return t
