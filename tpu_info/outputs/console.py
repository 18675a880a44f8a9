"""Where the CLI's text goes: a rich ``Console``, and streams that never crash on ASCII.

An ASCII-only stdout (``LANG=C``, ``PYTHONIOENCODING=ascii``, an old
terminal) cannot encode the tables' glyphs (``…``, ``█``, box drawing).
:func:`degrade_streams` gives such a stream the ``tpu_info_ascii`` error
handler: each glyph becomes its ASCII look-alike (``…`` -> ``.``, ``█`` ->
``#``, box lines -> ``-``/``|``/``+``), accented letters lose their accents
and anything else becomes ``?``, one character for one so columns stay
aligned. rich sees the ASCII encoding and draws its tables with ASCII boxes.

Example:
    >>> degrade_streams()  # no-op where stdout speaks UTF-8
    >>> "█…ü\\u2500".encode("ascii", errors=ASCII_ERRORS)
    b'#.u-'
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import re
import shutil
import sys
import textwrap
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TextIO

ASCII_ERRORS = "tpu_info_ascii"
_GLYPHS = {"…": ".", "█": "#", "░": ".", "▏": "|", "µ": "u", "\ufffd": "?", "↻": "@",
           "×": "x", "→": ">", "←": "<", "·": "."}
_SAMPLE = "…█─"  # if these encode, the stream needs no help


def _ascii_of(c: str) -> str:
    if c in _GLYPHS:
        return _GLYPHS[c]
    name = unicodedata.name(c, "")
    if name.startswith("BOX DRAWINGS"):
        return "|" if "VERTICAL" in name and "HORIZONTAL" not in name else (
            "-" if "HORIZONTAL" in name and "VERTICAL" not in name else "+")
    base = unicodedata.normalize("NFKD", c).encode("ascii", "ignore").decode("ascii")
    return base[:1] if base.isprintable() and base else "?"


def _handler(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    return "".join(_ascii_of(c) for c in err.object[err.start:err.end]), err.end


codecs.register_error(ASCII_ERRORS, _handler)


def needs_ascii(stream: Any) -> bool:
    """True when ``stream`` cannot encode the tables' glyphs."""
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        _SAMPLE.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return True
    return False


def degrade_streams(*streams: TextIO) -> None:
    """Gives each of ``streams`` (default stdout and stderr) that cannot encode
    the glyphs the ASCII error handler, so printing never raises."""
    for stream in streams or (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and needs_ascii(stream):
            reconfigure(errors=ASCII_ERRORS)


def color_settings(no_color: bool = False, environ: Mapping[str, str] | None = None,
                   stream: Any = None) -> dict[str, Any]:
    """The ``Console`` arguments for colour: ``--no-color`` or ``NO_COLOR``
    (no-color.org: set and not empty) turn colour off; else ``FORCE_COLOR``
    (force-color.org: set and not empty; ``2`` 256 colours, ``3`` truecolor)
    turns it on even for a pipe or a file, which stays one (frames are
    appended, never redrawn in place: rich alone would take FORCE_COLOR for
    a terminal)."""
    env = os.environ if environ is None else environ
    if no_color or env.get("NO_COLOR", ""):
        return {"no_color": True}
    force = env.get("FORCE_COLOR", "")
    if not force:
        return {"no_color": False}
    stream = sys.stdout if stream is None else stream
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):
        tty = False
    system = {"2": "256", "3": "truecolor"}.get(force.strip(), "standard")
    return {"no_color": False, "force_terminal": tty,
            "color_system": "auto" if tty else system}


def make_console(no_color: bool = False) -> Any:
    """The rich ``Console`` every CLI view prints to (stdout; no markup, no emoji;
    colour as :func:`color_settings` says). A closed pipe raises
    ``BrokenPipeError`` (rich would exit with status 1, which means "targets
    failed" here)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _Console(highlight=False, emoji=False, markup=False, soft_wrap=False,
                    **color_settings(no_color))


# Plain text (doctor, report) -------------------------------------------------------

def text_width(stream: Any = None) -> int | None:
    """The width plain text is folded to: the terminal's when ``stream``
    (stdout) is one (``COLUMNS`` first, as rich reads it); None for a pipe or
    a file, whose lines stay whole (one explanation a line, torch_xla's
    report lines) for the scripts that read them."""
    stream = sys.stdout if stream is None else stream
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    return shutil.get_terminal_size().columns


# A label a folded line's value hangs under: "  Percentiles: ", "  basis: ",
# "                last cause: " (else two cells in: a finding's "  - [kind] ...")
_HANG = re.compile(r"^(\s*[A-Za-z][\w ]*: )")


def fold(lines: Iterable[str], width: int | None) -> list[str]:
    """Each line no wider than ``width`` (None: as it is): a longer one folds
    at its spaces, its next lines indented under its value."""
    if width is None:
        return list(lines)
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        m = _HANG.match(line)
        hang = len(m.group(1)) if m else len(line) - len(line.lstrip()) + 2
        hang = min(hang, max(0, width // 2))  # a long label: indent less, not a narrow column
        out += textwrap.wrap(line, width, subsequent_indent=" " * hang, break_on_hyphens=False,
                             drop_whitespace=True) or [line[:width]]
    return out


@contextlib.contextmanager
def folded_stdout(width: int | None = None) -> Iterator[None]:
    """What is printed inside, each line folded to ``width`` (default: the
    terminal's, :func:`text_width`); in a pipe or a file, as it is."""
    width = text_width() if width is None else width
    if width is None:
        yield
        return
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield
    sys.stdout.write("".join(f"{line}\n" for line in fold(buf.getvalue().splitlines(), width)))
