"""How a table fits the terminal: each column's role, applied when rich renders it.

rich draws every table of the one-shot CLI (alignment, ellipsis, folding,
styles, ASCII boxes on an ASCII stream). What rich cannot be told is which
column may give way: its own sizing, as a last resort, narrows every
column alike, numbers and names included, down to nothing (``--metric
sequencer_state_detailed`` at 80 columns drew chip, core and PC zero cells
wide), and a ``min_width`` it cannot honour widens the table past the
terminal, whose right edge is then cut off. So each column here has a role:

``number``
    never shrinks: a number is never cut (PID, HBM, counts, percentiles).
``key``
    what a row is (Name, Engine, Address, device, target, graph name):
    whole while anything else can give; then it shrinks, widest first, to no
    fewer than ``min`` cells, ending in an ellipsis.
``text``
    free text (Owner, Kind, a cause, an error): shrinks first, widest first,
    to ``want`` cells, later to ``min``, ending in an ellipsis.
``wrap``
    free text that folds onto more lines instead (a finding, a reason).

When a table is too wide for the console, in this order: cells with a
shorter form (:class:`Alt`) take it where the long ones would cut a key
column or drop a column; text columns shrink to ``want``; ``optional``
columns drop, the highest number first; text columns shrink to their
floor; key columns shrink to theirs. A table whose floors still do not fit
(a very narrow terminal) becomes one block of ``header  value`` lines per
row, so no number is cut and no column is ever zero cells wide.

:func:`table` returns a renderable that does this for the width rich
renders it at (``options.max_width``: the console's width, ``COLUMNS``, or
the ``width`` it was given, whichever is least), so a table sizes itself
for whatever prints it, ``--streaming``'s in-place redraw included. Every
string cell goes through :func:`~tpu_info.contract.safe.clean` into a
``Text`` object, so it is never read as rich markup and never carries
terminal escapes. Colour by level (:func:`level_style`) is a cell's style;
the console drops it for ``--no-color``, ``NO_COLOR`` and a pipe.

Example:
    >>> from rich.console import Console
    >>> c = Console(width=30, color_system=None)
    >>> with c.capture() as cap:
    ...     c.print(table("T", [Col("Name", role="key", min=6), Col("Steps", "right")],
    ...                   [["a_rather_long_program_name.py", "12,345"]]))
    >>> print(cap.get().rstrip())
    T
    Name                     Steps
    ──────────────────────────────
    a_rather_long_program…  12,345
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType
from rich.table import Table
from rich.text import Text

from tpu_info.contract.safe import clean
from tpu_info.views.values import NA, format_percent

WIDE = 120  # from here on: optional columns, HBM bars, causes inline
BAR_CELLS = 10
GAP = 2  # columns are separated by two cells
ROLES = ("number", "key", "text", "wrap")

# Colour by level, as nvitop's defaults: light (green) below the first
# figure, moderate (yellow) up to the second, heavy (red) from there on.
HBM_LEVELS = (10.0, 80.0)  # HBM used, % of the chip's
BUSY_LEVELS = (10.0, 75.0)  # busy (duty cycle), %


def level_style(percent: float, levels: tuple[float, float]) -> str:
    """``green``, ``yellow`` or ``red`` for ``percent`` by ``levels`` (low, high)."""
    low, high = levels
    return "red" if percent >= high else "yellow" if percent >= low else "green"


@dataclass(frozen=True, slots=True)
class Col:
    """A column's layout rules (see the module's text for the roles).

    ``min``: the narrowest a key, text or wrap column gets (0: its header's
    width, at least 4); ``want``: the width a text column shrinks to before
    any optional column drops (0: ``min``); ``max``: the widest it is drawn,
    its longer cells ending in an ellipsis (a wrap column folds them).
    """

    header: str
    justify: str = "left"
    role: str = "number"
    min: int = 0
    want: int = 0
    max: int = 80
    optional: int = 0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role {self.role!r} is not one of {ROLES}")

    @property
    def flex(self) -> bool:
        """True when the column may shrink (every role but ``number``)."""
        return self.role != "number"

    @property
    def floor(self) -> int:
        """The fewest cells the column is ever given."""
        if self.role == "number":
            return cell_len(self.header)
        return self.min or max(4, cell_len(self.header))


@dataclass(frozen=True, slots=True)
class Alt:
    """A cell with a shorter form (``10,561 (inferred: jit(step))`` and
    ``~10,561``): the table shows the short forms of the whole column set
    when the long ones would cut a key column, their own, or drop a column."""

    long: Text | str
    short: Text | str


Cell = Text | str | Alt


def cell(value: Cell, style: str = "", short: bool = False) -> Text:
    """A cell as ``Text``: a plain string is cleaned first; an :class:`Alt`
    gives its long form (its short one with ``short``)."""
    if isinstance(value, Alt):
        value = value.short if short else value.long
    return value if isinstance(value, Text) else Text(clean(value), style=style)


def na() -> Text:
    """The N/A a table shows (its reason is in :mod:`tpu_info.views.derived`)."""
    return Text(NA, style="dim")


def percent_text(p: float, levels: tuple[float, float], text: str | None = None) -> Text:
    """``text`` (default ``42%``) coloured by ``p``'s level."""
    return Text(format_percent(p) if text is None else text, style=level_style(p, levels))


def bar(p: float) -> Text:
    """``████░░░░░░  40%`` coloured by how full it is (:data:`HBM_LEVELS`)."""
    full = max(0, min(BAR_CELLS, round(p / 100 * BAR_CELLS)))
    style = level_style(p, HBM_LEVELS)
    return Text.assemble(("█" * full, style), ("░" * (BAR_CELLS - full), "dim"),
                         (f" {format_percent(p):>4}", style))


# Sizing ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Fit:
    """What :func:`fit` decided: the columns kept and their widths (None:
    the floors do not fit; the table becomes records)."""

    keep: list[int]
    widths: list[int] | None

    def cuts(self, cols: Sequence[Col], natural: Sequence[int], short: Collection[int] = ()
             ) -> bool:
        """Whether this fit drops a column, or narrows a key column or one of
        the ``short`` ones (those with a shorter form) below its content."""
        return len(self.keep) < len(cols) or self.widths is None or any(
            (cols[i].role == "key" or i in short) and w < natural[i]
            for i, w in zip(self.keep, self.widths))


def _natural(cols: Sequence[Col], rows: Sequence[Sequence[Text]]) -> list[int]:
    """Each column's width with nothing cut (a number's whole, others' up to ``max``)."""
    out = []
    for i, c in enumerate(cols):
        widest = max([cell_len(c.header)] + [r[i].cell_len for r in rows])
        out.append(widest if c.role == "number" else min(c.max, widest))
    return out


def _shrink(widths: dict[int, int], which: list[int], floor: dict[int, int],
            excess: int) -> int:
    """Takes ``excess`` cells from the ``which`` columns, a cell at a time from
    the widest, none below its ``floor``; returns what is left to take."""
    while excess > 0:
        room = [i for i in which if widths[i] > floor[i]]
        if not room:
            break
        widest = max(room, key=lambda i: (widths[i], -i))
        widths[widest] -= 1
        excess -= 1
    return excess


def fit(cols: Sequence[Col], rows: Sequence[Sequence[Text]], width: int) -> Fit:
    """Which columns to keep and how wide each is, so the table fits ``width``."""
    natural = _natural(cols, rows)
    keep = list(range(len(cols)))
    while True:
        widths = {i: natural[i] for i in keep}
        excess = sum(widths.values()) + GAP * (len(keep) - 1) - width
        text = [i for i in keep if cols[i].role in ("text", "wrap")]
        floors = {i: min(natural[i], cols[i].floor) for i in keep}
        wants = {i: max(floors[i], min(natural[i], cols[i].want)) for i in keep}
        excess = _shrink(widths, text, wants, excess)
        optional = [i for i in keep if cols[i].optional]
        if excess > 0 and optional:
            keep.remove(max(optional, key=lambda i: (cols[i].optional, i)))
            continue
        excess = _shrink(widths, text, floors, excess)
        excess = _shrink(widths, [i for i in keep if cols[i].role == "key"], floors, excess)
        return Fit(keep, [widths[i] for i in keep] if excess <= 0 else None)


# Drawing ---------------------------------------------------------------------------

def _records(cols: Sequence[Col], cells: list[list[Text]], width: int) -> Table:
    """Each row as a block of ``header  value`` lines: what a table becomes when
    its floors alone are wider than the terminal. Values fold, never cut."""
    label = min(max(cell_len(c.header) for c in cols), max(1, width // 3))
    t = Table(box=None, show_header=False, show_edge=False, pad_edge=False,
              padding=(0, 0, 0, 1), expand=False)
    t.add_column(width=label, no_wrap=True, overflow="ellipsis", style="bold")
    t.add_column(width=max(1, width - label - GAP), overflow="fold")
    for n, row in enumerate(cells):
        if n:
            t.add_row("", "")
        for c, v in zip(cols, row, strict=True):
            if c.header or v.plain:
                t.add_row(Text(c.header), v)
    return t


def _grid(cols: Sequence[Col], cells: list[list[Text]], f: Fit) -> Table:
    assert f.widths is not None
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1),
              header_style="bold", expand=False)
    for i, w in zip(f.keep, f.widths, strict=True):
        c = cols[i]
        t.add_column(c.header, justify=c.justify, width=w,  # type: ignore[arg-type]
                     no_wrap=c.role != "wrap",
                     overflow="fold" if c.role == "wrap" else "ellipsis")
    for row in cells:
        t.add_row(*(row[i] for i in f.keep))
    return t


class FitTable:
    """A titled table that fits itself to the width it is rendered at."""

    def __init__(self, title: str, cols: Sequence[Col], rows: Sequence[Sequence[Cell]],
                 width: int | None = None, caption: str | Text | None = None) -> None:
        if any(len(r) != len(cols) for r in rows):
            raise ValueError("a row's cells do not match the columns")
        self.title, self.cols, self.rows = title, list(cols), [list(r) for r in rows]
        self.width, self.caption = width, caption

    def laid_out(self, width: int) -> tuple[list[Col], list[list[Text]], Fit]:
        """The cells (long or short forms) and the fit for ``width`` columns."""
        cells = [[cell(v) for v in row] for row in self.rows]
        f = fit(self.cols, cells, width)
        short = {i for row in self.rows for i, v in enumerate(row) if isinstance(v, Alt)}
        if short and f.cuts(self.cols, _natural(self.cols, cells), short):
            cells = [[cell(v, short=True) for v in row] for row in self.rows]
            f = fit(self.cols, cells, width)
        return self.cols, cells, f

    def renderable(self, width: int) -> Table:
        cols, cells, f = self.laid_out(width)
        return _grid(cols, cells, f) if f.widths is not None else _records(cols, cells, width)

    def __rich_console__(self, console: Console, options: ConsoleOptions
                         ) -> Iterator[RenderableType]:
        width = options.max_width if self.width is None else min(self.width,
                                                                 options.max_width)
        if self.title:
            yield Text(self.title, style="bold", overflow="fold")
        yield self.renderable(max(1, width))
        if self.caption:
            yield (self.caption if isinstance(self.caption, Text)
                   else Text(clean(self.caption), style="dim"))


def table(title: str, cols: Sequence[Col], rows: Sequence[Sequence[Cell]],
          width: int | None = None, caption: str | Text | None = None) -> FitTable:
    """``rows`` under ``cols`` with ``title`` above and ``caption`` below, laid
    out by :func:`fit` when rendered, for the console's width (``width``
    caps it), as records when its floors do not fit."""
    return FitTable(title, cols, rows, width, caption)
